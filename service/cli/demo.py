"""``specwatch demo``: the laptop demo against a running instance (:mod:`service.demo`).

    specwatch serve &        # SPECWATCH_WEBHOOK_SECRET and SPECWATCH_API_TOKEN_HASHES set
    specwatch demo --token "$TOKEN"

Exit status: 0 when both runs ended with a verdict (the correct commit passed, the buggy one failed); 1 when a run
ended without one, the instance refused the target or the push, or the wait timed out.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from service.demo import DemoOptions, run_demo
from specwatch.protocol import ExitStatus


def demo(
    *,
    url: Annotated[str, typer.Option("--url", envvar="SPECWATCH_DEMO_URL", help="the running instance")] = "http://127.0.0.1:8000",
    secret: Annotated[
        str, typer.Option("--secret", envvar="SPECWATCH_WEBHOOK_SECRET", help="the instance's webhook secret", show_default=False)
    ] = "",
    token: Annotated[
        str, typer.Option("--token", envvar="SPECWATCH_API_TOKEN", help="an API write token (registers the target)", show_default=False)
    ] = "",
    name: Annotated[str, typer.Option("--name", help="the demo target's name")] = "toy-demo",
    workdir: Annotated[
        Path | None, typer.Option("--workdir", help="where to create the repository (default: a new temporary folder)")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait for the runs")] = 600.0,
) -> None:
    """Watch a toy library on a running instance: a correct commit passes, a swapped residual fails."""
    if not secret or not token:
        typer.echo("specwatch demo needs the instance's webhook secret and a write token (--secret, --token)", err=True)
        raise typer.Exit(ExitStatus.USAGE)
    folder = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="specwatch-demo-"))
    options = DemoOptions(url=url, secret=secret, token=token, name=name, workdir=folder, timeout_s=timeout)
    ok = run_demo(options, say=typer.echo, complain=lambda line: typer.echo(line, err=True))
    raise typer.Exit(ExitStatus.OK if ok else ExitStatus.VIOLATION)


__all__ = ["demo"]
