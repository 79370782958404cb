"""``specwatch alerts [ack|resolve]``: list alerts, acknowledge and resolve them from the command line.

The list reads :mod:`service.queries` (the same answers as the API); ``ack`` and ``resolve`` write directly to
the database of ``SPECWATCH_DATABASE_URL`` (no API token: database access is the credential). Exit status: 0
done, 2 no such alert or a resolved alert acknowledged, 1 database unreachable.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from service.alerts import AlertStateError, set_alert_state
from service.cli.database import reading
from service.models import AlertKind, AlertState
from service.models.entries import AlertEntry
from service.notifications.text import drift_text
from service.queries import AlertRow, list_alerts
from specwatch.cli.output import console, fail, out, print_json
from specwatch.protocol import ExitStatus

alerts_app = typer.Typer(help="List, acknowledge and resolve alerts.", invoke_without_command=True)


def _case_text(entry: AlertEntry) -> str:
    """A case of an alert: its id, and for a drift the figures and the per-trial range the test used."""
    drift = drift_text(entry)
    return escape(entry["case_id"] if drift is None else f"{entry['case_id']} (drift: {drift})")


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
            "\n".join(_case_text(c) for c in a.cases),
            a.created_at.isoformat(timespec="minutes") if a.created_at else "-",
        )
    return table


@alerts_app.callback()
def alerts_list(
    ctx: typer.Context,
    *,
    state: Annotated[AlertState | None, typer.Option(help="open, acknowledged or resolved")] = None,
    target: Annotated[str | None, typer.Option(help="the target's name")] = None,
    kind: Annotated[AlertKind | None, typer.Option(help="violation, performance, exception, broken or uninstallable")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Alerts, newest first (``specwatch alerts --state open``); ``ack`` and ``resolve`` change one."""
    if ctx.invoked_subcommand is not None:
        return
    with reading(ctx) as session:
        alerts = list_alerts(session, target=target, state=state, kind=kind, limit=limit)
    if as_json:
        print_json([dataclasses.asdict(a) for a in alerts])
        return
    if not alerts:
        console.print("no alerts", highlight=False)
        return
    out.print(_alert_table(alerts))


def _set_state(ctx: typer.Context, alert_id: int, state: AlertState, as_json: bool) -> None:
    with reading(ctx) as session:
        try:
            alert = set_alert_state(session, alert_id, state, now=datetime.now(UTC))
        except AlertStateError as exc:
            fail(str(exc), ExitStatus.USAGE)
    if as_json:
        print_json(alert)
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
