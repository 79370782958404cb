"""Tiny random Llama target and draft of the OpenVINO GenAI target, exported to OpenVINO IR (fp32), and their float64
reference forward.

Built in code (no hub download): a 2-layer random Llama (hidden 64, 2 heads of 32) over :data:`VOCAB` one-character
tokens with a ``tokenizers`` WordLevel tokenizer (one word per character, split per character, no special tokens but
the end token), saved as a transformers checkpoint and exported with optimum-intel (``optimum-cli export openvino
--task text-generation-with-past --weight-format fp32``, which converts the tokenizer with openvino-tokenizers). The
export runs once per model family and release: for a release of the release cache, in its install step, into the
release's own cache entry (``<entry>/specwatch-openvino-ir/<family>/``, :func:`prepare_release`: the only step that may
write it), else into ``SPECWATCH_CACHE_DIR/openvino/<release>/<family>/``; the
float64 copy of the same weights is the oracle of the exact laws, and :func:`forward_difference` checks that the IR
computes the same function within float32 noise (``INFERENCE_PRECISION_HINT=f32``: CPUs with AMX or AVX512-bf16
otherwise run in bf16).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.targets import TargetError
from specwatch.targets.tiny import DRAFT_NOISE, FFN, HEAD_SCALE, HEADS, HIDDEN, LAYERS, noisy_draft, tiny_llama

#: The characters of the vocabulary, in id order; ``EOS`` is the end token (never emitted by the fixtures' prompts).
PIECES = ("a", "b", "c", "d", "e", "f", "g", "h")
VOCAB = len(PIECES)
EOS = VOCAB - 1
#: Largest |IR logit - float64 logit| accepted as float32 noise.
FORWARD_TOLERANCE = 1e-4
#: The device configuration every pipeline and compiled model of the suite uses.
DEVICE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Family:
    """One model family: the seeds of the target and of its draft's head noise."""

    seed: int = 1
    draft_seed: int = 2

    @property
    def key(self) -> str:
        spec = json.dumps([self.seed, self.draft_seed, PIECES, HEAD_SCALE, DRAFT_NOISE, HIDDEN, HEADS, FFN, LAYERS], sort_keys=True)
        return hashlib.sha256(spec.encode()).hexdigest()[:12]


#: The family the cases use.
DEFAULT_FAMILY = Family()


@dataclass(frozen=True)
class Exported:
    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def draft(self) -> Path:
        return self.root / "draft"


_float64: dict[tuple[Family, str], Any] = {}
#: Families exported into temporary space by this process (their cache folder was read-only).
_scratch: dict[Family, Path] = {}
#: The marker of a complete release cache entry (:func:`specwatch.targets.install.pip_install`), and the folder of
#: the release's IR inside it.
INSTALLED = ".specwatch-complete"
IR_FOLDER = "specwatch-openvino-ir"


def release_version() -> str:
    return str(importlib.import_module("openvino_genai").__version__)


def cache_dir() -> Path:
    return Path(os.environ.get("SPECWATCH_CACHE_DIR") or Path.home() / ".cache" / "specwatch") / "openvino"


def models(family: Family = DEFAULT_FAMILY) -> tuple[Any, Any]:
    """The float32 transformers target and draft of ``family`` (deterministic from its seeds)."""
    target = tiny_llama(seed=family.seed, vocab=VOCAB, eos=EOS)
    return target, noisy_draft(target, seed=family.draft_seed)


def release_folder() -> Path | None:
    """The release cache entry the imported ``openvino_genai`` comes from (a folder :func:`specwatch.targets.install.
    pip_install` completed), or None for a release installed elsewhere."""
    folder = Path(importlib.import_module("openvino_genai").__file__ or "").resolve().parents[1]
    return folder if (folder / INSTALLED).exists() else None


def ir_root(family: Family = DEFAULT_FAMILY) -> Path:
    """Where ``family``'s IR of the imported release lives: inside the release's own cache entry (written by its
    install step, :func:`prepare_release`: the run step's cache is read-only), else under
    ``SPECWATCH_CACHE_DIR/openvino/<release>/``."""
    folder = release_folder()
    if folder is not None:
        return folder / IR_FOLDER / family.key
    return cache_dir() / _safe(release_version()) / family.key


def exported(family: Family = DEFAULT_FAMILY) -> Exported:
    """The IR folders of ``family``, exported once per release (a complete folder is reused). Where that folder
    cannot be written (a sandboxed run step whose install step did not export it), the export goes to a folder of
    this process's temporary space, said on stderr."""
    root = ir_root(family)
    if (root / ".complete").exists():
        return Exported(root)
    if family in _scratch:
        return Exported(_scratch[family])
    writable = next((p for p in (root, *root.parents) if p.exists()), None)
    if writable is None or not os.access(writable, os.W_OK):
        root = Path(tempfile.mkdtemp(prefix="specwatch-openvino-ir-")) / family.key
        print(f"openvino: {ir_root(family)} is read-only: exporting the tiny models into {root}", file=sys.stderr, flush=True)  # noqa: T201
        _scratch[family] = root
    _export_family(family, root)
    return Exported(root)


