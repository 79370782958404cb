"""The binding of vLLM's model-runner-v2 rejection sampler (vLLM >= 0.34), against fakes with its signature (runs
without vLLM installed).

``make_fake`` transcribes the semantics of vLLM 0.34's ``rejection_sample`` kernels for the plain (token-by-token)
path: gamma + 1 logits rows per request, the last one the bonus row sampled inside; the draft verified against row
``start + i`` read at ``draft_sampled[start + i + 1]``; q from the draft logits cache divided by the request's
temperature, or one-hot (the draft token) when the cache is None, whose residual is the target without that token.
The tests show the adapter's sampler passes the battery with it and fails when the layout is read one row off.
The real kernels (and block verification) run in test_vllm_v2_target.py under Triton's interpreter.
"""

from __future__ import annotations

import types

import pytest
import torch

from specwatch.cases import select
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.vllm.adapter import VllmAdapter, greedy_draft_cases
from specwatch.targets.vllm.bindings import AdapterError
from specwatch.targets.vllm.bindings_v2 import (
    BlockVerificationExperiment,
    RejectionSampleV2Api,
    bind_rejection_sample_v2,
    call_v2,
    rejection_sampler_v2,
)


def make_fake(*, draft_row_offset: int = 1, calls: list[dict[str, object]] | None = None):
    def rejection_sample(
        target_logits,
        draft_logits_cache,
        draft_sampled,
        cu_num_logits,
        pos,
        idx_mapping,
        expanded_idx_mapping,
        expanded_local_pos,
        temperature,
        seed,
        num_speculative_steps,
        synthetic_conditional_rates=None,
        use_fp64=False,
        use_block_verification=False,
        contexts=None,
        watermarking=None,
        watermarking_skip_mask=None,
        watermark_key=None,
        fly_window_size=0,
        fly_entropy_threshold=0.3,
        fly_entropy_top_k=3,
        skip_masked_vocab_blocks=False,
    ):
        if calls is not None:
            calls.append(dict(locals()))
        gamma = num_speculative_steps
        n = cu_num_logits.shape[0] - 1
        sampled = torch.zeros((n, gamma + 1), dtype=torch.int64)
        num_sampled = torch.zeros(n, dtype=torch.int32)
        for r in range(n):
            state = int(idx_mapping[r])
            generator = torch.Generator().manual_seed(int(seed[state]))
            start, temp = int(cu_num_logits[r]), float(temperature[state])
            for i in range(gamma):
                row = start + i
                draft = int(draft_sampled[row + draft_row_offset])
                p = target_logits[row].softmax(dim=-1)
                if draft_logits_cache is None:
                    q = torch.zeros_like(p)
                    q[draft] = 1.0
                else:
                    q = (draft_logits_cache.values[state, i] / temp).softmax(dim=-1)
                if float(p[draft]) > float(torch.rand((), generator=generator)) * float(q[draft]):
                    sampled[r, i] = draft
                    continue
                residual = (p - q).clamp(min=0)
                sampled[r, i] = int(torch.multinomial(residual, 1, generator=generator))
                num_sampled[r] = i + 1
                break
            else:
                bonus = target_logits[start + gamma].softmax(dim=-1)
                sampled[r, gamma] = int(torch.multinomial(bonus, 1, generator=generator))
                num_sampled[r] = gamma + 1
        return sampled, num_sampled

    return rejection_sample


def _api(fake) -> RejectionSampleV2Api:
    return RejectionSampleV2Api(rejection_sample=fake, apply_temperature=None, apply_top_k_top_p=None)


CORE = {
    "target_logits": torch.zeros(4, 8),
    "draft_logits_cache": None,
    "draft_sampled": torch.zeros(4, dtype=torch.int32),
    "cu_num_logits": torch.tensor([0, 4], dtype=torch.int32),
    "pos": torch.arange(4),
    "idx_mapping": torch.zeros(1, dtype=torch.int32),
    "expanded_idx_mapping": torch.zeros(4, dtype=torch.int32),
    "expanded_local_pos": torch.arange(4, dtype=torch.int32),
    "temperature": torch.ones(1),
    "seed": torch.zeros(1, dtype=torch.int64),
    "num_speculative_steps": 3,
}


