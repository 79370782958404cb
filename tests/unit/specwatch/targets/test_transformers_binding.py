"""Keyword binding of transformers' `_speculative_sampling` across its historical signatures."""

from __future__ import annotations

import pytest
import torch

from specwatch.cases import CASES
from specwatch.protocol import Verdict
from specwatch.runner import SuiteConfig, run_suite
from specwatch.targets.base import AdapterError
from specwatch.targets.transformers.bindings import bind_speculative_sampling, speculative_sampling_sampler

IDS, Q, P = torch.zeros((1, 4), dtype=torch.long), torch.zeros((1, 3, 8)), torch.zeros((1, 4, 8))
CORE = {"candidate_input_ids": IDS, "candidate_logits": Q, "candidate_length": 3, "new_logits": P}


def v4_37(candidate_input_ids, candidate_logits, candidate_length, new_logits, last_assistant_token_is_eos, max_matches): ...


def v4_40(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate): ...


def v5_14(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate, assistant_ensemble_weight=None): ...


def v5_18(candidate_input_ids, candidate_logits, candidate_length, new_logits, assistant_ensemble_weight: float | None = None): ...


@pytest.mark.parametrize(
    ("fn", "extra"),
    [
        (v4_37, {"last_assistant_token_is_eos": False, "max_matches": 3}),
        (v4_40, {"is_done_candidate": False}),
        (v5_14, {"is_done_candidate": False}),
        (v5_18, {}),
    ],
    ids=["4.37-4.39", "4.40-5.10", "5.14-5.17", "5.18+"],
)
def test_binds_every_historical_signature_by_keyword(fn, extra):
    kwargs = bind_speculative_sampling(fn, **CORE)
    assert kwargs == {**CORE, **extra}
    assert "assistant_ensemble_weight" not in kwargs  # the lossy ensemble stays at its default None


def test_a_positional_fifth_argument_would_have_become_the_ensemble_weight():
    """Why binding is by keyword: on 5.18+ the old positional call passes `False` as the weight."""
    import inspect

    bound = inspect.signature(v5_18).bind(IDS, Q, 3, P, False)
    assert bound.arguments["assistant_ensemble_weight"] is False


def test_unknown_required_arguments_and_non_none_weights_are_refused():
    def renamed(candidate_input_ids, candidate_logits, candidate_length, target_logits): ...

    def surprise(candidate_input_ids, candidate_logits, candidate_length, new_logits, temperature): ...

    def weighted(candidate_input_ids, candidate_logits, candidate_length, new_logits, assistant_ensemble_weight=0.5): ...

    for fn, message in ((renamed, "no parameter"), (surprise, "unknown argument 'temperature'"), (weighted, "needs None")):
        with pytest.raises(AdapterError, match=message):
            bind_speculative_sampling(fn, **CORE)


def _leviathan(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate):
    """A faithful batch-1 implementation with the 4.40 signature, drawing from the global RNG."""
    drafts = candidate_input_ids[0, -candidate_length:]
    q, p = candidate_logits[0].softmax(-1), new_logits[0].softmax(-1)
    n = 0
    while n < candidate_length and torch.rand(()) < p[n, drafts[n]] / q[n, drafts[n]]:
        n += 1
    last = p[n] if n == candidate_length else (p[n] - q[n]).clamp(min=0)
    t = torch.multinomial(last / last.sum(), 1)
    return torch.cat((drafts[:n], t))[None], torch.tensor(n)


@pytest.mark.slow  # over 30 s: the slow tier (`make test-slow`)
def test_the_adapter_passes_a_faithful_batch_one_sampler_and_catches_a_broken_one():
    cases = [c for c in CASES if c.id in ("direct/far_apart/V8/g1", "direct/far_apart/V8/g3")]
    config = SuiteConfig(epsilon=0.1)
    assert run_suite(cases, speculative_sampling_sampler(_leviathan), config).verdict == Verdict.PASS

    def swapped(candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done_candidate):
        target = torch.cat((candidate_logits, new_logits[:, -1:]), 1)
        return _leviathan(candidate_input_ids, new_logits[:, :-1], candidate_length, target, False)

    assert run_suite(cases, speculative_sampling_sampler(swapped), config).verdict == Verdict.FAIL
