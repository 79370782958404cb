"""End-to-end cases of the SGLang target: ``sglang.Engine.generate`` with tiny offline models against exact laws.

The models are the vLLM target's (:mod:`specwatch.targets.vllm.models`: a 2-layer random Llama target, a 1-layer
draft and a 1-layer EAGLE head over 8 tokens, saved with ``save_pretrained``), and so are the laws: the joint law
of the first ``E2E_LENGTH`` tokens after the processing (:func:`specwatch.targets.vllm.e2e.processed_law`) and the
long-horizon conditional check (every token of ``E2E_HORIZON`` against its exact conditional law, randomized PIT
under two token orders). Engines: plain (the control), ``STANDALONE`` (draft model), ``EAGLE`` (topk 1, so the
chain and tree paths coincide, and topk 2 for a tree) and ``NGRAM``, 3 drafts a step; processing off and on;
greedy equivalence (``temperature=0``: speculative output equals plain output on 64 prompts).

SGLang's engine needs CUDA here: the CPU engine needs ``sgl_kernel``'s CPU build (not on the package index; it
targets AMX Xeons), and on a CPU every sampled request would be verified greedily anyway (:mod:`.dispatch`). Where
there is no CUDA the cases are skipped with that reason, never passed; ``scripts/sglang_device_check.sh`` runs them
on a lent GPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from specwatch.cases import Case
from specwatch.conditional import FLOAT32_MARGIN, TokenOrder, processing_margin
from specwatch.experiments import CheckSpec, Observation, Violation
from specwatch.protocol import Layer
from specwatch.sampling import Processing, TargetRaised
from specwatch.targets.base import LibraryExperiment, conditional_pit, e2e_checks, e2e_draws, joint_cell, pit_check
from specwatch.targets.vllm.e2e import E2E_HORIZON, E2E_LENGTH, PROCESSING_ON, PROMPT, processed_law
from specwatch.targets.vllm.models import E2E_VOCAB, TinyModels, conditional_logits, tiny_models

#: Drafts a verification step (``speculative_num_steps``; ``speculative_num_draft_tokens`` = steps + 1 for a chain).
GAMMA = 3
#: Engine name -> the speculative arguments of ``sglang.Engine`` (model paths filled in by :func:`engine_kwargs`).
ENGINES: dict[str, dict[str, Any]] = {
    "plain": {},
    "standalone": {"speculative_algorithm": "STANDALONE", "speculative_eagle_topk": 1, "speculative_num_draft_tokens": GAMMA + 1},
    "eagle": {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1, "speculative_num_draft_tokens": GAMMA + 1},
    "eagle_tree": {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6},
    "eagle_rejection": {
        "speculative_algorithm": "EAGLE",
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": GAMMA + 1,
        "speculative_use_rejection_sampling": True,
    },
    "ngram": {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": GAMMA + 1},
}


def engine_kwargs(name: str, models: TinyModels, *, seed: int = 0) -> dict[str, Any]:
    """``sglang.Engine``'s arguments for engine ``name``: float32, no CUDA graphs, a small static memory fraction."""
    kwargs: dict[str, Any] = {
        "model_path": str(models.target),
        "dtype": "float32",
        "disable_cuda_graph": True,
        "mem_fraction_static": 0.2,
        "random_seed": seed,
        "log_level": "error",
        "skip_tokenizer_init": True,
        **ENGINES[name],
    }
    if name != "plain":
        kwargs["speculative_num_steps"] = GAMMA
    if name == "standalone":
        kwargs["speculative_draft_model_path"] = str(models.draft)
    elif name.startswith("eagle"):
        kwargs["speculative_draft_model_path"] = str(models.eagle)
    return kwargs


_ENGINES: dict[str, Any] = {}


def engine(name: str) -> Any:
    """The engine ``name``, built once per process (``sglang.Engine`` with :func:`engine_kwargs`)."""
    if name not in _ENGINES:
        sglang = importlib.import_module("sglang")
        _ENGINES[name] = sglang.Engine(**engine_kwargs(name, tiny_models()))
    return _ENGINES[name]


def sampling_params(processing: Processing, new_tokens: int, seed: int) -> dict[str, Any]:
    """One request's sampling parameters (``top_k=-1`` and ``top_p=1`` where the processing has none)."""
    return {
        "temperature": processing.temperature,
        "top_k": processing.top_k if processing.top_k is not None else -1,
        "top_p": processing.top_p if processing.top_p is not None else 1.0,
        "max_new_tokens": new_tokens,
        "ignore_eos": True,
        "sampling_seed": seed,
    }


class EngineGenerateExperiment(LibraryExperiment):
    """Trials of ``Engine.generate`` (one request a trial): the joint law of the first ``E2E_LENGTH`` tokens (sizes
    the run) and every token of ``E2E_HORIZON`` against its exact conditional law."""

    probe_trials = 64

    def __init__(self, engine_name: str, processing: Processing) -> None:
        self.engine_name, self.processing = engine_name, processing
        self.law = processed_law(processing, PROMPT, E2E_LENGTH)
        engine(engine_name)
        self._checks = e2e_checks(self.law, length=E2E_LENGTH, horizon=E2E_HORIZON, designed="first")

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    def run(self, n: int, generator: torch.Generator) -> Observation:
        seeds, pit_w = e2e_draws(n, E2E_HORIZON, generator)
        try:
            outputs = engine(self.engine_name).generate(
                input_ids=[list(PROMPT)] * n, sampling_params=[sampling_params(self.processing, E2E_HORIZON, s) for s in seeds]
            )
        except Exception as exc:
            raise TargetRaised(exc) from exc
        generated = [list(out["output_ids"]) for out in outputs]
        return observe(generated, self.processing, self.law, self._checks[0].name, pit_w)


