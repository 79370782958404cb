"""Runs: one run with its commit, environment, status and every case result (reads need a token only when
read auth is on)."""

from __future__ import annotations

from fastapi import APIRouter

from service.auth import ReadAuth
from service.deps import DbId, SessionDep
from service.queries import NotFoundError, RunDetail, run_detail
from service.routes.common import READ_ERRORS, http_error

router = APIRouter(tags=["history"], dependencies=[ReadAuth], responses=READ_ERRORS)


@router.get("/runs/{run_id}")
def get_run(run_id: DbId, session: SessionDep) -> RunDetail:
    """A run: its commit, environment, status and every case result."""
    try:
        return run_detail(session, run_id)
    except NotFoundError as exc:
        raise http_error(exc) from None
