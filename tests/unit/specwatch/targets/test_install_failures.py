"""A release pip cannot install is told apart from one that installs: real pip against a local package index
(tests/support/package_index.py) that lacks a dependency, holds conflicting ones, or fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from specwatch.protocol import ExitStatus
from specwatch.targets.install import InstallError, install_failure, main, pip_install
from tests.support.package_index import PackageIndex, build_wheel, serve

pytestmark = pytest.mark.unit

MISSING = "kernels>=0.19.1,<0.20"


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PackageIndex]:
    """A local index pip installs from (once: no retries), and a release cache of the test's own."""
    with serve(PackageIndex()) as served:
        monkeypatch.setenv("PIP_INDEX_URL", f"{served.url}/simple")
        monkeypatch.setenv("PIP_RETRIES", "0")
        monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path / "cache"))
        yield served


def publish(index: PackageIndex, dist: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    module = name.replace("-", "_")
    index.publish(name, version, wheel=build_wheel(dist, name, version, {f"{module}/__init__.py": ""}, requires))


def test_a_dependency_missing_from_the_index_is_named(index: PackageIndex, tmp_path: Path) -> None:
    publish(index, tmp_path / "dist", "wide-lib", "5.25.0", (MISSING,))

    with pytest.raises(InstallError) as raised:
        pip_install("wide-lib==5.25.0", log=False)

    failure = raised.value
    assert (failure.cause, failure.wanted) == ("missing", "wide-lib==5.25.0")
    assert sorted(failure.requirement.removeprefix("kernels").split(",")) == ["<0.20", ">=0.19.1"]  # pip's order
    assert str(failure) == (
        f"could not install: {failure.requirement} (no distribution on the package index satisfies it, needed by wide-lib==5.25.0)"
    )
    assert not (tmp_path / "cache" / "pip" / "wide-lib==5.25.0" / ".specwatch-complete").exists()


def test_a_release_the_index_does_not_have_is_the_requirement_itself(index: PackageIndex, tmp_path: Path) -> None:
    publish(index, tmp_path / "dist", "wide-lib", "1.0")

    assert main(["wide-lib==9.9"]) == ExitStatus.INSTALL
    with pytest.raises(InstallError, match=r"^could not install: wide-lib==9\.9 \(no distribution on the package index satisfies it\)$"):
        pip_install("wide-lib==9.9", log=False)


def test_conflicting_dependencies_are_a_resolution_failure_that_names_them(index: PackageIndex, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    publish(index, dist, "alpha-dep", "1.0")
    publish(index, dist, "alpha-dep", "2.0")
    publish(index, dist, "beta-dep", "1.0", ("alpha-dep==2.0",))
    publish(index, dist, "torn-lib", "1.0", ("alpha-dep==1.0", "beta-dep==1.0"))

    with pytest.raises(InstallError) as raised:
        pip_install("torn-lib==1.0", log=False)

    assert (raised.value.cause, raised.value.requirement) == ("conflict", "torn-lib==1.0")
    assert "its dependencies conflict" in str(raised.value)
    assert "beta-dep 1.0 depends on alpha-dep==2.0" in str(raised.value)


def test_an_index_that_fails_is_a_network_failure_not_a_missing_release(index: PackageIndex, tmp_path: Path) -> None:
    publish(index, tmp_path / "dist", "wide-lib", "1.0")
    index.failing_with = 503

    with pytest.raises(InstallError) as raised:
        pip_install("wide-lib==1.0", log=False)

    assert (raised.value.cause, raised.value.requirement) == ("network", "wide-lib==1.0")
    assert str(raised.value).startswith("could not install: wide-lib==1.0 (the package index could not be reached: ")


def test_a_release_that_installs_is_not_an_install_failure(index: PackageIndex, tmp_path: Path) -> None:
    publish(index, tmp_path / "dist", "kernels", "0.19.3")
    publish(index, tmp_path / "dist", "wide-lib", "5.25.0", (MISSING,))

    assert main(["wide-lib==5.25.0"]) == ExitStatus.OK
    assert main([]) == ExitStatus.USAGE


@pytest.mark.parametrize(
    ("output", "cause", "requirement"),
    [
        (
            "ERROR: Could not find a version that satisfies the requirement kernels<0.20,>=0.19.1 (from lib) (from versions: none)\n"
            "ERROR: No matching distribution found for kernels<0.20,>=0.19.1\n",
            "missing",
            "kernels<0.20,>=0.19.1",
        ),
        (
            "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by "
            "'NewConnectionError(...: Failed to establish a new connection: [Errno 111] Connection refused')': /simple/lib/\n"
            "ERROR: No matching distribution found for lib==1.0\n",
            "network",
            "lib==1.0",
        ),
        (
            "ERROR: Cannot install lib==1.0 because these package versions have conflicting dependencies.\n"
            "The conflict is caused by:\n    lib 1.0 depends on numpy<1\n    The user requested (constraint) numpy==2.2.1\n"
            "ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/...\n",
            "conflict",
            "lib==1.0",
        ),
        ("ERROR: Failed building wheel for lib\n", "pip", "lib==1.0"),
    ],
)
def test_pip_output_is_classified(output: str, cause: str, requirement: str) -> None:
    failure = install_failure("lib==1.0", output)
    assert (failure.cause, failure.requirement) == (cause, requirement)
    assert str(failure).startswith(f"could not install: {requirement} (")
