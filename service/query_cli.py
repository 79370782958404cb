"""``specwatch history``, ``runs show``, ``compare`` and ``alerts [ack|resolve]``: the history from the command line.

They read the database of ``SPECWATCH_DATABASE_URL`` directly through :mod:`service.queries` (the same
answers as the API). Tables for people, ``--json`` for scripts. Exit status: 0 found, 2 bad input or nothing
found (no such target, run, case, commit or alert; a bad sha; a resolved alert acknowledged), 1 database
unreachable. ``alerts ack``/``resolve`` write directly to the database (no API token: database access is
the credential).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any

import typer
from rich.table import Table
from sqlalchemy.orm import Session

from service.models import AlertKind, AlertState
from service.queries import (
    AlertRow,
    AlertStateError,
    NotFoundError,
    QueryError,
    case_history,
    case_ids,
    commits_page,
    compare,
    list_alerts,
    run_detail,
    set_alert_state,
)
from service.targets_cli import EXIT_USAGE, _fail, _unit_of_work, console, out

runs_app = typer.Typer(help="Inspect suite runs.", no_args_is_help=True)


@contextmanager
def _reading(ctx: typer.Context) -> Iterator[Session]:
    with _unit_of_work(ctx) as session:
        try:
            yield session
        except (NotFoundError, QueryError) as exc:
            _fail(str(exc), EXIT_USAGE)


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _json(value: Any) -> None:
    data = dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
    out.print_json(json.dumps(_plain(data)))


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _verdict(value: Enum | None) -> str:
    if value is None:
        return "-"
    colour = {"fail": "bold red", "failed": "bold red", "pass": "green", "passed": "green"}.get(str(value.value), "magenta")
    return f"[{colour}]{value.value}[/]"


def _threshold(value: float | None) -> str:
    return "-" if value is None or value <= 0 else f"{math.log(value):.2f}"


def history(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="the target's name")],
    *,
    branch: Annotated[str | None, typer.Option(help="default: the target's first watched branch")] = None,
    case: Annotated[str | None, typer.Option("--case", help="a case id glob: one line per commit and matching case")] = None,
    limit: Annotated[int, typer.Option(help="the newest commits to show", min=1, max=500)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """A branch's commits with their latest run (or, with --case, each matching case over commits)."""
    with _reading(ctx) as session:
        page = commits_page(session, target, branch=branch, limit=limit)
        if case is None:
            if as_json:
                _json(page)
                return
            table = Table("#", "commit", "run", "status", "failed cases", "message", title=f"{page.target} · {page.branch}")
            for c in page.commits:
                status = _verdict(c.status) + (" [bold red]← first failing[/]" if c.first_failing else "")
                message = (c.message or "").splitlines()[0] if c.message else ""
                table.add_row(str(c.branch_order), c.sha[:12], str(c.run_id or "-"), status, str(c.failed_cases or ""), message)
            out.print(table)
            return
        matching = [case_id for case_id in case_ids(session, target, branch=page.branch) if fnmatch.fnmatchcase(case_id, case)]
        if not matching:
            _fail(f"no case of {target!r} matches {case!r}", EXIT_USAGE)
        histories = [case_history(session, target, case_id, branch=page.branch, limit=limit) for case_id in matching]
    if as_json:
        _json([dataclasses.asdict(h) for h in histories])
        return
    table = Table(
        "case",
        "#",
        "commit",
        "verdict",
        "log E / log thr",
        "TV [interval], descriptive",
        "acceptance obs / exp",
        title=f"{target} · {page.branch}",
    )
    for h in histories:
        for p in reversed(h.points):
            tv = _num(p.tv_estimate, ".4f") + (f" [{_num(p.tv_low, '.4f')}, {_num(p.tv_high, '.4f')}]" if p.tv_low is not None else "")
            table.add_row(
                h.case_id,
                str(p.branch_order),
                p.sha[:12],
                _verdict(p.verdict),
                f"{_num(p.log_e_value, '.2f')} / {_threshold(p.threshold)}",
                tv,
                f"{_num(p.acceptance_observed)} / {_num(p.acceptance_expected)}",
            )
    out.print(table)


