"""Analysis decisions: confirmation, acceptance drift and bisection."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers.analysis import AcceptanceSample, Evidence, Outcome, acceptance_drift, bisect, confirmed


def test_confirmation_multiplies_e_values():
    threshold = 1e6
    strong = Evidence(log_e_value=math.log(1e9), threshold=threshold)
    assert confirmed(strong, Evidence(math.log(1e3), threshold))  # 1e12 >= 1e12
    assert not confirmed(strong, Evidence(math.log(1e2), threshold))
    weak = Evidence(log_e_value=math.log(2e6), threshold=threshold)
    assert not confirmed(weak, Evidence(math.log(1e5), threshold))
    assert confirmed(weak, Evidence(None, threshold))  # a certain refutation confirms on its own
    assert confirmed(Evidence(None, threshold), Evidence(0.0, threshold))


def test_confirmation_false_alarm_rate_under_the_null():
    """Under H0 each e-value has mean <= 1; with E ~ a likelihood ratio of a null Bernoulli stream the
    product crosses T^2 with probability <= 1/T^2 (Markov). Simulated: no crossing in 20,000 pairs."""
    rng = np.random.default_rng(0)
    threshold = 100.0

    def null_log_e() -> float:
        x = rng.random(200) < 0.5
        return float(np.sum(np.where(x, math.log(1.2), math.log(0.8))))  # mean-one bet on a fair coin

    alarms = sum(confirmed(Evidence(null_log_e(), threshold), Evidence(null_log_e(), threshold)) for _ in range(20_000))
    assert alarms <= 3  # bound: 20,000 / 1e4 = 2 expected at most


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


def _run_bisection(commits: list[str], first_bad: int, outcomes: dict[str, Outcome]) -> tuple[str | None, int]:
    runs = 0
    while True:
        state = bisect(commits, outcomes)
        if state.next_to_test is None:
            return state.first_bad, runs
        runs += 1
        outcomes[state.next_to_test] = Outcome.BAD if commits.index(state.next_to_test) >= first_bad else Outcome.GOOD


@pytest.mark.parametrize("first_bad", range(1, 9))
def test_bisection_finds_the_first_bad_commit_in_log_runs(first_bad):
    commits = [f"c{i}" for i in range(9)]  # c0 tested good, c1..c8 pushed together, head c8 tested bad
    found, runs = _run_bisection(commits, first_bad, {"c0": Outcome.GOOD, "c8": Outcome.BAD})
    assert found == f"c{first_bad}"
    assert runs <= math.ceil(math.log2(8))


def test_bisection_skips_broken_commits_and_needs_a_good_one():
    commits = ["a", "b", "c", "d"]
    state = bisect(commits, {"a": Outcome.GOOD, "b": Outcome.UNKNOWN, "c": Outcome.UNKNOWN, "d": Outcome.BAD})
    assert (state.first_bad, state.next_to_test, state.last_good) == ("d", None, "a")
    assert bisect(commits, {"c": Outcome.BAD}).first_bad == "c"
    assert bisect(commits, {"a": Outcome.GOOD}).first_bad is None
