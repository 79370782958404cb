"""Source mode tests each commit with the dependencies that commit declares: the worker resolves and installs them in
steps of their own under the sandbox's install rules, then the suite imports the commit's code and that environment.

Real bubblewrap, real pip against a local package index (tests/support/package_index.py), the real suite: two commits
of a toy library whose sampler imports ``toydep`` and works only with the version its commit declares (1.0, then
2.0), and a third that declares a version the index lacks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from specwatch.protocol import ExitStatus
from specwatch.sandbox import resolve_sandbox
from tests.support.package_index import PackageIndex, build_wheel, serve
from tests.support.toy_target import ADAPTER, CORRECT
from tests.unit.specwatch.targets.test_dependencies import checkout as declared_checkout
from workers import sandbox as worker_sandbox
from workers.sandbox import SPECWATCH_ROOT, SuiteCommand

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PackageIndex]:
    with serve(PackageIndex()) as served:
        monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple")
        monkeypatch.setenv("PIP_RETRIES", "0")
        for version in ("1.0", "2.0"):
            files = {"toydep/__init__.py": f"VERSION = {version!r}\n"}
            served.publish("toydep", version, wheel=build_wheel(tmp_path / "dist", "toydep", version, files))
        yield served


def _commit(scratch: Path, declared: str, works_with: str) -> Path:
    """A checkout in the run's scratch folder (where the worker puts it) declaring ``toydep==declared``, whose sampler
    raises unless ``toydep`` is ``works_with``."""
    checkout = declared_checkout(scratch / "checkout", [f"toydep=={declared}"], name="toy_lib")
    guard = f"import toydep\n\nif toydep.VERSION != {works_with!r}:\n    raise ImportError(f'toydep {{toydep.VERSION}}')\n"
    (checkout / "src" / "toy_lib" / "sampler.py").write_text(guard + CORRECT)
    return checkout


def _run(tmp_path: Path, name: str, declared: str, works_with: str) -> tuple[worker_sandbox.SuiteOutcome, Path]:
    scratch = tmp_path / name
    scratch.mkdir()
    checkout = _commit(scratch, declared, works_with)
    command = SuiteCommand(
        python=sys.executable,
        target=ADAPTER,
        suite_args=("--quick", "--cases", "direct/far_apart/*"),
        seed=1,
        device="cpu",
        python_path=(checkout / "src", SPECWATCH_ROOT),
        timeout_s=300,
        memory_limit_bytes=None,
        passthrough=("PIP_INDEX_URL", "PIP_RETRIES"),
        env=(("SPECWATCH_CACHE_DIR", str(tmp_path / "cache")),),
        sandbox=resolve_sandbox("bwrap", sys.executable),
        dependencies_of=checkout,
    )
    return worker_sandbox.run_suite_process(command, scratch), scratch


def test_each_commit_runs_with_the_dependency_versions_it_declares(index: PackageIndex, tmp_path: Path) -> None:
    old, _ = _run(tmp_path, "old", "1.0", works_with="1.0")
    new, _ = _run(tmp_path, "new", "2.0", works_with="2.0")
    for outcome in (old, new):
        assert outcome.exit_code == ExitStatus.OK, outcome.stderr_tail
        assert outcome.result is not None
        assert {r["verdict"] for r in outcome.result["results"]} == {"pass"}
    environments = sorted(p.name for p in (tmp_path / "cache" / "envs").iterdir())
    assert len(environments) == 2  # one per resolved set


def test_a_commit_with_the_same_set_reuses_the_environment(index: PackageIndex, tmp_path: Path) -> None:
    first, _ = _run(tmp_path, "first", "1.0", works_with="1.0")
    assert first.exit_code == ExitStatus.OK, first.stderr_tail
    (environment,) = (tmp_path / "cache" / "envs").iterdir()
    marker = (environment / ".specwatch-complete").stat()
    first_downloads = sum(r.startswith("/files/") for r in index.requests)  # resolving and installing
    index.requests.clear()
    second, _ = _run(tmp_path, "second", "1.0", works_with="1.0")
    assert second.exit_code == ExitStatus.OK, second.stderr_tail
    assert [p.name for p in (tmp_path / "cache" / "envs").iterdir()] == [environment.name]
    assert (environment / ".specwatch-complete").stat().st_mtime_ns == marker.st_mtime_ns  # not installed again
    assert sum(r.startswith("/files/") for r in index.requests) < first_downloads  # resolving only


def test_a_commit_whose_dependencies_cannot_be_resolved_is_uninstallable_and_never_tested(index: PackageIndex, tmp_path: Path) -> None:
    outcome, scratch = _run(tmp_path, "missing", "9.9", works_with="9.9")
    assert outcome.exit_code == ExitStatus.INSTALL
    assert "could not install: toydep==9.9 (no distribution on the package index satisfies it" in outcome.stderr_tail
    assert outcome.result is None
    assert not (scratch / "result.json").exists()