@runs_app.command("show")
def show(
    ctx: typer.Context,
    run_id: Annotated[int, typer.Argument(help="the run's id")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """A run: its commit, status, environment and every case result."""
    with _reading(ctx) as session:
        run = run_detail(session, run_id)
    if as_json:
        _json(run)
        return
    console.print(
        f"run {run.id} of {run.target} @ {run.sha[:12]} ({run.branch or 'release'}): {_verdict(run.status)}, "
        f"profile {run.profile}, device {run.device or '-'}",
        highlight=False,
        soft_wrap=True,
    )
    if run.error:
        console.print(f"error: {run.error}", highlight=False, soft_wrap=True)
    behaviour = f"vs run {run.previous_run_id}" if run.previous_run_id is not None else "behaviour"
    table = Table(
        "case",
        "verdict",
        "trials",
        "log E / log thr",
        "TV [interval], descriptive",
        "acceptance obs / exp",
        behaviour,
        "coverage",
        title=f"run {run.id}",
    )
    for c in run.cases:
        tv = _num(c.tv_estimate, ".4f") + (f" [{_num(c.tv_low, '.4f')}, {_num(c.tv_high, '.4f')}]" if c.tv_low is not None else "")
        table.add_row(
            c.case_id,
            _verdict(c.verdict),
            "-" if c.n_trials is None else f"{c.n_trials:,}",
            f"{_num(c.log_e_value, '.2f')} / {_threshold(c.threshold)}",
            tv,
            f"{_num(c.acceptance_observed)} / {_num(c.acceptance_expected)}",
            "-" if c.same_as_previous is None else ("unchanged" if c.same_as_previous else "changed"),
            c.coverage_summary,
        )
    out.print(table)


def compare_command(
    ctx: typer.Context,
    sha_a: Annotated[str, typer.Argument(help="a commit sha (or a unique prefix)")],
    sha_b: Annotated[str, typer.Argument(help="another commit sha (or a unique prefix)")],
    target: Annotated[str, typer.Option("--target", help="the target's name")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Two commits' latest runs compared case by case."""
    with _reading(ctx) as session:
        comparison = compare(session, target, sha_a, sha_b)
    if as_json:
        _json(comparison)
        return
    table = Table(
        "case",
        f"verdict {comparison.sha_a[:8]}",
        f"verdict {comparison.sha_b[:8]}",
        "log E a → b",
        "Δ acceptance",
        "same output",
        title=f"{comparison.target}: {comparison.sha_a[:12]} (run {comparison.run_a}) vs {comparison.sha_b[:12]} (run {comparison.run_b})",
    )
    for c in comparison.cases:
        same = "-" if c.fingerprint_equal is None else ("yes" if c.fingerprint_equal else "[bold red]no[/]")
        table.add_row(
            ("[bold]" + c.case_id + "[/]") if c.changed else c.case_id,
            _verdict(c.verdict_a),
            _verdict(c.verdict_b),
            f"{_num(c.log_e_value_a, '.2f')} → {_num(c.log_e_value_b, '.2f')}",
            _num(c.acceptance_difference, "+.4f"),
            same,
        )
    out.print(table)
    changed = sum(c.changed for c in comparison.cases)
    console.print(f"{changed} of {len(comparison.cases)} case(s) changed", highlight=False)


alerts_app = typer.Typer(help="List, acknowledge and resolve alerts.", invoke_without_command=True)


def _alert_table(alerts: list[AlertRow]) -> Table:
    table = Table("id", "target", "branch", "kind", "state", "first bad", "last good", "cases", "created", title="alerts")
    for a in alerts:
        colour = {"open": "bold red", "acknowledged": "yellow", "resolved": "green"}[a.state.value]
        table.add_row(
            str(a.id),
            a.target,
            a.branch,
            a.kind.value,
            f"[{colour}]{a.state.value}[/]",
            a.first_bad_sha[:12],
            (a.last_good_sha or "-")[:12],
            ", ".join(str(c.get("case_id")) for c in a.cases),
            a.created_at.isoformat(timespec="minutes") if a.created_at else "-",
        )
    return table


@alerts_app.callback()
def alerts_list(
    ctx: typer.Context,
    *,
    state: Annotated[AlertState | None, typer.Option(help="open, acknowledged or resolved")] = None,
    target: Annotated[str | None, typer.Option(help="the target's name")] = None,
    kind: Annotated[AlertKind | None, typer.Option(help="violation, performance, exception or broken")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Alerts, newest first (``specwatch alerts --state open``); ``ack`` and ``resolve`` change one."""
    if ctx.invoked_subcommand is not None:
        return
    with _reading(ctx) as session:
        alerts = list_alerts(session, target=target, state=state, kind=kind, limit=limit)
    if as_json:
        _json([dataclasses.asdict(a) for a in alerts])
        return
    if not alerts:
        console.print("no alerts", highlight=False)
        return
    out.print(_alert_table(alerts))


def _set_state(ctx: typer.Context, alert_id: int, state: AlertState, as_json: bool) -> None:
    with _reading(ctx) as session:
        try:
            alert = set_alert_state(session, alert_id, state, now=datetime.now(UTC))
        except AlertStateError as exc:
            _fail(str(exc), EXIT_USAGE)
    if as_json:
        _json(alert)
        return
    console.print(f"alert {alert.id} is {alert.state.value}", highlight=False)


@alerts_app.command("ack")
def alerts_ack(
    ctx: typer.Context,
    alert_id: Annotated[int, typer.Argument(help="the alert's id")],
    as_json: Annotated[bool, typer.Option("--json", help="print the alert as JSON")] = False,
) -> None:
    """Acknowledge an open alert (someone is on it)."""
    _set_state(ctx, alert_id, AlertState.acknowledged, as_json)


@alerts_app.command("resolve")
def alerts_resolve(
    ctx: typer.Context,
    alert_id: Annotated[int, typer.Argument(help="the alert's id")],
    as_json: Annotated[bool, typer.Option("--json", help="print the alert as JSON")] = False,
) -> None:
    """Resolve an alert by hand (no message is sent)."""
    _set_state(ctx, alert_id, AlertState.resolved, as_json)
