"""SGLang's verification kernels as the suite calls them, bound by keyword from their signatures.

Both kernels SGLang's ``eagle_sample`` (``srt/speculative/eagle_utils.py``) calls for sampled requests share one
signature: ``(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
threshold_single, threshold_acc, deterministic)``; they write ``predicts``, ``accept_index`` and
``accept_token_num``.

- ``chain_speculative_sampling_triton`` (``kernels/ops/speculative/reject_sampling.py``, Triton), the opt-in
  ``speculative_use_rejection_sampling`` path (EAGLE, topk 1): Leviathan's test with the draft's probabilities, or
  block verification (``block_verification=True``, ``speculative_use_block_verification``). The chain battery runs
  through it here: n trials are n requests of one call (the grid), the drafts drawn from q here (the drafter's job),
  a chain laid out as SGLang's verify input lays it (node 0 the last verified token, node i the i-th draft), target
  probabilities for the gamma + 1 nodes and draft probabilities for the gamma drafts, coins from the case's
  generator (``_verify_coins`` draws them with ``torch.rand`` the same way). Its thresholds are ignored by the kernel;
  they are passed at the engine's defaults.
- ``tree_speculative_sampling_target_only`` (JIT CUDA; :mod:`.tree` has its rule, exact law and a Python
  transcription): the default path; exact only at ``threshold_single = threshold_acc = 1``, which must be its
  defaults and the engine's (``speculative_accept_threshold_single``, ``speculative_accept_threshold_acc``).

SGLang's verification gets *processed* target probabilities (``sampling_softmax`` with the temperature, then
``top_k_renorm_prob`` and ``top_p_renorm_prob``: flashinfer/JIT CUDA kernels) and the draft's probabilities; here both
are the fixture's exact processed laws in float32 (the processing kernels do not run without CUDA).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from specwatch.sampling import Sampler, SpecOutput, SpecStep, sample_rows, uniforms
from specwatch.targets.base import AdapterError, bind_keywords
from specwatch.targets.sglang.tree import coins

#: Where the kernels live (``verify_sampling`` resolves them per platform: the tree kernel is None without CUDA).
MODULE = "sglang.kernels.ops.speculative.verify_sampling"
#: The arguments the suite fills, in the kernels' order.
CORE_ARGUMENTS = (
    "predicts",
    "accept_index",
    "accept_token_num",
    "candidates",
    "retrive_index",
    "retrive_next_token",
    "retrive_next_sibling",
    "uniform_samples",
    "uniform_samples_for_final_sampling",
    "target_probs",
    "draft_probs",
    "threshold_single",
    "threshold_acc",
    "deterministic",
)
#: The lossless thresholds (the engine's defaults): a threshold below 1 accepts more than the target allows.
LOSSLESS_THRESHOLDS: dict[str, float] = {"threshold_single": 1.0, "threshold_acc": 1.0}
#: The engine's fields holding them (``srt/arg_groups/fields/spec.py``).
ENGINE_THRESHOLDS = {"speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0}
_BLOCK = "block_verification"


def bind(fn: Callable[..., Any], core: Mapping[str, Any], *, label: str, chosen: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``fn`` as the installed release spells it (:func:`~specwatch.targets.base.bind_keywords`):
    every name of ``core`` must be a parameter; a threshold with a default must default to its lossless value
    (:data:`LOSSLESS_THRESHOLDS`); ``chosen`` sets optional parameters (which must exist); any other parameter must
    have a default."""
    return bind_keywords(fn, core, label=label, lossless=LOSSLESS_THRESHOLDS, required=chosen)


def engine_thresholds(defaults: Mapping[str, Any]) -> dict[str, float]:
    """The verification thresholds of the engine's defaults (``defaults``: field name -> default), checked to be
    lossless: :class:`AdapterError` when the release ships another default or lacks the fields."""
    found = {}
    for field_name, lossless in ENGINE_THRESHOLDS.items():
        if field_name not in defaults:
            raise AdapterError(f"the engine's arguments have no {field_name}")
        if float(defaults[field_name]) != lossless:
            raise AdapterError(f"the engine's {field_name} defaults to {defaults[field_name]!r}; lossless needs {lossless!r}")
        found[field_name.removeprefix("speculative_accept_")] = float(defaults[field_name])
    return found


