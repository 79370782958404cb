"""Multi-token-prediction fixtures: a tiny target whose local checkpoint carries MTP layers, chosen per release.

``generate(use_mtp=True)`` drafts with ``MTPCandidateGenerator``, which loads the drafting layers with
``MtpModel.from_pretrained(main_model)`` from the folder the target was loaded from, every call (the cases load them
once per process and reuse the model, :class:`LoadOnce`). It finds them
by the patterns the target's class lists in ``_keys_to_ignore_on_load_unexpected`` (the keys a plain load
skips; a pattern naming a layer index below the target's depth is dropped), renames the MTP layer of index
``num_hidden_layers + k`` to ``layers.k.mtp_block`` and then applies the MtpModel and model-family weight
conversions. Which architectures register such patterns changes between releases: 5.14-5.15 have GLM-4-MoE
(``model.layers.46``), DeepSeek-V3 (``model.layers.61``) and Inkling (``model.mtp.``), and 5.2x adds Mellum
(``mtp.``), among others. So the fixture is chosen per release by feature detection, never by a version table
(:func:`select_family`): the first family of :data:`FAMILIES` whose classes exist, whose config takes
``num_mtp_layers`` and whose registered patterns match every key the family writes.

Each MTP layer drafts one token, so the drafts per verification are the fixture's MTP layers. The families are
ordered by the drafts their layout lets a fixture have, then by cost:

* Inkling: MTP layers named by their own index (``model.mtp.layers.k``), so two layers draft 2 tokens per
  verification (and the MTP cache correction for more than one layer runs). Its short convolutions run
  PyTorch's reference path on CPU: about 4 times the cost of Mellum per ``generate()`` call.
* Mellum: ``mtp.layers.0``; its config accepts a single MTP layer, so one draft per verification.
* GLM-4-MoE: its checkpoints put their one MTP layer at a fixed index (``model.layers.46``, after the 46
  decoder layers of GLM-4.5-Air), so the target has 46 (dense, 16-wide) layers and drafts one token.

A one-layer fixture cannot reach the cases' coverage design (a verification of >= 2 drafts): the case then
reports its coverage short of design, never a plain pass.

Substitute for pretrained weights: the target and its MTP layers are seeded random modules of the library's
own classes (``MtpModel(main, k)``); the target's ``save_pretrained`` output gets the MTP weights under the
family's checkpoint names, the target is loaded from that folder, and building the fixture checks that
``MtpModel.from_pretrained`` reads back exactly the weights written. Nothing else is stubbed.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from specwatch.targets.base import AdapterError
from specwatch.targets.transformers.bindings import has, optional_import
from specwatch.targets.transformers.models import HEAD_VOCAB, TINY_SHAPE, UNREACHABLE_EOS, ModelFactory, scale_head, tiny_config

#: What an MtpModel shares with its target (not part of the MTP checkpoint).
_SHARED_PREFIXES = ("embed_tokens.", "shared_head.", "rotary_emb.")
#: A layer index inside a registered pattern (``MtpModel.from_pretrained`` reads the first one).
_PATTERN_INDEX = re.compile(r"\.(\d+)")


@dataclass(frozen=True)
class MtpFamily:
    """One architecture's tiny MTP fixture: its classes, config, depth and checkpoint layout."""

    name: str
    config_class: str
    model_class: str
    #: Decoder layers of the target and MTP layers (= drafts per verification).
    hidden_layers: int
    mtp_layers: int
    #: Config fields beyond :data:`~specwatch.targets.transformers.models.TINY_SHAPE`.
    fields: dict[str, Any]
    #: The checkpoint name of an ``MtpModel`` weight (its state-dict key), given the target's depth.
    checkpoint_key: Callable[[str, int], str]
    #: Seeds of the target and of its MTP layers.
    seeds: tuple[int, int]

    def config(self, transformers: ModuleType) -> Any:
        return tiny_config(
            getattr(transformers, self.config_class),
            vocab_size=HEAD_VOCAB,
            num_hidden_layers=self.hidden_layers,
            num_mtp_layers=self.mtp_layers,
            eos_token_id=UNREACHABLE_EOS,
            **self.fields,
        )

    def probe_keys(self) -> list[str]:
        """Checkpoint names of a weight every MTP layer has (its input projection)."""
        return [self.checkpoint_key(f"layers.{k}.eh_proj.weight", self.hidden_layers) for k in range(self.mtp_layers)]


def _indexed_after_decoder(key: str, hidden_layers: int) -> str:
    """GLM-4-MoE / DeepSeek-V3 layout: MTP layer k is decoder layer ``hidden_layers + k``, its block flattened
    into it and its final norm named ``shared_head.norm``."""
    _, index, rest = key.split(".", 2)
    rest = rest.removeprefix("mtp_block.")
    if rest.startswith("post_norm."):
        rest = "shared_head.norm." + rest.removeprefix("post_norm.")
    return f"model.layers.{hidden_layers + int(index)}.{rest}"


