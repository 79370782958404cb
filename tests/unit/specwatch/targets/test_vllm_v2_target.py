"""vLLM's model-runner-v2 rejection sampler (vLLM >= 0.34) through its real Triton kernels, on the CPU through
Triton's interpreter: a kernels-only install of the CUDA wheel.

Marked ``vllm``: ``make test-vllm`` installs ``VLLM2_PIP`` (vllm==0.34.0) kernels-only into the suite's release
cache and runs this module with it first on PYTHONPATH and the interpreter's variables set (TRITON_INTERPRET=1,
CUDA_VISIBLE_DEVICES=""). The interpreter runs a few dozen trials a second, so every run here is a handful of cases
at TV 0.3. The binding itself is tested without vLLM in test_vllm_binding_v2.py.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest

from specwatch.cases import DIRECT_CASES, select
from specwatch.protocol import Failure, Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.loader import resolve
from specwatch.targets.vllm.bindings_v2 import INTERPRETER_PROBE_TRIALS, DraftLogits, RejectionSampleV2Api, v2_cases

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


@pytest.fixture(scope="module")
def target():
    pytest.importorskip("vllm", reason="needs vllm >= 0.34 kernels-only first on PYTHONPATH (make test-vllm)")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 (make test-vllm sets it for the kernels-only install)")
    return resolve("vllm")


def _run(target, patterns, **config):
    cases = select(patterns, target.cases)
    assert cases, patterns
    assert not [c.id for c in cases if c.skip_reason], [(c.id, c.skip_reason) for c in cases]
    return run_suite(cases, target.sampler, SuiteConfig(seed=3, epsilon=0.3, **config), target=target.spec, library=target.library)


def _failures(run):
    return [(r.case_id, r.reason) for r in run.results if r.verdict != Verdict.PASS]


def test_the_build_identity_says_the_kernels_run_in_triton_s_interpreter(target):
    kernels = target.library.details["kernels"]
    assert "interpreter" in kernels
    assert "TRITON_INTERPRET=1" in kernels
    assert "libdevice.log1p" in kernels
    ids = {c.id: c for c in target.cases}
    assert ids["direct/far_apart/V8/g1"].skip_reason is None
    assert ids["direct_block/far_apart/V8/g1"].skip_reason is None
    assert ids["e2e/eagle/plain"].skip_reason.startswith("not reachable")


def test_direct_cases_pass_through_the_v2_kernels_with_draft_logits_one_hot_drafts_and_block_verification(target):
    """Draft logits (gamma 1), one-hot drafts with a processed target (temperature 0.7, top-k 8, top-p 0.9 through
    vLLM's temperature kernel and apply_top_k_top_p; gamma 5), and block verification."""
    run = _run(target, ["direct/far_apart/V8/g1", "direct/greedy_draft_processed/V64/g5", "direct_block/far_apart/V8/g1"])
    assert run.verdict == Verdict.PASS, _failures(run)


def test_draft_logits_at_the_wrong_temperature_are_caught(target):
    """A mutant input: the draft logits cache holds ``2 log q`` (q at temperature 1/2), so the kernels' ratio test,
    block test and residual use q^2 (renormalised) while the drafts follow q; the emitted tokens no longer follow p,
    through the token-by-token kernels and through block verification alike."""
    api = RejectionSampleV2Api.load()

    @functools.wraps(api.rejection_sample)  # the binding reads the real signature (through __wrapped__)
    def wrong_temperature(*args, draft_logits_cache=None, **kwargs):
        if draft_logits_cache is not None:
            draft_logits_cache = DraftLogits(draft_logits_cache.values * 2.0, draft_logits_cache.row_mapping)
        return api.rejection_sample(*args, draft_logits_cache=draft_logits_cache, **kwargs)

    mutant = dataclasses.replace(api, rejection_sample=wrong_temperature)
    cases = v2_cases(mutant, select(["direct/far_apart/V8/g1"], DIRECT_CASES), probe_trials=INTERPRETER_PROBE_TRIALS)
    # The mutant moves the first token's law by TV 0.037 only, far below the interpreter's design (TV 0.3): the early
    # pass may rightly stop it as clean (docs/statistics.md §7a), so it runs to the cap, whose trials catch it.
    run = run_suite(cases, target.sampler, SuiteConfig(seed=3, epsilon=0.3, early_pass=False), target="vllm-v2-mutant")
    assert {r.case_id: r.verdict for r in run.results} == {
        "direct/far_apart/V8/g1": Verdict.FAIL,
        "direct_block/far_apart/V8/g1": Verdict.FAIL,
    }
    # Refuted by the laws, not by a raise: the kernels ran.
    assert all(r.failure != Failure.RAISED and r.n_trials > 0 for r in run.results), [(r.case_id, r.reason) for r in run.results]


def test_the_kernels_divide_the_draft_logits_by_the_temperature(target):
    """The layout assumption under the temperature cases, on the real kernels: a processed target (temperature
    0.7) with draft logits log(q) * 0.7 passes."""
    run = _run(target, ["direct/temperature_target/V64/g3"], max_trials=4096)
    assert run.verdict == Verdict.PASS, _failures(run)
