"""The REST API: targets (``GET /targets``, ``POST /targets``, ``PATCH /targets/{name}``, ``DELETE /targets/{name}``).

Writes need a write token (:mod:`service.auth`); reads need one only when read auth is on.

Routes validate with :mod:`service.targets` (the same rules and messages as the CLI) and work on the
request's session, which commits when the route returns (:mod:`service.deps`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, ConfigDict, Field

from service.auth import ReadAuth, WriteAuth
from service.deps import SessionDep, SettingsDep
from service.models import CommitPolicy, InstallMode, Target
from service.queries.health import TargetHealth, targets_health
from service.repositories import RepoPolicy
from service.target_errors import TargetError, TargetExistsError, TargetNotFoundError
from service.targets import add_target, list_targets, make_spec, remove_target, update_target

router = APIRouter(tags=["targets"])


class TargetIn(BaseModel):
    """A target to watch. ``poll`` is a duration such as ``5m`` (``null``: webhooks only)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    repo_url: str
    branches: list[str] = Field(min_length=1)
    adapter: str
    install_mode: InstallMode = InstallMode.source
    poll: str | None = None
    commit_policy: CommitPolicy = CommitPolicy.head
    # Besides the commit status, a GitHub check run with the run's report (opt-in).
    github_checks: bool = False


class TargetChange(BaseModel):
    """What ``PATCH /targets/{name}`` may change (absent: unchanged)."""

    model_config = ConfigDict(extra="forbid")

    github_checks: bool | None = None


class PollOut(BaseModel):
    kind: str
    ref: str
    polled_at: datetime | None
    succeeded_at: datetime | None
    error: str | None


class LastRunOut(BaseModel):
    id: int
    sha: str
    status: str
    finished_at: datetime | None
    error: str | None


class TargetOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    repo_url: str
    branches: list[str]
    adapter: str
    install_mode: InstallMode
    poll_interval_s: int | None
    commit_policy: CommitPolicy
    github_checks: bool = False
    created_at: datetime | None
    # The target's health (service.queries.health): the cause of its open configuration alert (None: none), its
    # pollers' last poll and their errors.
    configuration_error: str | None = None
    configuration_alert_id: int | None = None
    last_polled_at: datetime | None = None
    poll_errors: dict[str, str] = Field(default_factory=dict)
    # Each poll state (a watched branch, or the releases): when it was last polled and last succeeded, its error.
    polls: list[PollOut] = Field(default_factory=list)
    # Runs waiting for a worker and running now; how long the oldest has waited (None: none waits).
    queued_runs: int = 0
    running_runs: int = 0
    oldest_queued_at: datetime | None = None
    queue_age_s: float | None = None
    # The last finished run: its id, commit, status, when it finished, and its error (an error or uninstallable run).
    last_run: LastRunOut | None = None


def _out(target: Target, health: TargetHealth | None = None) -> TargetOut:
    out = TargetOut.model_validate(target)
    if health is None:
        return out
    return out.model_copy(
        update={
            "configuration_error": health.configuration_error,
            "configuration_alert_id": health.configuration_alert_id,
            "last_polled_at": health.last_polled_at,
            "poll_errors": {f"{p.kind}:{p.ref}": p.error for p in health.poll_errors if p.error},
            "polls": [
                PollOut(kind=p.kind, ref=p.ref, polled_at=p.polled_at, succeeded_at=p.succeeded_at, error=p.error) for p in health.polls
            ],
            "queued_runs": health.queued_runs,
            "running_runs": health.running_runs,
            "oldest_queued_at": health.oldest_queued_at,
            "queue_age_s": health.queue_age_s(datetime.now(UTC)),
            "last_run": None
            if health.last_run is None
            else LastRunOut(
                id=health.last_run.id,
                sha=health.last_run.sha,
                status=health.last_run.status.value,
                finished_at=health.last_run.finished_at,
                error=health.last_run.error,
            ),
        }
    )


@router.get("/targets", dependencies=[ReadAuth])
def get_targets(session: SessionDep) -> list[TargetOut]:
    """Every watched target, by name, with its health: a configuration error, each poll's last time and error, its
    queue (runs waiting and running, the oldest's age) and its last finished run."""
    targets = list_targets(session)
    health = targets_health(session, [t.id for t in targets])
    return [_out(target, health[target.id]) for target in targets]


@router.post(
    "/targets",
    status_code=status.HTTP_201_CREATED,
    dependencies=[WriteAuth],
    responses={
        401: {"description": "no valid token"},
        403: {"description": "a read-only token"},
        409: {"description": "a target with that name exists"},
        422: {"description": "invalid target"},
    },
)
def post_target(body: TargetIn, session: SessionDep, settings: SettingsDep) -> TargetOut:
    """Watch a new target."""
    try:
        spec = make_spec(
            name=body.name,
            repo_url=body.repo_url,
            branches=body.branches,
            adapter=body.adapter,
            install_mode=body.install_mode,
            poll=body.poll,
            commit_policy=body.commit_policy,
            repo_policy=RepoPolicy.from_settings(settings),
            github_checks=body.github_checks,
        )
        target = add_target(session, spec)
    except TargetExistsError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except TargetError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    session.refresh(target)
    return _out(target)


@router.patch(
    "/targets/{name}",
    dependencies=[WriteAuth],
    responses={401: {"description": "no valid token"}, 403: {"description": "a read-only token"}, 404: {"description": "no such target"}},
)
def patch_target(name: str, body: TargetChange, session: SessionDep) -> TargetOut:
    """Change a target's options (``github_checks``); its repository, branches and adapter stay."""
    try:
        target = update_target(session, name, github_checks=body.github_checks)
    except TargetNotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    return _out(target)


@router.delete(
    "/targets/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    dependencies=[WriteAuth],
    responses={401: {"description": "no valid token"}, 403: {"description": "a read-only token"}, 404: {"description": "no such target"}},
)
def delete_target(name: str, session: SessionDep) -> None:
    """Stop watching a target and delete its history (commits, runs, results)."""
    try:
        remove_target(session, name)
    except TargetNotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
