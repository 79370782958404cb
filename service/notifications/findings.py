"""The Slack message of a known finding that stopped failing ("fixed in <commit>"), as an outbox row.

Written by :func:`workers.analysis.findings.record_findings` in the analysis's transaction and sent by
``workers.deliver_notifications`` like every other row (:mod:`workers.notify`). Its texts (the finding's title and
link, a user's input) are made literal (:func:`service.notifications.text.mrkdwn`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from sqlalchemy.orm import Session

from service.models import KnownFinding, Notification, NotificationChannel, NotificationStatus, Run
from service.notifications.outbox import NotifyConfig, add_notification, commit_url
from service.notifications.slack import MAX_FALLBACK_TEXT, MAX_HEADER_TEXT
from service.notifications.text import cut, mrkdwn
from service.releases import release_version


def _md(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def _commit_text(run: Run) -> str:
    commit = run.commit
    sha = commit.sha if release_version(commit.sha) else commit.sha[:12]
    link = commit_url(commit.target, commit)
    return f"<{link}|`{sha}`>" if link else f"`{sha}`"


def finding_fixed_message(
    finding: KnownFinding, run: Run, previous: Run, dashboard_url: str, elsewhere: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Block Kit: ``finding`` no longer fails at ``run``'s commit; ``previous``, the last tested run, still failed it;
    ``elsewhere``: its cases that fail at ``run``'s commit as other known findings (case -> that finding's key)."""
    target = run.commit.target
    base = dashboard_url.rstrip("/")
    page = f"{base}/ui/targets/{quote(target.name, safe='')}/findings#finding-{quote(finding.key, safe='')}"
    header = cut(f"Known finding fixed in {target.name}", MAX_HEADER_TEXT)
    branch = run.commit.branch or "releases"
    now_run, then_run = f"<{base}/ui/runs/{run.id}|{run.id}>", f"<{base}/ui/runs/{previous.id}|{previous.id}>"
    others = "".join(
        f", `{mrkdwn(case, 200)}` fails there as known finding `{mrkdwn(key, 200)}`" for case, key in sorted((elsewhere or {}).items())
    )
    what = (
        f"*<{page}|{mrkdwn(finding.title)}>* stopped failing: its cases pass at {_commit_text(run)} on {mrkdwn(branch, 200)} "
        f"(run {now_run}){' except that' + others[1:] if others else ''}; they failed at {_commit_text(previous)} (run {then_run})."
    )
    then = "From this commit on a failure of its cases is alerted as a regression of the finding."
    blocks = [
        {"type": "header", "text": {"type": "plain_text", "text": header, "emoji": False}},
        {"type": "section", "text": _md(what[:3000])},
        {"type": "context", "elements": [_md(then)]},
    ]
    sha = run.commit.sha if release_version(run.commit.sha) else run.commit.sha[:12]
    text = f"{mrkdwn(header)}: {mrkdwn(finding.title)} fixed in {sha}; {page}"[:MAX_FALLBACK_TEXT]
    return {"text": text, "blocks": blocks}


def queue_finding_fixed(
    session: Session, config: NotifyConfig, finding: KnownFinding, run: Run, previous: Run, *, elsewhere: Mapping[str, str] | None = None
) -> int:
    """An outbox row for Slack: ``finding`` seen fixed at ``run``'s commit (``elsewhere``: its cases failing there as
    other known findings); 0 when Slack is not configured."""
    if not config.slack:
        return 0
    row = Notification(
        dedup_key=f"finding:{finding.id}:fixed:{run.commit_id}:slack",
        run_id=run.id,
        channel=NotificationChannel.slack,
        event="finding-fixed",
        payload=finding_fixed_message(finding, run, previous, config.dashboard_url, elsewhere),
        status=NotificationStatus.pending,
    )
    return add_notification(session, row)
