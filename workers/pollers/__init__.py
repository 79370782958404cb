"""The pollers: new commits of watched branches and new releases on the package index become queued runs.

Most users cannot add a webhook to the upstream library they watch; beat runs both pollers every
``poll_interval_s`` and each target's own poll interval decides whether it is due. A poller reaches the same
ingest step as a webhook (docs/architecture.md §1 and §5).

A poll has three steps, so that no transaction is held open across the network:

1. **claim** (:func:`claim_due`, one transaction): the due targets' poll states (``poll_states``, one per
   watched branch or per package) are locked with ``SKIP LOCKED`` and stamped ``polled_at = now``, so a
   second poller running at the same time skips them;
2. **look** (no transaction): ``git ls-remote`` for the branches' heads, then the new commits from the
   target's mirror (:class:`workers.checkout.MirrorCache`), or the package's release list from
   ``GET {pypi_url}/pypi/{name}/json``;
3. **record** (one transaction per branch or package): the target is locked (serialised with webhooks), the
   new commits are recorded and runs queued per the target's commit policy (:mod:`service.ingest`), the
   state's head moves; the runs are enqueued once that transaction has committed
   (:func:`service.after_commit.after_commit`), never if it rolls back.

The modules: :mod:`~workers.pollers.claims` (claim, and keep what a poll found or why it failed),
:mod:`~workers.pollers.branches` (git remotes), :mod:`~workers.pollers.releases` (the package index).

Branches: the first poll of a branch records only its head (the history before specwatch watched it is not
tested); later polls record every commit between the old and the new head along the first-parent chain,
oldest first. A forced push (the old head is not an ancestor of the new one) records only the new head and
says so in the state's ``note``. An unreachable remote or a missing branch is logged and kept in the state's
``error``; the head is unchanged and the next due poll tries again. Nothing is raised for them.

Releases: final releases only (pre-releases, development releases and releases whose every file is yanked
are skipped), recorded as commits ``release:<version>`` ordered by :class:`packaging.version.Version`. The
first poll records every release and queues a run for the newest only; later polls queue runs for the new
releases per the target's policy (``every``: each, ``head``: the newest of them).
"""

from workers.pollers.branches import poll_branches
from workers.pollers.claims import Enqueue, PackageOf, PollJob, PollReport, claim_due
from workers.pollers.releases import PackageIndexError, Release, fetch_releases, parse_releases, poll_releases

__all__ = [
    "Enqueue",
    "PackageIndexError",
    "PackageOf",
    "PollJob",
    "PollReport",
    "Release",
    "claim_due",
    "fetch_releases",
    "parse_releases",
    "poll_branches",
    "poll_releases",
]
