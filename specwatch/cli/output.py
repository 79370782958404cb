"""What every command prints: messages on stderr, tables and JSON on stdout, one-line errors."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import datetime
from enum import Enum
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

#: Progress, messages and errors.
console = Console(stderr=True)
#: Tables and JSON. Piped output (scripts, CI logs, files) gets a wide table instead of rich's 80-column default.
out = Console(width=None if sys.stdout.isatty() else 180)


def fail(message: str, code: int) -> NoReturn:
    """One line on stderr, then exit with ``code`` (never a traceback). ``message`` is plain text: brackets in it
    (``specwatch[server]``, a path, a library's error) are shown, not read as markup."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def plain(value: Any) -> Any:
    """``value`` with enums as their values and datetimes in ISO format, for JSON."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """``value`` (a dataclass, or plain data) as JSON on stdout."""
    data = dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
    out.print_json(json.dumps(plain(data)))