FAMILIES: tuple[MtpFamily, ...] = (
    MtpFamily(
        name="Inkling",
        config_class="InklingTextConfig",
        model_class="InklingForCausalLM",
        hidden_layers=2,
        mtp_layers=2,
        fields={
            "swa_num_attention_heads": TINY_SHAPE["num_attention_heads"],
            "swa_num_key_value_heads": TINY_SHAPE["num_key_value_heads"],
            "swa_head_dim": TINY_SHAPE["head_dim"],
            "sliding_window_size": TINY_SHAPE["max_position_embeddings"],
            "d_rel": 4,
            "rel_extent": TINY_SHAPE["max_position_embeddings"],
            "mlp_layer_types": ["dense"] * 2,
            "logits_mup_width_multiplier": 1.0,
        },
        checkpoint_key=lambda key, _: f"model.mtp.{key}",
        seeds=(16, 17),
    ),
    MtpFamily(
        name="Mellum",
        config_class="MellumConfig",
        model_class="MellumForCausalLM",
        hidden_layers=2,
        mtp_layers=1,
        fields={
            "sliding_window": None,
            "layer_types": ["full_attention"] * 2,
            "mlp_layer_types": ["dense"] * 2,
            "mtp_layer_types": ["full_attention"],
            "mtp_mlp_layer_types": ["dense"],
        },
        checkpoint_key=lambda key, _: f"mtp.{key}",
        seeds=(11, 12),
    ),
    MtpFamily(
        name="GLM-4-MoE",
        config_class="Glm4MoeConfig",
        model_class="Glm4MoeForCausalLM",
        hidden_layers=46,
        mtp_layers=1,
        fields={"first_k_dense_replace": 46, "moe_intermediate_size": 8, "n_routed_experts": 4, "num_experts_per_tok": 2},
        checkpoint_key=_indexed_after_decoder,
        seeds=(18, 19),
    ),
)


def select_family(transformers: ModuleType, families: tuple[MtpFamily, ...] = FAMILIES) -> tuple[MtpFamily | None, str]:
    """The first family the installed transformers can draft with by MTP, or None and why none can."""
    if not has(optional_import("transformers.modeling_layers"), "MtpModel"):
        return None, "no MtpModel"
    reasons = []
    for family in families:
        reason = unavailable(transformers, family)
        if reason is None:
            return family, ""
        reasons.append(f"{family.name}: {reason}")
    return None, "; ".join(reasons)


def unavailable(transformers: ModuleType, family: MtpFamily) -> str | None:
    """Why ``family`` cannot be an MTP fixture on the installed transformers (None when it can)."""
    if not has(transformers, family.config_class, family.model_class):
        return f"no {family.model_class}"
    try:
        config = family.config(transformers)
    except Exception as exc:  # noqa: BLE001 - a strict config refusing the fields (e.g. more MTP layers than it allows)
        return f"its config refuses the fixture ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    if getattr(config.get_text_config(), "num_mtp_layers", None) != family.mtp_layers:
        return "its config has no num_mtp_layers"
    patterns = _mtp_patterns(getattr(transformers, family.model_class), family.hidden_layers)
    unread = [key for key in family.probe_keys() if not any(re.search(p, key) for p in patterns)]
    if unread:
        return f"registers no MTP checkpoint pattern matching {', '.join(unread)} (patterns {sorted(patterns)})"
    return None


def _mtp_patterns(model_class: Any, hidden_layers: int) -> list[str]:
    """The patterns ``MtpModel.from_pretrained`` reads MTP weights by: the class's ignored-on-load keys, less
    those naming a layer below the target's depth."""
    patterns = getattr(model_class, "_keys_to_ignore_on_load_unexpected", None) or ()
    kept = []
    for pattern in patterns:
        index = _PATTERN_INDEX.search(pattern)
        if index is None or int(index.group(1)) >= hidden_layers:
            kept.append(pattern)
    return kept


def mtp_models(family: MtpFamily) -> ModelFactory:
    """The model factory of ``family``: a target loaded from a local checkpoint holding its MTP layers, no draft."""

    def build(transformers: ModuleType, device: torch.device) -> tuple[Any, None]:
        return _build(family, transformers, device), None

    return build


