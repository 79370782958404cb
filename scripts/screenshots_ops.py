"""The operations part of the screenshots' history (``scripts/screenshots.py``): a target whose poller cannot reach
its repository, a commit that breaks the suite (a broken-commit alert, the run's error and log), and a run waiting.

``transformers-nightly`` watches ``main`` every 5 minutes: commits 1-2 pass; commit 3 cannot be imported (the run
ends in error with the suite's traceback in its log; the analysis opens a broken alert at once); commit 4 waits in
the queue; the last poll failed (the host could not be resolved). Written through the service's own code paths, as
the workers would have: target added, commits recorded and runs queued (:mod:`service.ingest`), each run claimed and
stored (:mod:`workers.runs`) and analysed (:func:`workers.analysis.run.analyse`); the poll state as the branch
poller records a failed poll.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.ingest import NewCommit, RunOptions, queue_runs, record_commits
from service.models import Alert, AlertKind, PollKind, PollState, Run, RunStatus
from service.targets import add_target, make_spec
from workers.analysis.context import AnalysisConfig
from workers.analysis.run import analyse
from workers.runs import RunOutcome, RunSpec, claim_run, record_outcome

NIGHTLY = "transformers-nightly"
POLL_ERROR = "git ls-remote failed (exit 128): could not resolve host: github.com (host not found)"
BROKEN_ERROR = (
    "the suite could not run this commit (exit 2): ImportError: cannot import name 'CandidateGenerator' from "
    "'transformers.generation.candidate_generator'"
)
BROKEN_LOG = """\
specwatch 0.2.0: 13 cases, target transformers 5.26.0.dev0 (source checkout)
Traceback (most recent call last):
  File "specwatch/targets/transformers_target.py", line 41, in load
    from transformers.generation.candidate_generator import CandidateGenerator
ImportError: cannot import name 'CandidateGenerator' from 'transformers.generation.candidate_generator'
(/scratch/run-57/src/transformers/generation/candidate_generator.py)
error: the target could not be loaded: ImportError: cannot import name 'CandidateGenerator'
"""
COMMITS = (
    ("Speed up the assistant's cache cropping", "Mira K."),
    ("[generation] Typing of the candidate generators", "Jonas P."),
    ("Move CandidateGenerator to generation/candidates.py", "Jonas P."),
    ("Docs: the new candidates module", "Lea S."),
)


def _sha(label: str) -> str:
    return hashlib.sha1(label.encode(), usedforsecurity=False).hexdigest()


def seed_operations(session: Session, run_passing: Callable[[int, datetime], None], *, start: datetime, now: datetime) -> int:
    """Add ``transformers-nightly``'s history; ``run_passing(run_id, when)`` runs a queued run as the main history's
    worker does. The id of the broken-commit alert."""
    target = add_target(
        session,
        make_spec(
            name=NIGHTLY,
            repo_url="https://github.com/huggingface/transformers.git",
            branches=["main"],
            adapter="transformers",
            poll="5m",
            commit_policy="every",
        ),
    )
    options = RunOptions(profile="quick", queued_lease=timedelta(hours=6))
    described = [
        NewCommit(sha=_sha(f"nightly/{order}"), author=author, committed_at=start + timedelta(hours=order), message=message)
        for order, (message, author) in enumerate(COMMITS, start=1)
    ]
    commits, _ = record_commits(session, target, "main", described)
    for order, new in enumerate(described, start=1):
        [run_id] = queue_runs(session, [commits[new.sha]], options)
        when = start + timedelta(hours=order, minutes=5)
        if order <= 2:
            run_passing(run_id, when)
        elif order == 3:
            claim = claim_run(session, run_id, worker="gpu-worker-2", now=when, lease_s=3600)
            assert isinstance(claim, RunSpec), claim
            outcome = RunOutcome(RunStatus.error, error=BROKEN_ERROR, log_tail=BROKEN_LOG, device="cuda:NVIDIA H100 80GB HBM3")
            assert record_outcome(session, run_id, claim.attempt, outcome, now=when + timedelta(seconds=40))
            analyse(session, run_id, config=AnalysisConfig(), now=when + timedelta(seconds=45))
        else:
            run = session.get_one(Run, run_id)
            run.queued_at = now - timedelta(minutes=25)
    session.add(
        PollState(
            target_id=target.id,
            kind=PollKind.branch,
            ref="main",
            head=described[-1].sha,
            polled_at=now - timedelta(minutes=3),
            succeeded_at=now - timedelta(minutes=38),
            error=POLL_ERROR,
        )
    )
    session.flush()
    query = select(Alert.id).where(Alert.target_id == target.id, Alert.kind == AlertKind.broken)
    return session.execute(query).scalar_one()
