"""End-to-end cases for transformers' drafting heads: multi-token prediction, DFlash, Gemma 4 assistants.

These paths draft with modules that belong to a model family rather than with a free-standing small
model, so each case builds a tiny randomly initialised (seeded) instance of the real classes:

* ``use_mtp=True`` (``MTPCandidateGenerator``): a Mellum target whose config has ``num_mtp_layers``.
  The generator loads its MTP layers with ``MtpModel.from_pretrained(main_model)`` from the
  checkpoint the target came from. Substitute: the MTP layers are a seeded random ``MtpModel`` of the
  same classes, written with the target's own weights into a local safetensors checkpoint in a
  temporary directory, and the target is loaded from there; nothing else is stubbed.
* ``speculation_type="dflash"`` (``DFlashTokenCandidateGenerator``): a random ``MuseGlimmerAssistantModel``
  (the DFlash drafter class) reading the tiny Llama target's hidden states and heads.
* A ``Gemma4AssistantForCausalLM`` assistant (``SinglePositionMultiTokenCandidateGenerator``) for a
  tiny ``Gemma4ForCausalLM`` target; the assistant's ``num_assistant_tokens`` is set as its
  checkpoint's generation config would.

These drafters skip the first step (the target's prefill must run first), so the joint law of the
first three generated tokens is tested, over a 4-token vocabulary to keep V**3 cells small.
"""

from __future__ import annotations

import importlib
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from workers.suite.cases import Case
from workers.suite.experiments import Experiment
from workers.suite.sampling import Processing
from workers.suite.targets.transformers import (
    E2E_COVERAGE,
    AdapterError,
    GenerateExperiment,
    GreedyEquivalenceExperiment,
    ModelFactory,
    _tiny_llama,
)

if TYPE_CHECKING:
    from workers.suite.targets.transformers import TransformersAdapter

#: Vocabulary of the head cases, tokens tested jointly, and the prompt (every id in range).
HEAD_VOCAB = 4
HEAD_LENGTH = 3
HEAD_PROMPT: tuple[int, ...] = (1, 2, 3, 1, 2)
#: End of sequence and padding outside the vocabulary: generation never stops early.
_UNREACHABLE = 6
#: Processing that bites on the 4-token models: top-k removes at least 0.065 and top-p at least 0.01 of the
#: mass on every enumerated row of the three head fixtures, with boundary margins of 0.013 (asserted at build).
_PROCESSING_ON = Processing(temperature=1.6, top_k=3, top_p=0.65)
#: Output heads are scaled so next-token laws are peaked but not degenerate.
_HEAD_SCALE = 12.0


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


def head_cases(adapter: TransformersAdapter) -> tuple[Case, ...]:
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
        )

    return Case(
        id=f"e2e/{path.name}/{label}",
        family="e2e",
        description=f"{path.description} ({desc}); joint law of the first {HEAD_LENGTH} tokens, V = {HEAD_VOCAB}. {path.substitute}",
        epsilon=0.1,
        make_experiment=make,
        skip_reason=path.missing,
        quick=processing is _PROCESSING_ON,
    )


def _greedy_case(transformers: ModuleType, path: HeadPath) -> Case:
    def make(device: torch.device) -> Experiment:
        return GreedyEquivalenceExperiment(
            transformers, path.options, device, pad_token_id=_UNREACHABLE, models=path.models, vocab=HEAD_VOCAB, coverage=E2E_COVERAGE
        )

    return Case(
        id=f"e2e/greedy/{path.name}",
        family="e2e",
        description=f"do_sample=False with {path.description}: output equals plain greedy output exactly (64 prompts). {path.substitute}",
        epsilon=0.1,
        make_experiment=make,
        skip_reason=path.missing,
    )


# ---------------------------------------------------------------------------------------------------
# Feature detection: what the installed library has, never a version table.


def _has(module: ModuleType | None, *names: str) -> bool:
    return module is not None and all(hasattr(module, n) for n in names)


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means the feature is absent
        return None


