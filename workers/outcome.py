"""What a run keeps of an attempt: the run's status from the suite's exit status and result file
(:func:`interpret`), and of an exception its worker raised, the type, message and where (:func:`exception_record`)."""

from __future__ import annotations

import json
import signal
import traceback
from pathlib import Path
from typing import Any

from service.models import RunStatus
from specwatch.protocol import ExitStatus, ResultSchemaError, RunResult
from workers.runs import RunOutcome
from workers.sandbox import SPECWATCH_ROOT, SuiteCommand, SuiteOutcome


def exception_record(attempt: int, exc: BaseException) -> dict[str, Any]:
    """What a run keeps of an exception its worker raised: the attempt, the type, the message (cut), and where:
    the innermost frame of specwatch's own code, then the innermost of all when that is elsewhere (the standard
    library, a dependency: its file name only), each with its line and function."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [frame for frame in frames if _own_path(frame) is not None]
    where = " via ".join(dict.fromkeys(_frame_text(frame) for frame in (ours[-1:] + frames[-1:]))) or "unknown"
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return {"attempt": attempt, "type": name, "message": str(exc)[:_EXCEPTION_MESSAGE_CHARS], "where": where}


_EXCEPTION_MESSAGE_CHARS = 1000


def _own_path(frame: traceback.FrameSummary) -> str | None:
    """The frame's path inside specwatch's own packages (``workers/execution.py``), or None."""
    path = Path(frame.filename)
    if not path.is_relative_to(SPECWATCH_ROOT):
        return None
    relative = path.relative_to(SPECWATCH_ROOT)
    return relative.as_posix() if relative.parts[0] in _OWN_PACKAGES else None


_OWN_PACKAGES = frozenset({"specwatch", "service", "workers"})


def _frame_text(frame: traceback.FrameSummary) -> str:
    """``path:line in function``: the path inside specwatch's own packages, else the file name only."""
    return f"{_own_path(frame) or Path(frame.filename).name}:{frame.lineno} in {frame.name}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output on stderr)"


def _header(result: RunResult | None, command: SuiteCommand) -> dict[str, Any] | None:
    """What the run keeps of the suite's result besides its cases (``runs.result_header``), as JSON values."""
    if result is None:
        return None
    header = {key: value for key, value in result.to_dict().items() if key != "results"}
    return {"run": json.loads(json.dumps(header)), "suite_args": list(command.suite_args)}


def interpret(outcome: SuiteOutcome, command: SuiteCommand, *, library_version: str | None, profile: str) -> RunOutcome:
    """The run's status from the suite's exit status AND its result file; an inconsistent pair is an error.

    The result file is read as :class:`~specwatch.protocol.RunResult` (:meth:`~specwatch.protocol.RunResult.from_json`
    checks its ``schema``); one this worker cannot read makes the run an error that says why. The run's library
    version is ``library_version`` (a release's own) or else the one the suite recorded from the library it tested.
    """
    unreadable = None
    try:
        result = None if outcome.result is None else RunResult.from_json(outcome.result)
    except ResultSchemaError as exc:
        result, unreadable = None, str(exc)
    verdict = result.verdict.value if result is not None else None
    library = result.library if result is not None else None
    common: dict[str, Any] = {
        "log_tail": outcome.stderr_tail or None,
        "device": (result.device if result is not None else None) or command.device,
        "library_version": library_version or (library.version or None if library is not None else None),
        "library_distribution": library.distribution if library is not None else None,
        "torch_version": result.environment.get("torch") if result is not None else None,
        "python_version": result.environment.get("python") if result is not None else None,
        "seed": command.seed,
        "cases": result.results if result is not None else (),
        "result_header": _header(result, command),
    }
    if outcome.timed_out or outcome.limit is not None:
        error = (
            f"the suite reached {outcome.limit} and was killed"
            if outcome.limit is not None
            else f"the suite exceeded its wall-clock limit of {command.timeout_s:g} s (profile {profile}) and was killed"
        )
        return RunOutcome(RunStatus.error, error=error, **common)
    if unreadable is not None:
        error = f"the suite's result file cannot be read by this worker: {unreadable}"
        return RunOutcome(RunStatus.error, error=error, infrastructure_error=True, **common)
    code = outcome.exit_code
    if code == 0 and verdict == "pass":
        return RunOutcome(RunStatus.passed, **common)
    if code == 1 and verdict == "fail":
        return RunOutcome(RunStatus.failed, **common)
    if code == ExitStatus.INSTALL:
        return RunOutcome(RunStatus.uninstallable, error=_last_line(outcome.stderr_tail).removeprefix("error: "), **common)
    if code == ExitStatus.USAGE:
        error = f"the suite could not test this commit (exit 2, a broken commit or target): {_last_line(outcome.stderr_tail)}"
    elif code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        error = f"the suite was killed by {name} (memory limit, or a crash in native code): {_last_line(outcome.stderr_tail)}"
    else:
        error = f"the suite crashed (exit {code}, verdict {verdict!r}): {_last_line(outcome.stderr_tail)}"
    return RunOutcome(RunStatus.error, error=error, **common)
