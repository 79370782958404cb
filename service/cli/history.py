"""``specwatch history``, ``runs show`` and ``compare``: the history from the command line.

They read the database of ``SPECWATCH_DATABASE_URL`` directly through :mod:`service.queries` (the same
answers as the API). Tables for people, ``--json`` for scripts. Exit status: 0 found, 2 bad input or nothing
found (no such target, run, case or commit; a bad sha), 1 database unreachable.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from enum import Enum
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from service.cli.database import reading
from service.queries import case_history, case_ids, commits_page, compare, run_detail
from specwatch.cli.output import console, fail, out, print_json
from specwatch.protocol import ExitStatus

runs_app = typer.Typer(help="Inspect suite runs.", no_args_is_help=True)

#: The TV column's header; escaped, as rich reads "[interval]" as markup and would drop it.
TV_HEADER = escape("TV [interval], descriptive")


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
    branch: Annotated[str | None, typer.Option(help="default: the first watched branch; (releases) for a pip target")] = None,
    case: Annotated[str | None, typer.Option("--case", help="a case id glob: one line per commit and matching case")] = None,
    limit: Annotated[int, typer.Option(help="the newest commits to show", min=1, max=500)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """A branch's commits with their latest run (or, with --case, each matching case over commits)."""
    with reading(ctx) as session:
        page = commits_page(session, target, branch=branch, limit=limit)
        if case is None:
            if as_json:
                print_json(page)
                return
            table = Table("#", "commit", "run", "status", "failed cases", "message", title=f"{page.target} · {page.branch}")
            for c in page.commits:
                status = _verdict(c.status) + (" [bold red]← first failing[/]" if c.first_failing and not c.known_only else "")
                message = escape((c.message or "").splitlines()[0]) if c.message else ""
                if c.error and c.status is not None and c.status.value in ("error", "uninstallable", "queued"):
                    # Why the run could not test the commit (specwatch runs show ID for its log).
                    message += f"\n[red]{escape(c.error.splitlines()[0][:200] if c.error.splitlines() else c.error)}[/]"
                if c.rerun_reason:
                    message += f"\n[italic]re-run by {escape(c.rerun_by or '-')}: {escape(c.rerun_reason[:200])}[/]"
                failed = str(c.failed_cases or "")
                if c.known_failed_cases:
                    failed += f" [yellow]({'all' if c.known_only else c.known_failed_cases} known)[/]"
                table.add_row(str(c.branch_order), c.sha[:12], str(c.run_id or "-"), status, failed, message)
            out.print(table)
            return
        matching = [case_id for case_id in case_ids(session, target, branch=page.branch) if fnmatch.fnmatchcase(case_id, case)]
        if not matching:
            fail(f"no case of {target!r} matches {case!r}", ExitStatus.USAGE)
        histories = [case_history(session, target, case_id, branch=page.branch, limit=limit) for case_id in matching]
    if as_json:
        print_json([dataclasses.asdict(h) for h in histories])
        return
    table = Table(
        "case",
        "#",
        "commit",
        "verdict",
        "log E / log thr",
        TV_HEADER,
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
    with reading(ctx) as session:
        run = run_detail(session, run_id)
    if as_json:
        print_json(run)
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
        TV_HEADER,
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
    with reading(ctx) as session:
        comparison = compare(session, target, sha_a, sha_b)
    if as_json:
        print_json(comparison)
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
