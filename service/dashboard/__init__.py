"""The dashboard: server-rendered pages (Jinja2 templates shipped in this package, charts as inline SVG).

Pages: targets overview (``/ui``), a branch's timeline (commits × verdict, the first failing commit of each
failure streak marked), a case over commits (e-value on a log scale against the threshold, TV estimate with
its interval, acceptance observed vs expected), a run, and the alerts (read-only: acknowledging and resolving
need a write token, so they go through the API or ``specwatch alerts ack|resolve``). They read through :mod:`service.queries`, like the
API and the CLI, and follow the API's read auth.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from service.auth import ReadAuth
from service.dashboard.charts import Chart, Series, render
from service.deps import DbId, SessionDep
from service.models import AlertState
from service.queries import (
    CaseHistory,
    NotFoundError,
    QueryError,
    case_history,
    case_ids,
    commits_page,
    list_alerts,
    run_detail,
    targets_overview,
)

TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")
TEMPLATES.env.filters["log"] = math.log
# The pages' one stylesheet, served from /ui/style.css (the CSP allows no inline style: service.headers).
STYLESHEET = (Path(__file__).parent / "style.css").read_bytes()
LN10 = math.log(10)

router = APIRouter(prefix="/ui", tags=["dashboard"], dependencies=[ReadAuth], include_in_schema=False)


def _page(request: Request, template: str, **context: object) -> HTMLResponse:
    return TEMPLATES.TemplateResponse(request, template, context)


def _not_found(exc: Exception) -> HTTPException:
    code = status.HTTP_404_NOT_FOUND if isinstance(exc, NotFoundError) else status.HTTP_400_BAD_REQUEST
    return HTTPException(code, str(exc))


@router.get("", response_class=HTMLResponse)
def overview(request: Request, session: SessionDep) -> HTMLResponse:
    return _page(request, "overview.html", targets=targets_overview(session))


@router.get("/", include_in_schema=False)
def overview_slash() -> RedirectResponse:
    return RedirectResponse("/ui")


@router.get("/style.css")
def stylesheet() -> Response:
    return Response(STYLESHEET, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


@router.get("/targets/{name}", response_class=HTMLResponse)
def timeline(
    request: Request,
    name: str,
    session: SessionDep,
    *,
    branch: str | None = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> HTMLResponse:
    try:
        page = commits_page(session, name, branch=branch, cursor=cursor, limit=limit)
        cases = case_ids(session, name, branch=page.branch)
    except (NotFoundError, QueryError) as exc:
        raise _not_found(exc) from None
    alerts = list_alerts(session, target=name, branch=page.branch, limit=20)
    return _page(request, "timeline.html", page=page, cases=cases, alerts=[a for a in alerts if a.state is not AlertState.resolved])


def _log10(value: float | None) -> float | None:
    return None if value is None else value / LN10


def case_charts(history: CaseHistory) -> list[Markup]:
    """The case page's three charts over commits."""
    points = history.points
    labels = [p.sha[:8] for p in points]
    fails = [i for i, p in enumerate(points) if p.verdict.value == "fail"]
    evidence = Chart(
        title="e-value (log scale) against the rejection threshold",
        labels=labels,
        series=[
            Series("log10 E", [_log10(p.log_e_value) for p in points], "#1f5fbf"),
            Series("threshold", [None if p.threshold is None else math.log10(p.threshold) for p in points], "#d33", dashed=True),
        ],
        marks=fails,
        log_ticks=True,
    )
    tv = Chart(
        title="TV distance estimate with its interval (descriptive: computed at a data-dependent stop)",
        labels=labels,
        series=[Series("TV estimate", [p.tv_estimate for p in points], "#1f5fbf")],
        band=([p.tv_low for p in points], [p.tv_high for p in points]),
        marks=fails,
    )
    acceptance = Chart(
        title="acceptance rate: observed vs expected",
        labels=labels,
        series=[
            Series("observed", [p.acceptance_observed for p in points], "#1f5fbf"),
            Series("expected", [p.acceptance_expected for p in points], "#888", dashed=True),
        ],
        marks=fails,
    )
    # render() escapes every text it writes: the SVG is safe to insert as markup.
    return [Markup(render(chart)) for chart in (evidence, tv, acceptance)]  # noqa: S704


@router.get("/targets/{name}/cases/{case_id:path}", response_class=HTMLResponse)
def case_page(
    request: Request,
    name: str,
    case_id: str,
    session: SessionDep,
    *,
    branch: str | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 200,
) -> HTMLResponse:
    try:
        history = case_history(session, name, case_id, branch=branch, limit=limit)
    except (NotFoundError, QueryError) as exc:
        raise _not_found(exc) from None
    return _page(request, "case.html", history=history, charts=case_charts(history))


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: DbId, session: SessionDep) -> HTMLResponse:
    try:
        run = run_detail(session, run_id)
    except NotFoundError as exc:
        raise _not_found(exc) from None
    return _page(request, "run.html", run=run)


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(request: Request, session: SessionDep, *, state: AlertState | None = None, target: str | None = None) -> HTMLResponse:
    try:
        alerts = list_alerts(session, target=target, state=state, limit=200)
    except (NotFoundError, QueryError) as exc:
        raise _not_found(exc) from None
    return _page(request, "alerts.html", alerts=alerts, state=state, states=list(AlertState))
