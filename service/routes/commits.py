"""Commits: the overview of every target's branches, a branch's commits, one case over commits, two commits
compared.

Every route answers from :mod:`service.queries`; unknown names are 404, bad input (cursor, limit, ambiguous
sha) 400. Reads need a token only when read auth is on (:mod:`service.auth`). Case ids contain slashes
(``direct/far_apart/V8/g1``), hence the ``{case_id:path}`` route.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service.auth import ReadAuth
from service.deps import SessionDep
from service.queries import (
    MAX_HISTORY,
    MAX_PAGE,
    CaseHistory,
    CommitPage,
    Comparison,
    NotFoundError,
    QueryError,
    TargetSummary,
    case_history,
    commits_page,
    compare,
    targets_overview,
)
from service.routes.common import READ_ERRORS, http_error

router = APIRouter(tags=["history"], dependencies=[ReadAuth], responses=READ_ERRORS)


@router.get("/overview")
def get_overview(session: SessionDep) -> list[TargetSummary]:
    """Every target with the head of each watched branch, its latest run's status, and its runs by status."""
    return targets_overview(session)


@router.get("/targets/{name}/commits")
def get_commits(
    name: str,
    session: SessionDep,
    branch: Annotated[str | None, Query(description="default: the first watched branch; (releases) for a pip target")] = None,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> CommitPage:
    """A branch's commits, newest first, each with its latest run's status; pages continue with ``cursor``."""
    try:
        return commits_page(session, name, branch=branch, cursor=cursor, limit=limit)
    except (NotFoundError, QueryError) as exc:
        raise http_error(exc) from None


@router.get("/targets/{name}/cases/{case_id:path}/history")
def get_case_history(
    name: str,
    case_id: str,
    session: SessionDep,
    branch: Annotated[str | None, Query(description="default: the first watched branch; (releases) for a pip target")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_HISTORY, description="the newest commits to include")] = 1000,
) -> CaseHistory:
    """One case over a branch's commits, oldest first, ready to plot: verdict, log e-value and threshold,
    TV estimate with its interval, acceptance observed and expected, fingerprint."""
    try:
        return case_history(session, name, case_id, branch=branch, limit=limit)
    except (NotFoundError, QueryError) as exc:
        raise http_error(exc) from None


@router.get("/compare")
def get_compare(
    session: SessionDep,
    target: Annotated[str, Query(description="the target's name")],
    a: Annotated[str, Query(description="a commit sha (or a unique prefix)")],
    b: Annotated[str, Query(description="another commit sha (or a unique prefix)")],
) -> Comparison:
    """Two commits' latest runs compared case by case: verdicts, log e-values, acceptance difference (b - a)
    and whether the seeded output fingerprints are equal."""
    try:
        return compare(session, target, a, b)
    except (NotFoundError, QueryError) as exc:
        raise http_error(exc) from None
