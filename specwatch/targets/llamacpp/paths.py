"""The speculative paths of llama.cpp the end-to-end cases drive, each turning seeds into generated tokens.

- :class:`PythonGenerate`: llama-cpp-python's ``Llama.generate`` (one ``Llama`` per configuration, reused), plain
  or with ``LlamaPromptLookupDecoding`` drafting (exact-match verification: the target samples every position and
  a draft is kept while the sampled token equals it). Each trial sets the seed the sampler chain is built with.
- :class:`SpeculativeTool`: the ``llama-speculative`` example (one process per trial, ``--seed``), target and
  draft GGUF models, one draft sequence of up to ``GAMMA`` tokens.

A trial records the generated tokens and, where the path lets the suite see them, its verification rounds as
(drafted, accepted) pairs.
"""

from __future__ import annotations

import importlib
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specwatch.targets.llamacpp.chain import LlamaChain
from specwatch.targets.llamacpp.models import EOS, PIECES, text, tiny_models

GGML_TYPE_F32 = 0
#: Drafts per verification (prompt lookup's num_pred_tokens, llama-speculative's --draft-max).
GAMMA = 3


class PathError(Exception):
    """A path did not produce what the case needs (not a finding by itself: the case errors with it)."""


@dataclass(frozen=True)
class Trial:
    tokens: list[int]
    #: (drafted, accepted) per verification round, where observable.
    rounds: list[tuple[int, int]] = field(default_factory=list)


