"""The suite proves itself: every lossy mutant fails losslessness, the lossless-but-slower ones fail
conformance only, and the reference passes everything, each for 5 seeds with default settings.

Output fingerprints (drawn with a seed fixed per case) mark "behaviour unchanged": the reference's do not
depend on the run's seed or attempt, and every mutant changes the fingerprint of a case it fails."""

from __future__ import annotations

import pytest

from specwatch.cases import CASES, select
from specwatch.mutants import MUTANTS
from specwatch.protocol import Failure, Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.sampling import reference_sampler

SEEDS = range(5)
LOSSY = [m for m in MUTANTS.values() if not m.lossless]
SLOWER = [m for m in MUTANTS.values() if m.lossless]


@pytest.fixture(scope="module")
def reference_fingerprints() -> dict[str, str]:
    run = run_suite(CASES, reference_sampler, SuiteConfig(seed=1_000, attempt=3))
    return {r.case_id: r.fingerprint for r in run.results}


def test_the_catalogue_is_broad():
    assert len(LOSSY) >= 15
    assert {m.name for m in SLOWER} == {"strict_acceptance", "greedy_onehot_draft"}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", LOSSY, ids=lambda m: m.name)
def test_lossy_mutants_fail_losslessness(mutant, reference_fingerprints):
    for seed in SEEDS:
        run = run_suite(CASES, mutant.sampler, SuiteConfig(seed=seed, fail_fast=True))
        assert run.verdict == Verdict.FAIL, f"seed {seed}: {mutant.name} passed the battery"
        failing = run.results[-1]
        assert failing.lossless == Verdict.FAIL, f"seed {seed}: {failing.case_id} failed {failing.reason}"
        assert failing.fingerprint != reference_fingerprints[failing.case_id]


@pytest.mark.slow
@pytest.mark.parametrize("mutant", SLOWER, ids=lambda m: m.name)
def test_lossless_but_slower_mutants_fail_conformance_only(mutant, reference_fingerprints):
    for seed in SEEDS:
        run = run_suite(CASES, mutant.sampler, SuiteConfig(seed=seed))
        assert all(r.lossless == Verdict.PASS for r in run.results), [r.reason for r in run.results if r.lossless != Verdict.PASS]
        failing = [r for r in run.results if r.conformance == Verdict.FAIL]
        assert failing
        assert all(r.fingerprint != reference_fingerprints[r.case_id] for r in failing)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_reference_passes_every_case(seed, reference_fingerprints):
    run = run_suite(CASES, reference_sampler, SuiteConfig(seed=seed))
    assert {r.case_id: r.fingerprint for r in run.results} == reference_fingerprints
    assert run.verdict == Verdict.PASS, [r.reason for r in run.results if r.verdict != Verdict.PASS]
    assert all(r.powered for r in run.results), [r.reason for r in run.results if not r.powered]


def test_one_shared_uniform_per_step_fails_p_equals_q():
    """Every position's own law is right (one uniform per draw), so the per-position checks pass; the joint
    law of the step is not (P(Y1 = Y2) = 0.029 against 0.016): the pairwise lossless check fails the case."""
    for seed in range(3):
        result = run_suite(select(["direct/p_equals_q/V64/g3"]), MUTANTS["shared_step_uniform"].sampler, SuiteConfig(seed=seed)).results[0]
        assert (result.verdict, result.failure) == (Verdict.FAIL, Failure.LOSSLESS), result.reason
        assert result.headline is not None
        assert result.headline.startswith("lossless/pair")
        assert all(not c.rejected for c in result.checks if c.name.startswith("lossless/pos"))
