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
import subprocess
import tempfile
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
    #: (drafted, accepted) per verification round; None where not observed.
    rounds: list[tuple[int, int]] | None = field(default_factory=list)


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


#: Trials per batch whose verification rounds are reconstructed (float64 draft forwards: coverage, not the law).
COVERAGE_TRIALS = 32


def speculative_rounds(prompt: Sequence[int], tokens: Sequence[int], *, banned: Sequence[int] = ()) -> list[tuple[int, int]]:
    """llama-speculative's verification rounds, reconstructed from its output: its drafts are deterministic, the draft
    model's most likely tokens after the chain (``cur_p->data[0]``; the cuts and the temperature keep the argmax,
    the bias removes ``banned``), ``GAMMA`` per round. The first token comes from the prompt's forward; a round
    starting at output index s drafts from ``tokens[:s]``, keeps the common prefix a of drafts and output, and the
    next round starts at s + a + 1 (a rejection's residual token or the bonus token). Rounds the horizon cuts
    short are left out."""
    from specwatch.targets.llamacpp.models import next_token_logits  # noqa: PLC0415

    rounds: list[tuple[int, int]] = []
    start = 1
    while start + 1 <= len(tokens):
        drafts: list[int] = []
        for _ in range(GAMMA):
            row = next_token_logits(prompt, [*tokens[:start], *drafts], model="draft")
            row[list(banned)] = -np.inf
            drafts.append(int(np.argmax(row)))
        following = list(tokens[start:])
        accepted = 0
        while accepted < GAMMA and accepted < len(following) and following[accepted] == drafts[accepted]:
            accepted += 1
        if start + min(accepted + 1, GAMMA) > len(tokens):
            break
        rounds.append((GAMMA, accepted))
        start += accepted + 1
    return rounds


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
            *("-m", str(models.target), "-md", str(models.draft), "-p", text(prompt), "-n", str(horizon + TOOL_EXTRA)),
            *("--spec-draft-n-max", str(GAMMA), "-np", "1", "--seed", str(seed), "--ignore-eos"),
            *("-t", "1", "-c", "128", "-b", "64", "--repeat-penalty", "1"),
            *("-ctk", "f32", "-ctv", "f32", "-ctkd", "f32", "-ctvd", "f32"),
            *("-fa", "off"),  # "auto" turns the CPU's flash attention on: logits up to 4e-3 from the reference
            *temp,
            *cuts,
        ]

    def run(self, prompt: Sequence[int], chain: LlamaChain | None, horizon: int, seeds: Sequence[int]) -> list[Trial]:
        out: list[Trial] = []
        for seed in seeds:
            cmd = self.command(prompt, chain, horizon, int(seed))
            tokens = parse_tokens(_run_tool(cmd, horizon), horizon)
            rounds = speculative_rounds(prompt, tokens, banned=IGNORE_EOS) if len(out) < COVERAGE_TRIALS else None
            out.append(Trial(tokens, rounds))
        return out


#: Runs of one seed before a cut print is an error, and tokens generated past the horizon. The tool's log thread
#: can drop the tail of what it prints at exit (its logger is never flushed: upstream issue 22142); the tail is
#: what is lost, and a seed always gives the same tokens, so a run is repeated until the horizon's tokens are there.
TOOL_ATTEMPTS = 20
TOOL_EXTRA = 8


def _run_tool(cmd: list[str], need: int) -> str:
    """The tool's printed text after the prompt once it holds at least ``need`` characters."""
    prompt = cmd[cmd.index("-p") + 1]
    body, log = "", ""
    for _ in range(TOOL_ATTEMPTS):
        with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
            code = subprocess.run(cmd, stdout=stdout, stderr=stderr, check=False, timeout=120).returncode  # noqa: S603
            stdout.seek(0)
            stderr.seek(0)
            body, log = stdout.read().strip().removeprefix(prompt), stderr.read()
        if code != 0:
            raise PathError(f"{Path(cmd[0]).name} exited {code}: {log.strip()[-300:]}")
        if len(body) >= need:
            break
    return body


def parse_tokens(body: str, horizon: int) -> list[int]:
    """The first ``horizon`` generated tokens in the tool's printed text after the prompt (one character a token)."""
    if any(c not in PIECES for c in body) or len(body) < horizon:
        raise PathError(f"llama-speculative printed {body[-200:]!r}: expected {horizon} generated characters of {''.join(PIECES)}")
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
