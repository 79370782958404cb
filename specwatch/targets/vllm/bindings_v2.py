"""The direct path of vLLM's model-runner-v2 rejection sampler (vLLM >= 0.34), bound by keyword from its signature.

``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils.rejection_sample`` is pure Triton. Its layout, read from
its kernels: each request has gamma + 1 logits rows, the last one the bonus row (the bonus token is sampled inside,
by Gumbel-max over that row: it is not an input); ``draft_sampled[row]`` is the input token at that row, so the
draft verified against row ``start + i`` is ``draft_sampled[start + i + 1]`` (``draft_sampled[start]``, the last
accepted token, is not read). Draft logits come as a cache (``values`` [request states, steps, V], stored before
temperature and divided by the request's temperature inside; ``row_mapping`` None: indexed by request state),
or None for one-hot drafts (ngram, greedy drafters), which take a separate branch. Temperature and seed are per
request state; the ratio test's uniform is Philox at (seed, position), the resampling noise murmur3 at
(seed, position, token).

Here n trials of a chain step are n requests of one call: drafts drawn from q here (the drafter's job), one seed
per request from the case's private generator, positions 0..gamma. q enters as draft logits ``log(q) * T`` (T the
request's temperature), whose softmax at T is exactly the fixture's q. The target's processing (temperature, top-k,
top-p) is the v2 ``Sampler.apply_sampling_params`` step: its ``SamplingStates`` calls vLLM's temperature kernel and
then ``apply_top_k_top_p``; those two functions are called here in that order, on one request's rows (the step is
row by row and deterministic, and every request has the same rows). ``SamplingStates`` itself is not built: its
module imports ``vllm.sampling_params``, whose dependencies (msgspec, ...) a kernels-only install leaves out, and it
keeps its state in host-mapped device buffers; the logits processors ``apply_sampling_params`` also runs (bias,
penalties, bad words) are off for plain sampling parameters, and min-p is not among the fixtures' processing.

Every optional parameter must default to its lossless value: synthetic acceptance rates, FLy (``fly_window_size >
0``, a lossy window that defers rejections) and watermarking are lossy by design and stay off. Block verification
(``use_block_verification=True``, ``rejection_sample_method="block"``) is claimed lossless and runs as its own cases.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specwatch.cases import Case
from specwatch.experiments import ChainExperiment, CheckSpec, Experiment, Observation
from specwatch.laws import MAX_JOINT_CELLS
from specwatch.sampling import Processing, Sampler, SpecOutput, SpecStep, sample_rows, uniforms
from specwatch.targets.base import AdapterError, LibraryExperiment, bind_keywords
from specwatch.targets.vllm.bindings import one_hot_rows

#: Where the model-runner-v2 sampler lives.
MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"

#: The arguments of ``rejection_sample`` the adapter fills; any other parameter must have a default.
CORE_ARGUMENTS = (
    "target_logits",
    "draft_logits_cache",
    "draft_sampled",
    "cu_num_logits",
    "pos",
    "idx_mapping",
    "expanded_idx_mapping",
    "expanded_local_pos",
    "temperature",
    "seed",
    "num_speculative_steps",
)

#: Optional parameters with a single lossless value, which must be their defaults: synthetic acceptance (fixed
#: rates), FLy (defers rejections in a window) and watermarking (keyed resampling) change the law by design.
LOSSLESS_DEFAULTS: dict[str, Any] = {
    "synthetic_conditional_rates": None,
    "fly_window_size": 0,
    "contexts": None,
    "watermarking": None,
    "watermarking_skip_mask": None,
    "watermark_key": None,
    "use_block_verification": False,
}

#: Set as vLLM's ``RejectionSampler._verify`` sets it, where the release has it: whether processing may leave -inf.
_SKIP_MASKED = "skip_masked_vocab_blocks"
_BLOCK = "use_block_verification"


def bind_rejection_sample_v2(fn: Callable[..., Any], *, block: bool = False, may_mask: bool = False, **core: Any) -> dict[str, Any]:
    """Keyword arguments for v2 ``rejection_sample`` (:func:`~specwatch.targets.base.bind_keywords`:
    :data:`CORE_ARGUMENTS` given, :data:`LOSSLESS_DEFAULTS` at their lossless values, but ``use_block_verification``
    set with ``block``, which needs the release to have it; ``skip_masked_vocab_blocks`` set to ``may_mask`` where
    the release has it)."""
    missing_core = [name for name in CORE_ARGUMENTS if name not in core]
    if missing_core:
        raise TypeError(f"bind_rejection_sample_v2 needs {missing_core}")
    label = "rejection_sample (model runner v2)"
    if block and _BLOCK not in inspect.signature(fn).parameters:
        raise AdapterError(f"{label} has no {_BLOCK}: no block verification in this release")
    chosen = {_SKIP_MASKED: may_mask, **({_BLOCK: True} if block else {})}
    return bind_keywords(fn, {name: core[name] for name in CORE_ARGUMENTS}, label=label, lossless=LOSSLESS_DEFAULTS, fixed=chosen)


@dataclass(frozen=True)
class DraftLogits:
    """What ``rejection_sample`` reads of a ``DraftLogitsCache``: ``values`` [request states, steps, V] (before
    temperature) and ``row_mapping`` (None: a replicated cache, indexed by request state)."""

    values: torch.Tensor
    row_mapping: torch.Tensor | None = None


@dataclass(frozen=True)
class RejectionSampleV2Api:
    """What the direct sampler calls: ``rejection_sample`` and the processing step's two functions."""

    rejection_sample: Callable[..., Any]
    apply_temperature: Callable[..., Any] | None
    apply_top_k_top_p: Callable[..., Any] | None

    @classmethod
    def load(cls) -> RejectionSampleV2Api:
        """The installed vLLM's model-runner-v2 functions; :class:`AdapterError` when the sampler is missing."""
        try:
            module = importlib.import_module(MODULE)
        except Exception as exc:
            raise AdapterError(f"cannot import {MODULE}: {type(exc).__name__}: {exc}") from exc
        fn = getattr(module, "rejection_sample", None)
        if fn is None:
            raise AdapterError(f"{MODULE} has no rejection_sample")
        return cls(
            rejection_sample=fn,
            apply_temperature=_optional("vllm.v1.worker.gpu.sample.gumbel", "apply_temperature"),
            apply_top_k_top_p=_optional("vllm.v1.sample.ops.topk_topp_sampler", "apply_top_k_top_p"),
        )


