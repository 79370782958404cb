"""Slack messages (Block Kit) about alerts: opened, reopened, partly fixed, resolved, written as outbox rows.

Every text that comes from the code under test or a user (case ids, reasons, errors, a finding's title and link) is
made literal and cut (:func:`service.notifications.text.mrkdwn`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from sqlalchemy.orm import Session

from service.models import Alert, AlertKind, Notification, NotificationChannel, NotificationStatus
from service.models.entries import AlertEntry, alert_entries
from service.notifications.outbox import NotifyConfig, add_notification, commit_url
from service.notifications.text import cut, drift_text, evidence_text, mrkdwn
from service.queries import FindingLink, alert_findings, alert_regressions
from service.releases import release_version
from specwatch.findings import is_web_link

# Block Kit limits (https://api.slack.com/reference/block-kit/blocks).
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_HEADER_TEXT = 150
MAX_FALLBACK_TEXT = 3000


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "—"


def _known_text(finding: FindingLink, findings_url: str) -> str:
    """A known finding in Slack mrkdwn: its entry on the dashboard, and its own link (the finding's section in
    docs/findings.md, or the upstream issue)."""
    link = mrkdwn(finding.link)
    # A link with '|' or a space would carry a label of its own: shown as text.
    own = f"<{link}>" if is_web_link(finding.link) and not set("| ") & set(finding.link) else f"`{link}`"
    # Slack's control characters in text: a title must not open or close a link.
    return f"known finding: <{findings_url}#finding-{quote(finding.key, safe='')}|{mrkdwn(finding.title)}> ({own})"


def _finding_note(
    case_id: str, findings: Mapping[str, FindingLink], regressions: Mapping[str, FindingLink], findings_url: str
) -> str | None:
    """What a case's line adds: the known finding that explains it, or the fixed one it brings back."""
    if case_id in findings:
        return _known_text(findings[case_id], findings_url)
    if case_id in regressions:
        fixed = regressions[case_id]
        where = f", fixed in {mrkdwn(fixed.fixed_in, 200)}" if fixed.fixed_in else ""
        return f"regression of a fixed {_known_text(fixed, findings_url)}{where}"
    return None


def _md(text: str) -> dict[str, Any]:
    """A mrkdwn text object that Slack does not preprocess (``verbatim``): no bare URL becomes a link and no
    ``@channel`` a mention; the links written here as ``<url|text>`` still work."""
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def _case_line(entry: AlertEntry, known: str | None = None) -> str:
    """One alert entry in Slack mrkdwn. Its texts (case id, reason, error) come from the run's result file or
    its error, so from the code under test: each is made literal and cut (:func:`service.notifications.text.mrkdwn`)."""
    if known:
        return f"{_case_line(entry)} — {known}"[:MAX_SECTION_TEXT]
    case_id, reason = mrkdwn(entry["case_id"], 200), mrkdwn(entry["reason"], 50)
    if entry["reason"] == "broken":
        return f"*suite error*: {mrkdwn(entry['error'] or 'the suite could not run')}"
    if entry["reason"] == "uninstallable":
        return f"*could not install*: {mrkdwn(entry['error'] or entry['requirement'] or 'pip failed')}"
    if entry["reason"] == "configuration":
        return f"*configuration error*: {mrkdwn(entry['error'] or 'the repository cannot be used')}"
    if entry["reason"] == "raised":
        return f"• `{case_id}` (the sampler raised on a valid input): {mrkdwn(entry['error'] or '—')}"
    line = (
        f"• `{case_id}` ({reason}): {evidence_text(entry)}, "
        f"TV estimate {_fmt(entry.get('tv_estimate'), '.4f')} (descriptive), acceptance {_fmt(entry.get('acceptance_observed'), '.3f')} "
        f"(expected {_fmt(entry.get('acceptance_expected'), '.3f')})"
    )
    drift = drift_text(entry)
    if drift is not None:
        line += f"; drift: {drift}"
    return line


def _sections(lines: list[str], budget: int) -> list[dict[str, Any]]:
    """Lines packed into at most ``budget`` sections of at most MAX_SECTION_TEXT characters; the rest is counted."""
    blocks: list[dict[str, Any]] = []
    current = ""
    shown = 0
    for full in lines:
        line = full[: MAX_SECTION_TEXT - 1]
        if current and len(current) + 1 + len(line) > MAX_SECTION_TEXT:
            if len(blocks) == budget - 1:
                break
            blocks.append({"type": "section", "text": _md(current)})
            current = ""
        current = f"{current}\n{line}" if current else line
        shown += 1
    if current:
        blocks.append({"type": "section", "text": _md(current)})
    if shown < len(lines):
        blocks.append({"type": "context", "elements": [_md(f"… and {len(lines) - shown} more cases on the dashboard")]})
    return blocks