def test_binds_the_0_34_signature_by_keyword_with_every_lossy_mode_off():
    kwargs = bind_rejection_sample_v2(make_fake(), **CORE)
    assert kwargs == {**CORE, "skip_masked_vocab_blocks": False}
    for lossy in ("synthetic_conditional_rates", "fly_window_size", "watermark_key", "contexts", "use_block_verification"):
        assert lossy not in kwargs
    block = bind_rejection_sample_v2(make_fake(), block=True, may_mask=True, **CORE)
    assert block["use_block_verification"] is True
    assert block["skip_masked_vocab_blocks"] is True


def test_missing_and_unknown_arguments_lossy_defaults_and_an_absent_block_mode_are_refused():
    def renamed(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                expanded_local_pos, temperature, seed, num_speculative_steps): ...  # fmt: skip

    def surprise(target_logits, draft_logits_cache, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                 expanded_local_pos, temperature, seed, num_speculative_steps, acceptance_floor): ...  # fmt: skip

    def fly(target_logits, draft_logits_cache, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
            expanded_local_pos, temperature, seed, num_speculative_steps, fly_window_size=4): ...  # fmt: skip

    def block_on(target_logits, draft_logits_cache, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                 expanded_local_pos, temperature, seed, num_speculative_steps, use_block_verification=True): ...  # fmt: skip

    def no_block(target_logits, draft_logits_cache, draft_sampled, cu_num_logits, pos, idx_mapping, expanded_idx_mapping,
                 expanded_local_pos, temperature, seed, num_speculative_steps): ...  # fmt: skip

    for fn, block, message in (
        (renamed, False, "no parameter"),
        (surprise, False, "unknown argument 'acceptance_floor'"),
        (fly, False, "fly_window_size defaults to 4"),
        (block_on, False, "use_block_verification defaults to True"),
        (no_block, True, "no use_block_verification"),
    ):
        with pytest.raises(AdapterError, match=message):
            bind_rejection_sample_v2(fn, block=block, **CORE)
    assert bind_rejection_sample_v2(no_block, **CORE) == CORE


def test_the_layout_rows_drafts_draft_logits_and_seeds():
    calls: list[dict[str, object]] = []
    step = select(["direct/far_apart/V8/g3"])[0].step()
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    seeds = torch.tensor([11, 12])
    call_v2(_api(make_fake(calls=calls)), step, drafts, seeds, block=False)
    got = calls[-1]
    assert got["target_logits"].shape == (2 * 4, 8)
    assert torch.allclose(got["target_logits"][4:8].softmax(dim=-1).double(), step.target_probs, atol=1e-6)  # bonus row included
    assert got["draft_sampled"].reshape(2, 4)[:, 1:].tolist() == drafts.tolist()  # row start + i is verified against start + i + 1
    assert got["cu_num_logits"].tolist() == [0, 4, 8]
    assert got["expanded_idx_mapping"].tolist() == [0] * 4 + [1] * 4
    assert got["expanded_local_pos"].tolist() == [0, 1, 2, 3] * 2
    assert got["seed"].tolist() == [11, 12]
    assert got["num_speculative_steps"] == 3
    cache = got["draft_logits_cache"]
    assert cache.row_mapping is None
    assert cache.values.shape == (2, 3, 8)
    assert torch.allclose(cache.values[1].softmax(dim=-1).double(), step.draft_probs, atol=1e-6)


def test_draft_logits_are_scaled_by_the_temperature_the_kernels_divide_by():
    calls: list[dict[str, object]] = []
    step = select(["direct/temperature_target/V64/g3"])[0].step()
    api = RejectionSampleV2Api(make_fake(calls=calls), apply_temperature=lambda logits, idx, temps: logits.div_(temps[idx][:, None]),
                               apply_top_k_top_p=lambda logits, k, p, has_topp_only_rows: logits)  # fmt: skip
    call_v2(api, step, torch.zeros((1, 3), dtype=torch.long), torch.tensor([1]), block=False)
    got = calls[-1]
    temp = float(got["temperature"][0])
    assert temp == pytest.approx(step.target_processing.temperature) != 1.0
    assert torch.allclose((got["draft_logits_cache"].values[0] / temp).softmax(dim=-1).double(), step.draft_probs, atol=1e-6)


