"""scripts/cold-check.sh (``make test-cold``) fails whenever a check did not really run cold, sandboxed and clean.

The script is driven with a stand-in ``specwatch`` (``SPECWATCH_BIN``) that writes the JSON a real check writes
(``specwatch check --json``) with what each test needs; the real checks run in CI's ``make test-cold``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cold-check.sh"


def _bin(tmp_path: Path, run: dict[str, object] | None, code: int = 0) -> Path:
    """A folder with ``python`` (this interpreter) and a ``specwatch`` that writes ``run`` to its ``--json`` file."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python").symlink_to(sys.executable)
    payload = json.dumps(run) if run is not None else ""
    script = folder / "specwatch"
    script.write_text(
        "#!/usr/bin/env bash\n"
        'while [ "$#" -gt 0 ]; do if [ "$1" = --json ]; then json="$2"; fi; shift; done\n'
        + (f"cat > \"$json\" <<'EOF'\n{payload}\nEOF\n" if run is not None else "")
        + 'echo "cache: $SPECWATCH_CACHE_DIR" >&2\n'
        + f"exit {code}\n"
    )
    script.chmod(0o755)
    return folder


def _run(tmp_path: Path, folder: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECWATCH_BIN": str(folder), "PATH": f"{tmp_path / 'fakebwrap'}:{os.environ['PATH']}"}
    (tmp_path / "fakebwrap").mkdir(exist_ok=True)
    bwrap = tmp_path / "fakebwrap" / "bwrap"  # the script asks only that bubblewrap is installed
    bwrap.write_text("#!/bin/sh\nexit 0\n")
    bwrap.chmod(0o755)
    return subprocess.run(["bash", str(SCRIPT), str(cache), "demo==1.0"], capture_output=True, text=True, env=env, check=False)


def _result(mode: str = "bwrap", verdicts: tuple[str, ...] = ("pass", "fail"), known: bool = True) -> dict[str, object]:
    results = [
        {"case_id": f"case/{i}", "verdict": v, "known_finding": "k" if v == "fail" and known else None} for i, v in enumerate(verdicts)
    ]
    environment = {"library_distribution": "demo", "library_version": "1.0", "library_build_seconds": "12.5"}
    return {"results": results, "environment": environment, "isolation": {"mode": mode, "reason": "r"}}


def test_a_clean_sandboxed_check_from_an_empty_cache_passes_and_says_what_it_tested(tmp_path: Path) -> None:
    done = _run(tmp_path, _bin(tmp_path, _result()), tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok demo==1.0: 2 case(s) ran, 1 failed (1 known); tested demo 1.0; built in 12 s; wall 0 min" in done.stdout
    assert f"cache: {tmp_path / 'cache'}" in done.stderr


@pytest.mark.parametrize(
    ("run", "code", "why"),
    [
        (_result(mode="none"), 0, "not sandboxed (none: r)"),
        (_result(verdicts=("skipped", "skipped")), 0, "no case ran"),
        (_result(known=False), 1, "exit status 1"),
        (None, 3, "exit status 3, no JSON result"),
    ],
)
def test_a_check_that_is_not_sandboxed_ran_nothing_or_failed_fails_the_tier(
    tmp_path: Path, run: dict[str, object] | None, code: int, why: str
) -> None:
    done = _run(tmp_path, _bin(tmp_path, run, code), tmp_path / "cache")
    assert done.returncode == 1, done.stdout
    assert why in done.stdout


def test_a_warm_cache_is_refused_before_anything_runs(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "pip" / "demo==1.0").mkdir(parents=True)
    done = _run(tmp_path, _bin(tmp_path, _result()), cache)
    assert done.returncode == 2
    assert "is not empty" in done.stderr
    assert "cache:" not in done.stderr  # the check itself never ran
