"""The ``specwatch`` command line (console script ``specwatch = service.cli:main``).

One module per group of commands, over shared pieces:

- :mod:`service.cli.check`: ``check``, the suite in a subprocess with progress and a results table;
- :mod:`service.cli.targets`: ``targets add|list|remove``;
- :mod:`service.cli.history`: ``history``, ``runs show``, ``compare`` (over :mod:`service.queries`);
- :mod:`service.cli.alerts`: ``alerts [ack|resolve]``;
- :mod:`service.cli.findings`: ``findings list|add|edit|remove|seed`` (a target's known findings);
- :mod:`service.cli.processes`: ``serve``, ``worker``, ``beat`` (run by :mod:`workers.cli`, imported by name);
- :mod:`service.cli.exits` (exit statuses), :mod:`service.cli.output` (consoles, one-line errors, JSON) and
  :mod:`service.cli.database` (the unit of work of the database commands).
"""

from __future__ import annotations

import typer

from service.cli.alerts import alerts_app
from service.cli.check import check
from service.cli.findings import findings_app
from service.cli.history import compare_command, history, runs_app
from service.cli.processes import PASSTHROUGH, beat, serve, worker
from service.cli.targets import targets_app

app = typer.Typer(help="specwatch: continuous monitoring of speculative-decoding losslessness.", no_args_is_help=True)


@app.callback()
def _root() -> None:
    """specwatch command line."""


app.add_typer(targets_app, name="targets")
app.add_typer(runs_app, name="runs")
app.add_typer(alerts_app, name="alerts")
app.add_typer(findings_app, name="findings")
app.command("history")(history)
app.command("compare")(compare_command)
app.command()(check)
app.command()(serve)
app.command(context_settings=PASSTHROUGH)(worker)
app.command(context_settings=PASSTHROUGH)(beat)


def main() -> None:
    app()
