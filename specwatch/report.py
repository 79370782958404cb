"""A ``specwatch check`` run as Markdown, ready to paste into an upstream issue (``--markdown FILE``).

It says what was tested (library, version, commit, dependencies, torch, Python, device), which cases
failed with the evidence (trials, log e-value against the threshold's log, TV estimate and its interval, which
is descriptive) and which of them a known finding explains (with an absolute link, or the finding's section named
in words: a relative link would be broken in an upstream issue), and the exact command that reproduces the run
(seeds derive from it).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, metadata
from typing import Any, Protocol

from specwatch.protocol import CaseResult, RunResult, Verdict

_ENVIRONMENT_KEYS = (
    "library_name",
    "library_distribution",
    "library_version",
    "library_git_sha",
    "python",
    "torch",
    "numpy",
    "scipy",
    "platform",
)


class KnownFinding(Protocol):
    """What the report shows of a known finding (a :class:`~specwatch.findings.Finding`, or a server's link to one)."""

    @property
    def key(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def link(self) -> str: ...


def _evidence(result: CaseResult) -> str:
    threshold = math.log(result.threshold)
    if result.log_e_value is None:
        return f"certain (an impossible output; threshold log E {threshold:.1f})"
    return f"log E = {result.log_e_value:.1f} (threshold log E {threshold:.1f})"


def _tv(result: CaseResult) -> str:
    tv, ci = result.tv_estimate, result.tv_ci
    if tv is None:
        return "-"
    return f"{tv:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{tv:.3f}"


def finding_url(link: str) -> str | None:
    """An absolute address for a finding's link: itself when it is one; for a section of specwatch's
    ``docs/findings.md``, that file in the project's repository (the ``Source`` URL of the installed package's
    metadata); None when neither is known (the report then names the section in words, never a relative link)."""
    if link.startswith(("https://", "http://")):
        return link
    try:
        urls = metadata("specwatch").get_all("Project-URL") or []
    except PackageNotFoundError:
        return None
    source = next((u.split(",", 1)[1].strip() for u in urls if u.split(",", 1)[0].strip().lower() == "source"), None)
    return f"{source.rstrip('/')}/blob/main/{link}" if source else None


def _known(result: CaseResult, known: Mapping[str, KnownFinding], url_of: Callable[[KnownFinding], str | None]) -> str:
    finding = known.get(result.case_id)
    if finding is None:
        return "new"
    title = _cell(finding.title)
    url = url_of(finding)
    if url is not None:  # brackets in a title would end the link's text early
        label = _cell(finding.title.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]"))
        return f"known: [{label}]({url})"
    section = finding.link.partition("#")[2] or finding.link
    return f"known: {title} (specwatch's docs/findings.md, section `{_cell(section)}`)"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _shipped_url(finding: KnownFinding) -> str | None:
    return finding_url(finding.link)


def markdown_report(
    run: RunResult,
    known: Mapping[str, KnownFinding],
    command: list[str],
    *,
    url_of: Callable[[KnownFinding], str | None] = _shipped_url,
) -> str:
    """The report of ``run`` (``known``: the failures a finding explains, by case id) reproduced by ``command``;
    ``url_of`` gives a finding's absolute address (default: :func:`finding_url` of its link; the server passes its
    dashboard's page of the finding)."""
    results = run.results
    failed = [r for r in results if r.verdict == Verdict.FAIL]
    errored = [r for r in results if r.verdict == Verdict.ERROR]
    environment, library = run.environment, run.library
    name = library.name if library is not None else run.target
    version = library.version if library is not None else ""
    explained = sum(1 for r in failed if r.case_id in known)
    lines = [
        f"## specwatch: {len(failed)} of {len(results)} case(s) fail on {name} {version}".rstrip()
        + (f" ({explained} of them known finding{'s' if explained != 1 else ''})" if explained else ""),
        "",
        f"Verdict **{run.verdict.value}** at family-wise false-alarm rate α = {run.alpha} "
        f"over {run.tests} sequential tests (e-processes against exact laws); seed {run.seed}, "
        f"device {run.device}, suite {run.suite_version} (catalogue {run.catalogue_version}).",
        "",
        "| | |",
        "| --- | --- |",
    ]
    lines += [f"| {key} | {_cell(environment[key])} |" for key in _ENVIRONMENT_KEYS if environment.get(key)]
    dependencies = library.details.get("dependencies") if library is not None else None
    if dependencies:
        lines.append(f"| dependencies | {_cell(dependencies)} |")
    if failed or errored:
        lines += [
            "",
            "### Failing cases",
            "",
            "| case | layer | trials | evidence | TV estimate [99 % interval, descriptive] | reason | known? |",
            "| --- | --- | ---: | --- | --- | --- | --- |",
        ]
        for r in failed + errored:
            layers = [layer.value for layer in r.failed_layers()]
            layer = ", ".join(layers) or r.verdict.value
            reason = r.reason.splitlines()[0] if r.reason else ""
            lines.append(
                f"| `{r.case_id}` | {layer} | {r.n_trials:,} | {_evidence(r)} | {_tv(r)} "
                f"| {_cell(reason)} | {_known(r, known, url_of) if r.verdict == Verdict.FAIL else '-'} |"
            )
    lines += ["", "### Reproduce", "", "```", shlex.join(command), "```", ""]
    return "\n".join(lines)


def coverage_summary(coverage: dict[str, Any] | None, trials: int | None = None) -> str:
    """One line for tables: the most drafts a verification had, how many accepted all / some of >= 2
    drafts, the range of rounds per call, the trials whose rounds were seen when ``trials`` is given and the
    rounds of some were not (llama-speculative's are reconstructed for part of each batch), and "short" when
    the design was not reached."""
    if not coverage:
        return "-"
    drafts = [int(k) for k, v in coverage.get("drafts", {}).items() if v]
    rounds = [int(k) for k, v in coverage.get("rounds", {}).items() if v]
    text = (
        f"drafts<={max(drafts, default=0)} full {coverage.get('full', 0)} partial {coverage.get('partial', 0)} "
        f"rounds {min(rounds, default=0)}-{max(rounds, default=0)}"
    )
    seen = sum(int(v) for v in coverage.get("rounds", {}).values())
    if trials is not None and seen < trials:
        text += f" (in {seen} of {trials} trials)"
    return text + (" (short of design)" if coverage.get("shortfalls") else "")
