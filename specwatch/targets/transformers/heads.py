"""End-to-end cases for transformers' drafting heads: multi-token prediction, DFlash, Gemma 4 assistants.

These paths draft with modules that belong to a model family rather than with a free-standing small
model, so each case builds a tiny randomly initialised (seeded) instance of the real classes:

* ``use_mtp=True`` (``MTPCandidateGenerator``): a tiny target of the first architecture the installed release
  can draft with by MTP (:mod:`specwatch.targets.transformers.mtp`, chosen by feature detection: Inkling
  with two MTP layers, else Mellum or GLM-4-MoE with one). Its seeded random MTP layers are written with the
  target's own weights into a local safetensors checkpoint under the family's checkpoint names, and the target
  is loaded from there, so ``MtpModel.from_pretrained`` reads them as it reads a real checkpoint.
* ``speculation_type="dflash"`` (``DFlashTokenCandidateGenerator``): a random ``MuseGlimmerAssistantModel``
  (the DFlash drafter class) reading the tiny Llama target's hidden states and heads.
* A ``Gemma4AssistantForCausalLM`` assistant (``SinglePositionMultiTokenCandidateGenerator``) for a
  tiny ``Gemma4ForCausalLM`` target; the assistant's ``num_assistant_tokens`` is set as its
  checkpoint's generation config would.

These drafters skip the first step (the target's prefill must run first), so the joint law of the
first three generated tokens is tested, over a 4-token vocabulary to keep V**3 cells small. The models are built
in :mod:`specwatch.targets.transformers.models`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import torch

from specwatch.cases import Case
from specwatch.experiments import Experiment
from specwatch.sampling import Processing
from specwatch.targets.base import AdapterError
from specwatch.targets.transformers.bindings import has, optional_import
from specwatch.targets.transformers.experiments import (
    E2E_COVERAGE,
    E2E_EPSILON,
    AroundCalls,
    GenerateExperiment,
    GreedyEquivalenceExperiment,
)
from specwatch.targets.transformers.models import HEAD_VOCAB, UNREACHABLE_EOS, ModelFactory, dflash_models, gemma4_models
from specwatch.targets.transformers.mtp import LoadOnce, MtpFamily, mtp_models, select_family

#: Tokens tested jointly, and the prompt (every id in :data:`~specwatch.targets.transformers.models.HEAD_VOCAB`).
HEAD_LENGTH = 3
HEAD_PROMPT: tuple[int, ...] = (1, 2, 3, 1, 2)
#: Processing that bites on the 4-token models: top-k removes at least 0.065 and top-p at least 0.01 of the
#: mass on every enumerated row of the three head fixtures, with boundary margins of 0.013 (asserted at build).
_PROCESSING_ON = Processing(temperature=1.6, top_k=3, top_p=0.65)


class Installed(Protocol):
    """What the adapter found (:class:`~specwatch.targets.transformers.adapter.TransformersAdapter`)."""

    @property
    def module(self) -> ModuleType: ...
    @property
    def version(self) -> str: ...
    @property
    def features(self) -> dict[str, bool]: ...


@dataclass(frozen=True)
class HeadPath:
    """One drafting path: how to build its models, the generate() options and what it needs."""

    name: str
    description: str
    substitute: str
    options: dict[str, Any]
    models: ModelFactory
    #: Why the installed transformers cannot run it (None when it can).
    missing: str | None
    #: Makes, per experiment, the context its generate() calls run in (MTP: the layers loaded once per process).
    around_calls: Callable[[], AroundCalls] | None = None

    def around(self) -> AroundCalls | None:
        return self.around_calls() if self.around_calls is not None else None


def head_cases(adapter: Installed) -> tuple[Case, ...]:
    """Sampling cases (processors off and on) and a greedy-equivalence case for every drafting head path."""
    cases: list[Case] = []
    for path in _paths(adapter.module, adapter.version, adapter.features):
        for processing, label, desc in (
            (Processing(), "plain", "processors off"),
            (_PROCESSING_ON, "processed", "temperature 1.6, top-k 3, top-p 0.65"),
        ):
            cases.append(_sampling_case(adapter.module, path, processing, label, desc))
        cases.append(_greedy_case(adapter.module, path))
    return tuple(cases)


def _sampling_case(transformers: ModuleType, path: HeadPath, processing: Processing, label: str, desc: str) -> Case:
    def make(device: torch.device) -> Experiment:
        return GenerateExperiment(
            transformers,
            processing,
            path.options,
            device,
            models=path.models,
            length=HEAD_LENGTH,
            vocab=HEAD_VOCAB,
            prompt=HEAD_PROMPT,
            coverage=E2E_COVERAGE,
            around_calls=path.around(),
        )

    return Case(
        id=f"e2e/{path.name}/{label}",
        family="e2e",
        description=f"{path.description} ({desc}); joint law of the first {HEAD_LENGTH} tokens, V = {HEAD_VOCAB}. {path.substitute}",
        epsilon=E2E_EPSILON,
        make_experiment=make,
        skip_reason=path.missing,
        quick=processing is _PROCESSING_ON,
    )


def _greedy_case(transformers: ModuleType, path: HeadPath) -> Case:
    def make(device: torch.device) -> Experiment:
        return GreedyEquivalenceExperiment(
            transformers,
            path.options,
            device,
            pad_token_id=UNREACHABLE_EOS,
            models=path.models,
            vocab=HEAD_VOCAB,
            coverage=E2E_COVERAGE,
            around_calls=path.around(),
        )

    return Case(
        id=f"e2e/greedy/{path.name}",
        family="e2e",
        description=f"do_sample=False with {path.description}: output equals plain greedy output exactly (64 prompts). {path.substitute}",
        epsilon=0.1,
        make_experiment=make,
        skip_reason=path.missing,
    )


def _mtp_path(family: MtpFamily | None, missing: str | None) -> HeadPath:
    models: ModelFactory
    if family is None:
        what, models = "a tiny target with MTP layers drafts (no architecture available)", _no_models
    else:
        layers = "one MTP layer" if family.mtp_layers == 1 else f"{family.mtp_layers} MTP layers"
        what, models = f"a tiny {family.name} target with {layers} drafts", mtp_models(family)
    return HeadPath(
        name="mtp",
        description=f"multi-token prediction (use_mtp=True): {what}",
        substitute="Substitute for pretrained weights: seeded random MTP layers (MtpModel of the same classes) saved with the "
        "target into a local safetensors checkpoint under the architecture's checkpoint names; MtpModel.from_pretrained "
        "loads them from there. The architecture is chosen per release by feature detection.",
        options={"use_mtp": True},
        models=models,
        missing=missing,
        around_calls=lambda: LoadOnce().around,
    )


def _no_models(transformers: ModuleType, device: torch.device) -> tuple[Any, Any]:
    raise AdapterError("no multi-token-prediction fixture on this release: the case is skipped and never built")


# ---------------------------------------------------------------------------------------------------
# Feature detection: what the installed library has, never a version table.


def _paths(transformers: ModuleType, version: str, features: dict[str, bool]) -> tuple[HeadPath, ...]:
    generators = optional_import("transformers.generation.candidate_generator")
    layers = optional_import("transformers.modeling_layers")

    family, why_none = select_family(transformers)
    mtp_missing = None
    if not features.get("mtp"):
        mtp_missing = f"transformers {version} has no mtp path (no use_mtp generation option)"
    elif not has(generators, "MTPCandidateGenerator") or not has(layers, "MtpModel"):
        mtp_missing = f"transformers {version} has use_mtp but no MTPCandidateGenerator/MtpModel"
    elif family is None:
        mtp_missing = f"transformers {version} has use_mtp but no architecture whose MTP layers a tiny fixture can load ({why_none})"

    dflash_missing = None
    if not features.get("dflash"):
        dflash_missing = f"transformers {version} has no dflash path (no DFlashTokenCandidateGenerator)"
    elif not has(transformers, "MuseGlimmerAssistantConfig", "MuseGlimmerAssistantModel"):
        dflash_missing = f"transformers {version} has DFlash but no MuseGlimmerAssistantModel drafter class"

    gemma_missing = None
    if not has(generators, "SinglePositionMultiTokenCandidateGenerator"):
        gemma_missing = f"transformers {version} has no model-specific assistant path (no SinglePositionMultiTokenCandidateGenerator)"
    elif not has(transformers, "Gemma4TextConfig", "Gemma4ForCausalLM", "Gemma4AssistantConfig", "Gemma4AssistantForCausalLM"):
        gemma_missing = f"transformers {version} has SinglePositionMultiTokenCandidateGenerator but no Gemma 4 assistant classes"

    return (
        _mtp_path(family, mtp_missing),
        HeadPath(
            name="dflash",
            description='DFlash (speculation_type="dflash"): a tiny MuseGlimmerAssistantModel drafts a block of 2 for a tiny Llama target',
            substitute="Substitute for pretrained weights: a seeded random MuseGlimmerAssistantModel built from its config.",
            options={"assistant_model": True, "speculation_type": "dflash"},
            models=dflash_models,
            missing=dflash_missing,
        ),
        HeadPath(
            name="gemma4_assistant",
            description="model-specific assistant: a tiny Gemma4AssistantForCausalLM drafts 2 tokens from a tiny Gemma4ForCausalLM's "
            "shared KV states (SinglePositionMultiTokenCandidateGenerator)",
            substitute="Substitute for pretrained weights: seeded random target and assistant built from their configs; the "
            "assistant's num_assistant_tokens = 2 set as its checkpoint's generation config would.",
            options={"assistant_model": True},
            models=gemma4_models,
            missing=gemma_missing,
        ),
    )
