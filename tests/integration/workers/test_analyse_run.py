"""workers.analyse_run on the toy target, tasks called directly: confirmation, bisection, kinds, resolution.

Each suite run is the real subprocess on a real git checkout (profile ``smoke``); the analysis queues the
confirmation and bisection runs, and the test plays the worker: it runs every queued run and analyses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.models import (
    Alert,
    AlertKind,
    AlertState,
    CaseResult,
    Commit,
    CommitPolicy,
    Notification,
    Run,
    RunPurpose,
    RunStatus,
    Target,
    Verdict,
)
from tests.support.http_fakes import block_kit_problems
from tests.support.toy_target import ADAPTER, BROKEN_IMPORT, CORRECT, SWAPPED_RESIDUAL, ToyRepo
from tests.support.workers import clear_caches

# The module, not its tasks (see test_tasks.py).
from workers import tasks

# Each test runs the suite in a real worker over several commits: the slow tier (`make test-slow`).
pytestmark = [pytest.mark.usefixtures("worker_env"), pytest.mark.slow]

# Lossless but slower: a draft is accepted only when it equals an independent target sample.
STRICT_ACCEPTANCE = '''"""Speculative sampling that accepts a draft only when an independent target sample agrees."""

from specwatch.mutants import strict_acceptance as speculative_sample

__all__ = ["speculative_sample"]
'''


# Raises on every valid input (as transformers 5.24.0 does when the residual underflows to zero in float32).
RAISES = CORRECT.replace(
    "    p, q = step.target_probs, step.draft_probs\n",
    "    raise RuntimeError('probability tensor contains either inf, nan or element < 0')\n",
    1,
)


@pytest.fixture(autouse=True)
def slack_configured(monkeypatch: pytest.MonkeyPatch, worker_env: dict[str, str]) -> None:
    """Slack configured (nothing is sent here: the outbox rows are checked)."""
    monkeypatch.setenv("SPECWATCH_SLACK_WEBHOOK_URL", "http://127.0.0.1:9/never-called")
    monkeypatch.setenv("SPECWATCH_DASHBOARD_URL", "https://specwatch.example.com")
    clear_caches()


def record(factory: sessionmaker[Session], repo: ToyRepo, shas: list[str], tested: list[str]) -> tuple[dict[str, int], list[int]]:
    """A head-policy target with ``shas`` on main in order; a queued smoke run for each of ``tested``."""
    with session_scope(factory) as session:
        target = Target(name="toy", repo_url=repo.url, adapter=ADAPTER, branches=["main"], commit_policy=CommitPolicy.head)
        commits = {sha: Commit(target=target, sha=sha, branch="main", branch_order=i + 1) for i, sha in enumerate(shas)}
        session.add_all(commits.values())
        runs = [Run(commit=commits[sha], profile="smoke") for sha in tested]
        session.add_all(runs)
        session.flush()
        return {sha: c.id for sha, c in commits.items()}, [r.id for r in runs]


def drive(run_ids: list[int], *, between: Callable[[int], None] | None = None) -> list[int]:
    """Play the workers: run each queued run, analyse it, and do the same for the runs the analysis queued.

    ``between`` is called with each run's id after the suite stored its results and before the analysis."""
    pending, done = list(run_ids), []
    while pending:
        run_id = pending.pop(0)
        assert tasks.run_suite(run_id)["status"] in {"passed", "failed", "error"}
        if between is not None:
            between(run_id)
        report = tasks.analyse_run(run_id)
        assert report["outcome"] == "analysed"
        assert tasks.analyse_run(run_id)["reason"] == "already analysed"  # idempotent
        pending.extend(report["queued"])
        done.append(run_id)
    return done


def alerts(factory: sessionmaker[Session]) -> list[Alert]:
    with factory() as session:
        return list(session.scalars(select(Alert).order_by(Alert.id)))


def slack_rows(factory: sessionmaker[Session]) -> list[Notification]:
    with factory() as session:
        return list(session.scalars(select(Notification).where(Notification.channel == "slack").order_by(Notification.id)))


