"""The suite process of ``specwatch check``, streamed: its events read as they come (protocol objects, schema checked),
progress bars on a terminal, one line per finished case and a heartbeat elsewhere, its standard error drained."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import IO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from specwatch.cli.heartbeat import HEARTBEAT_S, Heartbeat
from specwatch.cli.isolated import Plan, unsandboxed
from specwatch.cli.output import console
from specwatch.cli.table import _fmt_verdict
from specwatch.protocol import CaseResult, RunResult


@dataclass
class Streamed:
    """What the suite process gave back: its exit status, the cases as they finished, the run result, the error
    it reported, its standard error, and the cases ``--quick`` left out of those ``--cases`` named."""

    code: int = 0
    results: list[CaseResult] = dataclass_field(default_factory=list)
    run: RunResult | None = None
    error: str | None = None
    stderr: str = ""
    left_out: list[str] = dataclass_field(default_factory=list)


def _drain(stream: IO[str], into: list[str]) -> None:
    """Read ``stream`` to its end (a thread of its own: a suite that writes a lot to stderr never blocks on a full
    pipe while stdout is being read)."""
    into.extend(stream)


def stream_suite(command: list[str], plan: Plan | None = None) -> Streamed:
    """Run the suite as ``plan`` says (default: as the caller), render progress, read its events (protocol objects,
    schema checked). Outside a terminal no bars are drawn (they would render once, at the end, after the per-case
    lines): each case prints a line as it ends, and a heartbeat line every :data:`HEARTBEAT_S` of silence."""
    plan = plan or unsandboxed(command, "--no-sandbox")
    got = Streamed()
    tasks: dict[str, TaskID] = {}
    errors: list[str] = []
    total = 0
    terminal = console.is_terminal
    heartbeat = Heartbeat(HEARTBEAT_S)
    with (
        heartbeat if not terminal else contextlib.nullcontext(),
        subprocess.Popen(  # noqa: S603 -- our interpreter (in bubblewrap), no shell
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=plan.env, cwd=plan.cwd, **plan.popen_options()
        ) as proc,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=not terminal,
        ) as bars,
    ):
        assert proc.stdout is not None
        assert proc.stderr is not None
        reader = threading.Thread(target=_drain, args=(proc.stderr, errors), daemon=True)
        reader.start()
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = event.get("event") if isinstance(event, dict) else None
            if kind == "start":
                got.left_out = list(event.get("left_out") or [])
                total = len(event.get("cases") or [])
                heartbeat.printed(f"{total} case(s) started, waiting for the first batch")
            elif kind == "progress":
                case_id = event["case_id"]
                if case_id not in tasks:
                    tasks[case_id] = bars.add_task(case_id, total=event["cap"], status="")
                log_e = event["log_e"]
                evidence = "certain" if log_e is None else f"log E {log_e:.1f}/{event['log_threshold']:.1f}"
                bars.update(tasks[case_id], completed=event["trials"], total=event["cap"], status=evidence)
                heartbeat.doing(f"{case_id}: {event['trials']:,} of {event['cap']:,} trials, {evidence}")
            elif kind == "case":
                result = CaseResult.from_json(event["result"])
                got.results.append(result)
                task = tasks.get(result.case_id)
                if task is None:
                    task = tasks[result.case_id] = bars.add_task(result.case_id, total=1, status="")
                trials = max(result.n_trials, 1)
                bars.update(task, total=trials, completed=trials, status=_fmt_verdict(result))
                if not terminal:  # a log or CI: no bars, one line per case
                    console.print(case_line(result, len(got.results), total), highlight=False, soft_wrap=True)
                    heartbeat.printed(f"{len(got.results)} of {total or '?'} case(s) done, waiting for the next one's first batch")
            elif kind == "error":
                got.error = event["message"]
            elif kind == "run":
                got.run = RunResult.from_json(event["result"])
        got.code = proc.wait()
        reader.join()
    got.stderr = "".join(errors)
    return got


def case_line(result: CaseResult, done: int, total: int) -> str:
    """One finished case for output that is not a terminal: ``[3/55] id: verdict, trials of cap, seconds``."""
    early = ", passed early" if result.early_pass else ""
    trials = f"{result.n_trials:,} of {result.trial_cap:,} trials" if result.trial_cap else f"{result.n_trials:,} trials"
    return f"[{done}/{total or '?'}] {result.case_id}: {_fmt_verdict(result)}, {trials}{early}, {result.duration_s:.1f} s"
