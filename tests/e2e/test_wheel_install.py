"""The product as users install it: the project's wheel in fresh virtual environments, outside the checkout.

- ``pip install specwatch-*.whl``: the library alone. Nothing of the server's stack is installed; a library
  maintainer's test file with ``assert_lossless`` passes for a correct sampler and fails for a wrong one; the
  server's commands say what to install.
- ``pip install 'specwatch-*.whl[server]'``: ``specwatch serve`` in an empty folder migrates its database from
  the migrations inside the wheel, answers ``/healthz``, and ``specwatch demo`` (from the wheel) drives a signed push through it
  to a passing and a failing run (the toy sampler imports ``from specwatch import SpecOutput``, as the README
  shows, inside the worker's sandbox).

The wheel is built from a copy of the tracked files (what a release would hold), never from the checkout in
place. Each environment installs torch 2.13.0 (the CPU build) and its requirements: a minute or two each.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from alembic.script import ScriptDirectory

from service.auth import hash_token
from service.schema import alembic_config
from tests.e2e.conftest import wait_for
from tests.e2e.test_serve import LISTENING, Served

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("wheel")]

ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"
SECRET = "wheel-test-webhook-secret"
TOKEN = "wheel-test-api-token"
SERVER_STACK = {"fastapi", "celery", "sqlalchemy", "alembic", "uvicorn", "psycopg", "slack-sdk", "slack_sdk", "pydantic-settings"}


def _run(command: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _clean_env(**more: str) -> dict[str, str]:
    """The caller's environment without specwatch's settings and without a PYTHONPATH that could reach the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECWATCH_") and k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return env | {"OMP_NUM_THREADS": "1", **more}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel`` of a copy of the tracked files."""
    source = tmp_path_factory.mktemp("source")
    listed = _run(["git", "ls-files", "-z"], cwd=ROOT)
    assert listed.returncode == 0, listed.stderr
    for name in filter(None, listed.stdout.split("\0")):
        origin, copy = ROOT / name, source / name
        if not origin.exists() and not origin.is_symlink():
            continue  # deleted in the working tree, not yet committed
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, copy, follow_symlinks=False)
    dist = tmp_path_factory.mktemp("dist")
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(source)], cwd=source)
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = dist.glob("specwatch-*.whl")
    return found


def make_venv(where: Path, *requirements: str) -> Path:
    """A fresh virtual environment with torch (CPU build) and ``requirements``; its ``bin`` folder."""
    made = _run([sys.executable, "-m", "venv", str(where)], cwd=where.parent)
    assert made.returncode == 0, made.stderr
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    for step in ([TORCH], list(requirements)):
        done = _run([*pip, *step], cwd=where.parent, env=_clean_env())
        assert done.returncode == 0, f"pip install {step}: {done.stdout}\n{done.stderr}"
    return where / "bin"


def installed(bin_dir: Path) -> set[str]:
    listed = _run([str(bin_dir / "python"), "-m", "pip", "list", "--format", "freeze"], cwd=bin_dir, env=_clean_env())
    return {line.split("==")[0].lower() for line in listed.stdout.split()}


MAINTAINERS_TEST = """
    from specwatch import assert_lossless

    import sampler_bad
    import sampler_ok


    def test_the_correct_sampler_is_lossless():
        assert_lossless(sampler_ok.speculative_sample, cases=["direct/far_apart/*"], quick=True)


    def test_the_swapped_residual_is_caught():
        assert_lossless(sampler_bad.speculative_sample, cases=["direct/far_apart/*"], quick=True)
"""