def _paths(transformers: ModuleType, version: str, features: dict[str, bool]) -> tuple[HeadPath, ...]:
    generators = _import("transformers.generation.candidate_generator")
    layers = _import("transformers.modeling_layers")

    mtp_missing = None
    if not features.get("mtp"):
        mtp_missing = f"transformers {version} has no mtp path (no use_mtp generation option)"
    elif not _has(generators, "MTPCandidateGenerator") or not _has(layers, "MtpModel"):
        mtp_missing = f"transformers {version} has use_mtp but no MTPCandidateGenerator/MtpModel"
    elif not _has(transformers, "MellumConfig", "MellumForCausalLM"):
        mtp_missing = f"transformers {version} has use_mtp but no Mellum model class to draft with MTP layers"
    elif not any("mtp" in str(p) for p in getattr(transformers.MellumForCausalLM, "_keys_to_ignore_on_load_unexpected", None) or ()):
        # MtpModel.from_pretrained finds MTP weights through these patterns (5.15 has Mellum without them)
        mtp_missing = f"transformers {version}: Mellum registers no MTP checkpoint keys, so MtpModel cannot load its layers"

    dflash_missing = None
    if not features.get("dflash"):
        dflash_missing = f"transformers {version} has no dflash path (no DFlashTokenCandidateGenerator)"
    elif not _has(transformers, "MuseGlimmerAssistantConfig", "MuseGlimmerAssistantModel"):
        dflash_missing = f"transformers {version} has DFlash but no MuseGlimmerAssistantModel drafter class"

    gemma_missing = None
    if not _has(generators, "SinglePositionMultiTokenCandidateGenerator"):
        gemma_missing = f"transformers {version} has no model-specific assistant path (no SinglePositionMultiTokenCandidateGenerator)"
    elif not _has(transformers, "Gemma4TextConfig", "Gemma4ForCausalLM", "Gemma4AssistantConfig", "Gemma4AssistantForCausalLM"):
        gemma_missing = f"transformers {version} has SinglePositionMultiTokenCandidateGenerator but no Gemma 4 assistant classes"

    return (
        HeadPath(
            name="mtp",
            description="multi-token prediction (use_mtp=True): a tiny Mellum target with one MTP layer drafts",
            substitute="Substitute for pretrained weights: seeded random MTP layers (MtpModel of the same classes) saved with the "
            "target into a local safetensors checkpoint; MtpModel.from_pretrained loads them from there.",
            options={"use_mtp": True},
            models=mtp_models,
            missing=mtp_missing,
        ),
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


# ---------------------------------------------------------------------------------------------------
# Tiny models.


def _scale_head(model: Any) -> Any:
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(_HEAD_SCALE)
    return model


def _mellum_config(transformers: ModuleType) -> Any:
    return transformers.MellumConfig(
        vocab_size=HEAD_VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=None,
        layer_types=["full_attention"] * 2,
        mlp_layer_types=["dense"] * 2,
        num_mtp_layers=1,
        mtp_layer_types=["full_attention"],
        mtp_mlp_layer_types=["dense"],
        bos_token_id=0,
        eos_token_id=_UNREACHABLE,
        pad_token_id=0,
        tie_word_embeddings=False,
    )


def mtp_models(transformers: ModuleType, device: torch.device) -> tuple[Any, None]:
    """A tiny Mellum target (2 dense layers) loaded from a local checkpoint that also holds its MTP layer.

    The checkpoint is the target's own ``save_pretrained`` output plus the seeded random MTP layer's
    weights under the ``mtp.`` prefix Mellum checkpoints use (the keys ``MellumForCausalLM`` ignores
    and ``MtpModel.from_pretrained`` picks up). The temporary directory is removed with the model.
    """
    logging_utils = _import("transformers.utils.logging")
    if logging_utils is not None and hasattr(logging_utils, "disable_progress_bar"):
        logging_utils.disable_progress_bar()  # MtpModel.from_pretrained runs in every generate() call
    mtp_model_cls = importlib.import_module("transformers.modeling_layers").MtpModel
    torch.manual_seed(11)
    main = _scale_head(transformers.MellumForCausalLM(_mellum_config(transformers)).eval())
    torch.manual_seed(12)
    mtp = mtp_model_cls(main, 1)
    mtp_weights = {k: v.detach().clone() for k, v in mtp.layers.state_dict(prefix="layers.").items()}
    folder = tempfile.mkdtemp(prefix="specwatch-mtp-")
    try:
        _write_checkpoint(main, mtp, folder)
        target = transformers.MellumForCausalLM.from_pretrained(folder).eval().to(device)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weakref.finalize(target, shutil.rmtree, folder, ignore_errors=True)  # the checkpoint lives as long as the model
    loaded = mtp_model_cls.from_pretrained(target, device_map={"": device}).state_dict()
    if any(k not in loaded or not torch.equal(loaded[k].cpu(), v) for k, v in mtp_weights.items()):
        raise AdapterError("MtpModel.from_pretrained did not load the MTP weights written to the local checkpoint")
    return target, None


def _write_checkpoint(main: Any, mtp: Any, folder: str) -> None:
    """``main.save_pretrained(folder)`` with the MTP layers' weights under the ``mtp.`` prefix of Mellum checkpoints.

    The layers are attached to the main model only while it is saved, so the library writes them.
    """
    holder = torch.nn.Module()
    holder.layers = mtp.layers
    main.mtp = holder
    try:
        main.save_pretrained(folder)
    finally:
        del main.mtp


def dflash_models(transformers: ModuleType, device: torch.device) -> tuple[Any, Any]:
    """The tiny Llama target (2 layers) and a 1-layer DFlash drafter reading both layers' hidden states."""
    target = _tiny_llama(transformers, device, seed=1, layers=2, vocab=HEAD_VOCAB)
    torch.manual_seed(13)
    config = transformers.MuseGlimmerAssistantConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=64,
        block_size=3,  # the anchor token and 2 drafts
        mask_token_id=HEAD_VOCAB - 1,  # a vocabulary id: its embedding marks the positions to draft
        target_layer_ids=[0, 1],
        bos_token_id=0,
        eos_token_id=_UNREACHABLE,
        pad_token_id=0,
    )
    drafter = transformers.MuseGlimmerAssistantModel(config).eval().to(device)
    return target, drafter


def _gemma4_text_config(transformers: ModuleType) -> Any:
    return transformers.Gemma4TextConfig(
        vocab_size=HEAD_VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=64,
        layer_types=["sliding_attention", "full_attention"],
        vocab_size_per_layer_input=0,
        hidden_size_per_layer_input=0,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=_UNREACHABLE,
        tie_word_embeddings=False,
    )


def gemma4_models(transformers: ModuleType, device: torch.device) -> tuple[Any, Any]:
    """A tiny 2-layer Gemma 4 text target and a 2-layer Gemma 4 assistant drafting 2 tokens per step."""
    torch.manual_seed(14)
    target = _scale_head(transformers.Gemma4ForCausalLM(_gemma4_text_config(transformers)).eval()).to(device)
    torch.manual_seed(15)
    text = _gemma4_text_config(transformers)
    config = transformers.Gemma4AssistantConfig(text_config=text.to_dict(), backbone_hidden_size=16, tie_word_embeddings=False)
    assistant = _scale_head(transformers.Gemma4AssistantForCausalLM(config).eval()).to(device)
    assistant.generation_config.num_assistant_tokens = 2
    return target, assistant
