"""Library-level mutants: realistic regressions planted in the installed transformers' ``generate()`` path.

Each mutant patches the imported library in this process (nothing on disk changes) outside
``_speculative_sampling``: in the candidate generators, the verification loop's logits processing or the
target's verification forward. The suite must fail every lossy one and pass every lossless one (whose
acceptance change shows in the coverage histograms). Select one with the target spec
``transformers+mutant:NAME`` (``specwatch check --target transformers+mutant:NAME``); the patch is applied
when the adapter loads, in every process that runs cases.

Patches that must act only inside assisted generation (the suite's own reference forwards use the same
model) look for ``_assisted_decoding`` among their callers' frames.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

_VERIFY_LOOP = "_assisted_decoding"


def _called_from(name: str, depth: int = 12) -> FrameType | None:
    """The frame of the nearest caller named ``name`` within ``depth`` frames, or None."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        if frame.f_code.co_name == name:
            return frame
        frame = frame.f_back
    return None


def _processors_first_position_only() -> None:
    """The target's logits processors are applied to the first verified position only: later rows of the
    verification keep the raw scores (a loop that breaks early, an index fixed at 0)."""
    processing = importlib.import_module("transformers.generation.logits_process")
    original = processing.LogitsProcessorList.__call__

    def patched(self: Any, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.FloatTensor:
        frame = _called_from(_VERIFY_LOOP, depth=2)
        if frame is not None and int(frame.f_locals.get("i", 0)) > 0:
            return scores
        result: torch.FloatTensor = original(self, input_ids, scores, **kwargs)
        return result

    processing.LogitsProcessorList.__call__ = patched


#: How often :func:`_temperature_skipped_on_some_rows` leaves the temperature out of a verified row.
SKIP_RATE = 1 / 4


def _temperature_skipped_on_some_rows() -> None:
    """A small-effect regression: each row of the verification is processed without the target's temperature
    warper with probability :data:`SKIP_RATE` (the other processors still run, so the support never grows: no
    certain violation), independently, drawn from a private seeded generator (the global RNG the library samples
    from is untouched). ``bench/mutant_law.py`` measures its effect on the checks' laws exactly per row.
    """
    processing = importlib.import_module("transformers.generation.logits_process")
    original = processing.LogitsProcessorList.__call__
    warper = processing.TemperatureLogitsWarper
    skips = torch.Generator().manual_seed(0)

    def patched(self: Any, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.FloatTensor:
        frame = _called_from(_VERIFY_LOOP, depth=2)
        if frame is not None and float(torch.rand((), generator=skips)) < SKIP_RATE:
            kept = processing.LogitsProcessorList(p for p in self if not isinstance(p, warper))
            result: torch.FloatTensor = original(kept, input_ids, scores, **kwargs)
            return result
        result = original(self, input_ids, scores, **kwargs)
        return result

    processing.LogitsProcessorList.__call__ = patched


def _raw_q_processed_drafts() -> None:
    """The assistant drafts from its processed scores but reports its raw logits as q (transformers #47932
    class): the q used for acceptance is not the law the drafts came from."""
    generators = importlib.import_module("transformers.generation.candidate_generator")
    original = generators.AssistedCandidateGenerator._generate_candidates

    def patched(self: Any, generation_args: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids, logits = original(self, generation_args)
        if logits is None:
            return ids, logits
        with torch.no_grad():
            raw = self.assistant_model(ids).logits[:, -logits.shape[1] - 1 : -1]
        return ids, raw.to(logits.dtype)

    generators.AssistedCandidateGenerator._generate_candidates = patched


def _target_rows_off_by_one() -> None:
    """After the first round, the verification reads the target's rows one position early (a slice
    ``[-n - 2 : -1]`` for ``[-n - 1 :]``): draft i is judged by the law of position i - 1."""
    modules = importlib.import_module("torch.nn.modules.module")
    original = modules.Module.__call__

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        frame = _called_from(_VERIFY_LOOP, depth=1)
        if frame is None or frame.f_locals.get("is_first_iteration", True) or not hasattr(out, "logits"):
            return out
        logits = out.logits
        if logits is not None and logits.shape[1] > 1:
            shifted = logits.clone()
            shifted[:, 1:] = logits[:, :-1]
            out.logits = shifted
        return out

    modules.Module.__call__ = patched


def _fewer_drafts() -> None:
    """Lossless but slower: the assistant's candidates are cut to one draft whatever was asked."""
    generators = importlib.import_module("transformers.generation.candidate_generator")
    original = generators.AssistedCandidateGenerator.get_candidates

    def patched(self: Any, input_ids: torch.LongTensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids, logits = original(self, input_ids, *args, **kwargs)
        keep = input_ids.shape[-1] + 1
        if logits is None or ids.shape[-1] <= keep:
            return ids, logits
        return ids[:, :keep], logits[:, :1]

    generators.AssistedCandidateGenerator.get_candidates = patched


@dataclass(frozen=True)
class LibraryMutant:
    name: str
    description: str
    lossless: bool
    apply: Callable[[], None]
    #: The end-to-end cases it is planted in (the paths whose code it changes).
    cases: tuple[str, ...]
    #: Whether ``--quick`` (TV 0.05) is designed to catch it; a small effect needs the default profile's design.
    quick: bool = True


LIBRARY_MUTANTS: dict[str, LibraryMutant] = {
    m.name: m
    for m in (
        LibraryMutant(
            "processors_first_position_only",
            "the target's logits processors applied to the first verified position only",
            lossless=False,
            apply=_processors_first_position_only,
            cases=("e2e/assistant_model/processed", "e2e/prompt_lookup/processed"),
        ),
        LibraryMutant(
            "temperature_skipped_on_some_rows",
            "the target's temperature warper left out of one verified row in four, at random (a small effect)",
            lossless=False,
            apply=_temperature_skipped_on_some_rows,
            cases=("e2e/assistant_model/processed", "e2e/early_exit/processed", "e2e/prompt_lookup/processed"),
            quick=False,
        ),
        LibraryMutant(
            "raw_q_processed_drafts",
            "the assistant's q taken from its raw scores while it drafts from processed ones",
            lossless=False,
            apply=_raw_q_processed_drafts,
            cases=("e2e/assistant_model/processed",),
        ),
        LibraryMutant(
            "target_rows_off_by_one",
            "the target's verification rows read one position early after the first round",
            lossless=False,
            apply=_target_rows_off_by_one,
            cases=("e2e/assistant_model/plain", "e2e/assistant_model/processed"),
        ),
        LibraryMutant(
            "fewer_drafts",
            "the assistant's candidates cut to one draft (lossless; lower acceptance per round)",
            lossless=True,
            apply=_fewer_drafts,
            cases=("e2e/assistant_model/plain", "e2e/assistant_model/processed"),
        ),
    )
}


_APPLIED: set[str] = set()


def apply_mutant(name: str) -> LibraryMutant:
    """Plant mutant ``name`` in the imported library (once per process); KeyError names the known ones."""
    if name not in LIBRARY_MUTANTS:
        raise KeyError(f"unknown transformers mutant {name!r}; known: {', '.join(sorted(LIBRARY_MUTANTS))}")
    mutant = LIBRARY_MUTANTS[name]
    if name not in _APPLIED:
        mutant.apply()
        _APPLIED.add(name)
    return mutant
