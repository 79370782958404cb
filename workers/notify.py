"""The notification outbox: Slack messages (Block Kit) and GitHub commit statuses, written now, sent later.

Writers (:func:`queue_alert_message`, :func:`queue_commit_status`) add a ``notifications`` row in the caller's
transaction, with the whole payload and a unique ``dedup_key``; nothing is sent there. The sender
(:func:`deliver_due`, the task ``workers.deliver_notifications``) takes one due row at a time under
``SELECT .. FOR UPDATE SKIP LOCKED`` (two senders never send the same row), sends it and records the result
in the same short transaction. A run's commit statuses (and check runs) go out in the order they were written: a
row waits while an older one of its run is being sent, and an older one taken after a newer exists is never sent
(``superseded``):

- 2xx: ``sent``;
- HTTP 429: still ``pending``, next try after ``Retry-After`` (never slept on in the task);
- 5xx or a network error: ``failed``, next try after an exponential backoff capped at ``backoff_max_s``;
  after ``max_attempts`` tries ``next_attempt_at`` is cleared (given up, visible in the table);
- another 4xx (bad payload, revoked hook): ``failed`` with no next try (retrying cannot help).

Secrets (the Slack webhook URL, the GitHub token) are read from settings when sending, never stored in a
payload, never logged: error texts are scrubbed of them.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from service.alert_text import cut, drift_text, evidence_text, mrkdwn
from service.check_runs import queue_check_run
from service.commit_status import add_notification, commit_url, queue_status
from service.db import session_scope
from service.models import Alert, AlertKind, Notification, NotificationChannel, NotificationStatus, Run
from service.models.entries import AlertEntry, alert_entries
from service.queries import FindingLink, alert_findings, alert_regressions
from service.releases import release_version
from specwatch.findings import is_web_link
from workers.senders import SENDERS, Channels, Sent, send_github, send_github_check, send_slack

log = logging.getLogger(__name__)

__all__ = ["SENDERS", "Channels", "NotifyConfig", "Sent", "deliver_due", "queue_alert_message", "queue_commit_status"]
__all__ += ["send_github", "send_github_check", "send_slack", "slack_message"]

# Block Kit limits (https://api.slack.com/reference/block-kit/blocks).
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_HEADER_TEXT = 150
MAX_FALLBACK_TEXT = 3000


@dataclass(frozen=True)
class NotifyConfig:
    """Which channels are configured, and where links point (no secrets here)."""

    slack: bool = False
    github: bool = False
    dashboard_url: str = "http://127.0.0.1:8000"


# ----------------------------------------------------------------------------------------------- Slack
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
    its error, so from the code under test: each is made literal and cut (:func:`service.alert_text.mrkdwn`)."""
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
    kind = {
        AlertKind.violation: "Losslessness violation",
        AlertKind.performance: "Performance regression",
        AlertKind.broken: "Broken commit",
        AlertKind.exception: "Sampler exception on a valid input",
        AlertKind.uninstallable: "Could not install",
        AlertKind.configuration: "Configuration error",
    }[alert.kind]
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
        blocks.append({"type": "section", "text": _md("The previously failing cases pass again on a later commit.")})
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
            lines.append(f"`{mrkdwn(entry['case_id'], 200)}` fixed at `{mrkdwn(sha[:12])}`")
    return lines


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


# ---------------------------------------------------------------------------------------------- GitHub
def queue_commit_status(session: Session, config: NotifyConfig, run: Run, status: str) -> int:
    """An outbox row for the GitHub commit status ``status`` (see :data:`service.commit_status.STATUSES`) of
    primary run ``run``, and one for its check run when the target opted in (:mod:`service.check_runs`); the
    number of rows written (0 if not applicable)."""
    if not config.github:
        return 0
    written = queue_status(session, run, run.commit, status, config.dashboard_url)
    return written + queue_check_run(session, run, run.commit, status, config.dashboard_url)


# ---------------------------------------------------------------------------------------------- sending
@dataclass(frozen=True)
class DeliveryReport:
    sent: list[int]
    deferred: list[int]  # 429: pending until Retry-After
    failed: list[int]  # will be retried
    given_up: list[int]

    def as_dict(self) -> dict[str, list[int]]:
        return {"sent": self.sent, "deferred": self.deferred, "failed": self.failed, "given_up": self.given_up}