def test_the_library_wheel_installs_no_server_and_asserts_losslessness(wheel: Path, tmp_path: Path) -> None:
    bin_dir = make_venv(tmp_path / "venv", str(wheel), "pytest")
    packages = installed(bin_dir)
    assert {"specwatch", "torch", "numpy", "scipy"} <= packages
    assert not packages & SERVER_STACK, packages & SERVER_STACK

    project = tmp_path / "mylib"
    project.mkdir()
    correct = (ROOT / "service" / "demo" / "toy_sampler.py.txt").read_text()
    assert "from specwatch import SpecOutput" in correct
    (project / "sampler_ok.py").write_text(correct)
    (project / "sampler_bad.py").write_text(correct.replace("return (p - q).clamp(min=0)", "return (q - p).clamp(min=0)"))
    (project / "test_sampler.py").write_text(textwrap.dedent(MAINTAINERS_TEST))
    ran = _run([str(bin_dir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, env=_clean_env())
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "1 failed, 1 passed" in ran.stdout, ran.stdout
    assert "FAILED test_sampler.py::test_the_swapped_residual_is_caught" in ran.stdout
    assert "LosslessnessError" in ran.stdout

    # The server's commands exist but say, in one line, what to install.
    serve = _run([str(bin_dir / "specwatch"), "serve"], cwd=project, env=_clean_env())
    assert serve.returncode == 2
    assert "pip install 'specwatch[server]'" in serve.stderr
    assert "Traceback" not in serve.stderr


@pytest.fixture
def served(wheel: Path, tmp_path: Path) -> Iterator[Served]:
    """``specwatch serve`` of a ``specwatch[server]`` install, started in an empty folder."""
    bin_dir = make_venv(tmp_path / "venv", f"{wheel}[server]")
    folder = tmp_path / "empty"
    folder.mkdir()
    env = _clean_env(
        SPECWATCH_WEBHOOK_SECRET=SECRET,
        SPECWATCH_API_TOKEN_HASHES=hash_token(TOKEN),
        SPECWATCH_RUN_PROFILE="smoke",
        SPECWATCH_REDIS_URL="redis://127.0.0.1:1/0",
        SPECWATCH_WORKER_DEVICE="cpu",
        SPECWATCH_WORKER_MEMORY_LIMIT_MB="8192",
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(bin_dir / "specwatch"), "serve", "--host", "127.0.0.1", "--port", "0"],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Served(proc, log)

    def listening() -> bool:
        found = LISTENING.search(server.output())
        server.url = found[1] if found else ""
        return bool(found) or proc.poll() is not None

    try:
        wait_for(listening, timeout=120, what="specwatch serve to listen", logs=server.output)
        assert server.url, f"specwatch serve exited with {proc.returncode}:\n{server.output()}"
        server.bin_dir = bin_dir  # type: ignore[attr-defined]
        server.folder = folder  # type: ignore[attr-defined]
        yield server
    finally:
        server.terminate()


def test_the_server_wheel_serves_from_an_empty_folder_and_runs_the_demo(served: Served, tmp_path: Path) -> None:
    bin_dir: Path = served.bin_dir  # type: ignore[attr-defined]
    folder: Path = served.folder  # type: ignore[attr-defined]
    assert httpx.get(f"{served.url}/healthz", timeout=10).json() == {"status": "ok"}

    # Migrated from the migrations inside the wheel, to the newest revision.
    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    with sqlite3.connect(folder / "specwatch.db") as db:
        (revision,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
    assert revision == head
    site = _run([str(bin_dir / "python"), "-c", "import service.schema as s; print(s.MIGRATIONS)"], cwd=folder, env=_clean_env())
    assert str(tmp_path / "venv") in site.stdout, site.stdout

    # `specwatch demo`: the demo is part of the wheel (its toy sampler is package data).
    demo = [str(bin_dir / "specwatch"), "demo", "--url", served.url, "--secret", SECRET, "--token", TOKEN]
    demo += ["--workdir", str(tmp_path / "demo"), "--timeout", "300"]
    done = _run(demo, cwd=folder, env=_clean_env(), timeout=400)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- serve ---\n{served.output()[-4000:]}"
    # The correct commit passes and the swapped residual fails: the sampler's `from specwatch import SpecOutput`
    # resolved inside the worker's sandbox to the installed library.
    assert "passed" in done.stdout
    assert "failed" in done.stdout
    assert "ModuleNotFoundError" not in served.output()
