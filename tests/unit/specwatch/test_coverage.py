"""Coverage of speculative end-to-end cases: histograms, shortfalls, and a case that misses its design
says so instead of passing silently."""

from __future__ import annotations

import json

import numpy as np
import torch

from specwatch.cases import Case
from specwatch.experiments import CheckSpec, Coverage, CoverageDesign, Observation
from specwatch.protocol import Layer, Verdict
from specwatch.runner import SuiteConfig, run_case

DESIGN = CoverageDesign(min_drafts=2, min_rounds=3)
REACHED = Coverage(drafts={1: 2, 3: 5}, accepted={0: 3, 1: 2, 3: 2}, rounds={3: 2, 4: 1}, full=2, partial=1)


def test_shortfalls_name_each_missing_part_of_the_design():
    assert REACHED.shortfalls(DESIGN) == []
    one_draft = Coverage(drafts={1: 9}, accepted={0: 5, 1: 4}, rounds={5: 2})
    missing = one_draft.shortfalls(DESIGN)
    assert len(missing) == 3
    assert "2 or more drafts" in missing[0]
    assert "accepted all" in missing[1]
    assert "some but not all" in missing[2]
    few_rounds = Coverage(drafts={3: 4}, accepted={1: 2, 3: 2}, rounds={2: 1, 3: 1}, full=2, partial=2)
    assert few_rounds.shortfalls(DESIGN) == ["a call had fewer than 3 verification rounds (rounds {2: 1, 3: 1})"]
    assert Coverage().shortfalls(DESIGN)  # nothing observed: the path never drafted


def test_coverage_merges_histograms():
    merged = REACHED.merge(Coverage(drafts={3: 1, 2: 1}, accepted={2: 1}, rounds={3: 1}, full=1))
    assert merged.drafts == {1: 2, 2: 1, 3: 6}
    assert merged.rounds == {3: 3, 4: 1}
    assert (merged.full, merged.partial) == (3, 1)
    assert json.loads(json.dumps(merged.to_dict(DESIGN)))["drafts"] == {"1": 2, "2": 1, "3": 6}


class _Uniform:
    """Draws uniform cells (the null holds) and reports a fixed coverage per batch."""

    probe_trials = 4
    expected_acceptance = None
    accepted_per_trial_max = None
    fixed_trials = None

    def __init__(self, coverage: Coverage) -> None:
        self.coverage_design = DESIGN
        self._coverage = coverage
        self.checks = (CheckSpec("lossless/cells", Layer.LOSSLESS, np.full(4, 0.25), 1.0),)

    def run(self, n: int, generator: torch.Generator) -> Observation:
        cells = torch.randint(0, 4, (n,), generator=generator)
        counts = np.bincount(cells.numpy(), minlength=4).astype(np.int64)
        return Observation({"lossless/cells": counts}, (), 0, counts.tobytes(), self._coverage)


CASE = Case(id="test/coverage", family="test", description="uniform cells", epsilon=0.2)


def test_a_case_that_reaches_its_coverage_passes_and_records_it():
    result = run_case(CASE, _Uniform(REACHED), SuiteConfig(seed=1), 1)
    assert result.verdict == Verdict.PASS
    assert result.powered
    assert result.coverage is not None
    assert result.coverage["shortfalls"] == []
    assert result.coverage["drafts"]["3"] > 0


def test_a_case_short_of_its_coverage_says_so_and_is_not_a_plain_pass():
    result = run_case(CASE, _Uniform(Coverage(drafts={1: 3}, accepted={0: 1, 1: 2}, rounds={3: 1})), SuiteConfig(seed=1), 1)
    assert result.verdict == Verdict.PASS
    assert not result.powered
    assert result.reason.startswith("coverage short of design: no verification had 2 or more drafts")
    assert result.to_dict()["coverage"]["shortfalls"]


def test_an_experiment_can_lower_the_trial_floor_to_its_own_minimum():
    """Without ``min_trials`` the cap is at least one first batch (1024); an experiment whose trials are
    costly (generate() calls) can ask for fewer when its design needs fewer (the cap itself: no early pass)."""
    wide = Case(id="test/coverage/wide", family="test", description="uniform cells", epsilon=0.45)
    config = SuiteConfig(seed=1, early_pass=False)
    default = run_case(wide, _Uniform(REACHED), config, 1)
    assert default.trial_cap == 1024
    cheap = _Uniform(REACHED)
    cheap.min_trials = 32
    lowered = run_case(wide, cheap, config, 1)
    assert 32 <= lowered.trial_cap < 1024
    assert lowered.n_trials == lowered.trial_cap
    assert lowered.powered  # the design's own size still gives the designed power


class _PathDependent(_Uniform):
    """Each trial accepts 2 drafts where 1.5 were expected on the path it took (the fingerprint probe included)."""

    def run(self, n: int, generator: torch.Generator) -> Observation:
        obs = super().run(n, generator)
        return Observation(obs.counts, (), 2 * n, obs.sample, obs.coverage, 1.5 * n)


def test_a_path_dependent_expected_acceptance_is_the_sum_over_the_counted_trials():
    result = run_case(CASE, _PathDependent(REACHED), SuiteConfig(seed=1), 1)
    assert (result.acceptance.observed, result.acceptance.expected) == (2.0, 1.5)


def test_an_experiment_that_cannot_measure_acceptance_says_why():
    experiment = _Uniform(REACHED)
    experiment.acceptance_unmeasured = "q is not known"
    result = run_case(CASE, experiment, SuiteConfig(seed=1), 1)
    assert result.verdict == Verdict.PASS
    assert result.reason.endswith("; acceptance not measured: q is not known")
    assert result.acceptance.expected is None


def test_the_summary_says_in_how_many_trials_the_rounds_were_seen():
    from specwatch.report import coverage_summary

    summary = REACHED.to_dict(DESIGN)
    assert coverage_summary(summary) == "drafts<=3 full 2 partial 1 rounds 3-4"
    assert coverage_summary(summary, 3) == "drafts<=3 full 2 partial 1 rounds 3-4"  # every trial's rounds seen
    assert coverage_summary(summary, 105) == "drafts<=3 full 2 partial 1 rounds 3-4 (in 3 of 105 trials)"


def test_a_case_short_of_its_coverage_does_not_stop_on_an_early_pass():
    """Its check passes early, but stopping would leave the coverage short: it runs to its cap, where the case
    that reached its coverage stops on the early pass."""
    short = run_case(CASE, _Uniform(Coverage(drafts={1: 3}, accepted={0: 1, 1: 2}, rounds={3: 1})), SuiteConfig(seed=1), 1)
    assert (short.n_trials, short.early_pass) == (short.trial_cap, False)
    assert short.checks[0].passed_at is not None
    reached = run_case(CASE, _Uniform(REACHED), SuiteConfig(seed=1), 1)
    assert reached.early_pass
    assert reached.n_trials < reached.trial_cap
