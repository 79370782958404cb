"""``specwatch targets add|list|remove``: manage the watched targets from the command line.

Each command is one unit of work on the database of ``SPECWATCH_DATABASE_URL``. Bad input (an invalid
name, URL, branch, adapter, install mode, policy or interval; a duplicate or missing target) is one line on
stderr and exit status 2; an unreachable database is one line and exit status 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from service.cli.database import unit_of_work
from service.models import CommitPolicy, InstallMode, Target
from service.settings import get_settings
from service.targets import (
    KNOWN_ADAPTERS,
    RepoPolicy,
    TargetError,
    add_target,
    format_duration,
    history_size,
    list_targets,
    make_spec,
    remove_target,
)
from specwatch.cli.output import console, fail, out, print_json
from specwatch.findings import shipped_findings
from specwatch.protocol import ExitStatus

targets_app = typer.Typer(help="Manage the watched target libraries.", no_args_is_help=True)

T = TypeVar("T")

#: ``--adapter``'s help: every adapter the suite knows by name, then the module:function form.
ADAPTER_HELP = (
    "suite adapter: "
    + "; ".join(f"{name} ({what})" for name, what in sorted(KNOWN_ADAPTERS.items()))
    + "; or module:function, a sampler in the target's source tree"
)


def _validated(build: Callable[[], T]) -> T:
    try:
        return build()
    except TargetError as exc:
        fail(str(exc), ExitStatus.USAGE)


@targets_app.command("add")
def add(
    ctx: typer.Context,
    *,
    name: Annotated[str, typer.Argument(help="a short unique name, e.g. transformers")],
    repo: Annotated[str, typer.Option("--repo", help="clone URL of the library's repository")],
    adapter: Annotated[str, typer.Option(help=ADAPTER_HELP)],
    install: Annotated[InstallMode, typer.Option("--install", help="source: the commit's tree; pip: released versions")],
    branch: Annotated[
        list[str] | None, typer.Option("--branch", help="a branch to watch; repeat for several (default: main)", show_default=False)
    ] = None,
    poll: Annotated[str | None, typer.Option(help="poll the branches every DURATION (e.g. 5m); default: webhooks only")] = None,
    policy: Annotated[CommitPolicy, typer.Option(help="head: a run per push/poll head; every: a run per new commit")] = CommitPolicy.head,
) -> None:
    """Watch a new target library."""
    spec = _validated(
        lambda: make_spec(
            name=name,
            repo_url=repo,
            branches=branch or ["main"],
            adapter=adapter,
            install_mode=install,
            poll=poll,
            commit_policy=policy,
            repo_policy=RepoPolicy.from_settings(get_settings()),
        )
    )
    with unit_of_work(ctx) as session:
        add_target(session, spec)
    polled = f", polled every {format_duration(spec.poll_interval_s)}" if spec.poll_interval_s else ", webhooks only"
    branches = ", ".join(spec.branches)
    seeded = len(shipped_findings(spec.adapter))
    findings = f"; {seeded} known finding(s) seeded (specwatch findings list {spec.name})" if seeded else ""
    console.print(f"added target [bold]{spec.name}[/] ({spec.repo_url}, {branches}{polled}){findings}", highlight=False, soft_wrap=True)


def _as_dict(target: Target) -> dict[str, Any]:
    return {
        "name": target.name,
        "repo_url": target.repo_url,
        "branches": list(target.branches),
        "adapter": target.adapter,
        "install_mode": target.install_mode.value,
        "poll_interval_s": target.poll_interval_s,
        "commit_policy": target.commit_policy.value,
    }


def _as_cells(target: Target) -> tuple[str, ...]:
    return (
        target.name,
        target.repo_url,
        ", ".join(target.branches),
        target.adapter,
        target.install_mode.value,
        format_duration(target.poll_interval_s),
        target.commit_policy.value,
    )


@targets_app.command("list")
def list_(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """List the watched targets."""
    with unit_of_work(ctx) as session:
        targets = list_targets(session)
        rows, cells = [_as_dict(t) for t in targets], [_as_cells(t) for t in targets]
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no targets (add one with: specwatch targets add NAME --repo URL --branch main ...)", soft_wrap=True)
        return
    table = Table("name", "repository", "branches", "adapter", "install", "poll", "policy")
    for row in cells:
        table.add_row(*row)
    out.print(table)


@targets_app.command("remove")
def remove(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the target's name")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
) -> None:
    """Stop watching a target and delete its history (commits, runs, results, alerts); asks first unless --yes."""
    if not yes:
        with unit_of_work(ctx) as session:
            size = history_size(session, name)
        question = f"remove target {name!r} and delete its history ({size.commits} commit(s), {size.runs} run(s))?"
        if not typer.confirm(question, default=False, err=True):
            fail(f"target {name!r} kept (nothing deleted)", ExitStatus.USAGE)
    with unit_of_work(ctx) as session:
        removed = remove_target(session, name)
    history = f"{removed.commits} commit(s), {removed.runs} run(s)"
    console.print(f"removed target [bold]{removed.name}[/] ({history})", highlight=False, soft_wrap=True)