def observe(generated: list[list[int]], processing: Processing, law: Any, first: str, pit_w: Any) -> Observation:
    """Counts of the first tokens' joint cell and the PIT bins of every token; a certain violation for a wrong length,
    an id out of range or a token of conditional probability 0."""
    counts = np.zeros(len(law), dtype=np.int64)
    for new in generated:
        if len(new) != E2E_HORIZON or any(not 0 <= t < E2E_VOCAB for t in new):
            return Observation({}, (Violation(Layer.LOSSLESS, f"generate returned {new} for {E2E_HORIZON} new tokens"),), 0, b"")
        counts[joint_cell(new, E2E_VOCAB, E2E_LENGTH)] += 1
    trials: list[tuple[list[int], Any, Any]] = []
    if generated:
        logits = conditional_logits(tiny_models(), PROMPT, generated)
        rows = processing.probs(torch.from_numpy(logits)).numpy()
        for out, trial_rows, trial_logits in zip(generated, rows, logits, strict=True):
            margins = [processing_margin(row, processing.temperature, processing.top_k, processing.top_p) for row in trial_logits]
            trials.append((out, trial_rows, np.array([m >= FLOAT32_MARGIN for m in margins])))
    pit, violations = conditional_pit(trials, pit_w)
    return Observation({first: counts, **{pit_check(o): pit[o] for o in TokenOrder}}, violations, 0, counts.tobytes())


class GreedyEquivalenceExperiment(LibraryExperiment):
    """``temperature=0``: the speculative engine's output equals the plain engine's exactly, on 64 random prompts."""

    prompts = 64

    def __init__(self, engine_name: str, *, new_tokens: int = 6) -> None:
        self.engine_name, self.new_tokens = engine_name, new_tokens
        engine("plain")
        engine(engine_name)

    @property
    def fixed_trials(self) -> int:
        return self.prompts

    def run(self, n: int, generator: torch.Generator) -> Observation:
        prompts = torch.randint(0, E2E_VOCAB, (n, 6), generator=generator).tolist()
        params = {"temperature": 0.0, "max_new_tokens": self.new_tokens, "ignore_eos": True}
        try:
            plain = [o["output_ids"] for o in engine("plain").generate(input_ids=prompts, sampling_params=params)]
            spec = [o["output_ids"] for o in engine(self.engine_name).generate(input_ids=prompts, sampling_params=params)]
        except Exception as exc:
            raise TargetRaised(exc) from exc
        diff = [(p, a, b) for p, a, b in zip(prompts, plain, spec, strict=True) if list(a) != list(b)]
        found = (Violation(Layer.LOSSLESS, f"greedy output differs on {len(diff)} prompts, e.g. {diff[0]}"),) if diff else ()
        return Observation({}, found, 0, b"")


class Installed(Protocol):
    @property
    def version(self) -> str: ...


#: Why the end-to-end cases cannot run on a machine without CUDA.
NO_CUDA = (
    "not reachable: SGLang's engine needs CUDA here (the CPU engine needs sgl_kernel's CPU build, which the package "
    "index does not carry, and verifies sampled requests greedily on a CPU); scripts/sglang_device_check.sh runs it on a GPU"
)


def e2e_cases(adapter: Installed, *, cuda: bool | None = None) -> tuple[Case, ...]:
    """The end-to-end cases: sampling (processing off and on) per engine, greedy equivalence per speculative engine;
    skipped with :data:`NO_CUDA` where torch sees no CUDA device."""
    runnable = torch.cuda.is_available() if cuda is None else cuda
    cases: list[Case] = []
    for name in ENGINES:
        for label, processing in (("plain", Processing()), ("processed", PROCESSING_ON)):

            def sample(device: torch.device, name: str = name, processing: Processing = processing) -> EngineGenerateExperiment:
                return EngineGenerateExperiment(name, processing)

            what = "control: no speculation" if name == "plain" else f"{ENGINES[name]['speculative_algorithm']} with {GAMMA} drafts"
            cases.append(
                Case(
                    id=f"e2e/{name}/{label}",
                    family="e2e",
                    description=(
                        f"sglang {adapter.version} Engine.generate, {what}; {processing.describe()}; first {E2E_LENGTH} "
                        f"tokens' joint law and {E2E_HORIZON} tokens' conditional laws"
                    ),
                    epsilon=0.05,
                    make_experiment=sample if runnable else None,
                    skip_reason=None if runnable else NO_CUDA,
                    quick=name in ("plain", "eagle") and label == "processed",
                )
            )
        if name != "plain":

            def greedy(device: torch.device, name: str = name) -> GreedyEquivalenceExperiment:
                return GreedyEquivalenceExperiment(name)

            cases.append(
                Case(
                    id=f"e2e/{name}/greedy_equivalence",
                    family="e2e",
                    description=f"temperature 0: {name} output equals the plain engine's on 64 prompts",
                    epsilon=1.0,
                    make_experiment=greedy if runnable else None,
                    skip_reason=None if runnable else NO_CUDA,
                    quick=name == "eagle",
                )
            )
    return tuple(cases)
