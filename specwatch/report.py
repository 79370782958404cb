"""A ``specwatch check`` run as Markdown, ready to paste into an upstream issue (``--markdown FILE``).

It says what was tested (library, version, commit, dependencies, torch, Python, device), which cases
failed with the evidence (trials, e-value against the threshold, TV estimate and its interval, which is
descriptive) and which of them a known finding explains (``known_finding``, set by ``specwatch check``), and the
exact command that reproduces the run (seeds derive from it).
"""

from __future__ import annotations

import math
import shlex
from typing import Any

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


def _evidence(result: dict[str, Any]) -> str:
    log_e = result.get("log_e_value")
    if log_e is None:
        return "certain (an impossible output)"
    return f"log E = {log_e:.1f} (threshold log {math.log(float(result['threshold'])):.1f})"


def _tv(result: dict[str, Any]) -> str:
    tv, ci = result.get("tv_estimate"), result.get("tv_ci")
    if tv is None:
        return "-"
    return f"{tv:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{tv:.3f}"


def _known(result: dict[str, Any]) -> str:
    known = result.get("known_finding")
    if not known:
        return "new"
    title = _cell(known["title"])
    link = str(known["link"])
    return f"known: [{title}]({link})" if link.startswith(("https://", "http://")) else f"known: {title} (`{_cell(link)}`)"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_report(run: dict[str, Any], command: list[str]) -> str:
    """The report of ``run`` (the suite's run result as JSON) reproduced by ``command`` (argv)."""
    results: list[dict[str, Any]] = list(run.get("results") or [])
    failed = [r for r in results if r.get("verdict") == "fail"]
    errored = [r for r in results if r.get("verdict") == "error"]
    environment = run.get("environment") or {}
    name = environment.get("library_name") or run.get("target", "?")
    version = environment.get("library_version", "")
    known = sum(1 for r in failed if r.get("known_finding"))
    lines = [
        f"## specwatch: {len(failed)} of {len(results)} case(s) fail on {name} {version}".rstrip()
        + (f" ({known} of them known finding{'s' if known != 1 else ''})" if known else ""),
        "",
        f"Verdict **{run.get('verdict', '?')}** at family-wise false-alarm rate α = {run.get('alpha')} "
        f"over {run.get('tests')} sequential tests (e-processes against exact laws); seed {run.get('seed')}, "
        f"device {run.get('device')}, suite {run.get('suite_version')} (catalogue {run.get('catalogue_version')}).",
        "",
        "| | |",
        "| --- | --- |",
    ]
    lines += [f"| {key} | {_cell(environment[key])} |" for key in _ENVIRONMENT_KEYS if environment.get(key)]
    dependencies = environment.get("library_dependencies")
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
            layer = ", ".join(n for n in ("lossless", "conformance") if r.get(n) == "fail") or r.get("verdict", "")
            lines.append(
                f"| `{r['case_id']}` | {layer} | {int(r.get('n_trials', 0)):,} | {_evidence(r)} | {_tv(r)} "
                f"| {_cell((r.get('reason') or '').splitlines()[0] if r.get('reason') else '')} "
                f"| {_known(r) if r.get('verdict') == 'fail' else '-'} |"
            )
    lines += ["", "### Reproduce", "", "```", shlex.join(command), "```", ""]
    return "\n".join(lines)


def coverage_summary(coverage: dict[str, Any] | None) -> str:
    """One line for tables: the most drafts a verification had, how many accepted all / some of >= 2
    drafts, the range of rounds per call, and "short" when the design was not reached."""
    if not coverage:
        return "-"
    drafts = [int(k) for k, v in coverage.get("drafts", {}).items() if v]
    rounds = [int(k) for k, v in coverage.get("rounds", {}).items() if v]
    text = (
        f"drafts<={max(drafts, default=0)} full {coverage.get('full', 0)} partial {coverage.get('partial', 0)} "
        f"rounds {min(rounds, default=0)}-{max(rounds, default=0)}"
    )
    return text + (" (short of design)" if coverage.get("shortfalls") else "")
