"""specwatch used as a library's test suite would use it: the library's own copy of the reference speculative
sampler passes ``assert_lossless``; a mutant with a known bug fails with a message that names the case, the
check and the TV estimate; the pytest plugin's fixture and options work in a pytest run of their own."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from specwatch import LosslessnessError, SpecOutput, SpecStep, UnderpoweredError, assert_lossless, check_lossless
from specwatch.mutants import MUTANTS
from specwatch.protocol import Verdict

pytestmark = pytest.mark.unit

pytest_plugins = ["pytester"]

# The seed of this project: transformers' target-distribution fixture, its two edge checks, and one direct case.
CASES = ["direct/transformers_target_distribution/V10/g3", "edge/transformers_fixture/*", "direct/far_apart/V8/g3"]


# --- the library's code under test: its own Leviathan/Chen speculative sampler (a copy of the reference) ------


def _draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cdf = probs.cumsum(-1)
    index = torch.searchsorted(cdf, (u * cdf[-1]).contiguous(), right=True)
    return index.clamp(max=int(torch.nonzero(probs > 0).max()))


def library_speculative_sample(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
    """Draft x_i ~ q_i; accept while u_i < p_i(x_i) / q_i(x_i); then resample from (p - q)+ or the bonus p."""
    p, q, gamma = step.target_probs, step.draft_probs, step.gamma

    def uniforms(k: int) -> torch.Tensor:
        return torch.rand((n, k), generator=generator, dtype=torch.float64, device=step.device)

    u = uniforms(gamma)
    drafts = torch.stack([_draw(q[i], u[:, i]) for i in range(gamma)], dim=1)
    ratio = p[:gamma].gather(1, drafts.T).T / q.gather(1, drafts.T).T
    accepted = (uniforms(gamma) < ratio).long().cumprod(dim=1).sum(dim=1)
    residual = (p[:gamma] - q).clamp(min=0)
    rows = torch.cat((residual / residual.sum(-1, keepdim=True).clamp(min=1e-300), p[gamma:]), dim=0)
    last = uniforms(1)[:, 0]
    final = torch.empty(n, dtype=torch.long, device=step.device)
    for row in torch.unique(accepted).tolist():
        chosen = accepted == row
        final[chosen] = _draw(rows[row], last[chosen])
    columns = torch.arange(gamma + 1, device=step.device)
    padded = torch.cat((drafts, torch.full((n, 1), -1, dtype=drafts.dtype, device=step.device)), dim=1)
    tokens = torch.where(columns < accepted[:, None], padded, torch.full_like(padded, -1))
    tokens[torch.arange(n, device=step.device), accepted] = final
    return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=accepted)


# --- the library's tests ----------------------------------------------------------------------------------


def test_the_library_sampler_is_lossless() -> None:
    result = assert_lossless(library_speculative_sample, cases=CASES, quick=True)
    assert result.verdict is Verdict.PASS
    assert [r.case_id for r in result.results] == [
        "direct/far_apart/V8/g3",
        "direct/transformers_target_distribution/V10/g3",
        "edge/transformers_fixture/V10/g3/u_min",
        "edge/transformers_fixture/V10/g3/u_max",
    ]
    assert all(r.powered for r in result.results)


def test_a_mutant_fails_naming_the_case_the_check_and_the_tv_estimate() -> None:
    with pytest.raises(LosslessnessError) as raised:
        assert_lossless(MUTANTS["swapped_residual"].sampler, cases=CASES, quick=True, seed=7)
    message = str(raised.value)
    assert message.startswith("swapped_residual is not lossless: 4 of 4 case(s) failed (alpha = 0.0001, seed = 7")
    # A rejection by the e-process: case, check, layer, trials, log E against the threshold, TV estimate and interval.
    assert re.search(
        r"direct/far_apart/V8/g3: check lossless/pos\d \(lossless\) failed after \d+ trials: "
        r"log E = [\d.]+ >= log threshold [\d.]+; TV estimate 0\.\d+ \[0\.\d+, 0\.\d+\]",
        message,
    ), message
    # A certain violation (a token the exact law rules out) says so.
    assert re.search(
        r"direct/transformers_target_distribution/V10/g3: check lossless/pos\d \(lossless\) failed after \d+ trials: "
        r"an observation the exact law rules out \(certain\); TV estimate",
        message,
    ), message
    # The deterministic edge checks name the check their certain violation is in.
    assert re.search(r"edge/transformers_fixture/V10/g3/u_min: check (lossless|conformance)/pos\d \(\w+\) failed", message), message
    assert "reproduce: assert_lossless(swapped_residual, cases=['direct/far_apart/V8/g3', " in message
    failed = [r for r in raised.value.result.results if r.verdict is Verdict.FAIL and r.tv_estimate is not None]
    assert len(failed) == 2
    assert all(f"TV estimate {r.tv_estimate:.3g}" in message for r in failed)


def test_a_lossless_but_slower_mutant_fails_on_conformance() -> None:
    with pytest.raises(LosslessnessError, match=r"u_min: check conformance/pos1 \(conformance\) failed after \d+ trials: an observation"):
        assert_lossless(MUTANTS["strict_acceptance"].sampler, cases=["edge/p_zero_draft/*"])


def test_a_budget_stops_cases_early_and_says_they_are_underpowered() -> None:
    result = check_lossless(library_speculative_sample, cases=["direct/far_apart/V8/g1"], budget_s=1e-3)
    (case,) = result.results
    assert case.verdict is Verdict.PASS
    assert not case.powered
    assert "underpowered" in case.reason


def test_an_underpowered_pass_is_not_green_unless_accepted() -> None:
    """The issue's silent green: a budget too short for the design passed every case underpowered, and the test was
    green. Now it raises, naming each case, its trials of its cap and the budget a call needs; accepted on request."""
    with pytest.raises(UnderpoweredError) as raised:
        assert_lossless(library_speculative_sample, cases=["direct/far_apart/V8/g1", "direct/far_apart/V8/g3"], budget_s=1e-3)
    error = raised.value
    assert isinstance(error, AssertionError)
    assert not isinstance(error, LosslessnessError)  # no violation was seen: a distinct error
    assert error.cases == ["direct/far_apart/V8/g1", "direct/far_apart/V8/g3"]
    assert re.search(r"direct/far_apart/V8/g1: [\d,]+ of [\d,]+ trials, needs about \d+ s", str(error))
    assert error.budget_s is not None
    assert f"about budget_s={error.budget_s} runs every case to its design" in str(error)
    assert "allow_underpowered=True" in str(error)
    result = assert_lossless(library_speculative_sample, cases=["direct/far_apart/V8/g1"], budget_s=1e-3, allow_underpowered=True)
    assert not result.results[0].powered


def test_a_violation_under_a_short_budget_is_still_a_violation() -> None:
    with pytest.raises(LosslessnessError):
        assert_lossless(MUTANTS["strict_acceptance"].sampler, cases=["edge/p_zero_draft/*", "direct/far_apart/V8/g1"], budget_s=1e-3)


def test_bad_arguments_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="no case matches"):
        check_lossless(library_speculative_sample, cases=["nope/*"])
    with pytest.raises(ValueError, match="alpha"):
        check_lossless(library_speculative_sample, alpha=2.0)


def test_the_plugin_loads_without_torch() -> None:
    code = "import sys, specwatch.pytest_plugin, specwatch; assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_pytest_fixture_and_its_options(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from specwatch.mutants import MUTANTS

        def test_mutant(assert_lossless):
            assert_lossless(MUTANTS["swapped_residual"].sampler, cases=["edge/transformers_fixture/*"])
        """
    )
    outcome = pytester.runpytest_inprocess("-p", "no:randomly", "--specwatch-seed", "11", "--specwatch-quick")
    outcome.assert_outcomes(failed=1)
    outcome.stdout.fnmatch_lines(
        ["*LosslessnessError: swapped_residual is not lossless*seed = 11*", "*edge/transformers_fixture/V10/g3/u_*"]
    )
