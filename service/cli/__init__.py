"""The server's commands of the ``specwatch`` command line, added to the library's (:mod:`specwatch.cli`, which
owns ``check``) through the entry point ``specwatch.cli`` -> :func:`register`.

One module per group of commands, over shared pieces:

- :mod:`service.cli.targets`: ``targets add|list|remove``;
- :mod:`service.cli.history`: ``history``, ``runs show``, ``compare`` (over :mod:`service.queries`);
- :mod:`service.cli.alerts`: ``alerts [ack|resolve]``;
- :mod:`service.cli.rerun`: ``rerun`` (test a commit again, with a reason);
- :mod:`service.cli.schema`: ``db upgrade`` (the migrations shipped in the package);
- :mod:`service.cli.findings`: ``findings list|add|edit|remove|seed`` (a target's known findings);
- :mod:`service.cli.processes`: ``serve``, ``worker``, ``beat`` (run by :mod:`workers.cli`, imported by name);
- :mod:`service.cli.demo`: ``demo`` (the laptop demo against a running instance, :mod:`service.demo`);
- :class:`specwatch.protocol.ExitStatus` (exit statuses), :mod:`specwatch.cli.output` (consoles, one-line errors, JSON) and
  :mod:`service.cli.database` (the unit of work of the database commands).
"""

from __future__ import annotations

import typer

from service.cli.alerts import alerts_app
from service.cli.demo import demo
from service.cli.findings import findings_app
from service.cli.history import compare_command, history, runs_app
from service.cli.processes import PASSTHROUGH, beat, serve, worker
from service.cli.rerun import rerun
from service.cli.schema import db_app
from service.cli.targets import targets_app
from specwatch.cli import build_app


def register(app: typer.Typer) -> None:
    """Add the server's commands to the ``specwatch`` command line."""
    app.add_typer(targets_app, name="targets")
    app.add_typer(runs_app, name="runs")
    app.add_typer(alerts_app, name="alerts")
    app.add_typer(findings_app, name="findings")
    app.add_typer(db_app, name="db")
    app.command("history")(history)
    app.command("compare")(compare_command)
    app.command("rerun")(rerun)
    app.command()(serve)
    app.command()(demo)
    app.command(context_settings=PASSTHROUGH)(worker)
    app.command(context_settings=PASSTHROUGH)(beat)


#: The whole command line, the library's commands and these (what the console script :func:`specwatch.cli.main` runs).
app = build_app()


def main() -> None:
    app()
