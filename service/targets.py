"""Watched targets: validation of what a user types, and add / list / remove on a session.

Domain functions take a :class:`~sqlalchemy.orm.Session` and flush, never commit (docs/architecture.md §2, units of work); the CLI and
the REST API are the boundaries. Every user mistake raises :class:`TargetError` with a one-line message.

Also here: :func:`repo_key`, the normal form of a repository URL by which a webhook's repository is matched
to the targets that watch it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.addresses import is_private_host
from service.models import Commit, CommitPolicy, InstallMode, Run, Target
from service.queries.findings import seed_findings
from service.settings import Settings
from specwatch.targets.registry import registry


def known_adapters() -> dict[str, str]:
    """The adapters the suite knows by name, with what each tests: the library targets registered with it
    (:mod:`specwatch.targets.registry`, read without torch), those with an adapter."""
    return {name: info.description for name, info in registry().runnable().items()}


# Besides a known adapter: ``module:function``, a sampler inside the target's own source tree, handed to the
# suite as ``--target module:function`` (a small library of your own, or a toy target in tests).
_MODULE_FUNCTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SCP_LIKE = re.compile(r"^[\w.+-]+@(?P<host>[^:/\s]+):(?P<path>\S+)$")
_URL_SCHEMES = ("https", "http", "ssh", "git", "file")
# git's "<transport>::<address>" syntax (ext::, file::, fd::): a remote helper chosen by the URL; never allowed.
_TRANSPORT_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
#: The network protocols a repository may be fetched with (``file`` is :attr:`RepoPolicy.allow_local`).
GIT_PROTOCOLS = ("https", "ssh", "http", "git")
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
    # Besides the commit status, a GitHub check run with the run's report (opt-in).
    github_checks: bool = False


def validate_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > NAME_MAX or not _NAME.match(name):
        raise TargetError(
            f"invalid target name {name!r}: use letters, digits, '.', '_' or '-' "
            f"(starting with a letter or digit), at most {NAME_MAX} characters"
        )
    return name


@dataclass(frozen=True)
class RepoPolicy:
    """Which repositories may be watched and fetched: the same rules when a target is added (API, CLI) and
    when the worker runs git (:class:`workers.checkout.MirrorCache`), which also restricts git's
    ``protocol.allow`` to :meth:`git_protocols`.

    The default is the strict one: https only, no local path, no private or loopback host.
    """

    protocols: frozenset[str] = field(default_factory=lambda: frozenset({"https"}))
    allow_local: bool = False
    allow_private_hosts: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> RepoPolicy:
        return cls(
            protocols=frozenset(settings.git_protocols),
            allow_local=settings.local_repositories_allowed,
            allow_private_hosts=settings.private_hosts_allowed,
        )

    def git_protocols(self) -> frozenset[str]:
        """The protocols git may use: :attr:`protocols`, and ``file`` when local repositories are allowed."""
        return self.protocols | ({"file"} if self.allow_local else set())


def _scheme_of(url: str) -> str:
    if _SCP_LIKE.match(url):
        return "ssh"
    if url.startswith("/"):
        return "file"
    return urlsplit(url).scheme


def validate_repo_url(url: str, policy: RepoPolicy | None = None) -> str:
    """A clonable repository that ``policy`` (default: the strict :class:`RepoPolicy`) allows.

    Forms: ``https://``, ``http://``, ``ssh://``, ``git://``, ``user@host:path`` (ssh), and, when local
    repositories are allowed, ``file://`` and absolute paths. Always refused: credentials in the URL (use a git
    credential helper), git's ``transport::address`` form (``ext::``, ``file::``) and options (``-...``).
    """
    policy = policy or RepoPolicy()
    url = url.strip()
    if not url or len(url) > REPO_MAX or any(c.isspace() or not c.isprintable() for c in url):
        raise TargetError(f"invalid repository {redact_url(url)!r}: give a clone URL of at most {REPO_MAX} characters, without spaces")
    if url.startswith("-") or _TRANSPORT_PREFIX.match(url):
        raise TargetError(f"invalid repository {redact_url(url)!r}: git transports (transport::address) and options are not allowed")
    scheme = _scheme_of(url)
    if scheme not in _URL_SCHEMES:
        schemes = ", ".join(f"{scheme}://" for scheme in _URL_SCHEMES)
        raise TargetError(f"invalid repository {redact_url(url)!r}: use a {schemes}, user@host:path or /absolute/path URL")
    if scheme == "file":
        if not policy.allow_local:
            raise TargetError(
                f"invalid repository {redact_url(url)!r}: local repositories are not allowed (SPECWATCH_ALLOW_LOCAL_REPOSITORIES)"
            )
        if not url.startswith("/") and urlsplit(url).netloc not in ("", "localhost"):
            raise TargetError(f"invalid repository {redact_url(url)!r}: a file:// URL names no host")
        return url
    if scheme not in policy.protocols:
        allowed = ", ".join(sorted(policy.protocols))
        raise TargetError(
            f"invalid repository {redact_url(url)!r}: the {scheme} protocol is not allowed (allowed: {allowed}; SPECWATCH_GIT_PROTOCOLS)"
        )
    host, path, user, password = _network_parts(url)
    if password is not None or (user is not None and scheme != "ssh"):
        raise TargetError(
            f"invalid repository URL: credentials in the URL are not allowed (give them to git with a credential helper): {redact_url(url)}"
        )
    if not policy.allow_private_hosts and is_private_host(host):
        raise TargetError(f"invalid repository {redact_url(url)!r}: {host} is a private or loopback host (SPECWATCH_ALLOW_PRIVATE_HOSTS)")
    if not path.strip("/"):
        raise TargetError(f"invalid repository {redact_url(url)!r}: the URL has no repository path")
    return url


def _network_parts(url: str) -> tuple[str, str, str | None, str | None]:
    """(host, path, user, password) of a network repository URL; :class:`TargetError` when malformed."""
    scp = _SCP_LIKE.match(url)
    if scp is not None:
        return scp["host"], scp["path"], None, None
    parts = urlsplit(url)
    try:
        host, user, password = parts.hostname or "", parts.username, parts.password
        parts.port  # noqa: B018 -- raises ValueError for a port out of range
    except ValueError:
        raise TargetError(f"invalid repository {url!r}: the URL's host or port is malformed") from None
    if not host:
        raise TargetError(f"invalid repository {url!r}: the URL has no host")
    return host, parts.path, user, password


def redact_url(url: str) -> str:
    """``url`` without the password of its user info (``https://user:***@host/...``), for messages and logs."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    authority, sep, tail = rest.partition("/")
    userinfo, at, hostport = authority.rpartition("@")
    if not at:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hostport}{sep}{tail}"