#: Most elements of the [requests, gamma + 1, V] float32 target probabilities in one call (64 MiB).
_CALL_ELEMENTS = 1 << 24


def chain_sampler(kernel: Callable[..., Any], *, block: bool = False) -> Sampler:
    """A Sampler whose verification (Leviathan's test or block verification), residual, bonus token and layout are
    ``kernel``'s (``chain_speculative_sampling_triton``)."""

    def sampler(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
        gamma, device = step.gamma, step.device
        drafts = sample_rows(step.draft_probs, uniforms(n, gamma, generator, device))
        tokens = torch.full((n, gamma + 1), -1, dtype=torch.long, device=device)
        accepted = torch.empty(n, dtype=torch.long, device=device)
        per_call = max(1, _CALL_ELEMENTS // ((gamma + 1) * step.vocab_size))
        for start in range(0, n, per_call):
            b = min(per_call, n - start)
            out, k = call_chain(kernel, step, drafts[start : start + b], generator, block=block)
            tokens[start : start + b], accepted[start : start + b] = out, k
        return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=accepted)

    return sampler


def call_chain(
    kernel: Callable[..., Any], step: SpecStep, drafts: torch.Tensor, generator: torch.Generator, *, block: bool, target_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """One call for ``len(drafts)`` requests of ``step``: the emitted tokens ([requests, gamma + 1], -1 after the
    last) and the accepted drafts per request. ``target_only``: ``draft_probs`` all zeros over the gamma + 1 nodes,
    as ``eagle_sample`` passes them to ``tree_speculative_sampling_target_only``."""
    gamma, vocab, device = step.gamma, step.vocab_size, step.device
    batch, slots = drafts.shape[0], gamma + 1
    candidates = torch.zeros((batch, slots), dtype=torch.int64, device=device)
    candidates[:, 1:] = drafts
    index = torch.arange(batch * slots, dtype=torch.int64, device=device).reshape(batch, slots)
    next_token = torch.tensor([*range(1, slots), -1], dtype=torch.int64, device=device).expand(batch, slots).contiguous()
    predicts = torch.full((batch * slots,), -1, dtype=torch.int32, device=device)
    accept_index = torch.full((batch, slots), -1, dtype=torch.int32, device=device)
    accept_num = torch.zeros(batch, dtype=torch.int32, device=device)
    core = {
        "predicts": predicts,
        "accept_index": accept_index,
        "accept_token_num": accept_num,
        "candidates": candidates,
        "retrive_index": index,
        "retrive_next_token": next_token,
        "retrive_next_sibling": torch.full((batch, slots), -1, dtype=torch.int64, device=device),
        "uniform_samples": coins(batch, slots, generator, device),
        "uniform_samples_for_final_sampling": coins(batch, 1, generator, device).reshape(batch),
        "target_probs": step.target_probs.float()[None].expand(batch, slots, vocab).contiguous(),
        "draft_probs": torch.zeros((batch, slots, vocab), dtype=torch.float32, device=device)
        if target_only
        else step.draft_probs.float()[None].expand(batch, gamma, vocab).contiguous(),
        **LOSSLESS_THRESHOLDS,
        "deterministic": True,
    }
    kwargs = bind(kernel, core, label=getattr(kernel, "__name__", "the verification kernel"), chosen={_BLOCK: True} if block else None)
    kernel(**kwargs)
    k = accept_num.long()
    emitted = predicts.long()[accept_index.long().clamp(min=0)]
    keep = torch.arange(slots, device=device)[None] <= k[:, None]
    return torch.where(keep, emitted, -1), k


def has_block_verification(kernel: Callable[..., Any]) -> bool:
    return _BLOCK in inspect.signature(kernel).parameters