def _optional(module: str, name: str) -> Callable[..., Any] | None:
    try:
        found: Callable[..., Any] | None = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    return found


#: Most elements of the [requests * (gamma + 1), V] float32 target logits in one call (64 MiB), and most requests
#: (under the interpreter, which runs each program instance in turn, a call's own cost is small either way).
_CALL_ELEMENTS = 1 << 24
_CALL_REQUESTS = 4096


def rejection_sampler_v2(api: RejectionSampleV2Api, *, block: bool = False) -> Sampler:
    """A Sampler whose ratio test (or block verification), resampling, bonus token and assembly are vLLM's v2
    ``rejection_sample``."""

    def sampler(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
        gamma, device = step.gamma, step.device
        q = step.draft_probs
        drafts = sample_rows(q, uniforms(n, gamma, generator, device))
        seeds = torch.randint(0, 2**62, (n,), generator=generator, device=device, dtype=torch.int64)
        tokens = torch.full((n, gamma + 1), -1, dtype=torch.long, device=device)
        emitted = torch.empty(n, dtype=torch.long, device=device)
        per_call = max(1, min(_CALL_REQUESTS, _CALL_ELEMENTS // ((gamma + 1) * step.vocab_size)))
        for start in range(0, n, per_call):
            b = min(per_call, n - start)
            sampled, num_sampled = call_v2(api, step, drafts[start : start + b], seeds[start : start + b], block=block)
            count = num_sampled.long()
            keep = torch.arange(gamma + 1, device=device)[None] < count[:, None]
            tokens[start : start + b] = torch.where(keep, sampled.long(), -1)
            emitted[start : start + b] = count
        return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=(emitted - 1).clamp(min=0))

    return sampler


def call_v2(api: RejectionSampleV2Api, step: SpecStep, drafts: torch.Tensor, seeds: torch.Tensor, *, block: bool) -> tuple[Any, Any]:
    """One call of v2 ``rejection_sample`` for ``len(drafts)`` requests of ``step``: (sampled, num_sampled)."""
    gamma, vocab, device = step.gamma, step.vocab_size, step.device
    batch, rows = drafts.shape[0], gamma + 1
    processing = step.target_processing
    temperature = float(torch.tensor(processing.temperature, dtype=torch.float32))  # the value the kernels read
    idx_mapping = torch.arange(batch, dtype=torch.int32, device=device)
    expanded_idx_mapping = idx_mapping.repeat_interleave(rows)
    expanded_local_pos = torch.arange(rows, dtype=torch.int32, device=device).repeat(batch)
    draft_sampled = torch.zeros((batch, rows), dtype=torch.int32, device=device)
    draft_sampled[:, 1:] = drafts.to(torch.int32)
    # Raw target logits, all gamma + 1 rows: vLLM applies the processing. An identity processing keeps log(p).
    # Processing is row by row and deterministic, and every request has the same rows: it runs on one copy.
    raw = step.target_logits.float() if not processing.is_identity else torch.log(step.target_probs).float()
    temperatures = torch.full((batch,), temperature, dtype=torch.float32, device=device)
    if not processing.is_identity:
        one_request = torch.zeros(rows, dtype=torch.int32, device=device)
        raw = _process(api, raw, processing=processing, expanded_idx_mapping=one_request, temperatures=temperatures[:1], vocab=vocab)
    target_logits = raw.repeat(batch, 1).contiguous()
    q = step.draft_probs
    cache = None
    if not one_hot_rows(q):
        values = (torch.log(q) * temperature).float()  # softmax(values / T) == q
        cache = DraftLogits(values[None].expand(batch, gamma, vocab).contiguous())
    kwargs = bind_rejection_sample_v2(
        api.rejection_sample,
        block=block,
        may_mask=processing.top_k is not None or processing.top_p not in (None, 1.0),
        target_logits=target_logits,
        draft_logits_cache=cache,
        draft_sampled=draft_sampled.reshape(-1),
        cu_num_logits=torch.arange(batch + 1, dtype=torch.int32, device=device) * rows,
        pos=torch.arange(rows, dtype=torch.int64, device=device).repeat(batch),
        idx_mapping=idx_mapping,
        expanded_idx_mapping=expanded_idx_mapping,
        expanded_local_pos=expanded_local_pos,
        temperature=temperatures,
        seed=seeds.contiguous(),
        num_speculative_steps=gamma,
    )
    sampled, num_sampled = api.rejection_sample(**kwargs)
    return sampled, num_sampled


def _process(
    api: RejectionSampleV2Api,
    logits: torch.Tensor,
    *,
    processing: Processing,
    expanded_idx_mapping: torch.Tensor,
    temperatures: torch.Tensor,
    vocab: int,
) -> torch.Tensor:
    """``SamplingStates``' part of ``Sampler.apply_sampling_params``: temperature in place, then top-k/top-p."""
    if api.apply_temperature is None or api.apply_top_k_top_p is None:
        raise AdapterError("this vLLM has no apply_temperature or apply_top_k_top_p: processed direct cases cannot run")
    logits = logits.clone()
    if processing.temperature != 1.0:
        api.apply_temperature(logits, expanded_idx_mapping, temperatures)
    rows = logits.shape[0]
    device = logits.device
    top_k = (
        None
        if processing.top_k is None or processing.top_k >= vocab
        else torch.full((rows,), processing.top_k, dtype=torch.int32, device=device)
    )
    top_p = None if processing.top_p in (None, 1.0) else torch.full((rows,), processing.top_p, dtype=torch.float32, device=device)
    if top_k is None and top_p is None:
        return logits
    processed: torch.Tensor = api.apply_top_k_top_p(logits, top_k, top_p, has_topp_only_rows=top_p is not None and top_k is None)
    return processed


class BlockVerificationExperiment(LibraryExperiment):
    """A chain step through block verification: only the law it claims is tested.

    Block verification (Sun et al., "Block verification accelerates speculative decoding") keeps the longest draft
    prefix that passes a test looking one position ahead, so whether position t is emitted depends on the tokens
    after it: the emitted token at t given t emitted need not follow p_t, and acceptance is not Leviathan's. What
    it claims is that the step's output, completed by fresh target draws, follows the target: the completed joint
    law (``lossless/joint``), or its adjacent pairs (``lossless/pair{t}``) where the joint has too many cells.
    Those checks of the wrapped :class:`ChainExperiment` size the run here; its per-position and conformance checks
    are off (its structural checks stay: ids in range, -1 padding, an accepted prefix equal to the drafts).
    """

    acceptance_unmeasured = "block verification accepts by its own rule, not Leviathan's; there is no expectation to compare"

    def __init__(self, chain: ChainExperiment) -> None:
        self.chain = chain
        self.probe_trials = chain.probe_trials
        claimed = ("lossless/joint", "lossless/pair")
        self._checks = tuple(dataclasses.replace(c, designed=True) for c in chain.checks if c.name.startswith(claimed))

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    @property
    def accepted_per_trial_max(self) -> int:
        """gamma, as for the wrapped step: block verification also accepts at most its drafts."""
        return self.chain.accepted_per_trial_max

    def run(self, n: int, generator: torch.Generator) -> Observation:
        obs = self.chain.run(n, generator)
        counts = {c.name: obs.counts[c.name] for c in self._checks if c.name in obs.counts}
        return dataclasses.replace(obs, counts=counts)


#: Trials of a case's fingerprint probe under Triton's interpreter (a vectorised step probes 1024: seconds there).
INTERPRETER_PROBE_TRIALS = 64


def v2_cases(api: RejectionSampleV2Api, battery: Sequence[Case], *, probe_trials: int | None = None) -> tuple[Case, ...]:
    """The ``battery`` through v2 ``rejection_sample`` (same ids), then through its block verification
    (``direct_block/...``; a release without ``use_block_verification`` gets those as skipped cases that say so).
    ``probe_trials``: the fingerprint probe's trials, where not the experiment's own."""
    direct = tuple(c for c in battery if c.make_step is not None)
    sampler = rejection_sampler_v2(api)
    plain = tuple(_case(c, sampler, probe_trials, block=False) for c in direct)
    if _BLOCK not in inspect.signature(api.rejection_sample).parameters:
        reason = "not reachable: this release's rejection_sample has no use_block_verification"
        block = tuple(_as_block(dataclasses.replace(c, make_step=None, skip_reason=reason)) for c in direct)
    else:
        block_sampler = rejection_sampler_v2(api, block=True)
        block = tuple(_as_block(_block_case(c, block_sampler, probe_trials)) for c in direct)
    return plain + block


def _block_case(case: Case, sampler: Sampler, probe_trials: int | None) -> Case:
    """The block variant of ``case``, or a skipped case where its step has no completed-law check (the completed
    joint and its adjacent pairs both exceed ``MAX_JOINT_CELLS``: V = 1024 and more)."""
    step = case.step()
    vocab, gamma = step.vocab_size, step.gamma
    if vocab ** (gamma + 1) > MAX_JOINT_CELLS and vocab**2 > MAX_JOINT_CELLS:
        reason = (
            f"not reachable: block verification is checked on the completed joint law or its adjacent pairs, and at "
            f"V = {vocab} both exceed {MAX_JOINT_CELLS} cells"
        )
        return dataclasses.replace(case, make_step=None, skip_reason=reason)
    return _case(case, sampler, probe_trials, block=True)


def _case(case: Case, sampler: Sampler, probe_trials: int | None, *, block: bool) -> Case:
    make = case.make_step
    assert make is not None

    def experiment(device: torch.device) -> Experiment:
        chain = ChainExperiment(make().to(device), sampler)
        if probe_trials is not None:
            chain.probe_trials = probe_trials
        return BlockVerificationExperiment(chain) if block else chain

    return dataclasses.replace(case, make_experiment=experiment)


def _as_block(case: Case) -> Case:
    return dataclasses.replace(
        case,
        id=case.id.replace("direct/", "direct_block/", 1),
        family="direct_block",
        description=f"block verification: {case.description}",
    )
