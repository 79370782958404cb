"""SGLang as a target: what the installed SGLang offers, found by looking, and the cases it runs.

- direct cases: the fixture battery through ``chain_speculative_sampling_triton`` (classic and block verification),
  bound by keyword from its signature (:mod:`.bindings`); Triton on CUDA, or Triton's interpreter on the CPU for a
  kernels-only install (:mod:`specwatch.targets.install`; the interpreter's additions are vLLM's target's,
  :mod:`specwatch.targets.vllm.interpreter`);
- tree cases through ``tree_speculative_sampling_target_only`` (JIT CUDA: where it is None, skipped with the reason);
- the verification a sampled request gets on the run's device (:mod:`.dispatch`): on a CPU it is greedy in
  sglang <= 0.5.23, and those cases fail (a known finding) instead of passing silently;
- end-to-end engine cases (:mod:`.e2e`): a GPU's, skipped with the reason elsewhere.

The verification thresholds must be lossless (1.0) in the engine's defaults and the tree kernel's signature
(:func:`~.bindings.engine_thresholds`): a release shipping another default cannot be adapted.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specwatch.cases import LIBRARY_DIRECT_EPSILON, Case, library_epsilon
from specwatch.protocol import LibraryIdentity
from specwatch.sampling import Sampler
from specwatch.targets.base import Adapter, AdapterError, refusing_sampler
from specwatch.targets.sglang import e2e
from specwatch.targets.sglang.bindings import MODULE, chain_sampler, engine_thresholds
from specwatch.targets.sglang.cases import INTERPRETER_PROBE_TRIALS, chain_cases, dispatch_cases, tree_cases
from specwatch.targets.sglang.dispatch import load_verify_uses_greedy
from specwatch.targets.vllm import interpreter

QUICK = frozenset(
    {
        "direct/far_apart/V8/g1",
        "direct/close/V64/g5",
        "direct/processed_both/V64/g3",
        "direct/disjoint/V8/g3",
        "direct/p_equals_q/V64/g3",
        "direct_block/far_apart/V8/g1",
        "direct_block/close/V64/g5",
        "direct_block/greedy_draft/V8/g3",
        "tree/chain/V8/d3",
        "tree/branching2/V8/d2",
        "tree/branching321/V64/d3",
        "engine/verify_dispatch/default/V8/g3",
        "engine/verify_dispatch/rejection_sampling/V8/g3",
    }
)
#: Under Triton's interpreter (about 40 ms a trial: each program instance runs in Python, with the kernel's
#: 4096-wide vocabulary tile): the quick profile and the TV distance every case is tested at.
INTERPRETER_QUICK = frozenset(
    {
        "direct/far_apart/V8/g1",
        "direct/near_identical/V64/g5",
        "direct_block/far_apart/V8/g1",
        "direct_block/disjoint/V8/g3",
        "engine/verify_dispatch/default/V8/g3",
        "engine/verify_dispatch/rejection_sampling/V8/g3",
    }
)
INTERPRETER_EPSILON = 0.3
TREE_UNREACHABLE = (
    "not reachable: tree_speculative_sampling_target_only is a JIT CUDA kernel (sglang's verify_sampling resolves it "
    "to None without CUDA); its rule and exact law are tested against a Python transcription in the suite's tests"
)


@dataclass
class SglangAdapter(Adapter):
    """What the installed SGLang offers, found by looking, not by version tables."""

    version: str
    path: str
    chain_kernel: Callable[..., Any] | None
    tree_kernel: Callable[..., Any] | None
    uses_greedy: Callable[..., bool] | None
    greedy_source: str
    thresholds: dict[str, float] = field(default_factory=dict)
    kernels: str = "unknown"
    errors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls) -> SglangAdapter:
        os.environ.setdefault("SGLANG_LOGGING_LEVEL", "WARNING")
        kernels = interpreter.prepare() if interpreter.active() else ("triton (CUDA)" if torch.cuda.is_available() else "triton")
        module = _kernel_module()
        errors: dict[str, str] = {}
        chain = getattr(module, "chain_speculative_sampling_triton", None)
        tree = getattr(module, "tree_speculative_sampling_target_only", None)
        if tree is not None:
            defaults = {n: p.default for n, p in inspect.signature(tree).parameters.items() if n.startswith("threshold")}
            if any(v not in (inspect.Parameter.empty, 1.0) for v in defaults.values()):
                raise AdapterError(f"tree_speculative_sampling_target_only's thresholds default to {defaults}; lossless needs 1.0")
        thresholds = engine_thresholds(_engine_defaults())
        try:
            uses_greedy, source = load_verify_uses_greedy()
        except AdapterError as exc:
            uses_greedy, source = None, ""
            errors["verify_dispatch"] = str(exc)
        return cls(
            version=_version(),
            path=str(getattr(importlib.import_module("sglang"), "__file__", "") or ""),
            chain_kernel=chain,
            tree_kernel=tree,
            uses_greedy=uses_greedy,
            greedy_source=source,
            thresholds=thresholds,
            kernels=kernels,
            errors=errors,
        )

    def describe(self) -> LibraryIdentity:
        """The build's identity: version, path, torch, the kernels that ran and the verification defaults."""
        details = {
            "torch": torch.__version__,
            "kernels": self.kernels,
            "tree_kernel": "tree_speculative_sampling_target_only (CUDA)" if self.tree_kernel is not None else "none (needs CUDA)",
            "thresholds": ", ".join(f"{k} {v}" for k, v in self.thresholds.items()),
            "verify_dispatch": self.greedy_source or self.errors.get("verify_dispatch", ""),
        }
        return LibraryIdentity(name="sglang", distribution="sglang", version=self.version, path=self.path, details=details)

    def sampler(self) -> Sampler:
        kernel = self.chain_kernel
        if kernel is None:
            return refusing_sampler(f"sglang {self.version} has no chain_speculative_sampling_triton")
        return chain_sampler(kernel)

    def cases(self) -> tuple[Case, ...]:
        slow = interpreter.active()
        if self.chain_kernel is None:
            direct: tuple[Case, ...] = ()
        else:
            direct = chain_cases(self.chain_kernel, probe_trials=INTERPRETER_PROBE_TRIALS if slow else None)
        trees = tree_cases(self.tree_kernel, skip_reason=TREE_UNREACHABLE)
        if self.uses_greedy is None:
            reason = f"not reachable: {self.errors.get('verify_dispatch', '_verify_uses_greedy not found')}"
            engine: tuple[Case, ...] = tuple(
                dataclasses.replace(c, make_experiment=None, skip_reason=reason)
                for c in dispatch_cases(lambda **_: True, chain_kernel=None, tree_kernel=None, source="")
            )
        else:
            engine = dispatch_cases(
                self.uses_greedy, chain_kernel=self.chain_kernel, tree_kernel=self.tree_kernel, source=self.greedy_source.split(" (")[0]
            )
        epsilon = INTERPRETER_EPSILON if slow else LIBRARY_DIRECT_EPSILON
        quick = INTERPRETER_QUICK if slow else QUICK
        tuned = tuple(
            dataclasses.replace(c, epsilon=library_epsilon(c, epsilon), quick=c.id in quick or c.family == "edge")
            for c in direct + trees + engine
        )
        return tuned + e2e.e2e_cases(self)