def is_ref_name(name: str) -> bool:
    """Whether ``name`` follows git's ref-name rules (``git check-ref-format``): no control character, space,
    ``~^:?*[\\``, ``..``, ``@{`` or ``//``; no component starting with ``.`` or ending with ``.lock``; not
    ``@``, not starting with ``-`` or ``/``, not ending with ``/`` or ``.``."""
    return not (
        not name
        or name.startswith(("-", "/"))
        or name.endswith(("/", ".", ".lock"))
        or ".." in name
        or "//" in name
        or "@{" in name
        or name == "@"
        or any(c.isspace() or c in "~^:?*[\\" or ord(c) < 32 or ord(c) == 127 for c in name)
        or any(part.startswith(".") or part.endswith(".lock") for part in name.split("/"))
    )


def validate_branch(branch: str) -> str:
    """A branch name as ``git check-ref-format --branch`` would accept it (``refs/heads/`` is stripped)."""
    name = branch.strip().removeprefix("refs/heads/")
    if len(name) > BRANCH_MAX or not is_ref_name(name):
        raise TargetError(f"invalid branch name {branch!r}")
    return name


def validate_branches(branches: Iterable[str]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(validate_branch(b) for b in branches))
    if not names:
        raise TargetError("watch at least one branch (--branch main)")
    return names


