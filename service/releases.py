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
