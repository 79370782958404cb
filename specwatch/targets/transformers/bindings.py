"""The direct path: ``transformers.generation.utils._speculative_sampling`` bound by keyword from its signature.

The signature changed across releases; binding by name, never by position, keeps every historical version on its
lossless path (:func:`specwatch.targets.base.bind_keywords`). :class:`AdapterError` (the kit's) is how every module of
this adapter reports a library it cannot adapt.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from specwatch.sampling import Sampler, SpecOutput, SpecStep, sample_rows, uniforms
from specwatch.targets.base import bind_keywords

#: Arguments older releases require that have a single lossless value here.
_FIXED_ARGUMENTS: dict[str, Callable[[int], Any]] = {
    "is_done_candidate": lambda gamma: False,  # 4.40 - 5.17: the last draft is not EOS
    "last_assistant_token_is_eos": lambda gamma: False,  # 4.37 - 4.39
    "max_matches": lambda gamma: gamma,  # 4.37 - 4.39: room for every draft
}
#: Optional since 5.18, lossy by design (an ensemble of the two models' logits): must default to None and stay there.
_LOSSLESS_DEFAULTS: dict[str, Any] = {"assistant_ensemble_weight": None}


def bind_speculative_sampling(
    fn: Callable[..., Any],
    *,
    candidate_input_ids: torch.Tensor,
    candidate_logits: torch.Tensor,
    candidate_length: int,
    new_logits: torch.Tensor,
) -> dict[str, Any]:
    """Keyword arguments for any historical ``_speculative_sampling`` signature.

    Binding by name matters: on 5.18+ a fifth positional argument would become
    ``assistant_ensemble_weight`` (lossy by design), which is always left at its default ``None``.
    """
    core = {
        "candidate_input_ids": candidate_input_ids,
        "candidate_logits": candidate_logits,
        "candidate_length": candidate_length,
        "new_logits": new_logits,
    }
    fixed = {name: value(candidate_length) for name, value in _FIXED_ARGUMENTS.items()}
    return bind_keywords(fn, core, label="_speculative_sampling", lossless=_LOSSLESS_DEFAULTS, fixed=fixed)


def _log_rows(probs: torch.Tensor) -> torch.Tensor:
    """Logits whose softmax is ``probs`` exactly (zeros become -inf)."""
    return torch.log(probs).to(torch.float32)


def speculative_sampling_sampler(fn: Callable[..., Any]) -> Sampler:
    """A Sampler that drafts from q itself (the candidate generator's job) and verifies with ``fn``.

    ``fn`` draws from torch's global RNG, which is seeded once per batch from the case's private
    generator (never inside the loop), so results stay reproducible from the recorded seed.
    """

    def sampler(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
        gamma = step.gamma
        drafts = sample_rows(step.draft_probs, uniforms(n, gamma, generator, step.device))
        q_logits = _log_rows(step.draft_probs)[None]
        p_logits = _log_rows(step.target_probs)[None]
        prompt = torch.zeros((1, 1), dtype=torch.long, device=step.device)
        ids = torch.cat((prompt.expand(n, 1), drafts), dim=1)
        kwargs = bind_speculative_sampling(
            fn, candidate_input_ids=ids[:1], candidate_logits=q_logits, candidate_length=gamma, new_logits=p_logits
        )
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=step.device))
        torch.manual_seed(seed)
        rows: list[torch.Tensor] = []
        matches: list[torch.Tensor] = []
        for row_ids in torch.split(ids, 1):  # one call per trial, as generate() makes it; the outputs are gathered at the end
            kwargs["candidate_input_ids"] = row_ids
            valid, n_matches = fn(**kwargs)
            rows.append(valid.reshape(-1))
            matches.append(torch.as_tensor(n_matches).reshape(()))
        tokens = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=-1)
        tokens = torch.nn.functional.pad(tokens, (0, gamma + 1 - tokens.shape[1]), value=-1)
        accepted = torch.stack(matches).to(dtype=torch.long, device=step.device)
        return SpecOutput(drafts=drafts, tokens=tokens.to(dtype=torch.long, device=step.device), n_accepted=accepted)

    return sampler


def generation_config_fields(transformers: ModuleType) -> set[str]:
    config = transformers.GenerationConfig()
    return set(vars(config)) | set(inspect.signature(transformers.GenerationConfig.__init__).parameters)


def has(module: ModuleType | None, *names: str) -> bool:
    return module is not None and all(hasattr(module, n) for n in names)


def optional_import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means the feature is absent
        return None
