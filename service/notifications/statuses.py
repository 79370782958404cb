"""GitHub commit statuses as outbox rows: ``pending`` when a commit's run is queued, then its outcome.

A failing run that is confirmed first (``confirm_failures``) shows ``pending`` ("confirming") meanwhile,
then ``failure`` when the rerun confirms it, ``success`` when it does not (nobody is paged for it
either), ``error`` when the rerun could not test the commit.

Only primary runs post statuses (one per commit and profile, context ``specwatch/<profile>``): a
confirmation run is the same commit again and a bisection run is a search aid, so their statuses would
overwrite the commit's real one. The row is written in the caller's transaction and sent later by
``workers.deliver_notifications`` (beat, every ``SPECWATCH_WORKER_NOTIFY_INTERVAL_S``); a token is needed only
to send, but rows are written only when one is configured.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.models import Commit, Notification, NotificationChannel, NotificationStatus, Run, RunPurpose
from service.notifications.outbox import add_notification, github_repo
from service.notifications.text import cut
from service.releases import release_version

#: GitHub refuses a commit status whose description is longer (422).
GITHUB_DESCRIPTION_MAX = 140

#: What a status says, by name: (GitHub state, description). The plain outcomes of a run, and the steps
#: of a failing run's confirmation.
STATUSES = {
    "pending": ("pending", "run queued"),
    "success": ("success", "run passed"),
    "failure": ("failure", "run failed (a distribution test rejected)"),
    "known": ("failure", "run failed on known findings only (nothing new)"),
    "error": ("error", "run could not test this commit"),
    "uninstallable": ("error", "could not install this commit (not a test result)"),
    "confirming": ("pending", "run failed; confirming with fresh seeds before alerting"),
    "confirmed": ("failure", "run failed, confirmed by a rerun with fresh seeds"),
    "not-confirmed": ("success", "passed: the first run's rejection was not confirmed by a rerun"),
    "unconfirmable": ("error", "run failed; the confirmation run could not test this commit"),
    "fixed": ("success", "run passed; fixed here: cases of an alert pass again"),
}


def queue_status(session: Session, run: Run, commit: Commit, status: str, dashboard_url: str) -> int:
    """An outbox row for the GitHub commit status ``status`` (a name in :data:`STATUSES`) of primary run ``run``
    of ``commit``; 0 when not applicable (another purpose, a release, a repository not on GitHub, or already
    written)."""
    if status not in STATUSES:
        raise ValueError(f"unknown commit status {status!r}; expected one of {', '.join(STATUSES)}")
    repo = github_repo(commit.target.repo_url)
    if run.purpose is not RunPurpose.primary or repo is None or release_version(commit.sha) is not None:
        return 0
    state, what = STATUSES[status]
    description = f"specwatch: {run.profile} {what}"
    row = Notification(
        dedup_key=f"status:run:{run.id}:{status}",
        run_id=run.id,
        channel=NotificationChannel.github,
        event=status,
        payload={
            "repo": repo,
            "sha": commit.sha,
            "state": state,
            "target_url": f"{dashboard_url.rstrip('/')}/ui/runs/{run.id}",
            "description": cut(description, GITHUB_DESCRIPTION_MAX),
            "context": f"specwatch/{run.profile}",
        },
        status=NotificationStatus.pending,
    )
    return add_notification(session, row)
