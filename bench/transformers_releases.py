"""Run the transformers target on a spread of releases and print verdicts per case family.

Each release is installed with ``--pip`` into the suite's isolated cache (first run downloads it) and
tested with the default profile (or ``--quick``). Prints one row per release: verdict counts per
family (direct / e2e), failing cases, and the wall time; the JSON results go to ``--out``.

    .venv/bin/python bench/transformers_releases.py [--quick] [--out DIR] [VERSION ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

DEFAULT_RELEASES = ["4.37.2", "4.40.2", "4.44.2", "4.48.3", "4.52.4", "4.57.6", "5.5.4", "5.15.1", "5.24.0"]


def run_release(version: str, out: Path, quick: bool, jobs: int) -> tuple[int, dict | None, float, str]:
    result_file = out / f"transformers-{version}.json"
    cmd = [
        sys.executable,
        "-m",
        "specwatch",
        "run",
        "--target",
        "transformers",
        "--pip",
        f"transformers=={version}",
        "--json",
        str(result_file),
    ]
    if quick:
        cmd.append("--quick")
    if jobs > 1:
        cmd += ["--jobs", str(jobs)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    elapsed = time.perf_counter() - started
    payload = json.loads(result_file.read_text()) if result_file.exists() else None
    return proc.returncode, payload, elapsed, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


def summarise(payload: dict) -> tuple[str, str, list[str]]:
    per_family: dict[str, Counter[str]] = {}
    failing = []
    for r in payload["results"]:
        per_family.setdefault(r["family"], Counter())[r["verdict"]] += 1
        if r["verdict"] in ("fail", "error"):
            layers = "/".join(name for name in ("lossless", "conformance") if r[name] == "fail") or r["verdict"]
            failing.append(f"{r['case_id']} ({layers})")

    def fmt(family: str) -> str:
        counts = per_family.get(family, Counter())
        return " ".join(f"{counts[v]} {v}" for v in ("pass", "fail", "error", "skipped") if counts[v]) or "-"

    return fmt("direct"), fmt("e2e"), failing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("versions", nargs="*", default=DEFAULT_RELEASES)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("results-transformers"))
    parser.add_argument("--jobs", type=int, default=2, help="processes per release run")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{'release':10} {'exit':>4} {'direct':28} {'e2e':28} {'wall s':>7}  failing cases")
    for version in args.versions:
        code, payload, elapsed, last_err = run_release(version, args.out, args.quick, args.jobs)
        if payload is None:
            print(f"{version:10} {code:>4} {'(no result)':28} {'':28} {elapsed:7.0f}  {last_err}", flush=True)
            continue
        direct, e2e, failing = summarise(payload)
        print(f"{version:10} {code:>4} {direct:28} {e2e:28} {elapsed:7.0f}  {'; '.join(failing) or '-'}", flush=True)


if __name__ == "__main__":
    main()