def _build(family: MtpFamily, transformers: ModuleType, device: torch.device) -> Any:
    logging_utils = optional_import("transformers.utils.logging")
    if logging_utils is not None and hasattr(logging_utils, "disable_progress_bar"):
        logging_utils.disable_progress_bar()  # MtpModel.from_pretrained runs in every generate() call
    mtp_model_cls = importlib.import_module("transformers.modeling_layers").MtpModel
    model_cls = getattr(transformers, family.model_class)
    main_seed, mtp_seed = family.seeds
    torch.manual_seed(main_seed)
    main = scale_head(model_cls(family.config(transformers)).eval())
    torch.manual_seed(mtp_seed)
    mtp = mtp_model_cls(main, family.mtp_layers)
    _initialise(main, mtp)
    weights = {k: v.detach().clone() for k, v in mtp.state_dict().items() if not k.startswith(_SHARED_PREFIXES)}
    folder = tempfile.mkdtemp(prefix="specwatch-mtp-")
    try:
        _write_checkpoint(main, {family.checkpoint_key(k, family.hidden_layers): v for k, v in weights.items()}, folder)
        target = model_cls.from_pretrained(folder).eval().to(device)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weakref.finalize(target, shutil.rmtree, folder, ignore_errors=True)  # the checkpoint lives as long as the model
    loaded = mtp_model_cls.from_pretrained(target, device_map={"": device}).state_dict()
    wrong = [k for k, v in weights.items() if k not in loaded or not torch.equal(loaded[k].cpu(), v)]
    if wrong:
        raise AdapterError(
            f"MtpModel.from_pretrained did not load the {family.name} MTP weights written to the local checkpoint: {', '.join(wrong[:4])}"
        )
    return target


class LoadOnce:
    """``MtpModel.from_pretrained`` of one target run once per process, its model reused by later ``generate()`` calls.

    ``MTPCandidateGenerator.__init__`` loads the MTP layers from the target's checkpoint folder on every ``generate()``
    call (about 137 ms for the tiny Inkling fixture, more than the call's own decoding). Inside :meth:`around` the
    first load for ``target`` runs the library's loader and keeps its model; later loads for the same target and
    arguments return that model. The loader itself is still exercised (here, and when the fixture is built, which
    checks that it reads back exactly the weights written); ``MtpModel``'s forward keeps no state between calls
    (its cache is the generator's ``MtpCache``, made afresh each call), so the calls decode as they would with a
    fresh load. ``loads`` counts the real loads, ``reused`` the calls served from the kept model.
    """

    def __init__(self) -> None:
        self.loads = 0
        self.reused = 0
        self._kept: dict[str, Any] = {}

    @contextlib.contextmanager
    def around(self, target: Any) -> Iterator[None]:
        mtp_model_cls = importlib.import_module("transformers.modeling_layers").MtpModel
        original = mtp_model_cls.__dict__["from_pretrained"]
        load = original.__func__

        def from_pretrained(cls: Any, main_model: Any, *args: Any, **kwargs: Any) -> Any:
            if main_model is not target or cls is not mtp_model_cls:
                return load(cls, main_model, *args, **kwargs)
            key = repr((args, sorted(kwargs.items())))
            if key not in self._kept:
                self._kept[key] = load(cls, main_model, *args, **kwargs)
                self.loads += 1
            else:
                self.reused += 1
            return self._kept[key]

        mtp_model_cls.from_pretrained = classmethod(from_pretrained)
        try:
            yield
        finally:
            mtp_model_cls.from_pretrained = original


def _initialise(main: Any, mtp: Any) -> None:
    """Initialise the MTP layers with the target's own ``_init_weights`` (seeded by the caller).

    ``MtpModel``'s ``post_init`` knows only generic modules: it leaves a family's own parameter types as
    ``torch.empty`` memory (Inkling's relative-position logits projection), which would make the fixture differ
    from run to run and can hold NaN. Real MTP layers are loaded from a checkpoint, so the library never needs this.
    """
    with torch.no_grad():
        for name, child in mtp.named_children():
            if f"{name}." not in _SHARED_PREFIXES:
                for module in child.modules():
                    main._init_weights(module)
    bad = [name for name, p in mtp.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise AdapterError(f"the tiny MTP layers have non-finite weights after initialisation: {', '.join(bad[:4])}")


def _write_checkpoint(main: Any, mtp_weights: dict[str, torch.Tensor], folder: str) -> None:
    """``main.save_pretrained(folder)``, then its one safetensors file rewritten with ``mtp_weights`` added."""
    safetensors = importlib.import_module("safetensors.torch")  # transformers' own checkpoint format
    main.save_pretrained(folder)
    path = Path(folder) / "model.safetensors"
    if not path.exists():
        found = sorted(p.name for p in Path(folder).iterdir())
        raise AdapterError(f"save_pretrained wrote no single model.safetensors for the tiny MTP target (found {found})")
    tensors = dict(safetensors.load_file(str(path)))
    clash = sorted(set(tensors) & set(mtp_weights))
    if clash:
        raise AdapterError(f"the MTP checkpoint names clash with the target's own weights: {', '.join(clash[:4])}")
    safetensors.save_file({**tensors, **mtp_weights}, str(path), metadata={"format": "pt"})