def validate_adapter(adapter: str) -> str:
    adapter = adapter.strip()
    known_names = known_adapters()
    if adapter in known_names or (len(adapter) <= ADAPTER_MAX and _MODULE_FUNCTION.match(adapter)):
        return adapter
    known = ", ".join(sorted(known_names))
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
    repo_policy: RepoPolicy | None = None,
    github_checks: bool = False,
) -> TargetSpec:
    """Validate user input (CLI or API) into a :class:`TargetSpec`; raises :class:`TargetError`. The repository
    must be one ``repo_policy`` allows (default: the strict :class:`RepoPolicy`); a local one must exist and be a
    git repository (:func:`check_local_repository`), checked before anything is saved."""
    if isinstance(poll, int):
        if poll < MIN_POLL_INTERVAL_S:
            raise TargetError(f"poll interval {poll}s is too short: at least {MIN_POLL_INTERVAL_S}s")
        poll_interval_s: int | None = poll
    else:
        poll_interval_s = None if poll is None else parse_duration(poll)
    spec = TargetSpec(
        name=validate_name(name),
        repo_url=validate_repo_url(repo_url, repo_policy),
        branches=validate_branches(branches),
        adapter=validate_adapter(adapter),
        install_mode=parse_install_mode(install_mode),
        poll_interval_s=poll_interval_s,
        commit_policy=parse_commit_policy(commit_policy),
        github_checks=github_checks,
    )
    check_local_repository(spec.repo_url)
    return spec


def check_local_repository(url: str) -> None:
    """A local repository (an absolute path or a ``file://`` URL) exists and is a git repository; else
    :class:`TargetError` saying so. A network URL is left to the pollers and workers: when it cannot be cloned,
    the target gets one configuration alert with the cause (``workers.analysis.configuration``)."""
    if _scheme_of(url) != "file":
        return
    path = Path(urlsplit(url).path if url.startswith("file:") else url)
    if not path.exists():
        raise TargetError(f"repository {url!r} does not exist: give the path of a git repository on this machine, or a clone URL")
    if not ((path / "HEAD").is_file() or (path / ".git").exists()):
        raise TargetError(f"repository {url!r} is not a git repository (it has no .git, and no HEAD as a bare repository has)")


def add_target(session: Session, spec: TargetSpec) -> Target:
    """Store a new target with the known findings shipped for its adapter (:func:`seed_findings`; flushed, not
    committed); :class:`TargetExistsError` if the name is taken."""
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
        github_checks=spec.github_checks,
    )
    session.add(target)
    session.flush()
    seed_findings(session, target)
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


def update_target(session: Session, name: str, *, github_checks: bool | None = None) -> Target:
    """Change what a target's options say (None: unchanged); flushed, not committed. Its repository, branches
    and adapter are its identity: to change those, remove it and add it again."""
    target = get_target(session, name)
    if github_checks is not None:
        target.github_checks = github_checks
    session.flush()
    return target


def history_size(session: Session, name: str) -> Removed:
    """What removing target ``name`` would delete: its commits and runs (:class:`TargetNotFoundError` if none)."""
    target = get_target(session, name)
    commits = session.scalar(select(func.count()).select_from(Commit).where(Commit.target_id == target.id)) or 0
    runs = session.scalar(select(func.count()).select_from(Run).join(Commit).where(Commit.target_id == target.id)) or 0
    return Removed(name=name, commits=commits, runs=runs)


def remove_target(session: Session, name: str) -> Removed:
    """Delete a target and, by cascade, its commits, runs and results (flushed, not committed)."""
    removed = history_size(session, name)
    target = get_target(session, name)
    session.delete(target)
    session.flush()
    return removed


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
