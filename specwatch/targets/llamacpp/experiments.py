"""The llama.cpp target's experiments: a path's trials against exact laws of the tiny GGUF models.

Each trial generates ``HORIZON`` tokens from ``PROMPT`` with its own seed (drawn from the case's generator). Checks
(:class:`GenerateExperiment`): ``lossless/pit_id`` / ``lossless/pit_prob``, every token of the horizon against its
exact conditional law from one float64 forward over prompt + output (:mod:`specwatch.conditional`; rows within float32
noise of a processing boundary are left out), which size the run (``HORIZON`` observations a trial: 281 trials at TV
0.1), and ``lossless/first3``, the joint law of the first ``LENGTH`` tokens under llama.cpp's chain (:mod:`.chain`),
which rides along without sizing it, as in the transformers target: its 343 to 512 cells would need 9 233 to 10 877
trials at TV 0.1 (on 2 shared cores a ``Llama.generate`` trial with its checks takes 1 to 25 ms, with prompt lookup
0.1 to 1 s, and a ``llama-speculative`` process 0.15 s and more: 23 minutes a case). :class:`GreedyExperiment`
(temperature 0) compares the speculative output with plain greedy decoding of the float64 reference, leaving out
prompts whose top-2 gap is within float noise; :class:`ForwardExperiment` compares llama.cpp's forward with the
reference. Coverage: drafts and accepted drafts per verification round where the path shows them (prompt lookup:
recorded by wrapping the drafter; llama-speculative and llama-server: reconstructed from their deterministic drafts),
rounds per trial, in the sampling and the greedy cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from specwatch.conditional import FLOAT32_MARGIN, TokenOrder
from specwatch.experiments import CheckSpec, CoverageDesign, Observation, Violation
from specwatch.protocol import Layer
from specwatch.targets.base import (
    GreedyEquivalence,
    LibraryExperiment,
    conditional_pit,
    e2e_checks,
    e2e_draws,
    joint_cell,
    library_call,
    pit_check,
    rounds_coverage,
)
from specwatch.targets.llamacpp.chain import ChainFixtureError, LlamaChain
from specwatch.targets.llamacpp.models import VOCAB, conditional_logits, next_token_logits, tokens_of
from specwatch.targets.llamacpp.paths import PathError, Trial, greedy_reference

LENGTH = 3
HORIZON = 12
#: Repeats an n-gram so that prompt lookup proposes drafts from the first step on.
PROMPT: tuple[int, ...] = tuple(tokens_of("abcabcab"))
#: The least trials of a case whose checks see ``HORIZON`` tokens a trial (the conditional design needs 281 at TV 0.1),
#: not the runner's default floor of one first batch (1 024).
MIN_TRIALS = 256


class Runs(Protocol):
    def run(self, prompt: Sequence[int], chain: LlamaChain | None, horizon: int, seeds: Sequence[int]) -> list[Trial]: ...


class GenerateExperiment(LibraryExperiment):
    """Trials of one path at one chain: every token's conditional law (designed) and the joint law of the first
    tokens (riding along). ``process_per_trial``: a tool run per trial: a short fingerprint probe. At least
    :data:`MIN_TRIALS` trials."""

    min_trials = MIN_TRIALS

    def __init__(
        self,
        path: Runs,
        chain: LlamaChain,
        *,
        speculative: bool,
        horizon: int = HORIZON,
        process_per_trial: bool = False,
    ) -> None:
        self.path, self.chain, self.horizon = path, chain, horizon
        self.probe_trials = 16 if process_per_trial else 64
        try:
            self.law = chain.fixture_law(lambda prefix: next_token_logits(PROMPT, prefix), LENGTH, VOCAB)
        except ChainFixtureError as exc:
            raise PathError(str(exc)) from exc
        self.coverage_design = CoverageDesign(min_drafts=2, min_rounds=1) if speculative else None
        self._checks = e2e_checks(self.law, length=LENGTH, horizon=horizon, designed="pit")

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    def run(self, n: int, generator: torch.Generator) -> Observation:
        seeds, pit_w = e2e_draws(n, self.horizon, generator)
        trials = library_call(lambda: self.path.run(PROMPT, self.chain, self.horizon, seeds), PathError)
        counts = np.zeros(len(self.law), dtype=np.int64)
        for trial in trials:
            new = trial.tokens
            if len(new) != self.horizon or any(not 0 <= t < VOCAB for t in new):
                return Observation({}, (Violation(Layer.LOSSLESS, f"generated {new} for {self.horizon} tokens"),), 0, b"")
            counts[joint_cell(new, VOCAB, LENGTH)] += 1
        generated = [t.tokens for t in trials]
        logits = conditional_logits(PROMPT, generated)
        pit, violations = conditional_pit(
            (
                (
                    out,
                    np.stack([self.chain.probs(row) for row in logits[i]]),
                    np.array([self.chain.margin(row) >= FLOAT32_MARGIN for row in logits[i]]),
                )
                for i, out in enumerate(generated)
            ),
            pit_w,
        )
        found = {self._checks[0].name: counts, **{pit_check(o): pit[o] for o in TokenOrder}}
        coverage = rounds_coverage(trials) if self.coverage_design is not None else None
        return Observation(found, violations, 0, counts.tobytes(), coverage)


class GreedyExperiment(GreedyEquivalence):
    """Temperature 0: the path's output equals plain greedy decoding of the float64 reference on random prompts of 3 to
    8 tokens. Coverage as in the sampling cases (a prompt without a repeated n-gram gives prompt lookup nothing to draft)."""

    coverage_design = CoverageDesign(min_drafts=2, min_rounds=1)

    def __init__(self, path: Runs, *, banned: Sequence[int] = (), horizon: int = 8) -> None:
        self.path, self.banned, self.horizon = path, tuple(banned), horizon

    def prompt(self, generator: torch.Generator) -> list[int]:
        length = int(torch.randint(3, 9, (1,), generator=generator))
        return torch.randint(0, VOCAB - 1, (length,), generator=generator).tolist()

    def reference(self, prompt: list[int]) -> tuple[list[int], float]:
        return greedy_reference(prompt, self.horizon, next_token_logits, banned=self.banned)

    def call(self, prompt: list[int]) -> Trial:
        (trial,) = library_call(lambda: self.path.run(prompt, None, self.horizon, [0]), PathError)
        return trial
