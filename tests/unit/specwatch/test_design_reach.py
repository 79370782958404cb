"""A case is sized on the positions reached at least as often as its TV distance (``evidence.design_reach``).

docs/statistics.md §7, "Reach": a sampler that is exact except at a position reached with probability r emits a
record within TV r of the exact one, so a position reached less often than epsilon cannot carry a TV-epsilon bug on
its own. It still runs (its e-process can reject) but does not set the cap; the bonus path it would cover is sized in
the cases that reach it often."""

from __future__ import annotations

import math

import pytest
import torch

from specwatch.cases import CASES, select
from specwatch.evidence import MIN_DESIGN_REACH, design_reach, designed_checks
from specwatch.mutants import MUTANTS
from specwatch.protocol import Failure, Verdict
from specwatch.runner import SuiteConfig, rejection_threshold, run_case, trial_cap
from specwatch.sampling import reference_sampler
from specwatch.stats import plan_test, trials_for_observations

BONUS_ONLY = MUTANTS["bonus_from_last_draft_position"]
EPSILON = 0.05


def _experiment(case_id: str, sampler=reference_sampler):  # type: ignore[no-untyped-def]
    (case,) = select([case_id], CASES)
    return case, case.build(sampler, torch.device("cpu"))


@pytest.mark.unit
def test_the_least_designed_reach_is_the_tv_distance_at_least_1e_3() -> None:
    assert design_reach(0.05) == 0.05
    assert design_reach(0.3) == 0.3
    assert design_reach(1e-5) == MIN_DESIGN_REACH == 1e-3


@pytest.mark.unit
def test_a_bonus_position_reached_less_often_than_epsilon_runs_but_does_not_set_the_cap() -> None:
    """top-k on the draft, three drafts: the bonus (position 4) is reached in about 2 % of trials; sizing on it took
    953,108 trials, sizing on position 3 (about 8 %) takes a quarter of that."""
    _, experiment = _experiment("direct/top_k_draft/V64/g3")
    reach = {c.name: c.reach for c in experiment.checks}
    assert reach["lossless/pos4"] < EPSILON <= reach["lossless/pos3"]
    designed = {c.name for c in designed_checks(experiment, EPSILON)}
    assert "lossless/pos4" not in designed
    assert {"lossless/pos1", "lossless/pos2", "lossless/pos3"} <= designed
    assert {c.name for c in designed_checks(experiment, 1e-3)} >= designed | {"lossless/pos4"}

    threshold = rejection_threshold(1e-4, 55)
    config = SuiteConfig(epsilon=EPSILON)
    cap = trial_cap(experiment, config, EPSILON, threshold)

    def sized_on(name: str) -> float:
        check = next(c for c in experiment.checks if c.name == name)
        needed = plan_test(check.support, check.reach, EPSILON, 1.0 / threshold, config.beta).needed
        return trials_for_observations(needed, check.reach, 1e-3, limit=config.max_trials)

    assert cap == max(math.ceil(sized_on(name)) for name in designed)
    assert cap < 0.3 * sized_on("lossless/pos4")


@pytest.mark.unit
def test_the_rarely_reached_position_is_still_checked_and_reported_undesigned() -> None:
    """The default run of the case: position 4's check counts what reached it and says it is not designed; a pass
    is powered by the designed checks alone."""
    case, experiment = _experiment("direct/top_k_draft/V64/g3")
    result = run_case(case, experiment, SuiteConfig(seed=2), len(experiment.checks))
    assert result.verdict == Verdict.PASS, result.reason
    assert result.powered
    bonus = next(c for c in result.checks if c.name == "lossless/pos4")
    assert not bonus.designed
    assert 0 < bonus.observations < EPSILON * result.n_trials
    assert all(c.designed for c in result.checks if c.name in {"lossless/pos1", "lossless/pos2", "lossless/pos3"})


@pytest.mark.unit
def test_a_bug_confined_to_a_rarely_reached_position_moves_the_record_by_at_most_its_reach() -> None:
    """The premise of the rule, measured: the bonus-only mutant and the reference draw the same records (same
    generator) except where every draft was accepted, which happens in about the bonus position's reach."""
    _, experiment = _experiment("direct/top_k_draft/V64/g3")
    n = 200_000
    exact = reference_sampler(experiment.step, n, torch.Generator().manual_seed(7))
    mutant = BONUS_ONLY.sampler(experiment.step, n, torch.Generator().manual_seed(7))
    differs = ((exact.tokens != mutant.tokens).any(dim=1) | (exact.n_accepted != mutant.n_accepted)).numpy()
    reach = next(c.reach for c in experiment.checks if c.name == "lossless/pos4")
    all_accepted = (exact.n_accepted == experiment.step.gamma).numpy()
    assert not differs[~all_accepted].any()  # the coupling: identical records wherever the bonus is not reached
    assert differs.mean() <= all_accepted.mean() == pytest.approx(reach, rel=0.05)
    # So the TV distance between the two records' laws is at most the reach, below the case's design:
    assert reach < EPSILON


@pytest.mark.unit
def test_the_bonus_only_bug_fails_a_case_that_reaches_its_bonus_often() -> None:
    """The same mutant against the target-temperature case (bonus reached in about 18 % of trials, designed): the
    default design rejects it at the bonus position."""
    case, experiment = _experiment("direct/temperature_target/V64/g3", BONUS_ONLY.sampler)
    bonus = next(c for c in experiment.checks if c.name == "lossless/pos4")
    assert bonus.reach >= EPSILON
    for seed in (1, 2, 3):
        result = run_case(case, experiment, SuiteConfig(seed=seed), len(experiment.checks))
        assert (result.verdict, result.failure) == (Verdict.FAIL, Failure.LOSSLESS), result.reason
        assert next(c for c in result.checks if c.name == "lossless/pos4").rejected