def _export_family(family: Family, root: Path) -> None:
    """Export ``family``'s target and draft into ``root`` through a staging folder renamed when complete."""
    if (root / ".complete").exists():
        return
    staging = root.with_name(root.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, model in zip(("target", "draft"), models(family), strict=True):
        checkpoint = staging / f"{name}-hf"
        save_checkpoint(model, checkpoint)
        export(checkpoint, staging / name)
        shutil.rmtree(checkpoint)
    (staging / ".complete").write_text(json.dumps({"family": [family.seed, family.draft_seed], "release": release_version()}))
    if root.exists():
        shutil.rmtree(staging)
    else:
        staging.rename(root)


def prepare_release(folder: Path, *, log: bool = True) -> None:
    """The install step's preparation of a release (its registry entry's ``prepare``): the tiny models exported into
    the release's own folder, by a process that imports the release from it (the step that runs the cases cannot
    write the cache). :class:`~specwatch.targets.TargetError` with the exporter's output when it fails."""
    if (folder / IR_FOLDER / DEFAULT_FAMILY.key / ".complete").exists():
        return
    if log:
        print(f"exporting the tiny OpenVINO models into {folder / IR_FOLDER}", file=sys.stderr, flush=True)  # noqa: T201
    root = str(Path(__file__).resolve().parents[3])
    path = os.pathsep.join(p for p in (str(folder), root, os.environ.get("PYTHONPATH", "")) if p)
    code = "from specwatch.targets.openvino.models import exported; exported()"
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)  # noqa: S603
    if result.returncode != 0:
        raise TargetError(f"exporting the tiny OpenVINO models failed: {(result.stderr or result.stdout).strip()[-1500:]}")


def export(checkpoint: Path, out: Path) -> None:
    """``optimum-cli export openvino`` (fp32, with past) of a transformers checkpoint; its output on failure."""
    code = "import sys; from optimum.commands.optimum_cli import main; sys.argv[0] = 'optimum-cli'; main()"
    cmd = [sys.executable, "-c", code, "export", "openvino", "--model", str(checkpoint), "--task", "text-generation-with-past"]
    cmd += ["--weight-format", "fp32", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # noqa: S603
    if result.returncode != 0 or not (out / "openvino_model.xml").exists():
        raise RuntimeError(f"optimum-cli export openvino failed ({result.returncode}): {(result.stderr or result.stdout)[-2000:]}")


def tokenizer() -> Any:
    """The WordLevel tokenizer over :data:`PIECES`: every character is one word (a prompt of n characters is n ids)."""
    tokenizers = importlib.import_module("tokenizers")
    vocab = {piece: i for i, piece in enumerate(PIECES)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=PIECES[0]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    tok.decoder = tokenizers.decoders.Fuse()
    return tok


def save_checkpoint(model: Any, folder: Path) -> None:
    """``model`` and the :func:`tokenizer` as a transformers checkpoint (safetensors, fp32)."""
    transformers = importlib.import_module("transformers")
    model.save_pretrained(folder)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer(), eos_token=PIECES[EOS])
    fast.save_pretrained(folder)
    generation = folder / "generation_config.json"
    generation.write_text(json.dumps({"eos_token_id": EOS, "do_sample": False}))


def reference(name: str = "target", family: Family = Family()) -> Any:
    """The float64 transformers copy of ``family``'s ``target`` or ``draft`` (what the IR holds)."""
    if (family, name) not in _float64:
        target, draft = models(family)
        _float64[(family, "target")] = target.to(torch.float64).eval()
        _float64[(family, "draft")] = draft.to(torch.float64).eval()
    return _float64[(family, name)]


def text(tokens: Sequence[int]) -> str:
    return "".join(PIECES[t] for t in tokens)


def all_logits(tokens: Sequence[int], *, model: str = "target", family: Family = Family()) -> NDArray[np.float64]:
    """float64 logits at every position of ``tokens`` (shape (len, V))."""
    with torch.no_grad():
        out = reference(model, family)(torch.tensor([list(tokens)]), use_cache=False).logits[0]
    rows: NDArray[np.float64] = out.double().numpy()
    return rows


def ir_logits(folder: Path, tokens: Sequence[int]) -> NDArray[np.float64]:
    """The IR's logits at every position of ``tokens`` (one stateful infer, f32 precision)."""
    ov = importlib.import_module("openvino")
    core = ov.Core()
    compiled = core.compile_model(str(folder / "openvino_model.xml"), "CPU", DEVICE_CONFIG)
    request = compiled.create_infer_request()
    request.reset_state()
    n = len(tokens)
    inputs = {
        "input_ids": np.array([list(tokens)], dtype=np.int64),
        "attention_mask": np.ones((1, n), dtype=np.int64),
        "position_ids": np.arange(n, dtype=np.int64)[None],
        "beam_idx": np.zeros(1, dtype=np.int32),
    }
    names = {name for port in compiled.inputs for name in port.get_names()}
    request.infer({k: v for k, v in inputs.items() if k in names})
    out: NDArray[np.float64] = np.array(request.get_tensor("logits").data, dtype=np.float64)[0]
    return out


def forward_difference(tokens: Sequence[int], *, model: str = "target", family: Family = Family()) -> float:
    """Largest |IR logit - float64 reference logit| over every position of ``tokens``."""
    folder = getattr(exported(family), model)
    return float(np.abs(ir_logits(folder, tokens) - all_logits(tokens, model=model, family=family)).max())


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
