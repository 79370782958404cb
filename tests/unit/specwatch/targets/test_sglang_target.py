"""SGLang's real verification kernels: the Triton chain sampler on the CPU through Triton's interpreter (a
kernels-only install of the CUDA wheel), and on a GPU the CUDA tree kernel.

Marked ``sglang``: ``make test-sglang`` installs ``SGLANG_PIP`` (sglang==0.5.23) into the suite's release cache,
kernels-only without CUDA, and runs this module with it first on PYTHONPATH and TRITON_INTERPRET=1. The interpreter
runs about 25 trials a second, so each run here is a handful of cases at TV 0.3. The bindings, the tree law and the
dispatch are tested without SGLang in test_sglang_binding.py and test_sglang_tree.py.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os

import pytest
import torch

from specwatch.cases import select
from specwatch.protocol import Failure, Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.loader import resolve
from specwatch.targets.sglang.cases import INTERPRETER_PROBE_TRIALS, chain_cases, tree_cases

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


@pytest.fixture(scope="module")
def target():
    pytest.importorskip("sglang", reason="needs sglang first on PYTHONPATH (make test-sglang)")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 without CUDA (make test-sglang sets it for the kernels-only install)")
    return resolve("sglang")


def _run(target, patterns, **config):
    cases = select(patterns, target.cases)
    assert cases, patterns
    return run_suite(cases, target.sampler, SuiteConfig(seed=3, epsilon=0.3, **config), target=target.spec, library=target.library)


def _verdicts(run):
    return {r.case_id: r.verdict for r in run.results}


def test_the_identity_states_the_kernels_and_the_lossless_defaults(target):
    library = target.library
    assert library.version == os.environ.get("SPECWATCH_SGLANG_PIP", "sglang==0.5.23").split("==")[1]
    assert library.details["thresholds"] == "threshold_single 1.0, threshold_acc 1.0"  # the engine's defaults, read
    assert "_verify_uses_greedy" in library.details["verify_dispatch"]
    ids = {c.id: c for c in target.cases}
    if torch.cuda.is_available():
        assert ids["tree/branching2/V8/d2"].skip_reason is None
    else:
        assert "interpreter" in library.details["kernels"]
        assert ids["tree/branching2/V8/d2"].skip_reason.startswith("not reachable: tree_speculative_sampling_target_only")
        assert ids["e2e/eagle/processed"].skip_reason.startswith("not reachable")


def test_classic_and_block_verification_pass_through_the_triton_chain_sampler(target):
    run = _run(target, ["direct/far_apart/V8/g1", "direct_block/far_apart/V8/g1", "edge/all_accept/*", "edge/p_zero_draft/*"])
    assert run.verdict == Verdict.PASS, [(r.case_id, r.reason) for r in run.results if r.verdict != Verdict.PASS]


def test_the_two_findings_fail_on_this_release(target):
    """On a CPU the dispatch cases take the greedy branch (docs/findings.md); the transformers fixture's residual
    underflows in float32 and the kernel emits the last token id, which p forbids (any device)."""
    run = _run(target, ["engine/verify_dispatch/*", "edge/transformers_fixture/*"])
    verdicts = _verdicts(run)
    assert verdicts["edge/transformers_fixture/V10/g3/u_min"] == verdicts["edge/transformers_fixture/V10/g3/u_max"] == Verdict.FAIL
    expected_dispatch = Verdict.PASS if torch.cuda.is_available() else Verdict.FAIL
    assert verdicts["engine/verify_dispatch/default/V8/g3"] == expected_dispatch
    assert verdicts["engine/verify_dispatch/rejection_sampling/V8/g3"] == expected_dispatch
    assert all(r.failure != Failure.RAISED for r in run.results)


def test_draft_probabilities_at_the_wrong_temperature_are_caught(target):
    """A mutant input: the kernel gets q^2 (renormalised) while the drafts follow q: classic and block verification
    both emit tokens that no longer follow p."""
    from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton as kernel

    @functools.wraps(kernel)
    def squared(*args, draft_probs, **kwargs):
        q = draft_probs**2
        return kernel(*args, draft_probs=(q / q.sum(-1, keepdim=True)).contiguous(), **kwargs)

    squared.__signature__ = inspect.signature(kernel)  # type: ignore[attr-defined]
    cases = select(["direct/far_apart/V8/g1", "direct_block/far_apart/V8/g1"], chain_cases(squared, probe_trials=INTERPRETER_PROBE_TRIALS))
    # q^2 moves the first token's law by TV 0.037 only, far below the interpreter's design (TV 0.3): the early pass
    # may rightly stop it as clean (docs/statistics.md §7a), so it runs to the cap, whose trials catch it.
    run = run_suite(cases, target.sampler, SuiteConfig(seed=3, epsilon=0.3, early_pass=False), target="sglang-mutant")
    assert _verdicts(run) == {"direct/far_apart/V8/g1": Verdict.FAIL, "direct_block/far_apart/V8/g1": Verdict.FAIL}
    assert all(r.n_trials > 0 and r.failure != Failure.RAISED for r in run.results)


@pytest.mark.gpu
def test_the_cuda_tree_kernel_is_lossless_at_its_defaults_and_lossy_below_them(target):
    """On CUDA: the draft trees through tree_speculative_sampling_target_only pass; with threshold_acc 0.5 (the
    target's own known-lossy setting) they fail."""
    from sglang.kernels.ops.speculative.verify_sampling import tree_speculative_sampling_target_only as kernel

    run = _run(target, ["tree/*"])
    assert run.verdict == Verdict.PASS, [(r.case_id, r.reason) for r in run.results if r.verdict != Verdict.PASS]
    lossy = [dataclasses.replace(c, id=c.id + "/acc0.5") for c in tree_cases(kernel, threshold_acc=0.5)]
    run = run_suite(lossy, target.sampler, SuiteConfig(seed=3, epsilon=0.3), target="sglang-threshold")
    assert {r.verdict for r in run.results} == {Verdict.FAIL}
