"""The ``specwatch`` command line (console script ``specwatch = specwatch.cli:main``).

The library's own command is ``check`` (:mod:`specwatch.cli.check`: the suite in a subprocess, with progress, a
results table and the known findings). The server's commands (``serve``, ``worker``, ``beat``, ``targets``,
``history``, ``runs``, ``compare``, ``alerts``, ``findings``, ``db``) join the same command line through the entry point
group ``specwatch.cli``, which the server (:func:`service.cli.register`) fills; the library imports nothing of
it. Without the ``server`` extra those commands say, in one line, what to install.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

import typer
from rich.markup import escape

from specwatch.cli.check import check
from specwatch.cli.output import fail
from specwatch.protocol import ExitStatus

#: The entry point group through which other packages add commands: each entry is ``register(app)``.
COMMANDS_GROUP = "specwatch.cli"
#: The server's commands, named when the server cannot be loaded.
SERVER_COMMANDS = ("serve", "worker", "beat", "db", "targets", "history", "runs", "compare", "alerts", "findings")


def _server_missing(name: str, why: str) -> Callable[[], None]:
    def command() -> None:
        fail(f"`specwatch {name}` is part of the server, not installed here ({why}): pip install 'specwatch[server]'", ExitStatus.USAGE)

    # Escaped: typer renders help as rich markup, which reads "[server]" as a tag and drops it.
    command.__doc__ = escape(f"(server) not installed: pip install 'specwatch[server]' ({why})")
    return command


def build_app() -> typer.Typer:
    """The command line: ``check``, and every command registered under :data:`COMMANDS_GROUP`."""
    app = typer.Typer(help="specwatch: continuous monitoring of speculative-decoding losslessness.", no_args_is_help=True)

    @app.callback()
    def _root() -> None:
        """specwatch command line."""

    app.command()(check)
    for entry in entry_points(group=COMMANDS_GROUP):
        try:
            register = entry.load()
        except ImportError as exc:  # the server's dependencies are not installed (no `server` extra)
            for name in SERVER_COMMANDS:
                app.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})(
                    _server_missing(name, f"no module named {exc.name!r}" if exc.name else str(exc))
                )
            continue
        register(app)
    return app


def main() -> None:
    build_app()()
