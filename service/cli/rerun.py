"""``specwatch rerun TARGET SHA --reason TEXT``: test a commit again, with the reason recorded (:mod:`service.reruns`).

The command writes the run to the database of ``SPECWATCH_DATABASE_URL``; it does not talk to the workers' broker
(beside ``specwatch serve`` the queue lives in the server's process): the run is recorded as due, and the workers'
sweeper sends it at its next pass (a minute by default). ``POST /targets/{name}/commits/{sha}/rerun`` and the
dashboard's button send it at once. Exit status: 0 queued, 2 no such target or commit, no reason, or a run of the
commit still queued or running; 1 database unreachable.
"""

from __future__ import annotations

import getpass
from typing import Annotated

import typer

from service.cli.database import reading
from service.ingest import RunOptions
from service.reruns import rerun_commit
from service.settings import get_settings
from specwatch.cli.output import console, print_json


def rerun(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="the target's name")],
    sha: Annotated[str, typer.Argument(help="the commit (a unique prefix of at least 4 characters)")],
    *,
    reason: Annotated[str, typer.Option("--reason", help="why it is tested again (recorded, shown on the timeline)")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Test a commit again (same profile, the commit's own seeds), recording why."""
    options = RunOptions.from_settings(get_settings())
    with reading(ctx) as session:
        done = rerun_commit(session, target, sha, reason=reason, requested_by=f"cli:{getpass.getuser()}", options=options, due_now=True)
    if as_json:
        print_json(done)
        return
    console.print(
        f"queued run {done.run_id} of {done.target} {done.sha[:12]} ({done.reason}); the workers' sweeper sends it within "
        "a minute (specwatch runs show " + str(done.run_id) + ")",
        highlight=False,
        soft_wrap=True,
    )
