"""The results table of ``specwatch check`` and the known findings listed under it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rich.table import Table

from specwatch.findings import Finding
from specwatch.protocol import CaseResult, Failure, Verdict
from specwatch.report import coverage_summary


def _fmt_e(result: CaseResult) -> str:
    """The headline check's evidence as ``history`` shows it: log E against the log of the threshold."""
    threshold = math.log(result.threshold)
    return f"certain / {threshold:.1f}" if result.log_e_value is None else f"{result.log_e_value:.1f} / {threshold:.1f}"


def _fmt_known(result: CaseResult, known: Mapping[str, Finding]) -> str:
    """A short marker in the table; the finding's key, title and link are listed under the table, whole."""
    finding = known.get(result.case_id) if result.verdict == Verdict.FAIL else None
    return " [yellow]known[/]" if finding else ""


def _fmt_verdict(result: CaseResult) -> str:
    if result.verdict == Verdict.FAIL:
        if result.failure == Failure.RAISED:
            return "[bold red]FAIL[/] (the target raised)"
        layers = [layer.value for layer in result.failed_layers()]
        return f"[bold red]FAIL[/] ({', '.join(layers)})"
    if result.verdict == Verdict.PASS:
        return "[green]pass[/]" if result.powered else "[yellow]pass (underpowered)[/]"
    return f"[magenta]{result.verdict.value.upper()}[/]"


def _fmt_tv(result: CaseResult) -> str:
    tv, ci = result.tv_estimate, result.tv_ci
    if tv is None:
        return "-"
    return f"{tv:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{tv:.3f}"


def _fmt_acceptance(result: CaseResult) -> str:
    observed, expected = result.acceptance.observed, result.acceptance.expected
    if observed is None:
        return "-"
    return f"{observed:.3f} / {expected:.3f}" if expected is not None else f"{observed:.3f}"


def results_table(results: Sequence[CaseResult], known: Mapping[str, Finding] | None = None, isolation: str | None = None) -> Table:
    """The results, one row per case; the title says how the suite was isolated (``isolation``), when given."""
    known = known or {}
    table = Table(title="specwatch check" + (f" — {isolation}" if isolation else ""), show_lines=False)
    for name, justify in (
        ("case", "left"),
        ("verdict", "left"),
        ("trials", "right"),
        ("log E / log thr", "right"),
        ("TV estimate [99% CI], descriptive", "right"),
        ("acceptance obs / exp", "right"),
        ("coverage", "left"),
        ("time", "right"),
    ):
        table.add_column(name, justify=justify, overflow="fold" if name == "verdict" else "ellipsis")  # type: ignore[arg-type]
    table.caption = (
        "Decisions rest on the e-values (anytime-valid): a case fails when log E reaches log thr. The TV interval is "
        "computed at a data-dependent stop on the headline check: descriptive, not a guarantee."
    )
    for r in results:
        table.add_row(
            r.case_id,
            _fmt_verdict(r) + _fmt_known(r, known),
            f"{r.n_trials:,}",
            _fmt_e(r),
            _fmt_tv(r),
            _fmt_acceptance(r),
            coverage_summary(r.coverage, r.n_trials),
            f"{r.duration_s:.2f}s",
        )
    return table


def known_findings_lines(known: Mapping[str, Finding]) -> list[str]:
    """One line per known finding that explains a failure of this run: key, the cases, title, state, link (under
    the table, never wrapped into it, so a link stays whole)."""
    cases: dict[str, list[str]] = {}
    findings: dict[str, Finding] = {}
    for case_id, finding in known.items():
        cases.setdefault(finding.key, []).append(case_id)
        findings.setdefault(finding.key, finding)
    return [f"known finding {key} ({', '.join(cases[key])}): {f.title} ({_state(f)}) {f.link}" for key, f in findings.items()]


def _state(finding: Finding) -> str:
    return f"{finding.state.value}, fixed in {finding.fixed_in}" if finding.fixed_in else finding.state.value
