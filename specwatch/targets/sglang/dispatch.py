"""Which verification a sampled request gets: SGLang's ``eagle_sample`` dispatch, and its CPU/XPU greedy fallback.

``eagle_sample`` (``srt/speculative/eagle_utils.py``) commits the target's argmax (``verify_tree_greedy``: drafts
accepted while equal to the argmax, then the argmax) whenever ``_verify_uses_greedy(is_all_greedy, is_cpu, is_hip,
is_xpu, use_rejection_sampling)`` is true; sglang 0.5.23 has ``is_all_greedy or is_cpu or is_xpu or (is_hip and not
use_rejection_sampling)``: on a CPU or XPU every sampled request is verified greedily, whatever its temperature,
top-k and top-p (docs/findings.md, ``sglang-cpu-greedy-verification``). Otherwise sampled requests go to
``tree_speculative_sampling_target_only`` (CUDA) or, with ``speculative_use_rejection_sampling``,
``chain_speculative_sampling_triton``.

The function is the release's own: imported where ``eagle_utils`` imports (a full install), else compiled alone
from the release's ``eagle_utils.py`` (it is pure: its result depends on its arguments only), since a kernels-only
install cannot import that module (its imports reach the multimodal configs, which need torchvision).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from specwatch.sampling import Sampler, SpecOutput, SpecStep, sample_rows, uniforms
from specwatch.targets.base import AdapterError
from specwatch.targets.sglang.bindings import call_chain

MODULE = "sglang.srt.speculative.eagle_utils"
FUNCTION = "_verify_uses_greedy"


def load_verify_uses_greedy() -> tuple[Callable[..., bool], str]:
    """The release's ``_verify_uses_greedy`` and where it came from."""
    try:
        module = importlib.import_module(MODULE)
    except Exception as exc:  # noqa: BLE001 - a kernels-only install: compiled from the source below
        why = f"{type(exc).__name__}: {exc}"
    else:
        fn = getattr(module, FUNCTION, None)
        if fn is None:
            raise AdapterError(f"{MODULE} has no {FUNCTION}")
        return fn, f"{MODULE}.{FUNCTION}"
    spec = importlib.util.find_spec("sglang.srt.speculative")
    if spec is None or not spec.submodule_search_locations:
        raise AdapterError(f"cannot find {MODULE}'s source ({why})")
    path = Path(next(iter(spec.submodule_search_locations))) / "eagle_utils.py"
    return compile_function(path, FUNCTION), f"{FUNCTION} compiled alone from {path} (the module does not import here: {why[:160]})"


def compile_function(path: Path, name: str) -> Callable[..., bool]:
    """The top-level function ``name`` of the Python file ``path``, compiled without the rest of its module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[ast.stmt] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    if not found:
        raise AdapterError(f"{path} defines no {name}")
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102 - the release's own function
    fn: Callable[..., bool] = namespace[name]
    return fn


def platform_flags(device: torch.device) -> dict[str, bool]:
    """``_verify_uses_greedy``'s platform arguments for a run on ``device`` (``is_cpu`` as ``SGLANG_USE_CPU_ENGINE``
    would make it: the CPU engine is the engine on a CPU)."""
    hip = device.type == "cuda" and bool(getattr(torch.version, "hip", None))
    return {"is_cpu": device.type == "cpu", "is_hip": hip, "is_xpu": device.type == "xpu"}


def greedy_verify(step: SpecStep, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy branch of ``eagle_sample`` on a chain (``verify_tree_greedy``'s rule, transcribed: its CPU op lives
    in ``sgl_kernel``'s CPU build): the target's argmax per row of the target logits, drafts accepted while they equal
    it, then the argmax. Temperature, top-k and top-p do not move an argmax; the request's sampling is not used."""
    target_argmax = step.target_logits.argmax(dim=-1)
    gamma = step.gamma
    matches = drafts == target_argmax[:gamma][None]
    accepted = torch.cumprod(matches.long(), dim=1).sum(dim=1)
    tokens = torch.full((drafts.shape[0], gamma + 1), -1, dtype=torch.long, device=drafts.device)
    cols = torch.arange(gamma + 1, device=drafts.device)
    padded = torch.cat((drafts, torch.zeros_like(drafts[:, :1])), dim=1)
    tokens = torch.where(cols[None] < accepted[:, None], padded, tokens)
    tokens[torch.arange(drafts.shape[0]), accepted] = target_argmax[accepted]
    return tokens, accepted


def dispatch_sampler(
    uses_greedy: Callable[..., bool],
    *,
    device: torch.device,
    rejection_sampling: bool,
    chain_kernel: Callable[..., Any] | None,
    tree_kernel: Callable[..., Any] | None,
) -> tuple[Sampler, str]:
    """A sampled request's verification as ``eagle_sample`` dispatches it on ``device`` (with
    ``speculative_use_rejection_sampling`` = ``rejection_sampling``), and which branch that is."""
    greedy = bool(uses_greedy(is_all_greedy=False, use_rejection_sampling=rejection_sampling, **platform_flags(device)))
    kernel = chain_kernel if rejection_sampling else tree_kernel
    branch = (
        "greedy (argmax)"
        if greedy
        else ("chain_speculative_sampling_triton" if rejection_sampling else "tree_speculative_sampling_target_only")
    )

    def sampler(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
        drafts = sample_rows(step.draft_probs, uniforms(n, step.gamma, generator, step.device))
        if greedy:
            tokens, accepted = greedy_verify(step, drafts)
            return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=accepted)
        if kernel is None:
            raise AdapterError(f"{branch} is not available on {device.type} in this release")
        tokens, accepted = call_chain(kernel, step, drafts, generator, block=False, target_only=not rejection_sampling)
        return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=accepted)

    return sampler, branch
