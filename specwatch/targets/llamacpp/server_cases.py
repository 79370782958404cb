"""End-to-end cases of ``llama-server``: its shared speculative path (draft model, n-gram drafting) over HTTP.

The server verifies with ``common_sampler_sample_and_accept_n`` (``common/sampling.cpp``): the target samples every
position with its full chain and keeps drafts while they equal what it sampled, one draw per emitted token, so it
should be lossless and a seeded speculative request should reproduce the non-speculative one token for token.
Cases (:func:`server_cases`):

- ``e2e/server_draft/*``, ``e2e/server_ngram/*``: the joint law of the first tokens and every token of a long horizon
  against its conditional law (:class:`~specwatch.targets.llamacpp.experiments.GenerateExperiment` with a
  :class:`ServerGenerate` path), processing off and on, with coverage;
- ``e2e/greedy/server_*``: temperature 0 equals plain greedy decoding of the float64 reference;
- ``e2e/seeded/server_*``: per seed, the speculative server's tokens equal the non-speculative server's
  (:class:`SeededEqualityExperiment`).

Coverage: the server reports only the request's totals (``draft_n``, ``draft_n_accepted``). Its drafts are
deterministic given the output (draft-simple: the draft model's most likely token, ``cur_p->data[0]``, up to
``gamma``, from one float64 draft forward over each output: :func:`along_output`; ngram-simple:
:func:`ngram_simple_draft`), so every trial's rounds are reconstructed from its output (:func:`server_rounds`) and
kept only where their totals equal the server's own (a draft-model argmax within float noise can differ: that
trial's rounds are then not observed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specwatch.cases import Case
from specwatch.experiments import CoverageDesign, Observation, Violation
from specwatch.protocol import Layer
from specwatch.sampling import TargetRaised
from specwatch.targets.base import LibraryExperiment, trial_seeds
from specwatch.targets.llamacpp.build import tool_missing, tool_path
from specwatch.targets.llamacpp.chain import LlamaChain
from specwatch.targets.llamacpp.experiments import PROMPT, GenerateExperiment, GreedyExperiment
from specwatch.targets.llamacpp.paths import IGNORE_EOS, PathError, Trial
from specwatch.targets.llamacpp.server import Completion, ServerConfig, shared_server

#: Tokens per request: a long horizon (the conditional check tests each of them) at a few milliseconds a request.
SERVER_HORIZON = 32
GREEDY_HORIZON = 32
SEEDED_TRIALS = 64
#: Drafts per verification (draft-simple's --spec-draft-n-max, ngram-simple's m-gram) and the n-gram looked up.
GAMMA, NGRAM = 3, 2
#: Processing on for the server's law (the end-of-generation token banned: ``ignore_eos``): every cut removes at
#: least 1 % of the mass on each row the joint law enumerates (the fixture check asks it on average at each position)
#: and no row lies within 1e-4 of a boundary. The Python paths' earlier setting (T 0.8, top-k 6, top-p 0.9, min-p
#: 0.05) fails it once the token is banned: after prompt + (0, 1) top-p's boundary lies 4e-5 from a cumulative probability.
SERVER_PROCESSING = {"temperature": 0.8, "top_k": 4, "top_p": 0.9, "min_p": 0.2}
PROCESSED = "T 0.8, top-k 4, top-p 0.9, min-p 0.2"

Drafter = Callable[[list[int], int], list[int]]


def ngram_simple_draft(history: Sequence[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    """``common_ngram_simple_draft`` (``common/ngram-map.cpp``): the last ``size_n`` tokens (``history`` then
    ``sampled``) searched backwards in ``history`` (position 0 and the current match excluded); the up to
    ``size_m`` tokens after the match are the drafts, none when fewer than ``size_n`` of them exist."""
    cur = len(history)
    if cur <= size_n + size_m + 1:
        return []
    pattern = [*history[cur - size_n + 1 :], sampled]
    match = 0
    for j in range(cur - size_n - 1, 0, -1):
        if list(history[j : j + size_n]) == pattern:
            match = j
            break
    if match == 0:
        return []
    copy = min(size_m, cur - (match + size_n))
    if copy < size_n:
        return []
    return [int(t) for t in history[match + size_n : match + size_n + copy]]


def server_rounds(tokens: Sequence[int], drafter: Drafter, gamma: int) -> list[tuple[int, int]]:
    """The server's verification rounds for an output, given its deterministic ``drafter(context, n_max)`` (the
    output so far, the most drafts allowed). The first token comes from the prompt's forward; after ``s`` emitted
    tokens the server drafts at most ``min(gamma, horizon - s - 1)`` (``server_slot::get_n_draft_max``: room for
    the token the target samples after the drafts), keeps the drafts' common prefix ``a`` with the output and emits
    ``a + 1`` tokens; no drafts (none found, or no room) is a plain step, not a round."""
    rounds: list[tuple[int, int]] = []
    start = 1
    horizon = len(tokens)
    while start < horizon:
        n_max = min(gamma, horizon - start - 1)
        drafts = drafter(list(tokens[:start]), n_max)[:n_max] if n_max > 0 else []
        if not drafts:
            start += 1
            continue
        accepted = 0
        while accepted < len(drafts) and tokens[start + accepted] == drafts[accepted]:
            accepted += 1
        rounds.append((len(drafts), accepted))
        start += accepted + 1
    return rounds


def observed_rounds(completion: Completion, rounds: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """``rounds`` when their totals are the server's (``draft_n``, ``draft_n_accepted``), else None (not observed)."""
    drafted, accepted = sum(d for d, _ in rounds), sum(a for _, a in rounds)
    return rounds if (drafted, accepted) == (completion.draft_n, completion.draft_accepted) else None