def test_bisection_names_commit_5_of_an_8_commit_push(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    base = toy_repo.commit(CORRECT, "base, tested earlier")
    push = [toy_repo.commit(CORRECT if i < 5 else SWAPPED_RESIDUAL, f"commit {i}") for i in range(1, 9)]
    commit_ids, (base_run, head_run) = record(factory, toy_repo, [base, *push], tested=[base, push[-1]])
    drive([base_run])

    extra = drive([head_run])[1:]  # the head's own run is not extra

    assert len(extra) <= math.ceil(math.log2(8)) + 2
    (alert,) = alerts(factory)
    assert (alert.kind, alert.state, alert.confirmed) == (AlertKind.violation, AlertState.open, True)
    assert alert.first_bad_commit_id == commit_ids[push[4]]  # commit 5
    assert alert.last_good_commit_id == commit_ids[push[3]]
    assert alert.bisection_runs == len(extra) - 1  # all but the confirmation
    assert alert.detected_run_id == head_run
    assert {c["case_id"] for c in alert.cases} <= {"direct/far_apart/V8/g1", "direct/far_apart/V8/g3"}
    assert all(
        (c["reason"] == "lossless" and c["confirmation_log_e_value"] is not None) or c["confirmation_verdict"] == "fail"
        for c in alert.cases
    )
    with factory() as session:
        purposes = [session.get_one(Run, run_id).purpose for run_id in extra]
    assert purposes[0] is RunPurpose.confirmation
    assert set(purposes[1:]) == {RunPurpose.bisection}
    (message,) = slack_rows(factory)
    assert (message.event, message.alert_id) == ("opened", alert.id)
    print(
        f"bisection: 8-commit push, first bad = commit 5 after {len(extra)} extra runs (1 confirmation + {alert.bisection_runs} bisection)"
    )


def test_a_lossless_but_slower_sampler_is_a_performance_regression(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    good = toy_repo.commit(CORRECT, "correct")
    strict = toy_repo.commit(STRICT_ACCEPTANCE, "accept only what the target would sample")
    commit_ids, run_ids = record(factory, toy_repo, [good, strict], tested=[good, strict])

    drive(run_ids)

    (alert,) = alerts(factory)
    assert alert.kind is AlertKind.performance
    assert alert.first_bad_commit_id == commit_ids[strict]
    assert alert.confirmed
    assert {c["reason"] for c in alert.cases} == {"conformance"}
    for case in alert.cases:
        assert case["acceptance_observed"] < case["acceptance_expected"]


def test_a_broken_commit_is_its_own_kind_without_confirmation(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    good = toy_repo.commit(CORRECT, "correct")
    broken = toy_repo.commit(BROKEN_IMPORT, "broken import")
    commit_ids, run_ids = record(factory, toy_repo, [good, broken], tested=[good, broken])

    assert drive(run_ids) == run_ids  # no confirmation run

    (alert,) = alerts(factory)
    assert (alert.kind, alert.first_bad_commit_id, alert.confirmed) == (AlertKind.broken, commit_ids[broken], False)
    assert "could not test this commit" in alert.cases[0]["error"]


def test_a_sampler_that_raises_on_a_valid_input_is_its_own_kind_not_a_broken_commit(
    factory: sessionmaker[Session], toy_repo: ToyRepo
) -> None:
    good = toy_repo.commit(CORRECT, "correct")
    raising = toy_repo.commit(RAISES, "raises on a valid input")
    commit_ids, run_ids = record(factory, toy_repo, [good, raising], tested=[good, raising])

    done = drive(run_ids)

    assert len(done) == 3  # the two runs and a confirmation: the exception is confirmed, not assumed
    with factory() as session:
        run = session.get_one(Run, run_ids[1])
        assert run.status is RunStatus.failed  # a finding about the sampler, not an error of the run
        assert run.analysis is not None
        assert run.analysis["kind"] == "exception"
        case = run.case_results[0]
        assert case.details is not None
        assert case.details["failure"] == "raised"
    (alert,) = alerts(factory)
    assert (alert.kind, alert.first_bad_commit_id, alert.confirmed) == (AlertKind.exception, commit_ids[raising], True)
    assert {c["reason"] for c in alert.cases} == {"raised"}
    assert all("RuntimeError: probability tensor contains" in c["error"] for c in alert.cases)
    (message,) = slack_rows(factory)
    assert message.alert_id == alert.id


def test_the_alert_resolves_when_a_later_commit_passes(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    good, bad, fixed = toy_repo.history()
    commit_ids, run_ids = record(factory, toy_repo, [good, bad, fixed], tested=[good, bad, fixed])

    drive(run_ids[:2])
    (alert,) = alerts(factory)
    assert (alert.kind, alert.state, alert.first_bad_commit_id) == (AlertKind.violation, AlertState.open, commit_ids[bad])
    drive(run_ids[2:])

    (alert,) = alerts(factory)
    assert (alert.state, alert.resolved_by_commit_id) == (AlertState.resolved, commit_ids[fixed])
    assert [(n.event, n.alert_id) for n in slack_rows(factory)] == [("opened", alert.id), ("resolved", alert.id)]


def test_without_confirmation_the_first_failing_run_alerts(
    factory: sessionmaker[Session], toy_repo: ToyRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECWATCH_WORKER_CONFIRM_FAILURES", "false")
    clear_caches()
    good, bad, _ = toy_repo.history()
    _, run_ids = record(factory, toy_repo, [good, bad], tested=[good, bad])

    assert drive(run_ids) == run_ids

    (alert,) = alerts(factory)
    assert (alert.kind, alert.confirmed, alert.confirmation_run_id) == (AlertKind.violation, False, None)


def test_an_unconfirmed_failure_raises_no_alert(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    """A first run that failed by chance: its confirmation (fresh seeds) passes, so nobody is paged."""
    good = toy_repo.commit(CORRECT, "correct")
    _, (run_id,) = record(factory, toy_repo, [good], tested=[good])
    tasks.run_suite(run_id)
    with session_scope(factory) as session:  # make the stored first run look like a (false) rejection
        run = session.get_one(Run, run_id)
        run.status = RunStatus.failed
        for case in run.case_results:
            case.verdict, case.lossless = Verdict.FAIL, False
            case.log_e_value = math.log(case.threshold or 1.0) + 0.5

    report = tasks.analyse_run(run_id)
    drive(report["queued"])

    assert alerts(factory) == []
    with factory() as session:
        confirmation = session.scalars(select(Run).where(Run.parent_run_id == run_id)).one()
        assert confirmation.seed_attempt == 1
        assert confirmation.analysis is not None
        assert confirmation.analysis["confirmed"] == []
        first = {c.case_id: c.seed for c in session.get_one(Run, run_id).case_results}
        again = {c.case_id: c.seed for c in confirmation.case_results}
        assert set(first) == set(again)
        assert all(first[c] != again[c] for c in first)  # fresh seeds


def test_fingerprints_mark_a_refactor_unchanged_and_a_bug_changed(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    """Runs of different commits draw different seeds, yet a commit that only rewrites the sampler's source
    keeps every case's output fingerprint; the commit that breaks it changes the failing cases' ones."""
    good = toy_repo.commit(CORRECT, "correct")
    refactor = toy_repo.commit(CORRECT.replace('"""Speculative sampling', '"""Speculative sampling, reworded:', 1), "reword")
    bad = toy_repo.commit(SWAPPED_RESIDUAL, "swap the residual")
    _, run_ids = record(factory, toy_repo, [good, refactor, bad], tested=[good, refactor, bad])

    drive(run_ids)

    with factory() as session:
        good_run, refactor_run, bad_run = (session.get_one(Run, run_id) for run_id in run_ids)
        assert good_run.seed != refactor_run.seed
        cases = sorted(c.case_id for c in refactor_run.case_results)
        assert refactor_run.analysis is not None
        assert bad_run.analysis is not None
        assert refactor_run.analysis["unchanged_cases"] == cases
        failing = bad_run.analysis["failing"]
        assert failing
        assert not set(failing) & set(bad_run.analysis["unchanged_cases"])


def test_an_acceptance_drift_is_bisected_to_its_first_commit(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    """Lossless throughout, but from commit 5 of an 8-commit push the mean acceptance of one case moves (the
    stored runs of commits 5.. are given a higher acceptance, as a change the conformance checks missed
    would): the PERFORMANCE alert names commit 5, after at most ceil(log2 8) bisection runs."""
    base = toy_repo.commit(CORRECT, "base, tested earlier")
    push = [
        toy_repo.commit(CORRECT.replace("vectorised over trials", f"vectorised over trials (rev {i})", 1), f"commit {i}")
        for i in range(1, 9)
    ]
    commit_ids, (base_run, head_run) = record(factory, toy_repo, [base, *push], tested=[base, push[-1]])
    shifted = {commit_ids[sha] for sha in push[4:]}
    case_id = "direct/far_apart/V8/g3"

    def shift_acceptance(run_id: int) -> None:
        with session_scope(factory) as session:
            run = session.get_one(Run, run_id)
            if run.commit_id not in shifted:
                return
            case = session.scalars(select(CaseResult).where(CaseResult.run_id == run_id, CaseResult.case_id == case_id)).one()
            assert case.acceptance_observed is not None
            case.acceptance_observed = min(3.0, case.acceptance_observed + 0.6)

    drive([base_run], between=shift_acceptance)
    extra = drive([head_run], between=shift_acceptance)[1:]

    assert 1 <= len(extra) <= math.ceil(math.log2(8))
    (alert,) = alerts(factory)
    assert (alert.kind, alert.state, alert.confirmed) == (AlertKind.performance, AlertState.open, False)
    assert alert.first_bad_commit_id == commit_ids[push[4]]  # commit 5
    assert alert.last_good_commit_id == commit_ids[push[3]]
    assert alert.bisection_runs == len(extra)
    assert [c["case_id"] for c in alert.cases] == [case_id]
    assert alert.cases[0]["reason"] == "drift"
    assert alert.cases[0]["difference"] > alert.cases[0]["radius"] > 0
    with factory() as session:
        assert {session.get_one(Run, run_id).purpose for run_id in extra} == {RunPurpose.bisection}
    (message,) = slack_rows(factory)
    assert (message.event, message.alert_id) == ("opened", alert.id)


# A bug that shows for some inputs only (as greedy != assisted on one prompt): the sampler emits an impossible token in
# the trials drawn with the commit's own seeds (attempt 0, read from the suite's --seed), never with fresh ones.
ONE_INPUT_BUG = CORRECT.replace(
    "import torch\n",
    "import sys\n\nimport torch\n\nfrom specwatch.provenance import derive_seed\n\n"
    "_SEED = int(sys.argv[sys.argv.index('--seed') + 1]) if '--seed' in sys.argv else None\n"
    "_FIRST = {derive_seed(_SEED, c, 0) for c in ('direct/far_apart/V8/g1', 'direct/far_apart/V8/g3')} if _SEED is not None else set()\n",
    1,
).replace(
    "    return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=n_accepted)\n",
    "    if generator.initial_seed() in _FIRST:\n        tokens[0, n_accepted[0]] = p.shape[1]\n"
    "    return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=n_accepted)\n",
    1,
)


def test_a_counterexample_is_replayed_with_the_first_runs_inputs_before_fresh_ones(
    factory: sessionmaker[Session], toy_repo: ToyRepo
) -> None:
    """Issue 37: the confirmation run replays each case whose first run found a certain violation with that run's
    seeds (the same inputs) before drawing its own. The fresh inputs pass, the replayed ones fail the same way: the
    alert is confirmed by the counterexample coming back, where a fresh-only confirmation dropped it."""
    assert ONE_INPUT_BUG.count("_FIRST") == 2  # both replacements took
    sha = toy_repo.commit(ONE_INPUT_BUG, "A sampler wrong on some inputs")
    _, (run_id,) = record(factory, toy_repo, [sha], tested=[sha])

    drive([run_id])

    with factory() as session:
        first = {c.case_id: c for c in session.get_one(Run, run_id).case_results}
        confirmation = session.scalars(select(Run).where(Run.parent_run_id == run_id, Run.purpose == RunPurpose.confirmation)).one()
        assert {c: (r.verdict, r.details["certain"]) for c, r in first.items()} == {c: (Verdict.FAIL, ["lossless"]) for c in first}
        args = confirmation.result_header["suite_args"]
        assert args[args.index("--attempt") :] == [
            "--attempt",
            "1",
            *[a for c in sorted(first) for a in ("--replay", c)],
            "--replay-attempt",
            "0",
        ]
        for again in confirmation.case_results:
            replay = again.details["replay"]
            assert again.verdict is Verdict.PASS  # fresh inputs: nothing wrong
            assert (replay["attempt"], replay["seed"], replay["verdict"], replay["certain"]) == (
                0,
                first[again.case_id].seed,
                "fail",
                ["lossless"],
            )
            assert replay["reason"] == first[again.case_id].details["reason"]
    (alert,) = alerts(factory)
    assert (alert.kind, alert.confirmed) == (AlertKind.violation, True)
    assert {e["case_id"]: e["confirmed_by"] for e in alert.cases} == dict.fromkeys(first, "counterexample replayed")
    assert all(e["replay"].startswith(f"seed {first[e['case_id']].seed}: ") for e in alert.cases)


def test_a_fix_after_skipped_commits_is_bisected_to_its_first_good_commit(factory: sessionmaker[Session], toy_repo: ToyRepo) -> None:
    """Issue 37: with the head policy a push of several commits tests its head only; the head passing shows the alert's
    cases fixed, but where? A first-good-commit search (the mirror of the first-bad one) tests the skipped commits'
    midpoints and moves the cases' fixed_sha, and the alert's resolving commit, to the first commit that passes."""
    good = toy_repo.commit(CORRECT, "base")
    bad = toy_repo.commit(SWAPPED_RESIDUAL, "Simplify the residual")
    push = [toy_repo.commit(SWAPPED_RESIDUAL if i < 2 else CORRECT, f"commit {i}") for i in range(5)]  # push[2] fixes it
    commit_ids, (good_run, bad_run, head_run) = record(factory, toy_repo, [good, bad, *push], tested=[good, bad, push[-1]])
    drive([good_run, bad_run])
    (alert,) = alerts(factory)
    assert (alert.state, alert.first_bad_commit_id) == (AlertState.open, commit_ids[bad])

    extra = drive([head_run])[1:]

    (alert,) = alerts(factory)
    assert (alert.state, alert.resolved_by_commit_id) == (AlertState.resolved, commit_ids[push[2]])
    assert {e["case_id"]: e["fixed_sha"] for e in alert.cases} == {e["case_id"]: push[2] for e in alert.cases}
    with factory() as session:
        purposes = {session.get_one(Run, run_id).purpose for run_id in extra}
        search = session.get_one(Run, head_run).analysis["fix_searches"]
    assert purposes == {RunPurpose.bisection}
    assert len(extra) <= math.ceil(math.log2(4 + 1))  # 4 untested commits between the last failing one and the head
    assert [(s["done"], s["first_good"], s["last_bad"], s["runs"]) for s in search] == [(True, push[2], push[1], len(extra))]
    assert [(n.event, n.alert_id) for n in slack_rows(factory)] == [("opened", alert.id), ("resolved", alert.id), ("fix-located", alert.id)]
    assert block_kit_problems(slack_rows(factory)[-1].payload) == []
    located = slack_rows(factory)[-1].payload["text"]
    assert located.startswith("First good commit found: Losslessness violation in toy")
    assert f"fixed at `{push[2][:12]}`" in str(slack_rows(factory)[-1].payload["blocks"])
    print(f"fix bisection: 4 skipped commits, first good = the third, after {len(extra)} runs")
