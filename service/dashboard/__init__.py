"""The dashboard: server-rendered pages (Jinja2 templates shipped in this package, charts as inline SVG).

Pages: targets overview (``/ui``), a branch's timeline (commits × verdict, the first failing commit of each
failure streak marked, commits whose failures are all known findings in their own colour), a target's known
findings (each failure that one explains links to its entry there), a case over commits (log e-value relative
to the rejection threshold, clipped, TV estimate with its interval, acceptance observed vs expected), a run, the
alerts and one alert. They read through
:mod:`service.queries`, like the API and the CLI, and follow the API's read auth (a signed-in session counts).
Signing in with an API token and the forms that acknowledge and resolve alerts are in
:mod:`service.dashboard.actions`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from service.dashboard.charts import Axis, Chart, Rule, Series, percent, render
from service.dashboard.session import DashboardRead, viewer
from service.deps import DbId, SessionDep, app_settings
from service.models import AlertState
from service.notifications.text import drift_text
from service.queries import (
    CaseHistory,
    HistoryPoint,
    NotFoundError,
    QueryError,
    case_history,
    case_ids,
    commits_page,
    get_alert,
    list_alerts,
    list_findings,
    run_detail,
    targets_overview,
)
from service.queries.alerts import UNRESOLVED
from service.queries.common import get_target
from service.queries.health import targets_health
from service.releases import release_version
from service.targets import list_targets

TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")
TEMPLATES.env.filters["log"] = math.log


def short_sha(sha: str) -> str:
    """A commit as the pages show it: a git sha's first 12 digits, a release's whole id (``release:5.25.0``)."""
    return sha if release_version(sha) is not None else sha[:12]


TEMPLATES.env.filters["short"] = short_sha
TEMPLATES.env.filters["drift_text"] = drift_text

DASHBOARD_PATH = "/ui"

router = APIRouter(prefix=DASHBOARD_PATH, tags=["dashboard"], dependencies=[DashboardRead], include_in_schema=False)


def render_page(request: Request, template: str, status_code: int = status.HTTP_200_OK, **context: object) -> HTMLResponse:
    """A page; every template gets ``viewer`` (signed in? may write? the CSRF token for forms)."""
    context["viewer"] = viewer(request, app_settings(request))
    context["path"] = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return TEMPLATES.TemplateResponse(request, template, context, status_code=status_code)


def _not_found(exc: Exception) -> HTTPException:
    code = status.HTTP_404_NOT_FOUND if isinstance(exc, NotFoundError) else status.HTTP_400_BAD_REQUEST
    return HTTPException(code, str(exc))


@router.get("", response_class=HTMLResponse)
def overview(request: Request, session: SessionDep) -> HTMLResponse:
    return render_page(request, "overview.html", targets=targets_overview(session))


@router.get("/", include_in_schema=False)
def overview_slash() -> RedirectResponse:
    return RedirectResponse("/ui")


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
    health = targets_health(session, [get_target(session, name).id])
    open_alerts = [a for a in alerts if a.state is not AlertState.resolved]
    return render_page(request, "timeline.html", page=page, cases=cases, alerts=open_alerts, health=next(iter(health.values())))


@router.get("/targets/{name}/findings", response_class=HTMLResponse)
def findings_page(request: Request, name: str, session: SessionDep) -> HTMLResponse:
    try:
        findings = list_findings(session, name)
    except NotFoundError as exc:
        raise _not_found(exc) from None
    return render_page(request, "findings.html", target=name, findings=findings)


#: The e-value chart plots log E / log threshold (1 = the threshold) and clips at these: a rejection far
#: past the threshold cannot squash the passing commits and the threshold line.
EVIDENCE_CLIP = (-1.0, 3.0)


def _relative_log_e(point: HistoryPoint) -> float | None:
    """log E / log threshold; +inf for a certain violation (no e-value: an impossible observation)."""
    if point.threshold is None or point.threshold <= 1:
        return None
    if point.log_e_value is None:
        return math.inf if point.verdict.value == "fail" else None
    return point.log_e_value / math.log(point.threshold)


def _evidence_tip(point: HistoryPoint) -> str:
    if point.threshold is None:
        return f"{point.sha[:8]}: no e-value"
    if point.log_e_value is None:
        return f"{point.sha[:8]}: certain violation (an observation the exact law rules out)"
    return f"{point.sha[:8]}: log E = {point.log_e_value:.4g}, log threshold = {math.log(point.threshold):.4g}"


_DRAFTS = re.compile(r"/g(\d+)(?:/|$)")


def drafts_of(case_id: str) -> int | None:
    """The drafts per trial (γ) of a case whose id says it (``direct/far_apart/V8/g3`` → 3), else None."""
    found = _DRAFTS.search(case_id)
    return int(found[1]) if found and int(found[1]) > 0 else None


def _scaled(value: float | None, scale: float) -> float | None:
    return None if value is None else value / scale


def case_charts(history: CaseHistory) -> list[Markup]:
    """The case page's three charts over commits."""
    points = history.points
    labels = [p.sha[:8] for p in points]
    fails = [i for i, p in enumerate(points) if p.verdict.value == "fail"]
    evidence = Chart(
        title="evidence against losslessness: log e-value relative to the rejection threshold",
        labels=labels,
        series=[
            Series("log E / log threshold", [_relative_log_e(p) for p in points], "#1f5fbf", tooltips=[_evidence_tip(p) for p in points])
        ],
        axis=Axis("log E ÷ log threshold", include=(0.0, 1.25), clip=EVIDENCE_CLIP, tick_format=lambda v: f"{v:g}"),
        marks=fails,
        rules=[Rule(1.0, "rejection threshold")],
    )
    tv = Chart(
        title="TV distance estimate with its interval (descriptive: computed at a data-dependent stop)",
        labels=labels,
        series=[Series("TV estimate", [p.tv_estimate for p in points], "#1f5fbf")],
        axis=Axis("TV distance (0 = exact)", include=(0.0,)),
        band=([p.tv_low for p in points], [p.tv_high for p in points]),
        marks=fails,
    )
    gamma = drafts_of(history.case_id)
    scale = float(gamma) if gamma is not None else 1.0  # accepted drafts per trial (0 to γ) as a share of γ
    if gamma is not None:
        title, axis = (
            "acceptance rate: observed vs expected (accepted drafts per trial ÷ γ)",
            Axis(f"drafts accepted (% of γ = {gamma})", include=(0.0, 1.0), tick_format=percent),
        )
    else:  # no fixed number of drafts per trial (end-to-end cases): the mean itself
        title, axis = "accepted drafts per trial: observed vs expected", Axis("accepted drafts per trial", include=(0.0,))
    acceptance = Chart(
        title=title,
        labels=labels,
        series=[
            Series("observed", [_scaled(p.acceptance_observed, scale) for p in points], "#1f5fbf"),
            Series("expected", [_scaled(p.acceptance_expected, scale) for p in points], "#888", dashed=True),
        ],
        axis=axis,
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
    return render_page(request, "case.html", history=history, charts=case_charts(history))


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: DbId, session: SessionDep) -> HTMLResponse:
    try:
        run = run_detail(session, run_id)
    except NotFoundError as exc:
        raise _not_found(exc) from None
    return render_page(request, "run.html", run=run)


