"""The direct path of the vLLM target: ``vllm.v1.sample.rejection_sampler.rejection_sample`` bound by keyword.

Direct cases run the fixture battery through it, arguments bound by keyword from its signature: n trials of a
chain step are n requests of one batched call, drafts drawn from q here (the drafter's job), the bonus token
drawn here from p_{gamma+1} (vLLM's caller samples it; it is an input of the rejection sampler), and the
target's processing (temperature, top-k, top-p) applied by vLLM's own ``apply_sampling_constraints`` before
the ratio test, as ``RejectionSampler.forward`` does. Where every draft row of q is one-hot,
``draft_probs=None`` is passed: that is how vLLM's greedy drafters (the draft-model default,
``draft_sample_method="greedy"``) and ngram report q, and the kernels then take a separate branch.

:class:`~specwatch.targets.base.AdapterError` (the kit's) is how every module of this adapter reports a vLLM it cannot adapt.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specwatch.sampling import Processing, Sampler, SpecOutput, SpecStep, sample_rows, uniforms
from specwatch.targets.base import AdapterError, bind_keywords

#: The arguments of ``rejection_sample`` the adapter fills; any other parameter must have a default.
CORE_ARGUMENTS = (
    "draft_token_ids",
    "num_draft_tokens",
    "max_spec_len",
    "cu_num_draft_tokens",
    "draft_probs",
    "target_logits",
    "bonus_token_ids",
    "sampling_metadata",
)


#: Optional parameters with a single lossless value: synthetic acceptance accepts at fixed rates (a
#: benchmarking mode, lossy by design) and must stay off.
_LOSSLESS_DEFAULTS: dict[str, Any] = {"synthetic_mode": False, "synthetic_conditional_rates": None}


def bind_rejection_sample(fn: Callable[..., Any], **core: Any) -> dict[str, Any]:
    """Keyword arguments for ``rejection_sample`` (:func:`bind_keywords`: :data:`CORE_ARGUMENTS` given,
    :data:`_LOSSLESS_DEFAULTS` at their lossless values)."""
    missing_core = [name for name in CORE_ARGUMENTS if name not in core]
    if missing_core:
        raise TypeError(f"bind_rejection_sample needs {missing_core}")
    return bind_keywords(fn, {name: core[name] for name in CORE_ARGUMENTS}, label="rejection_sample", lossless=_LOSSLESS_DEFAULTS)


def sampling_metadata(cls: type, processing: Processing, batch: int, device: torch.device) -> Any:
    """A ``SamplingMetadata`` for ``batch`` random-sampling requests with ``processing`` and nothing else
    (no penalties, no masks, no logits processors, no per-request generators).

    Built from the dataclass's fields by name: a field this function does not know must have a default.
    """
    if not dataclasses.is_dataclass(cls):
        raise AdapterError(f"{cls.__qualname__} is not a dataclass")
    known: dict[str, Callable[[], Any]] = {
        "temperature": lambda: torch.full((batch,), processing.temperature, dtype=torch.float32, device=device),
        "all_greedy": lambda: False,
        "all_random": lambda: True,
        "top_p": lambda: (
            None if processing.top_p in (None, 1.0) else torch.full((batch,), processing.top_p, dtype=torch.float32, device=device)
        ),
        "top_k": lambda: None if processing.top_k is None else torch.full((batch,), processing.top_k, dtype=torch.int32, device=device),
        "min_p": lambda: None,
        "generators": dict,
        "max_num_logprobs": lambda: None,
        "no_penalties": lambda: True,
        "prompt_token_ids": lambda: None,
        "frequency_penalties": lambda: torch.zeros(batch, dtype=torch.float32, device=device),
        "presence_penalties": lambda: torch.zeros(batch, dtype=torch.float32, device=device),
        "repetition_penalties": lambda: torch.ones(batch, dtype=torch.float32, device=device),
        "output_token_ids": lambda: [[] for _ in range(batch)],
        "allowed_token_ids_mask": lambda: None,
        "bad_words_token_ids": dict,
        "logitsprocs": lambda: _logits_processors(cls),
    }
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name in known and (required or f.name != "logitsprocs"):
            kwargs[f.name] = known[f.name]()
        elif required:
            raise AdapterError(f"SamplingMetadata requires unknown field {f.name!r}")
    return cls(**kwargs)


def _logits_processors(metadata_cls: type) -> Any:
    """An empty ``LogitsProcessors`` from the package that defines ``SamplingMetadata``."""
    package = metadata_cls.__module__.rpartition(".")[0]
    module = importlib.import_module(f"{package}.logits_processor")
    return module.LogitsProcessors()


def one_hot_rows(probs: torch.Tensor) -> bool:
    """Every row puts all its mass on one token (a greedy drafter's or ngram's q)."""
    return bool(((probs > 0).sum(dim=-1) == 1).all())


#: Most elements of the [requests * gamma, V] float32 tensors in one call (64 MiB each).
_CALL_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class RejectionSampleApi:
    """What the direct sampler calls: ``rejection_sample``, the processing step and the metadata class."""

    rejection_sample: Callable[..., Any]
    apply_sampling_constraints: Callable[..., Any] | None
    metadata_cls: type


def rejection_sampler(api: RejectionSampleApi) -> Sampler:
    """A Sampler whose ratio test, recovered tokens and assembly are vLLM's ``rejection_sample``.

    Randomness: vLLM draws its uniforms and exponentials from torch's global RNG (no per-request generators
    here), which is seeded once per batch from the case's private generator, never inside the loop.
    """

    def sampler(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
        gamma, vocab, device = step.gamma, step.vocab_size, step.device
        q, p = step.draft_probs, step.target_probs
        drafts = sample_rows(q, uniforms(n, gamma, generator, device))
        bonus = sample_rows(p[gamma:], uniforms(n, 1, generator, device))
        no_draft_probs = one_hot_rows(q)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=device))
        torch.manual_seed(seed)
        tokens = torch.empty((n, gamma + 1), dtype=torch.long, device=device)
        chunk = max(1, _CALL_ELEMENTS // (gamma * vocab))
        # Raw target logits: vLLM applies the processing itself. An identity processing keeps
        # log(p) (exactly the law the fixture defines).
        raw = step.target_logits[:gamma].float() if not step.target_processing.is_identity else torch.log(p[:gamma]).float()
        for start in range(0, n, chunk):
            b = min(chunk, n - start)
            out = _call(
                api,
                step,
                drafts=drafts[start : start + b],
                bonus=bonus[start : start + b],
                raw_target=raw,
                draft_probs=None if no_draft_probs else q.float(),
                batch=b,
            )
            tokens[start : start + b] = out.long()
        emitted = (tokens >= 0).sum(dim=1)
        return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=(emitted - 1).clamp(min=0))

    return sampler


def _call(
    api: RejectionSampleApi,
    step: SpecStep,
    *,
    drafts: torch.Tensor,
    bonus: torch.Tensor,
    raw_target: torch.Tensor,
    draft_probs: torch.Tensor | None,
    batch: int,
) -> torch.Tensor:
    gamma, vocab, device = step.gamma, step.vocab_size, step.device
    cu = torch.arange(1, batch + 1, dtype=torch.int32, device=device) * gamma
    metadata = sampling_metadata(api.metadata_cls, step.target_processing, batch, device)
    target_logits = raw_target[None].expand(batch, gamma, vocab).reshape(batch * gamma, vocab).contiguous()
    if not step.target_processing.is_identity:  # what RejectionSampler.forward does before rejection_sample
        if api.apply_sampling_constraints is None:
            raise AdapterError("this vLLM has no apply_sampling_constraints: processed direct cases cannot run")
        target_logits = api.apply_sampling_constraints(target_logits, cu, metadata)
    kwargs = bind_rejection_sample(
        api.rejection_sample,
        draft_token_ids=drafts.reshape(-1).to(torch.int32).contiguous(),
        num_draft_tokens=[gamma] * batch,
        max_spec_len=gamma,
        cu_num_draft_tokens=cu,
        draft_probs=None
        if draft_probs is None
        else draft_probs[None].expand(batch, gamma, vocab).reshape(batch * gamma, vocab).contiguous(),
        target_logits=target_logits,
        bonus_token_ids=bonus.reshape(batch, 1).to(torch.int64).contiguous(),
        sampling_metadata=metadata,
    )
    out: torch.Tensor = api.rejection_sample(**kwargs)
    return out
