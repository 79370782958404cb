"""Analysis decisions: confirmation, acceptance drift and bisection."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from service.models import AlertKind, CaseResult, RunStatus, Verdict
from workers.analysis.bisection import commit_outcome, known_at
from workers.analysis.decisions import (
    REPLAYED,
    AcceptanceSample,
    CaseOutcome,
    CheckEvidence,
    CommitOutcome,
    FixBisection,
    RunEvidence,
    Signature,
    acceptance_drift,
    bisect,
    bisect_fix,
    classify,
    confirmation,
    signatures_differ,
)
from workers.analysis.history import TestedRun

T = 1e6


def _case(*checks: tuple[str, str, bool, float | None], certain: frozenset[str] = frozenset(), raised: bool = False) -> RunEvidence:
    """Evidence of one case: (check, layer, rejected, stopped e-value or None for a certain refutation)."""
    return RunEvidence(
        T,
        tuple(CheckEvidence(name, layer, rejected, None if e is None else math.log(e)) for name, layer, rejected, e in checks),
        certain,
        raised,
    )


def test_confirmation_multiplies_the_same_checks_stopped_e_values():
    first = _case(("lossless/pos1", "lossless", True, 1e9), ("lossless/pos2", "lossless", False, 0.5))
    assert confirmation(first, _case(("lossless/pos1", "lossless", False, 1e3)), "lossless") == "lossless/pos1"  # 1e12 >= T^2
    assert confirmation(first, _case(("lossless/pos1", "lossless", False, 1e2)), "lossless") is None
    # Another check's evidence does not multiply with this one's.
    assert (
        confirmation(first, _case(("lossless/pos1", "lossless", False, 1.0), ("lossless/pos2", "lossless", False, 1e5)), "lossless") is None
    )
    # Or the same check rejects again in the rerun (its running maximum past T: Ville, independent runs).
    assert confirmation(first, _case(("lossless/pos1", "lossless", True, 10.0)), "lossless") == "lossless/pos1"
    # A certain refutation of the layer in the rerun confirms it.
    assert confirmation(first, _case(certain=frozenset({"lossless"})), "lossless") == "certain violation"
    assert confirmation(first, _case(("lossless/pos1", "lossless", False, None)), "lossless") == "lossless/pos1"


def test_a_certain_violation_is_not_confirmed_by_a_clean_rerun():
    """A certain refutation in the first run (stopped e-value None) used to count as an infinite factor, so any
    rerun confirmed it, a clean one included (docs/statistics.md section 8 asks for evidence in the rerun)."""
    first = _case(("lossless/pos1", "lossless", True, None), certain=frozenset({"lossless"}))
    clean = _case(("lossless/pos1", "lossless", False, 0.3), ("lossless/pos2", "lossless", False, 2.0))
    assert confirmation(first, clean, "lossless") is None
    # Evidence just short of the rerun's own threshold does not confirm either; at the threshold it does.
    assert confirmation(first, _case(("lossless/pos1", "lossless", False, T / 2)), "lossless") is None
    assert confirmation(first, _case(("lossless/pos1", "lossless", False, T)), "lossless") == "lossless/pos1"
    # A rejection or a certain violation of the layer in the rerun confirms it.
    assert confirmation(first, _case(("lossless/pos1", "lossless", True, 1.0)), "lossless") == "lossless/pos1"
    assert confirmation(first, _case(certain=frozenset({"lossless"})), "lossless") == "certain violation"
    assert confirmation(first, _case(("lossless/pos1", "lossless", False, None)), "lossless") == "lossless/pos1"
    # A certain violation of another layer in the rerun does not.
    assert confirmation(first, _case(("lossless/pos1", "lossless", False, 1.0), certain=frozenset({"conformance"})), "lossless") is None


def test_a_counterexample_replayed_with_the_first_runs_inputs_confirms_a_certain_violation():
    """Issue 37: greedy != assisted on one prompt, then 64 fresh prompts all equal, and the case left the alert. The
    confirmation now replays the case with the first run's seeds first: the counterexample coming back confirms it,
    whatever the fresh inputs show; one that does not come back leaves the fresh inputs to decide."""
    first = _case(("lossless/pos1", "lossless", True, None), certain=frozenset({"lossless"}))
    clean = (("lossless/pos1", "lossless", False, 0.3),)
    replayed = RunEvidence(T, tuple(_case(*clean).checks), replayed=frozenset({"lossless"}))
    assert confirmation(first, replayed, "lossless") == REPLAYED
    assert confirmation(first, RunEvidence(T, tuple(_case(*clean).checks)), "lossless") is None  # not replayed
    # A replay that misses it (a nondeterministic library) leaves the fresh evidence to decide.
    assert confirmation(first, _case(certain=frozenset({"lossless"})), "lossless") == "certain violation"
    # The replay's violation of another layer, or a replay of a failure that was not certain, confirms nothing.
    assert confirmation(first, RunEvidence(T, tuple(_case(*clean).checks), replayed=frozenset({"conformance"})), "lossless") is None
    statistical = _case(("lossless/pos1", "lossless", True, T * 10))
    assert confirmation(statistical, replayed, "lossless") is None


def test_running_maxima_are_not_multiplied():
    """The old rule multiplied the case-level running maxima (1e7 x 1e5 >= 1e12): a rerun whose check wandered
    up to 1e5 and ended at 0.01 confirmed. Its stopped value does not, and it never rejected."""
    first = _case(("lossless/pos1", "lossless", True, 1e7))
    assert confirmation(first, _case(("lossless/pos1", "lossless", False, 1e-2)), "lossless") is None


def test_confirmation_stays_within_the_layer_of_the_alert():
    """A conformance-only certain violation (or rejection) in the rerun does not confirm a lossless alert."""
    first = _case(("lossless/pos1", "lossless", True, 1e7), ("conformance/K", "conformance", True, 1e8))
    rerun = _case(
        ("lossless/pos1", "lossless", False, 0.5), ("conformance/K", "conformance", True, 1e9), certain=frozenset({"conformance"})
    )
    assert confirmation(first, rerun, "lossless") is None
    assert confirmation(first, rerun, "conformance") == "certain violation"
    assert confirmation(_case(raised=True), _case(raised=True), "raised") == "raised again"
    assert confirmation(_case(raised=True), rerun, "raised") is None


def test_confirmation_false_alarm_rate_under_the_null():
    """Under H0 each stopped e-value has mean <= 1; the product of two independent ones crosses T^2 with
    probability <= 1/T^2 (Markov), and both running maxima cross T with probability <= 1/T^2 (Ville): per
    check at most 2/T^2. Simulated with a mean-one bet on a fair coin stopped at a random time: no crossing
    in 20,000 pairs at T = 100 (expected at most 4)."""
    rng = np.random.default_rng(0)
    threshold = 100.0

    def null_check() -> CheckEvidence:
        steps = np.where(rng.random(200) < 0.5, math.log(1.2), math.log(0.8))
        path = np.cumsum(steps)
        stop = int(rng.integers(1, 201))  # a stopping time independent of the future
        return CheckEvidence("c", "lossless", bool(path[:stop].max() >= math.log(threshold)), float(path[stop - 1]))

    def null_case() -> RunEvidence:
        return RunEvidence(threshold, (null_check(),))

    alarms = sum(confirmation(null_case(), null_case(), "lossless") is not None for _ in range(20_000))
    assert alarms <= 5


def test_a_target_that_raised_is_its_own_kind():
    cases = [CaseOutcome("a", "fail", None, None, raised=True), CaseOutcome("b", "pass", True, True)]
    assert classify("failed", cases) == (AlertKind.exception, ["a"])
    lossy = [*cases, CaseOutcome("c", "fail", False, False)]
    # A lossless failure is worse news (the kind), and the case that raised beside it is still named.
    assert classify("failed", lossy) == (AlertKind.violation, ["c", "a"])
    assert classify("failed", [CaseOutcome("d", "fail", True, False)]) == (AlertKind.performance, ["d"])
    assert classify("error", cases) == (AlertKind.broken, [])


def test_acceptance_drift_is_calibrated_and_detects_a_drop():
    rng = np.random.default_rng(1)
    gamma, n = 3, 20_000

    def sample(p: float) -> AcceptanceSample:
        k = rng.binomial(gamma, p, size=n)
        return AcceptanceSample(mean=float(k.mean()), trials=n, gamma=gamma)

    baseline = [sample(0.6) for _ in range(3)]
    false_alarms = sum(acceptance_drift(sample(0.6), baseline, alpha=1e-3).significant for _ in range(200))
    assert false_alarms == 0
    drop = acceptance_drift(sample(0.5), baseline, alpha=1e-3)
    assert drop is not None
    assert drop.significant
    assert drop.difference < 0
    assert acceptance_drift(sample(0.6), [], alpha=1e-3) is None


@pytest.mark.parametrize("bound", [3, 11])
def test_acceptance_drift_false_alarm_rate_holds_at_alpha_for_a_range_of_b(bound: int) -> None:
    """Under "same mean" the drift test alarms with probability <= alpha for accepted counts in [0, B], whatever
    their law; the hardest law for Hoeffding is the two-point one on {0, B} (the largest variance). Simulated at
    alpha = 0.05 over 4,000 comparisons of 100 trials against 300: at most 5 % plus four binomial standard errors.
    Measured with a range three times too small (B / 3.67, the gamma a direct case of the same id would give),
    the same comparisons alarm far beyond alpha: the range is what makes the test calibrated."""
    rng = np.random.default_rng(bound)
    alpha, repeats, n_current, n_baseline = 0.05, 4_000, 100, 300
    current = bound * rng.binomial(1, 0.5, size=(repeats, n_current)).mean(axis=1)
    baseline = bound * rng.binomial(1, 0.5, size=(repeats, n_baseline)).mean(axis=1)

    def alarms(b: int) -> int:
        found = (
            acceptance_drift(AcceptanceSample(float(c), n_current, b), [AcceptanceSample(float(m), n_baseline, b)], alpha)
            for c, m in zip(current, baseline, strict=True)
        )
        return sum(d is not None and d.significant for d in found)

    assert alarms(bound) <= alpha * repeats + 4 * math.sqrt(alpha * (1 - alpha) * repeats)
    assert alarms(max(1, round(bound / 3.67))) > 2 * alpha * repeats


def test_acceptance_drift_detects_an_end_to_end_drop_over_its_range() -> None:
    """Accepted drafts per trial in [0, 11] (a 12-token horizon): a drop from about 7 to about 1 is flagged at the
    default per-run alpha from one run of 100 trials against five of 100."""
    rng = np.random.default_rng(3)

    def sample(mean: float, n: int) -> AcceptanceSample:
        k = rng.binomial(11, mean / 11, size=n)
        return AcceptanceSample(mean=float(k.mean()), trials=n, gamma=11)

    baseline = [sample(7.07, 100) for _ in range(5)]
    drop = acceptance_drift(sample(1.0, 100), baseline, alpha=1e-4)
    assert drop is not None
    assert drop.significant
    assert drop.difference < 0
    assert not acceptance_drift(sample(7.07, 100), baseline, alpha=1e-4).significant


def _run_bisection(commits: list[str], first_bad: int, outcomes: dict[str, CommitOutcome]) -> tuple[str | None, int]:
    runs = 0
    while True:
        state = bisect(commits, outcomes)
        if state.next_to_test is None:
            return state.first_bad, runs
        runs += 1
        outcomes[state.next_to_test] = CommitOutcome.BAD if commits.index(state.next_to_test) >= first_bad else CommitOutcome.GOOD


@pytest.mark.parametrize("first_good", range(1, 9))
def test_a_fix_is_bisected_to_its_first_good_commit_in_log_runs(first_good):
    """The mirror search: c0 tested failing, c1..c8 pushed together, the head c8 tested passing."""
    commits = [f"c{i}" for i in range(9)]
    outcomes = {"c0": CommitOutcome.BAD, "c8": CommitOutcome.GOOD}
    runs = 0
    while (state := bisect_fix(commits, outcomes)).next_to_test is not None:
        runs += 1
        outcomes[state.next_to_test] = CommitOutcome.GOOD if commits.index(state.next_to_test) >= first_good else CommitOutcome.BAD
    assert (state.first_good, state.last_bad) == (f"c{first_good}", f"c{first_good - 1}")
    assert runs <= math.ceil(math.log2(8))


def test_a_fix_search_belongs_to_the_newest_streak_and_skips_commits_that_cannot_tell():
    good, bad, unknown = CommitOutcome.GOOD, CommitOutcome.BAD, CommitOutcome.UNKNOWN
    # Fixed at c1, failing again at c3, fixed again by the head: the search is about the newest streak of passes.
    assert bisect_fix(["c0", "c1", "c2", "c3", "c4"], {"c0": bad, "c1": good, "c3": bad, "c4": good}).first_good == "c4"
    # A broken commit between the last failure and the first pass is not retested: the first pass is named.
    assert bisect_fix(["c0", "c1", "c2"], {"c0": bad, "c1": unknown, "c2": good}) == FixBisection("c2", None, "c0")


@pytest.mark.parametrize("first_bad", range(1, 9))
def test_bisection_finds_the_first_bad_commit_in_log_runs(first_bad):
    commits = [f"c{i}" for i in range(9)]  # c0 tested good, c1..c8 pushed together, head c8 tested bad
    found, runs = _run_bisection(commits, first_bad, {"c0": CommitOutcome.GOOD, "c8": CommitOutcome.BAD})
    assert found == f"c{first_bad}"
    assert runs <= math.ceil(math.log2(8))


def test_bisection_skips_broken_commits_and_needs_a_good_one():
    commits = ["a", "b", "c", "d"]
    state = bisect(commits, {"a": CommitOutcome.GOOD, "b": CommitOutcome.UNKNOWN, "c": CommitOutcome.UNKNOWN, "d": CommitOutcome.BAD})
    assert (state.first_bad, state.next_to_test, state.last_good) == ("d", None, "a")
    assert bisect(commits, {"c": CommitOutcome.BAD}).first_bad == "c"
    assert bisect(commits, {"a": CommitOutcome.GOOD}).first_bad is None


@pytest.mark.parametrize("status", [RunStatus.uninstallable, RunStatus.error])
def test_a_commit_that_could_not_be_installed_is_never_bad_in_a_bisection(status):
    entries = [{"case_id": "direct/a/V8/g1", "reason": "lossless"}]
    assert commit_outcome([TestedRun(1, status, None, {})], entries) is CommitOutcome.UNKNOWN
    # A later run of the commit that installed and passed decides instead.
    assert commit_outcome([TestedRun(1, status, None, {}), TestedRun(2, RunStatus.passed, None, {})], entries) is CommitOutcome.GOOD


_STAT = Signature("lossless", "lossless/pos1", "statistical", (0.10, 0.30), frozenset({"lossless/pos1", "lossless/pos2"}))


@pytest.mark.parametrize(
    ("new", "differs"),
    [
        (_STAT, False),
        (replace(_STAT, tv=(0.25, 0.5)), False),  # overlapping intervals: the same bug measured again
        (replace(_STAT, tv=(0.40, 0.52)), True),  # disjoint: the distance itself moved
        (replace(_STAT, evidence="certain"), True),  # statistical turned certain
        (replace(_STAT, reason="conformance"), True),  # another layer
        (replace(_STAT, check="lossless/pos2", checks=frozenset({"lossless/pos2"})), False),  # a shared rejecting check
        (replace(_STAT, check="lossless/pos4", checks=frozenset({"lossless/pos4"})), True),  # another position
        (replace(_STAT, check=None, checks=frozenset(), tv=None), False),  # nothing to compare: the same
        (Signature("raised", "RuntimeError", "exception"), True),
    ],
)
def test_how_two_signatures_of_a_case_are_compared(new: Signature, differs: bool) -> None:
    assert signatures_differ(new, _STAT) is differs
    assert signatures_differ(_STAT, new) is differs  # symmetric
    assert Signature.from_dict(new.as_dict()) == new  # stored as JSON in alert entries


def test_a_failure_another_alert_stood_for_is_not_bad_in_a_bisection():
    """Issue 42: at a midpoint where another alert stood for the case for another reason than the search's (its
    lossless failure, under a conformance or drift search), its failure is that alert's: the commit cannot tell
    (unknown), unless another case of the search is bad there."""

    def failing(case_id: str, *, lossless: bool) -> CaseResult:
        return CaseResult(case_id=case_id, verdict=Verdict.FAIL, lossless=lossless, conformance=not lossless)

    a, b = "direct/a/V8/g1", "direct/b/V8/g1"
    runs = [TestedRun(1, RunStatus.failed, None, {a: failing(a, lossless=False)})]
    entries = [{"case_id": a, "reason": "lossless"}]
    assert commit_outcome(runs, entries) is CommitOutcome.BAD
    # Known for the search's own reason: the same failure, so the search names that alert's commit again (reopens it).
    assert commit_outcome(runs, entries, {(a, "lossless")}) is CommitOutcome.BAD
    assert commit_outcome(runs, entries, {(b, "lossless")}) is CommitOutcome.BAD
    both = [TestedRun(1, RunStatus.failed, None, {a: failing(a, lossless=False), b: failing(b, lossless=False)})]
    two = [*entries, {"case_id": b, "reason": "lossless"}]
    assert commit_outcome(both, two, {(a, "lossless")}) is CommitOutcome.BAD  # b is new there
    conformance = [TestedRun(1, RunStatus.failed, None, {a: failing(a, lossless=True)})]
    assert commit_outcome(conformance, [{"case_id": a, "reason": "conformance"}], {(a, "lossless")}) is CommitOutcome.UNKNOWN
    standing = [((3, 6), {(a, "lossless")}), ((5, None), {(b, "raised")})]
    assert [sorted(known_at(standing, order)) for order in (2, 3, 5, 6)] == [
        [],
        [(a, "lossless")],
        [(a, "lossless"), (b, "raised")],
        [(b, "raised")],
    ]
