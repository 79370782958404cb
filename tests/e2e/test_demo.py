"""The README's embedded path as a newcomer runs it: `specwatch serve`, then `scripts/demo.py` against it.

The demo creates its own repository, registers it through the API, posts a signed push and follows the
runs through `GET /runs/{id}` until they finish: the correct commit passes, the buggy one fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_serve import API_TOKEN, SECRET, sqlite_factory, sqlite_url, start_serve  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo.py"


def test_the_demo_push_produces_completed_runs_visible_through_the_api(start_serve, tmp_path):  # noqa: F811
    served = start_serve()
    command = [sys.executable, str(DEMO), "--url", served.url, "--secret", SECRET, "--token", API_TOKEN]
    command += ["--workdir", str(tmp_path / "demo"), "--timeout", "300"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=360, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- serve ---\n{served.output()[-3000:]}"
    assert "passed" in done.stdout
    assert "failed" in done.stdout
