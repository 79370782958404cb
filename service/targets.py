"""Watched targets: validation of what a user types, and add / list / remove on a session.

Domain functions take a :class:`~sqlalchemy.orm.Session` and flush, never commit (docs/architecture.md §2, units of work); the CLI and
the REST API are the boundaries. Every user mistake raises :class:`TargetError` with a one-line message.

Which repositories a target may name is :mod:`service.repositories`; the errors are :mod:`service.target_errors`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.findings import seed_findings
from service.models import Commit, CommitPolicy, InstallMode, Run, Target
from service.repositories import RepoPolicy, check_local_repository, is_ref_name, validate_repo_url
from service.target_errors import TargetError, TargetExistsError, TargetNotFoundError
from specwatch.targets.registry import registry


def known_adapters() -> dict[str, str]:
    """The adapters the suite knows by name, with what each tests: the library targets registered with it
    (:mod:`specwatch.targets.registry`, read without torch), those with an adapter."""
    return {name: info.description for name, info in registry().runnable().items()}


# Besides a known adapter: ``module:function``, a sampler inside the target's own source tree, handed to the
# suite as ``--target module:function`` (a small library of your own, or a toy target in tests).
_MODULE_FUNCTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DURATION = re.compile(r"^(?P<value>\d+)(?P<unit>[smhd]?)$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_POLL_INTERVAL_S = 30
NAME_MAX, BRANCH_MAX, ADAPTER_MAX = 100, 255, 100


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