def _due(now: datetime) -> ColumnElement[bool]:
    """Pending rows not deferred past ``now``, and failed rows whose retry is due (a given-up row has none)."""
    return or_(
        and_(
            Notification.status == NotificationStatus.pending,
            or_(Notification.next_attempt_at.is_(None), Notification.next_attempt_at <= now),
        ),
        and_(Notification.status == NotificationStatus.failed, Notification.next_attempt_at <= now),
    )


def _superseded(session: Session, row: Notification) -> bool:
    """A commit status (or check run) with a newer one for the same run (GitHub shows the last one posted)."""
    if row.channel not in (NotificationChannel.github, NotificationChannel.github_check) or row.run_id is None:
        return False
    newer = select(Notification.id).where(Notification.channel == row.channel, Notification.run_id == row.run_id, Notification.id > row.id)
    return session.scalars(newer.limit(1)).first() is not None


def _older_in_flight(session: Session, row: Notification) -> bool:
    """Whether an older commit status (or check run) of ``row``'s run is being sent by another sender now (its row
    locked): then ``row`` waits, so that a run's statuses reach GitHub in the order they were written (two senders
    could otherwise post an older one after a newer). The older rows not in flight stay locked by this
    transaction until ``row`` is recorded, so none of them starts meanwhile (it is superseded when taken)."""
    if row.channel not in (NotificationChannel.github, NotificationChannel.github_check) or row.run_id is None:
        return False
    older = select(Notification.id).where(Notification.channel == row.channel, Notification.run_id == row.run_id, Notification.id < row.id)
    every = set(session.scalars(older))
    free = set(session.scalars(older.with_for_update(skip_locked=True)))
    return free != every


def deliver_due(factory: sessionmaker[Session], channels: Channels, *, now: Callable[[], datetime], limit: int) -> DeliveryReport:
    """Send up to ``limit`` due notifications, oldest first, one transaction per row (see the module docstring)."""
    sent: list[int] = []
    deferred: list[int] = []
    failed: list[int] = []
    given_up: list[int] = []
    skipped: set[int] = set()
    for _ in range(limit):
        with session_scope(factory) as session:
            moment = now()
            row = session.scalars(
                select(Notification)
                .where(_due(moment), Notification.id.not_in(skipped) if skipped else Notification.id.is_not(None))
                .order_by(Notification.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                break
            skipped.add(row.id)
            if _older_in_flight(session, row):  # sent on a later pass, after the older one
                continue
            if _superseded(session, row):  # a stale pending must never overwrite a newer failure
                row.status, row.next_attempt_at, row.last_error = NotificationStatus.failed, None, "superseded by a newer commit status"
                given_up.append(row.id)
                continue
            result = SENDERS[row.channel](row.payload, channels)
            row.attempts += 1
            if result.ok:
                row.status = NotificationStatus.sent
                row.sent_at = moment
                row.next_attempt_at = None
                row.last_error = None
                sent.append(row.id)
            elif result.retry_after_s is not None:
                row.status = NotificationStatus.pending
                row.next_attempt_at = moment + timedelta(seconds=result.retry_after_s)
                row.last_error = result.error
                deferred.append(row.id)
            else:
                row.status = NotificationStatus.failed
                row.last_error = result.error
                if result.retryable and row.attempts < channels.max_attempts:
                    delay = min(channels.backoff_s * 2 ** (row.attempts - 1), channels.backoff_max_s)
                    row.next_attempt_at = moment + timedelta(seconds=delay)
                    failed.append(row.id)
                else:
                    row.next_attempt_at = None
                    given_up.append(row.id)
            log.info(
                "notification_delivery id=%s channel=%s event=%s status=%s attempts=%s next=%s error=%s",
                row.id,
                row.channel.value,
                row.event,
                row.status.value,
                row.attempts,
                row.next_attempt_at,
                row.last_error,
            )
    return DeliveryReport(sent=sent, deferred=deferred, failed=failed, given_up=given_up)
