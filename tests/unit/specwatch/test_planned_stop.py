"""Issue 39, item 2: a case stops once every designed check is done, by its pass statistic or by the observations its
design plans (docs/statistics.md §7a, "Stopping when the designed checks are done"): it waits for its rarest designed
check, still catches a bug of size epsilon, passes the correct sampler and records why it stopped."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from specwatch import evidence
from specwatch.cases import Case, select
from specwatch.experiments import CheckSpec, Observation
from specwatch.mutants import MUTANTS
from specwatch.protocol import Failure, Layer, RunResult, Stop, Verdict
from specwatch.runner import SuiteConfig, run_case, run_suite
from specwatch.sampling import reference_sampler

EPSILON = 0.1
TESTS = 100  # threshold m / alpha = 1e6
UNIFORM16, UNIFORM256 = np.full(16, 1 / 16), np.full(256, 1 / 256)


def _shifted(p0: np.ndarray, tv: float) -> np.ndarray:
    """p0 moved by TV ``tv`` proportionally: up on the first half of the cells, down on the rest (least favourable)."""
    half = len(p0) // 2
    law = p0.copy()
    law[:half] *= 1 + tv / p0[:half].sum()
    law[half:] *= 1 - tv / p0[half:].sum()
    return law


class _CommonAndRare:
    """A common designed check (256 cells, one observation per trial) and a rare one (16 cells, reached by a trial with
    probability ``RARE_REACH``, the case's epsilon: the least reach that is designed): the rare check sets the cap, the
    common one has its planned observations long before. ``laws``: the observations' laws (the nulls when clean)."""

    RARE_REACH = EPSILON
    expected_acceptance = None
    accepted_per_trial_max = None
    fixed_trials = None

    def __init__(self, common: np.ndarray = UNIFORM256, rare: np.ndarray = UNIFORM16) -> None:
        self.laws = {"lossless/common": common, "lossless/rare": rare}
        self.checks = (
            CheckSpec("lossless/common", Layer.LOSSLESS, UNIFORM256, 1.0),
            CheckSpec("lossless/rare", Layer.LOSSLESS, UNIFORM16, self.RARE_REACH),
        )

    def run(self, n: int, generator: torch.Generator) -> Observation:
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
        reached = int(rng.binomial(n, self.RARE_REACH))
        common, rare = self.laws["lossless/common"], self.laws["lossless/rare"]
        counts = {"lossless/common": rng.multinomial(n, common), "lossless/rare": rng.multinomial(reached, rare)}
        return Observation(counts, (), 0, b"")


def _case(experiment: _CommonAndRare) -> Case:
    return Case(id="test/common_and_rare", family="test", description="", epsilon=EPSILON, make_experiment=lambda device: experiment)


def _done_at(check: object) -> float:
    return min(getattr(check, "passed_at", None) or math.inf, getattr(check, "planned_at", None) or math.inf)


@pytest.mark.parametrize("seed", range(3))
def test_a_case_waits_for_its_rare_designed_check(seed: int) -> None:
    """The common check has its planned observations after a few thousand trials; the case stops only once the rare
    one is done too, at the first batch end where both are (no check holds), before the cap, and says so."""
    experiment = _CommonAndRare()
    result = run_case(_case(experiment), experiment, SuiteConfig(seed=seed), TESTS)
    common, rare = (next(c for c in result.checks if c.name == name) for name in ("lossless/common", "lossless/rare"))
    assert (result.verdict, result.powered, result.early_pass, result.stopped_by) == (Verdict.PASS, True, True, Stop.CHECKS_DONE)
    assert common.planned_observations is not None
    assert common.planned_at is not None
    assert common.observations >= common.planned_observations
    assert _done_at(common) < _done_at(rare) == result.n_trials < result.trial_cap
    assert common.planned_at < result.n_trials  # the common check alone would have stopped the case sooner
    assert rare.passed_at == result.n_trials or rare.planned_at == result.n_trials
    assert "lossless/common by the observations planned" in result.reason or "every designed check has its planned" in result.reason


def test_without_its_pass_statistic_the_case_waits_for_the_rare_checks_planned_observations(monkeypatch: pytest.MonkeyPatch) -> None:
    """No check may pass by its statistic: the case stops at the first batch end where the rare check has its planned
    observations (it had fewer at every earlier batch end), below the cap the binomial margin sets."""
    monkeypatch.setattr(evidence, "log_pass_statistic", lambda *args, **kwargs: -math.inf)
    experiment = _CommonAndRare()
    result = run_case(_case(experiment), experiment, SuiteConfig(seed=0), TESTS)
    rare = next(c for c in result.checks if c.name == "lossless/rare")
    assert (result.verdict, result.stopped_by, rare.passed_at) == (Verdict.PASS, Stop.CHECKS_DONE, None)
    assert rare.planned_observations is not None
    assert rare.planned_at == result.n_trials < result.trial_cap
    assert rare.planned_observations <= rare.observations < rare.planned_observations + 0.1 * result.n_trials * experiment.RARE_REACH
    assert "every designed check has its planned observations (power 1 - beta at TV >= 0.1)" in result.reason
    # The stop waited for the rare check: stopping when the common one was done would have left it far short.
    common = next(c for c in result.checks if c.name == "lossless/common")
    assert common.planned_at is not None
    assert common.planned_at * experiment.RARE_REACH < 0.5 * rare.planned_observations


@pytest.mark.parametrize("buggy", ["common", "rare"])
def test_a_bug_of_size_epsilon_in_either_check_is_still_caught(buggy: str) -> None:
    """A law at TV exactly epsilon in one designed check, the other clean: the case fails on every one of 10 seeds (a
    miss needs the buggy check's pass statistic to cross, <= beta_pass, or its e-process below the threshold at its
    planned observations, <= beta)."""
    experiment = _CommonAndRare(**{buggy: _shifted(UNIFORM256 if buggy == "common" else UNIFORM16, EPSILON)})
    for seed in range(10):
        result = run_case(_case(experiment), experiment, SuiteConfig(seed=seed), TESTS)
        outcome = (result.verdict, result.failure, result.headline, result.stopped_by)
        assert outcome == (Verdict.FAIL, Failure.LOSSLESS, f"lossless/{buggy}", Stop.FAILED), seed


def test_the_reference_passes_and_a_lossy_mutant_fails_with_the_reason_recorded() -> None:
    """On a real chain step (``direct/far_apart/V8/g3``, whose rare positions set the cap): the reference sampler passes
    on the stop rule, every designed check done at the stop; a lossy mutant (the acceptance uniform reused for the
    residual) fails;
    the reason survives the JSON round trip, and with ``early_pass=False`` the case runs to its cap."""
    cases = select(["direct/far_apart/V8/g3"])
    passed = run_suite(cases, reference_sampler, SuiteConfig(seed=1))
    case = passed.results[0]
    assert (case.verdict, case.stopped_by, case.early_pass) == (Verdict.PASS, Stop.CHECKS_DONE, True)
    assert all(_done_at(c) <= case.n_trials for c in case.checks if c.designed)
    read = RunResult.from_json(json.loads(json.dumps(passed.to_dict(), allow_nan=False)))
    assert read.results[0].stopped_by is Stop.CHECKS_DONE
    assert read.results[0].checks == case.checks
    failed = run_suite(cases, MUTANTS["reused_uniform"].sampler, SuiteConfig(seed=1))
    assert (failed.results[0].verdict, failed.results[0].stopped_by) == (Verdict.FAIL, Stop.FAILED)
    full = run_suite(cases, reference_sampler, SuiteConfig(seed=1, early_pass=False))
    assert (full.results[0].n_trials, full.results[0].stopped_by) == (full.results[0].trial_cap, Stop.CAP)