def test_one_hot_drafts_go_without_a_draft_logits_cache():
    calls: list[dict[str, object]] = []
    greedy = next(c for c in greedy_draft_cases() if c.id == "direct/greedy_draft/V8/g3").step()
    rejection_sampler_v2(_api(make_fake(calls=calls)))(greedy, 20, torch.Generator().manual_seed(0))
    assert calls[-1]["draft_logits_cache"] is None


def test_each_trial_gets_its_own_seed_from_the_cases_generator():
    calls: list[dict[str, object]] = []
    step = select(["direct/far_apart/V8/g1"])[0].step()
    sampler = rejection_sampler_v2(_api(make_fake(calls=calls)))
    sampler(step, 50, torch.Generator().manual_seed(0))
    first = calls[-1]["seed"].clone()
    sampler(step, 50, torch.Generator().manual_seed(0))
    assert torch.equal(calls[-1]["seed"], first)  # reproducible from the case's generator
    assert len(set(first.tolist())) == 50
    sampler(step, 50, torch.Generator().manual_seed(1))
    assert not torch.equal(calls[-1]["seed"], first)


def test_a_processed_target_needs_vllms_processing_functions():
    step = select(["direct/temperature_target/V64/g3"])[0].step()
    with pytest.raises(AdapterError, match="apply_temperature or apply_top_k_top_p"):
        rejection_sampler_v2(_api(make_fake()))(step, 4, torch.Generator().manual_seed(0))


CASES = ["direct/far_apart/V8/g1", "direct/disjoint/V8/g3", "direct/greedy_draft/V8/g3"]


def _run(fake, patterns):
    cases = select(patterns, tuple(select(None)) + greedy_draft_cases())
    return run_suite(cases, rejection_sampler_v2(_api(fake)), SuiteConfig(seed=5, epsilon=0.2, max_trials=20_000), target="fake-vllm-v2")


def test_a_faithful_v2_rejection_sample_passes_through_the_adapter():
    run = _run(make_fake(), CASES)
    assert run.verdict == Verdict.PASS, [(r.case_id, r.reason) for r in run.results if r.verdict != Verdict.PASS]


def test_reading_the_draft_one_row_early_fails():
    """A kernel (or binding) that verifies ``draft_sampled[row]`` instead of ``[row + 1]`` tests the previous
    position's token against this row: the emitted tokens no longer follow p."""
    run = _run(make_fake(draft_row_offset=0), ["direct/far_apart/V8/g1"])
    assert run.verdict == Verdict.FAIL


def test_a_release_with_the_v2_sampler_gets_plain_and_block_cases_and_unreachable_e2e_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    adapter = VllmAdapter(module=types.ModuleType("vllm"), version="0.34.0", distribution="vllm", api=None, api_v2=_api(make_fake()))
    cases = {c.id: c for c in adapter.cases()}
    assert "direct/far_apart/V8/g1" in cases
    block = cases["direct_block/far_apart/V8/g1"]
    assert block.family == "direct_block"
    experiment = block.build(adapter.sampler(), torch.device("cpu"))
    assert isinstance(experiment, BlockVerificationExperiment)
    assert experiment.checks
    assert all(c.name.startswith("lossless/") and c.designed for c in experiment.checks)
    assert experiment.probe_trials == 64
    quick = {c.id for c in cases.values() if c.quick and c.skip_reason is None}
    assert {"direct/far_apart/V8/g1", "direct_block/far_apart/V8/g1"} <= quick
    assert all(c.epsilon >= 0.3 for c in cases.values() if c.family in ("direct", "direct_block"))
    large = cases["direct_block/large_vocab/V50257/g1"]
    assert large.skip_reason
    assert "not reachable" in large.skip_reason
    assert cases["direct/large_vocab/V50257/g1"].skip_reason is None
    assert all(c.skip_reason and "not reachable" in c.skip_reason for c in cases.values() if c.family == "edge")
    e2e = [c for c in cases.values() if c.family == "e2e"]
    assert e2e
    assert all(c.skip_reason and c.skip_reason.startswith("not reachable") for c in e2e)