def _confirmation_text(alert: Alert) -> str:
    """How the alert's failure was made sure of, in words (the Slack message's context line)."""
    by_kind = {
        AlertKind.broken: "not needed (a broken commit is deterministic)",
        AlertKind.configuration: "not a test result: the target's repository cannot be used, whatever the commit (one alert per target)",
        AlertKind.uninstallable: "the install failed on every attempt, retried with backoff (not a test result: nothing was tested)",
    }
    if alert.kind in by_kind:
        return by_kind[alert.kind]
    if alert.confirmed and alert.kind is AlertKind.exception:
        return "confirmed by a second run with fresh seeds (the target raised again)"
    if alert.confirmed:
        return "confirmed by a second run with fresh seeds (the same checks' stopped e-values multiplied, or rejecting again)"
    if any(e["reason"] == "drift" for e in alert_entries(alert.cases)):
        return "acceptance drift against the recent passing baseline (Hoeffding-calibrated)"
    return "not confirmed (confirmation runs are off)"


#: An alert's kind as its message's header says it.
KIND_TITLES = {
    AlertKind.violation: "Losslessness violation",
    AlertKind.performance: "Performance regression",
    AlertKind.broken: "Broken commit",
    AlertKind.exception: "Sampler exception on a valid input",
    AlertKind.uninstallable: "Could not install",
    AlertKind.configuration: "Configuration error",
}


def slack_message(
    alert: Alert,
    event: str,
    dashboard_url: str,
    findings: Mapping[str, FindingLink] | None = None,
    regressions: Mapping[str, FindingLink] | None = None,
    *,
    fixed: Collection[str] = (),
) -> dict[str, Any]:
    """The Block Kit message (and its text fallback) of an alert being opened, resolved, or partly fixed (``fixed``:
    the cases that pass again, each "fixed at" its commit); ``findings`` (by case
    id) are the known findings that explain some of its cases, each linked beside its case; ``regressions`` the
    fixed findings that some of its cases bring back (the header then says "Regression of a fixed known finding")."""
    target, commit = alert.target, alert.first_bad_commit
    findings = findings or {}
    regressions = regressions or {}
    findings_url = f"{dashboard_url.rstrip('/')}/ui/targets/{target.name}/findings"
    kind = KIND_TITLES[alert.kind]
    verb = {"resolved": "Resolved", "reopened": "Reopened", "fixed": "Partly fixed", "fix-located": "First good commit found"}.get(
        event, ""
    )
    # plain_text: Slack parses nothing in it, so it is only cut.
    if regressions:
        kind = f"Regression of a fixed known finding ({kind.lower()})"
    header = cut(f"{verb + ': ' if verb else ''}{kind} in {target.name}", MAX_HEADER_TEXT)
    link = commit_url(target, commit)
    sha = commit.sha if release_version(commit.sha) else commit.sha[:12]
    commit_text = f"<{link}|`{sha}`>" if link else f"`{sha}`"
    # The alert's own page: the alerts list shows only unresolved alerts by default.
    dashboard = f"{dashboard_url.rstrip('/')}/ui/alerts/{alert.id}"
    confirmation = _confirmation_text(alert)
    first_bad = f"*First bad commit:* {commit_text}"
    if alert.bisection_runs:
        first_bad += f" (bisection: {alert.bisection_runs} runs)"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header, "emoji": False}},
        {
            "type": "section",
            "fields": [
                _md(f"*Target:*\n{mrkdwn(target.name, 200)}"),
                _md(f"*Branch:*\n{mrkdwn(alert.branch, 200)}"),
            ],
        },
        {"type": "section", "text": _md(first_bad[:MAX_SECTION_TEXT])},
    ]
    if event == "resolved":
        ended = any(isinstance(e.get("now_fails_as"), dict) for e in alert_entries(alert.cases))
        note = "Each previously failing case passes again, or fails another way, on a later commit." if ended else ""
        blocks.append({"type": "section", "text": _md(note or "The previously failing cases pass again on a later commit.")})
        blocks.extend(_sections(_fixed_lines(alert), MAX_BLOCKS - 6))
    elif event == "fix-located":
        note = "A first-good-commit search over the commits that were not tested found where these cases pass again first."
        blocks.append({"type": "section", "text": _md(note)})
        blocks.extend(_sections(_fixed_lines(alert, fixed), MAX_BLOCKS - 7))
    elif event == "fixed":
        still = [e for e in alert_entries(alert.cases) if not isinstance(e.get("fixed_sha"), str)]
        blocks.extend(_sections(_fixed_lines(alert, fixed), MAX_BLOCKS - 7))
        blocks.append({"type": "section", "text": _md(f"{len(still)} case{'s' if len(still) != 1 else ''} of this alert still fail.")})
    else:
        if event == "reopened":
            times = f"{alert.reopened_count} time{'s' if alert.reopened_count != 1 else ''}"
            again = f"It had been resolved; it fails again (reopened {times})."
            blocks.append({"type": "section", "text": _md(again)})
        # Header, target, commit, confirmation and dashboard blocks take 5 of the 50 (a reopening note one more).
        lines = [_case_line(e, _finding_note(e["case_id"], findings, regressions, findings_url)) for e in alert_entries(alert.cases)]
        blocks.extend(_sections(lines, MAX_BLOCKS - 6 - (event == "reopened")))
        blocks.append({"type": "context", "elements": [_md(f"*Confirmation:* {confirmation}")]})
    links = f"<{dashboard}|Open on the dashboard>"
    if alert.detected_run_id is not None and alert.kind in (AlertKind.broken, AlertKind.configuration, AlertKind.uninstallable):
        links += f" · <{dashboard_url.rstrip('/')}/ui/runs/{alert.detected_run_id}#log|run {alert.detected_run_id} and its log>"
    blocks.append({"type": "section", "text": _md(links)})
    distinct = {f.key: f for f in findings.values()}.values()
    known = "".join(f"; known finding: {mrkdwn(f.title)} ({mrkdwn(f.link)})" for f in distinct)
    # The fallback is mrkdwn too (notifications, clients without blocks): its texts are made literal as well.
    text = f"{mrkdwn(header)}: {mrkdwn(alert.summary or '')} — first bad commit {sha}{known}; {dashboard}"[:MAX_FALLBACK_TEXT]
    return {"text": text, "blocks": blocks[:MAX_BLOCKS]}


