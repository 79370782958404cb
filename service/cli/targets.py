"""``specwatch targets add|update|list|remove``: manage the watched targets from the command line.

Each command is one unit of work on the database of ``SPECWATCH_DATABASE_URL``. Bad input (an invalid
name, URL, branch, adapter, install mode, policy or interval; a duplicate or missing target) is one line on
stderr and exit status 2; an unreachable database is one line and exit status 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from service.cli.database import unit_of_work
from service.models import CommitPolicy, InstallMode, Target
from service.queries.health import TargetHealth, targets_health
from service.repositories import RepoPolicy
from service.settings import get_settings
from service.target_errors import TargetError
from service.targets import add_target, format_duration, history_size, known_adapters, list_targets, make_spec, remove_target, update_target
from specwatch.cli.output import console, fail, out, plain, print_json
from specwatch.findings import shipped_findings
from specwatch.protocol import ExitStatus

targets_app = typer.Typer(help="Manage the watched target libraries.", no_args_is_help=True)

T = TypeVar("T")

_CHECKS_HELP = "besides the commit status, post a GitHub check run with the run's report (failing cases, known findings, reproduce)"

#: ``--adapter``'s help: every adapter the suite knows by name, then the module:function form.
ADAPTER_HELP = (
    "suite adapter: "
    + "; ".join(f"{name} ({what})" for name, what in sorted(known_adapters().items()))
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
    github_checks: Annotated[bool, typer.Option("--github-checks", help=_CHECKS_HELP)] = False,
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
            github_checks=github_checks,
        )
    )
    with unit_of_work(ctx) as session:
        add_target(session, spec)
    polled = f", polled every {format_duration(spec.poll_interval_s)}" if spec.poll_interval_s else ", webhooks only"
    branches = ", ".join(spec.branches)
    seeded = len(shipped_findings(spec.adapter))
    findings = f"; {seeded} known finding(s) seeded (specwatch findings list {spec.name})" if seeded else ""
    console.print(f"added target [bold]{spec.name}[/] ({spec.repo_url}, {branches}{polled}){findings}", highlight=False, soft_wrap=True)


@targets_app.command("update")
def update(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the target's name")],
    github_checks: Annotated[bool | None, typer.Option("--github-checks/--no-github-checks", help=_CHECKS_HELP)] = None,
) -> None:
    """Change a target's options (its repository, branches and adapter stay: remove and add it to change those)."""
    if github_checks is None:
        fail("nothing to change: say --github-checks or --no-github-checks", ExitStatus.USAGE)
    with unit_of_work(ctx) as session:
        target = update_target(session, name, github_checks=github_checks)
        checks = "on" if target.github_checks else "off"
    console.print(f"updated target [bold]{name}[/]: GitHub check runs {checks}", highlight=False, soft_wrap=True)


def _as_dict(target: Target, health: TargetHealth, now: datetime) -> dict[str, Any]:
    last = health.last_run
    return {
        "name": target.name,
        "repo_url": target.repo_url,
        "branches": list(target.branches),
        "adapter": target.adapter,
        "install_mode": target.install_mode.value,
        "poll_interval_s": target.poll_interval_s,
        "commit_policy": target.commit_policy.value,
        "github_checks": target.github_checks,
        "configuration_error": health.configuration_error,
        "polls": [plain(dataclasses.asdict(p)) for p in health.polls],
        "queued_runs": health.queued_runs,
        "running_runs": health.running_runs,
        "queue_age_s": health.queue_age_s(now),
        "last_run": None if last is None else plain(dataclasses.asdict(last)),
    }


def _span(seconds: float) -> str:
    """A duration to the nearest unit a reader wants: 45s, 12m, 5h, 3d."""
    for unit, size, up_to in (("s", 1, 120), ("m", 60, 7200), ("h", 3600, 172800)):
        if seconds < up_to:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds // 86400)}d"


def _ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    return f"{_span(max(0.0, (now - moment).total_seconds()))} ago"


def _health_cells(health: TargetHealth, now: datetime) -> tuple[str, str, str]:
    """Last poll (and its error), queue (waiting, running, the oldest's age), last run (and its error)."""
    polled = _ago(health.last_polled_at, now) if health.polls else "-"
    errors = "; ".join(f"{p.ref}: {escape(p.error)}" for p in health.poll_errors if p.error)
    if errors:
        polled += f" [red]error: {errors}[/]"
    if health.configuration_error:
        polled += f" [red]configuration error: {escape(health.configuration_error)}[/]"
    age = health.queue_age_s(now)
    queue = f"{health.queued_runs} queued" + (f" (oldest {_span(age)})" if age is not None else "")
    queue += f", {health.running_runs} running"
    last = health.last_run
    run = "-"
    if last is not None:
        run = f"{last.id} {last.status.value} {_ago(last.finished_at, now)}"
        if last.error:
            run += f" [red]{escape(last.error.splitlines()[0][:120] if last.error.splitlines() else last.error)}[/]"
    return polled, queue, run


def _as_cells(target: Target, health: TargetHealth, now: datetime) -> tuple[str, ...]:
    return (
        escape(target.name),
        escape(target.repo_url),
        escape(", ".join(target.branches)),
        target.adapter,
        target.install_mode.value,
        format_duration(target.poll_interval_s),
        target.commit_policy.value,
        *_health_cells(health, now),
    )


@targets_app.command("list")
def list_(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """List the watched targets with their health: last poll and its error, queue, last run."""
    now = datetime.now(UTC)
    with unit_of_work(ctx) as session:
        targets = list_targets(session)
        health = targets_health(session, [t.id for t in targets])
        rows = [_as_dict(t, health[t.id], now) for t in targets]
        cells = [_as_cells(t, health[t.id], now) for t in targets]
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no targets (add one with: specwatch targets add NAME --repo URL --branch main ...)", soft_wrap=True)
        return
    table = Table("name", "repository", "branches", "adapter", "install", "poll", "policy", "last poll", "queue", "last run")
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
