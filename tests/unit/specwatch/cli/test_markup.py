"""Text with square brackets reaches the terminal as written: rich reads ``[server]`` or ``[interval]`` as markup tags
and drops them (a library install's ``specwatch --help`` said ``pip install 'specwatch'``)."""

from __future__ import annotations

import io

import pytest
import typer
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from service.cli.history import TV_HEADER
from specwatch.cli import _server_missing

pytestmark = pytest.mark.unit


def test_a_library_installs_help_names_the_server_extra() -> None:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """root"""

    app.command("serve")(_server_missing("serve", "no module named 'fastapi'"))
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert shown.exit_code == 0
    assert "pip install 'specwatch[server]'" in shown.output
    refused = CliRunner().invoke(app, ["serve"])
    assert "pip install 'specwatch[server]'" in refused.output


def test_the_history_tables_tv_column_keeps_its_interval() -> None:
    table = Table("case", TV_HEADER)
    table.add_row("direct/x", "0.0100 [0.0010, 0.0300]")
    buffer = io.StringIO()
    Console(file=buffer, width=200).print(table)
    assert "TV [interval], descriptive" in buffer.getvalue()
    assert "0.0100 [0.0010, 0.0300]" in buffer.getvalue()