#: Where releases before ``verify_sampling`` keep the Triton chain sampler (0.5.16-0.5.20; 0.5.15 and earlier).
OLDER_MODULES = ("sglang.kernels.ops.speculative.reject_sampling", "sglang.srt.speculative.reject_sampling")


def _kernel_module() -> Any:
    """``verify_sampling`` (the kernels resolved per platform), else the module an older release keeps the chain
    sampler in (the tree kernel then counts as absent)."""
    errors = []
    for name in (MODULE, *OLDER_MODULES):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not (exc.name or "").startswith("sglang"):
                raise AdapterError(f"cannot import {name}: {type(exc).__name__}: {exc}") from exc
            errors.append(f"{name}: {exc}")
        except Exception as exc:
            raise AdapterError(f"cannot import {name}: {type(exc).__name__}: {exc}") from exc
    raise AdapterError(f"this sglang has none of the verification modules ({'; '.join(errors)})")


def _engine_defaults() -> dict[str, Any]:
    """The defaults of the engine's speculative fields (``srt/arg_groups/fields/spec.py``'s ``Spec``; older releases
    keep them on ``ServerArgs``)."""
    for module_name, class_name in (("sglang.srt.arg_groups.fields.spec", "Spec"), ("sglang.srt.server_args", "ServerArgs")):
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except Exception:  # noqa: BLE001, S112 - the next place to look
            continue
        found = {}
        for name in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
            fields = getattr(cls, "__struct_defaults__", None)
            if hasattr(cls, "__struct_fields__") and fields is not None:
                names = cls.__struct_fields__
                offset = len(names) - len(fields)
                if name in names and names.index(name) >= offset:
                    found[name] = fields[names.index(name) - offset]
            elif dataclasses.is_dataclass(cls):
                found.update({f.name: f.default for f in dataclasses.fields(cls) if f.name == name})
        if found:
            return found
    raise AdapterError("cannot read the engine's speculative_accept_threshold_* defaults")


def _version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(importlib.import_module("sglang.version"), "__version__", "unknown"))