class _RecordingLookup:
    """``LlamaPromptLookupDecoding`` wrapped to record what it proposed (the context length and the drafts)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[int, list[int]]] = []

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
        drafts = self.inner(input_ids, **kwargs)
        self.calls.append((len(input_ids), [int(t) for t in drafts]))
        return drafts


_llamas: dict[bool, Any] = {}


def _llama(lookup: bool) -> Any:
    if lookup not in _llamas:
        llama_cpp = importlib.import_module("llama_cpp")
        draft = None
        if lookup:
            spec = importlib.import_module("llama_cpp.llama_speculative")
            draft = _RecordingLookup(spec.LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=GAMMA))
        _llamas[lookup] = llama_cpp.Llama(
            model_path=str(tiny_models().target),
            n_ctx=64,
            n_batch=64,
            n_threads=1,
            verbose=False,
            seed=0,
            draft_model=draft,
            type_k=GGML_TYPE_F32,
            type_v=GGML_TYPE_F32,  # the default F16 cache moves logits by ~1e-4
        )
    return _llamas[lookup]


@dataclass(frozen=True)
class PythonGenerate:
    lookup: bool

    def run(self, prompt: Sequence[int], chain: LlamaChain | None, horizon: int, seeds: Sequence[int]) -> list[Trial]:
        """``horizon`` tokens per seed; ``chain`` None is temperature 0 (llama-cpp-python's greedy sampler)."""
        llm = _llama(self.lookup)
        recorder: _RecordingLookup | None = llm.draft_model if self.lookup else None
        out: list[Trial] = []
        params: dict[str, Any] = {"temp": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
        if chain is not None:
            params = {"temp": chain.temperature, "top_k": chain.top_k, "top_p": chain.top_p, "min_p": chain.min_p}
        for seed in seeds:
            llm.set_seed(int(seed))
            if recorder is not None:
                recorder.calls.clear()
            tokens: list[int] = []
            generator = llm.generate(list(prompt), repeat_penalty=1.0, reset=True, **params)
            for token in generator:
                tokens.append(int(token))
                if len(tokens) == horizon:
                    break
            generator.close()
            calls = list(recorder.calls) if recorder is not None else []
            out.append(Trial(tokens, _rounds(len(prompt), tokens, calls)))
        return out


def _rounds(prompt_length: int, tokens: Sequence[int], calls: Sequence[tuple[int, list[int]]]) -> list[tuple[int, int]]:
    """Verification rounds of exact-match drafting: drafts proposed after context length L are checked against the
    tokens generated next; accepted = their common prefix. Rounds that the horizon cuts short are left out."""
    rounds: list[tuple[int, int]] = []
    for length, drafts in calls:
        if not drafts:
            continue
        start = length - prompt_length  # index in ``tokens`` of the first position the drafts cover
        following = list(tokens[start:])
        accepted = 0
        while accepted < len(drafts) and accepted < len(following) and following[accepted] == drafts[accepted]:
            accepted += 1
        if start + min(accepted + 1, len(drafts)) <= len(tokens):
            rounds.append((len(drafts), accepted))
    return rounds


_STATS = re.compile(r"n_drafted\s*=\s*(\d+).*?n_accept\s*=\s*(\d+)", re.S)


@dataclass(frozen=True)
class SpeculativeTool:
    """``llama-speculative`` (target and draft GGUF, ``--draft-max GAMMA``, one draft sequence, ``--ignore-eos``)."""

    binary: Path

    def command(self, prompt: Sequence[int], chain: LlamaChain | None, horizon: int, seed: int) -> list[str]:
        models = tiny_models()
        temp = ["--temp", "0"] if chain is None else ["--temp", repr(chain.temperature)]
        cuts = ["--top-k", "0", "--top-p", "1", "--min-p", "0"]
        if chain is not None:
            cuts = ["--top-k", str(chain.top_k), "--top-p", repr(chain.top_p), "--min-p", repr(chain.min_p)]
        return [
            str(self.binary),
            *("-m", str(models.target), "-md", str(models.draft), "-p", text(prompt), "-n", str(horizon)),
            *("--draft-max", str(GAMMA), "--draft-min", "0", "-np", "1", "--seed", str(seed), "--ignore-eos"),
            *(
                "-t",
                "1",
                "-c",
                "128",
                "-b",
                "64",
                "--repeat-penalty",
                "1",
                "--no-warmup",
                *("-ctk", "f32", "-ctv", "f32", "-ctkd", "f32", "-ctvd", "f32"),
                "--no-display-prompt",
                *temp,
                *cuts,
            ),
        ]

    def run(self, prompt: Sequence[int], chain: LlamaChain | None, horizon: int, seeds: Sequence[int]) -> list[Trial]:
        out = []
        for seed in seeds:
            cmd = self.command(prompt, chain, horizon, int(seed))
            result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)  # noqa: S603
            if result.returncode != 0:
                raise PathError(f"llama-speculative exited {result.returncode}: {result.stderr.strip()[-300:]}")
            tokens = parse_tokens(result.stdout, text(prompt), horizon)
            stats = _STATS.search(result.stderr)
            rounds = [(int(stats[1]), int(stats[2]))] if stats else []
            out.append(Trial(tokens, rounds))
        return out


def parse_tokens(stdout: str, prompt: str, horizon: int) -> list[int]:
    """The generated tokens in the tool's printed text (one character per token; the prompt, if echoed, first).
    llama-speculative prints the token that ends generation too: up to ``horizon + 1`` tokens, cut to ``horizon``."""
    body = stdout.strip()
    body = body.removeprefix(prompt) if len(body) > horizon + 1 else body
    if any(c not in PIECES for c in body) or len(body) < horizon:
        raise PathError(f"llama-speculative printed {stdout[-200:]!r}: expected {horizon} generated characters of {''.join(PIECES)}")
    return [PIECES.index(c) for c in body[:horizon]]


def greedy_reference(prompt: Sequence[int], horizon: int, logits_of: Any, *, banned: Sequence[int] = ()) -> tuple[list[int], float]:
    """Plain greedy decoding of the float64 reference and the smallest top-2 logit gap met (a gap within float
    noise makes the comparison undecidable: the caller leaves such prompts out)."""
    out: list[int] = []
    gap = np.inf
    for _ in range(horizon):
        row = np.array(logits_of(prompt, out), dtype=np.float64)
        row[list(banned)] = -np.inf
        top = np.sort(row)[::-1]
        gap = min(gap, float(top[0] - top[1]))
        out.append(int(np.argmax(row)))
    return out, gap


#: The token llama-speculative's --ignore-eos removes (logit bias -inf on the end-of-generation tokens).
IGNORE_EOS = (EOS,)


def forward_difference(tokens: Sequence[int]) -> float:
    """Largest |llama.cpp logit - float64 reference logit| over every position of ``tokens`` (target model, F32
    weights and KV cache): llama.cpp must compute the function the exact laws are computed from."""
    from specwatch.targets.llamacpp.models import all_logits  # noqa: PLC0415

    llama_cpp = importlib.import_module("llama_cpp")
    llm = llama_cpp.Llama(
        model_path=str(tiny_models().target),
        n_ctx=64,
        n_threads=1,
        logits_all=True,
        verbose=False,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
    )
    try:
        llm.reset()
        llm.eval(list(tokens))
        got = np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    return float(np.abs(got - all_logits(tokens)).max())