def along_output(argmax: Sequence[int]) -> Drafter:
    """draft-simple's drafts as far as they matter: the draft model's most likely token (top-k 10 and ``p_min`` 0 keep
    it; no end-of-generation bias) at each position of the output itself, ``argmax[t]`` after prompt + output[:t].
    Drafted after context c, the i-th draft follows c and the i - 1 drafts before it; while those equal the output
    it is ``argmax[len(c) + i]``, and a draft after the first rejected one changes neither the round's length (the
    draft always drafts its maximum) nor its accepted count: one draft forward over the output gives every round."""

    def drafter(context: list[int], n_max: int) -> list[int]:
        return [int(t) for t in argmax[len(context) : len(context) + n_max]]

    return drafter


def ngram_drafter(prompt: Sequence[int], size_n: int, size_m: int) -> Drafter:
    def drafter(context: list[int], n_max: int) -> list[int]:
        return ngram_simple_draft([*prompt, *context[:-1]], context[-1], size_n, size_m)

    return drafter


@dataclass(frozen=True)
class ServerGenerate:
    """Requests to the process's ``llama-server`` started with ``config``, one per seed."""

    binary: Path
    config: ServerConfig

    def run(self, prompt: Sequence[int], chain: LlamaChain | None, horizon: int, seeds: Sequence[int]) -> list[Trial]:
        """``horizon`` tokens per seed; ``chain`` None is temperature 0 (its law would ban the end-of-generation
        token: ``ignore_eos``)."""
        server = shared_server(self.binary, self.config)
        completions = [server.complete(prompt, chain, horizon, int(seed)) for seed in seeds]
        if self.config.spec == "none":
            return [Trial(c.tokens, []) for c in completions]
        drafters: list[Drafter]
        if self.config.spec == "draft":
            from specwatch.targets.llamacpp.models import conditional_logits  # noqa: PLC0415 - needs transformers

            argmax = conditional_logits(prompt, [c.tokens for c in completions], model="draft").argmax(axis=-1)
            drafters = [along_output(row) for row in argmax.tolist()]
        else:
            drafters = [ngram_drafter(prompt, self.config.ngram, self.config.gamma)] * len(completions)
        return [
            Trial(c.tokens, observed_rounds(c, server_rounds(c.tokens, drafter, self.config.gamma)))
            for c, drafter in zip(completions, drafters, strict=True)
        ]


class SeededEqualityExperiment(LibraryExperiment):
    """Per seed, the speculative server's output equals the non-speculative server's with the same seed and
    settings (the shared path draws once per emitted token from the full chain): a difference is a violation of
    what the path promises (conformance; the law can hold without it)."""

    probe_trials = 8

    def __init__(self, speculative: ServerGenerate, plain: ServerGenerate, chain: LlamaChain, *, horizon: int = SERVER_HORIZON) -> None:
        self.speculative, self.plain, self.chain, self.horizon = speculative, plain, chain, horizon

    @property
    def fixed_trials(self) -> int:
        return SEEDED_TRIALS

    def run(self, n: int, generator: torch.Generator) -> Observation:
        seeds = trial_seeds(n, generator)
        try:
            fast = self.speculative.run(PROMPT, self.chain, self.horizon, seeds)
            slow = self.plain.run(PROMPT, self.chain, self.horizon, seeds)
        except PathError:
            raise
        except Exception as exc:
            raise TargetRaised(exc) from exc
        violations: list[Violation] = []
        differ = [i for i, (a, b) in enumerate(zip(fast, slow, strict=True)) if a.tokens != b.tokens]
        if differ:
            i = differ[0]
            first = next(j for j, (a, b) in enumerate(zip(fast[i].tokens, slow[i].tokens, strict=True)) if a != b)
            violations.append(
                Violation(
                    Layer.CONFORMANCE,
                    f"{len(differ)} of {n} seeds differ; seed {seeds[i]}: speculative {fast[i].tokens} != plain "
                    f"{slow[i].tokens} (from position {first})",
                )
            )
        sample = np.asarray([t for trial in fast for t in trial.tokens], dtype=np.int64)
        return Observation({}, tuple(violations), 0, sample.tobytes())