def _fixed_lines(alert: Alert, cases: Collection[str] | None = None) -> list[str]:
    """One line per fixed case of ``alert`` (of ``cases`` only, when given): "`case` fixed at `sha`"."""
    lines = []
    for entry in alert_entries(alert.cases):
        sha = entry.get("fixed_sha")
        if isinstance(sha, str) and (cases is None or entry["case_id"] in cases):
            lines.append(f"`{mrkdwn(entry['case_id'], 200)}` fixed at `{mrkdwn(sha[:12])}`{_now_fails(entry)}")
    return lines


def _now_fails(entry: AlertEntry) -> str:
    """What a case whose failure ended at its ``fixed_sha`` fails as there instead (empty: it passes there)."""
    now = entry.get("now_fails_as")
    if not isinstance(now, dict):
        return ""
    if "finding" in now:
        return f"; it now fails as known finding `{mrkdwn(str(now['finding']), 200)}`"
    return f"; it now fails another way, alerted as alert {mrkdwn(str(now.get('alert')), 20)}"


def queue_alert_message(session: Session, config: NotifyConfig, alert: Alert, event: str, *, about: Sequence[str] = ()) -> int:
    """An outbox row for Slack about ``alert`` (``opened``, ``resolved``, ``reopened``, ``fixed``: its cases
    ``about`` pass again while others still fail, or ``fix-located``: a search found where they were fixed first); 0
    when Slack is not configured.

    The dedup key names the alert's life (its reopen count after the first): a reopened alert's next
    resolution is a new message, not a duplicate of the first one; a ``fixed`` message names its cases.
    """
    if not config.slack:
        return 0
    life = f":{alert.reopened_count}" if alert.reopened_count else ""
    cases = ":" + hashlib.sha256("\n".join(sorted(about)).encode()).hexdigest()[:16] if about else ""
    row = Notification(
        dedup_key=f"alert:{alert.id}:{event}{cases}{life}:slack",
        alert_id=alert.id,
        channel=NotificationChannel.slack,
        event=event,
        payload=slack_message(
            alert, event, config.dashboard_url, alert_findings(session, alert), alert_regressions(session, alert), fixed=about
        ),
        status=NotificationStatus.pending,
    )
    return add_notification(session, row)
