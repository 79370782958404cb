"""Runs: one run with its commit, environment, status and every case result, its log, and a re-run of a commit
(reads need a token only when read auth is on; a re-run always needs a write token)."""

from __future__ import annotations

from fastapi import APIRouter, BackgroundTasks, HTTPException, status
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from service.after_commit import after_commit
from service.auth import ReadAuth, WriteAuth
from service.deps import DbId, ProducerDep, SessionDep, SettingsDep
from service.ingest import RunOptions
from service.queries import NotFoundError, QueryError, RunDetail, run_detail
from service.queue import enqueue_runs
from service.reruns import REASON_MAX, Rerun, RunBusyError, rerun_commit
from service.routes.common import READ_ERRORS, http_error

router = APIRouter(tags=["history"], responses=READ_ERRORS)


@router.get("/runs/{run_id}", dependencies=[ReadAuth])
def get_run(run_id: DbId, session: SessionDep) -> RunDetail:
    """A run: its commit, environment, status and every case result."""
    try:
        return run_detail(session, run_id)
    except NotFoundError as exc:
        raise http_error(exc) from None


@router.get("/runs/{run_id}/log", dependencies=[ReadAuth], response_class=PlainTextResponse)
def get_run_log(run_id: DbId, session: SessionDep) -> PlainTextResponse:
    """A run's error and the end of the suite's output, as plain text."""
    try:
        run = run_detail(session, run_id)
    except NotFoundError as exc:
        raise http_error(exc) from None
    parts = [f"run {run.id} of {run.target} {run.sha}: {run.status.value}"]
    if run.error:
        parts.append(f"error: {run.error}")
    parts.append(run.log_tail or "(the suite wrote no output)")
    return PlainTextResponse("\n\n".join(parts) + "\n")


class RerunIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=REASON_MAX)


@router.post(
    "/targets/{name}/commits/{sha}/rerun",
    status_code=status.HTTP_202_ACCEPTED,
    dependencies=[WriteAuth],
    responses={403: {"description": "a read-only token"}, 409: {"description": "a run of the commit is queued or running"}},
)
def post_rerun(
    name: str, sha: str, body: RerunIn, *, session: SessionDep, settings: SettingsDep, producer: ProducerDep, background: BackgroundTasks
) -> Rerun:
    """Test a commit again (same profile, the commit's own seeds) with the reason recorded; the run is queued."""
    try:
        rerun = rerun_commit(session, name, sha, reason=body.reason, requested_by="api", options=RunOptions.from_settings(settings))
    except RunBusyError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except (NotFoundError, QueryError) as exc:
        raise http_error(exc) from None
    after_commit(session, background.add_task, enqueue_runs, producer, [rerun.run_id])
    return rerun