def server_cases(adapter: Any) -> list[Case]:
    """The server's cases (each skipped with the reason where the release has no ``llama-server``)."""
    binary = tool_path(adapter.info, "llama-server")
    skip = None if binary is not None else tool_missing(adapter.info, "llama-server")
    path = Path(binary or "llama-server")
    configs = {
        "draft": (ServerConfig("draft", GAMMA, NGRAM), f"draft model (draft-simple, up to {GAMMA} drafts)"),
        "ngram": (ServerConfig("ngram", GAMMA, NGRAM), f"n-gram drafting (ngram-simple, {NGRAM}-gram lookup, up to {GAMMA} drafts)"),
    }
    plain = ServerGenerate(path, ServerConfig("none"))
    chains = {"plain": ({}, "processing off"), "processed": (SERVER_PROCESSING, PROCESSED)}
    described = f"every token of {SERVER_HORIZON} against its conditional law, the joint law of the first tokens"
    cases: list[Case] = []

    def add(case_id: str, what: str, make: Any, *, quick: bool = True) -> None:
        cases.append(Case(id=case_id, family="e2e", description=what, epsilon=0.1, make_experiment=make, skip_reason=skip, quick=quick))

    for label, (settings, desc) in chains.items():
        chain = ignore_eos_chain(settings)
        for name, (config, how) in configs.items():
            add(
                f"e2e/server_{name}/{label}",
                f"llama-server /completion with a seed per request, {how}, ignore_eos ({desc}): {described}",
                lambda device, c=chain, g=config: GenerateExperiment(ServerGenerate(path, g), c, speculative=True, horizon=SERVER_HORIZON),
            )
    add(
        "e2e/server_control/processed",
        f"llama-server without drafting (the harness's control; {PROCESSED}): {described}",
        lambda device: GenerateExperiment(plain, ignore_eos_chain(SERVER_PROCESSING), speculative=False, horizon=SERVER_HORIZON),
        quick=False,
    )
    processed = ignore_eos_chain(SERVER_PROCESSING)
    for name, (config, how) in configs.items():
        add(
            f"e2e/greedy/server_{name}",
            f"temperature 0: llama-server with {how} equals plain greedy decoding of the float64 reference",
            lambda device, g=config: greedy_experiment(ServerGenerate(path, g)),
        )
        add(
            f"e2e/seeded/server_{name}",
            f"llama-server with {how} reproduces the non-speculative server token for token, per seed ({SEEDED_TRIALS} "
            f"seeds, {SERVER_HORIZON} tokens, {PROCESSED})",
            lambda device, g=config: SeededEqualityExperiment(ServerGenerate(path, g), plain, processed),
        )
    return cases


def greedy_experiment(path: ServerGenerate) -> GreedyExperiment:
    """The greedy case of ``path``. ngram-simple drafts nothing on a greedy output that settles into a loop of period
    1 or 2 (seen on about 1 prompt in 10): the most recent match of the n-gram is then too close to the end to leave
    ``size_n`` tokens to draft and llama.cpp does not look further back (``common_ngram_simple_draft``), so a call
    without a verification round is allowed there; the other coverage the design asks for is not."""
    experiment = GreedyExperiment(path, banned=IGNORE_EOS, horizon=GREEDY_HORIZON)
    if path.config.spec == "ngram":
        experiment.coverage_design = CoverageDesign(min_drafts=2, min_rounds=0)
    return experiment


def ignore_eos_chain(settings: dict[str, float]) -> LlamaChain:
    """The chain of ``settings`` with the end-of-generation token banned (the server's ``ignore_eos``)."""
    return LlamaChain(**settings, banned=IGNORE_EOS)  # type: ignore[arg-type]
