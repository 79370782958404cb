"""GitHub check runs as outbox rows: a run's report where maintainers look (opt-in per target: ``github_checks``).

Besides the commit status (:mod:`service.notifications.statuses`), a target with ``github_checks`` gets one check run per
final decision about a primary run (the statuses' names, less the pending ones), written with the status
(:func:`service.notifications.github.queue_commit_status`) and sent by ``workers.deliver_notifications`` as ``POST
/repos/{owner}/{repo}/check-runs`` (``status: completed``, a conclusion, ``details_url`` the run's page) with
``output``:

- ``title``: what the run found (how many cases fail, how many of them known findings explain);
- ``summary``: the decision in words, the known findings with absolute links to their pages on the dashboard, and
  how to check out the commit;
- ``text``: the ``--markdown`` report of :mod:`specwatch.report` (versions, failing cases with their evidence, which
  are known, the command that reproduces the run), rebuilt from the run's stored suite header and case rows.

GitHub caps ``output.summary`` and ``output.text`` at 65535 characters each; a longer text is cut visibly with a
link to the run's page. A run stored without its header (a run older than the column) gets a summary only.
Texts from the code under test (case ids, reasons) and from users (finding titles) reach Markdown only through
the report's cell escaping or :func:`_md`. Releases get none (GitHub needs a commit), like statuses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import CaseResult, Commit, Notification, NotificationChannel, NotificationStatus, Run, RunPurpose, Target
from service.notifications.outbox import add_notification, github_repo
from service.notifications.statuses import STATUSES
from service.queries.findings import FindingLink, commit_version, finding_matcher
from service.releases import release_version
from service.textlimits import cut
from specwatch.protocol import ResultSchemaError, RunResult, Verdict
from specwatch.report import KnownFinding, markdown_report

#: GitHub's limits on a check run's output (https://docs.github.com/en/rest/checks/runs).
OUTPUT_TEXT_MAX = 65535
OUTPUT_SUMMARY_MAX = 65535
#: Not documented by GitHub; kept to one short line.
OUTPUT_TITLE_MAX = 255

#: A status's check-run conclusion; the pending statuses (``pending``, ``confirming``) post no check run.
CONCLUSIONS = {
    "success": "success",
    "fixed": "success",
    "not-confirmed": "success",
    "failure": "failure",
    "confirmed": "failure",
    "known": "failure",
    "error": "neutral",
    "uninstallable": "neutral",
    "unconfirmable": "neutral",
}
# Every final status has a conclusion (a new status without one would post nothing).
assert set(CONCLUSIONS) == set(STATUSES) - {"pending", "confirming"}


def _md(text: str) -> str:
    """Literal text in GitHub Markdown: its control characters escaped, one line."""
    escaped = "".join(f"\\{c}" if c in "\\`*_{}[]<>()#+-.!|~" else c for c in text)
    return " ".join(escaped.split())


def _layer(value: bool | None) -> str:
    return Verdict.SKIPPED.value if value is None else Verdict.PASS.value if value else Verdict.FAIL.value


def _number(value: float | None, default: float) -> float:
    return default if value is None or math.isnan(value) else value


def _case(row: CaseResult) -> dict[str, Any]:
    """A stored case row as the suite wrote it (:meth:`specwatch.protocol.CaseResult.from_json`'s input): the
    columns, and what had none (``details``)."""
    tv_ci = [row.tv_low, row.tv_high] if row.tv_low is not None and row.tv_high is not None else None
    columns = {
        "case_id": row.case_id,
        "verdict": row.verdict.value,
        "lossless": _layer(row.lossless),
        "conformance": _layer(row.conformance),
        "n_trials": row.n_trials or 0,
        "e_value": _number(row.e_value, 1.0),
        "log_e_value": row.log_e_value,
        "p_value": row.p_value,
        "threshold": _number(row.threshold, 1.0),
        "tv_estimate": row.tv_estimate,
        "tv_ci": tv_ci,
        "acceptance": {
            "observed": row.acceptance_observed,
            "expected": row.acceptance_expected,
            "per_trial_max": row.acceptance_per_trial_max,
        },
        "counts_digest": row.counts_digest or "",
        "fingerprint": row.fingerprint or "",
        "duration_s": _number(row.duration_s, 0.0),
        "seed": row.seed or 0,
        "device": row.device or "",
    }
    return dict(row.details or {}) | columns


def stored_result(run: Run, cases: Sequence[CaseResult]) -> RunResult | None:
    """The suite's result of ``run`` rebuilt from its stored header and case rows; None without a header or when
    what is stored cannot make one (rows of an older schema)."""
    header = (run.result_header or {}).get("run")
    if not isinstance(header, dict):
        return None
    try:
        return RunResult.from_json(header | {"results": [_case(c) for c in sorted(cases, key=lambda c: c.case_id)]})
    except ResultSchemaError:
        return None


def reproduce_command(target: Target, run: Run) -> list[str]:
    """``specwatch check`` as the worker ran the suite: the adapter, the checkout, the run's seed and profile."""
    suite_args = list((run.result_header or {}).get("suite_args") or [])
    kept: list[str] = []
    skip = False
    for arg in suite_args:  # --attempt, --replay: a confirmation's fresh seeds and replays, which check does not take
        if skip:
            skip = False
        elif arg in ("--attempt", "--replay", "--replay-attempt"):
            skip = True
        else:
            kept.append(str(arg))
    device = ["--device", "cuda"] if (run.device or "").startswith("cuda") else []
    return ["specwatch", "check", "--target", target.adapter, "--source", "checkout", "--seed", str(run.seed or 0), *kept, *device]


def _title(status: str, failed: int, total: int, known: int) -> str:
    if status in ("error", "uninstallable", "unconfirmable"):
        return cut(f"specwatch: {STATUSES[status][1]}", OUTPUT_TITLE_MAX)
    if failed == 0:
        return f"specwatch: {total} case(s) pass"
    known_text = f", {known} of them known finding(s)" if known else ""
    return cut(f"specwatch: {failed} of {total} case(s) fail{known_text}", OUTPUT_TITLE_MAX)


def check_run_payload(session: Session, run: Run, commit: Commit, status: str, dashboard_url: str) -> dict[str, Any]:
    """The check run of primary ``run`` for ``status`` (a name in :data:`CONCLUSIONS`), as the outbox stores it."""
    target = commit.target
    base = dashboard_url.rstrip("/")
    run_url = f"{base}/ui/runs/{run.id}"
    findings_url = f"{base}/ui/targets/{quote(target.name, safe='')}/findings"
    cases = list(session.scalars(select(CaseResult).where(CaseResult.run_id == run.id)))
    failing = sorted(c.case_id for c in cases if c.verdict is Verdict.FAIL)
    known: Mapping[str, FindingLink] = finding_matcher(session, target.id).match_all(
        failing,
        version=commit_version(commit.sha, run.library_version),
        distribution=run.library_distribution,
        branch=commit.branch,
        branch_order=commit.branch_order,
    )

    def url_of(finding: KnownFinding) -> str:
        return f"{findings_url}#finding-{quote(finding.key, safe='')}"

    lines = [f"**{_md(STATUSES[status][1])}** ({_md(run.profile)} profile). [The run on the dashboard]({run_url})."]
    if known:
        lines += ["", "Known findings (they page nobody; see the report's *known?* column):", ""]
        lines += [f"- [{_md(link.title)}]({url_of(link)})" for link in {link.key: link for link in known.values()}.values()]
    lines += [
        "",
        f"To reproduce: clone `{_md(target.repo_url)}` into `checkout`, `git -C checkout checkout {commit.sha}`, "
        "then run the command at the end of the report.",
    ]
    result = stored_result(run, cases)
    if result is not None:
        text = markdown_report(result, known, reproduce_command(target, run), url_of=url_of)
    else:
        text = f"The suite's report of this run was not stored; its results are on the dashboard: {run_url}"
    note = f"\n\n… the report is cut here (GitHub's limit); the whole run is on the dashboard: {run_url}\n"
    if len(text) > OUTPUT_TEXT_MAX:
        text = text[: OUTPUT_TEXT_MAX - len(note)] + note
    return {
        "repo": github_repo(target.repo_url),
        "name": f"specwatch/{run.profile}",
        "head_sha": commit.sha,
        "status": "completed",
        "conclusion": CONCLUSIONS[status],
        "details_url": run_url,
        "external_id": str(run.id),
        "output": {
            "title": _title(status, len(failing), len(cases), len(known)),
            "summary": cut("\n".join(lines), OUTPUT_SUMMARY_MAX),
            "text": text,
        },
    }


def queue_check_run(session: Session, run: Run, commit: Commit, status: str, dashboard_url: str) -> int:
    """An outbox row for the check run of primary ``run`` at ``status``; 0 when not applicable (the target did not
    opt in, a pending status, another purpose, a release, a repository not on GitHub, or already written)."""
    target = commit.target
    if not target.github_checks or status not in CONCLUSIONS or run.purpose is not RunPurpose.primary:
        return 0
    if github_repo(target.repo_url) is None or release_version(commit.sha) is not None:
        return 0
    row = Notification(
        dedup_key=f"check:run:{run.id}:{status}",
        run_id=run.id,
        channel=NotificationChannel.github_check,
        event=status,
        payload=check_run_payload(session, run, commit, status, dashboard_url),
        status=NotificationStatus.pending,
    )
    return add_notification(session, row)