#: The alerts page's state filters: the unresolved alerts (the default), all, or one state.
ALERT_SHOWS = ("unresolved", "all", *(s.value for s in AlertState))


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(request: Request, session: SessionDep, *, state: str = "unresolved", target: str | None = None) -> HTMLResponse:
    """The alerts, newest first: by default those not resolved (open or acknowledged), of every target or one."""
    if state not in ALERT_SHOWS:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"state must be one of {', '.join(ALERT_SHOWS)}")
    target = target or None
    one = AlertState(state) if state in AlertState.__members__ else None
    try:
        alerts = list_alerts(session, target=target, state=one, states=UNRESOLVED if state == "unresolved" else None, limit=200)
    except (NotFoundError, QueryError) as exc:
        raise _not_found(exc) from None
    names = [t.name for t in list_targets(session)]
    return render_page(request, "alerts.html", alerts=alerts, state=state, shows=ALERT_SHOWS, target=target, targets=names)


@router.get("/alerts/{alert_id}", response_class=HTMLResponse)
def alert_page(request: Request, alert_id: DbId, session: SessionDep) -> HTMLResponse:
    try:
        alert = get_alert(session, alert_id)
    except NotFoundError as exc:
        raise _not_found(exc) from None
    return render_page(request, "alert.html", alert=alert)
