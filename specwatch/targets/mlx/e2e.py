"""End-to-end cases of the MLX-LM target: ``stream_generate``/``generate`` with and without a draft model against
exact laws of the tiny models (:mod:`.models`).

The first-token cases (:func:`first_token_cases`) generate one token a call and design the law of that token; the
server's cases (:func:`server_cases`) send the same requests to ``mlx_lm.server`` over HTTP (:mod:`.server`).

Each trial generates ``HORIZON`` tokens from its prompt with its own seed (drawn from the case's generator). Checks:
``lossless/pit_id`` / ``lossless/pit_prob``, every token of the horizon against its exact conditional law from one
float64 forward over prompt + output, processed by MLX-LM's processors and sampler in their order (:mod:`.law`; rows
within float32 noise of a boundary are left out), which size the run (``HORIZON`` observations a trial: 281 trials at
TV 0.1), and ``lossless/first3``, the joint law of the first ``LENGTH`` tokens, which rides along without sizing it
(its 512 cells would need about 10 000 trials at TV 0.1). Greedy cases (temperature 0) compare the speculative output
with greedy decoding of the float64 reference on random prompts of 1 to 8 tokens, leaving out prompts whose top-2
gap is within float noise. Coverage: drafts and accepted drafts per verification round and rounds per call, read
from the responses' ``from_draft`` flags (:func:`~specwatch.targets.mlx.paths.rounds_of`), designed (a round of at
least 2 drafts accepting all, one accepting some but not all) where a round drafts 2 or more: with
``num_draft_tokens=1`` no round can accept part of its drafts, and its cases have no coverage design.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

import numpy as np
import torch

from specwatch.cases import Case
from specwatch.conditional import FLOAT32_MARGIN, TokenOrder
from specwatch.experiments import CheckSpec, CoverageDesign, Observation, Violation
from specwatch.protocol import Layer
from specwatch.targets.base import (
    ForwardExperiment,
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
from specwatch.targets.mlx.law import LawFixtureError, MlxSampling
from specwatch.targets.mlx.models import FORWARD_TOLERANCE, VOCAB, conditional_logits, forward_difference, next_token_logits, tokens_of
from specwatch.targets.mlx.paths import PathError, StreamGenerate, Trial

LENGTH = 3
HORIZON = 12
#: The prompts of several tokens and of one.
PROMPTS: dict[str, tuple[int, ...]] = {"prompt5": tuple(tokens_of("abcab")), "prompt1": tuple(tokens_of("b"))}
#: The least trials of a case whose checks see ``HORIZON`` tokens a trial (the conditional design needs 281 at TV 0.1).
MIN_TRIALS = 256
#: Drafts per round where a case does not say otherwise.
NUM_DRAFT = 3
#: The settings of the sampling cases: each sampler option alone, combined, each logits processor (with the prompts
#: of one token and of several), and all together. Each active option moves at least 1 % of the mass at every
#: position of the joint law, and no enumerated row lies within float noise of a boundary (checked when the law is
#: built: LawFixtureError).
SAMPLER_SETTINGS: dict[str, MlxSampling] = {
    "top_p": MlxSampling(top_p=0.8),
    "min_p": MlxSampling(min_p=0.1),
    "xtc": MlxSampling(xtc_probability=0.5, xtc_threshold=0.2),
    "top_k": MlxSampling(top_k=3),
    "sampler_combined": MlxSampling(top_p=0.93, min_p=0.14, xtc_probability=0.5, xtc_threshold=0.1, top_k=2),
}
PROCESSOR_SETTINGS: dict[str, MlxSampling] = {
    "repetition": MlxSampling(repetition_penalty=1.5),
    "presence": MlxSampling(presence_penalty=1.0),
    "frequency": MlxSampling(frequency_penalty=0.7),
}
#: Every sampler option and every penalty at once, per prompt (no one setting makes every cut bite on both).
ALL_ON: dict[str, MlxSampling] = {
    "prompt5": MlxSampling(
        temperature=0.8,
        top_p=0.97,
        min_p=0.2,
        xtc_probability=0.5,
        xtc_threshold=0.15,
        top_k=3,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=0.3,
    ),
    "prompt1": MlxSampling(
        temperature=0.8,
        top_p=0.9,
        min_p=0.12,
        xtc_probability=0.5,
        xtc_threshold=0.1,
        top_k=2,
        repetition_penalty=1.5,
        presence_penalty=0.5,
        frequency_penalty=0.3,
    ),
}
PLAIN = MlxSampling(temperature=1.0)
#: The three penalties at once: the control of the first-token cases (no draft model).
PENALTIES = MlxSampling(repetition_penalty=1.5, presence_penalty=1.0, frequency_penalty=0.7)


class Runs(Protocol):
    def run(
        self, prompt: Sequence[int], sampling: MlxSampling | None, horizon: int, seeds: Sequence[int], *, greedy: bool = False
    ) -> list[Trial]: ...


class GenerateExperiment(LibraryExperiment):
    """Trials of one path at one setting: every token's conditional law and the joint law of the first ``length``
    tokens; ``designed`` names the one that sizes the run (the other rides along). At least :data:`MIN_TRIALS`
    trials. A first-token case (:data:`FIRST`) generates one token a trial and designs the law of that token."""

    min_trials = MIN_TRIALS
    probe_trials = 32

    def __init__(
        self,
        path: Runs,
        sampling: MlxSampling,
        prompt: Sequence[int],
        *,
        speculative: bool,
        horizon: int = HORIZON,
        length: int = LENGTH,
        designed: Literal["first", "pit"] = "pit",
    ) -> None:
        self.path, self.sampling, self.prompt, self.horizon = path, sampling, tuple(prompt), horizon
        self.length = length
        try:
            self.law = sampling.fixture_law(lambda prefix: next_token_logits(self.prompt, prefix), self.prompt, length, VOCAB)
        except LawFixtureError as exc:
            raise PathError(str(exc)) from exc
        self.coverage_design = CoverageDesign(min_drafts=2, min_rounds=1) if speculative else None
        self._checks = e2e_checks(self.law, length=length, horizon=horizon, designed=designed)

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    def run(self, n: int, generator: torch.Generator) -> Observation:
        seeds, pit_w = e2e_draws(n, self.horizon, generator)
        trials = library_call(lambda: self.path.run(self.prompt, self.sampling, self.horizon, seeds), PathError)
        counts = np.zeros(len(self.law), dtype=np.int64)
        for trial in trials:
            new = trial.tokens
            if len(new) != self.horizon or any(not 0 <= t < VOCAB for t in new):
                return Observation({}, (Violation(Layer.LOSSLESS, f"generated {new} for {self.horizon} tokens"),), 0, b"")
            counts[joint_cell(new, VOCAB, self.length)] += 1
        generated = [t.tokens for t in trials]
        logits = conditional_logits(self.prompt, generated)
        pit, violations = conditional_pit(
            (
                (
                    out,
                    np.stack([self.sampling.probs(row, h) for row, h in zip(logits[i], self._histories(out), strict=True)]),
                    np.array(
                        [self.sampling.margin(row, h) >= FLOAT32_MARGIN for row, h in zip(logits[i], self._histories(out), strict=True)]
                    ),
                )
                for i, out in enumerate(generated)
            ),
            pit_w,
        )
        found = {self._checks[0].name: counts, **{pit_check(o): pit[o] for o in TokenOrder}}
        coverage = rounds_coverage(trials) if self.coverage_design is not None else None
        return Observation(found, violations, 0, counts.tobytes(), coverage)

    def _histories(self, out: Sequence[int]) -> list[tuple[int, ...]]:
        """What the processors have seen before each position of ``out``: the prompt and the tokens before it."""
        return [(*self.prompt, *out[:t]) for t in range(self.horizon)]


def greedy_reference(prompt: Sequence[int], horizon: int, processors: MlxSampling | None) -> tuple[list[int], float]:
    """Greedy decoding of the float64 reference (after ``processors``' penalties, when given): the tokens and the
    smallest top-2 gap met (float noise could flip an argmax below about 1e-3)."""
    settings = processors or PLAIN
    out: list[int] = []
    gap = np.inf
    for _ in range(horizon):
        token, g = settings.greedy(next_token_logits(prompt, out), (*prompt, *out))
        out.append(token)
        gap = min(gap, g)
    return out, float(gap)


class GreedyExperiment(GreedyEquivalence):
    """Temperature 0: the path's output equals greedy decoding of the float64 reference (with ``processors``'
    penalties, when given) on random prompts of 1 to 8 tokens."""

    def __init__(self, path: Runs, *, processors: MlxSampling | None = None, horizon: int = 8, speculative: bool = True) -> None:
        self.path, self.processors, self.horizon = path, processors, horizon
        self.coverage_design = CoverageDesign(min_drafts=2, min_rounds=1) if speculative else None

    def prompt(self, generator: torch.Generator) -> list[int]:
        length = int(torch.randint(1, 9, (1,), generator=generator))
        return torch.randint(0, VOCAB, (length,), generator=generator).tolist()

    def reference(self, prompt: list[int]) -> tuple[list[int], float]:
        return greedy_reference(prompt, self.horizon, self.processors)

    def call(self, prompt: list[int]) -> Trial:
        (trial,) = library_call(lambda: self.path.run(prompt, self.processors, self.horizon, [0], greedy=True), PathError)
        return trial


def first_token_cases(add: Any, no_draft: str | None) -> None:
    """The first-token cases: one token a call over the prompt of several tokens, its law designed at the case's TV
    (``lossless/first1``, 8 cells: about 3 000 calls at TV 0.1 and the run's level, where the conditional check of 12
    positions pools a deviation of the first token with the positions after it). Each penalty with the draft model,
    and the three at once without it (the control)."""

    def first(case_id: str, sampling: MlxSampling, k: int, skip: str | None) -> None:
        where = f"draft model, num_draft_tokens={k}" if k else "no draft model"
        add(
            case_id,
            f"stream_generate ({where}; {sampling.describe()}; prompt prompt5), one token a call: the law of the first token",
            lambda device, s=sampling, k=k: GenerateExperiment(
                StreamGenerate(k), s, PROMPTS["prompt5"], speculative=False, horizon=1, length=1, designed="first"
            ),
            skip,
        )

    for name, sampling in PROCESSOR_SETTINGS.items():
        first(f"e2e/draft/k{NUM_DRAFT}/{name}/prompt5/first1", sampling, NUM_DRAFT, no_draft)
    first("e2e/control/penalties/prompt5/first1", PENALTIES, 0, None)


def server_cases(add: Any, no_draft: str | None, no_server: str | None) -> None:
    """The HTTP server's cases (:mod:`.server`): with ``--draft-model`` and without (the control), greedy on random
    prompts and sampled with the request's own seed over the prompt of five tokens (every request: the server's prompt
    cache reuses what an earlier request left). No coverage design: the responses do not say which tokens were
    drafted. XTC is left out: the server protects the tokens of ``encode("\\n")`` and EOS from it, which in the tiny
    vocabulary (no newline) is token 0."""
    from specwatch.targets.mlx.server import ServerPath  # noqa: PLC0415 - starts a server only when a case runs

    for draft in (True, False):
        where = f"with --draft-model (num_draft_tokens={NUM_DRAFT})" if draft else "without a draft model"
        name = f"k{NUM_DRAFT}" if draft else "nodraft"
        skip = no_draft if draft else no_server
        add(
            f"e2e/server/{name}/greedy",
            f"temperature 0: mlx_lm.server {where} over HTTP equals greedy decoding of the float64 reference (prompts of 1 to 8 "
            "tokens, one server for all)",
            lambda device, d=draft: GreedyExperiment(ServerPath(NUM_DRAFT, draft=d), speculative=False),
            skip,
        )
        add(
            f"e2e/server/{name}/plain",
            f"mlx_lm.server {where} over HTTP, a seed per request ({PLAIN.describe()}; prompt prompt5): joint law of the first "
            f"{LENGTH} tokens, every token of {HORIZON} against its conditional law",
            lambda device, d=draft: GenerateExperiment(ServerPath(NUM_DRAFT, draft=d), PLAIN, PROMPTS["prompt5"], speculative=False),
            skip,
        )


class Installed(Protocol):
    @property
    def features(self) -> dict[str, bool]: ...


def e2e_cases(adapter: Installed) -> tuple[Case, ...]:
    """The end-to-end catalogue (every case in the quick profile)."""
    cases: list[Case] = []
    described = f"joint law of the first {LENGTH} tokens, every token of {HORIZON} against its conditional law"
    no_draft = None if adapter.features.get("speculative_generate_step") else "mlx_lm has no speculative_generate_step"

    def add(case_id: str, what: str, make: Any, skip: str | None = None) -> None:
        cases.append(Case(id=case_id, family="e2e", description=what, epsilon=0.1, make_experiment=make, skip_reason=skip))

    def sampling_case(case_id: str, path: str, sampling: MlxSampling, prompt: str, k: int) -> None:
        where = f"draft model, num_draft_tokens={k}" if k else "no draft model"
        add(
            case_id,
            f"stream_generate ({where}; {sampling.describe()}; prompt {prompt}): {described}",
            lambda device, s=sampling, p=PROMPTS[prompt], k=k: GenerateExperiment(StreamGenerate(k), s, p, speculative=k >= 2),
            no_draft if k else None,
        )

    sampling_case("e2e/control/plain", "control", PLAIN, "prompt5", 0)
    sampling_case("e2e/control/all_on", "control", ALL_ON["prompt5"], "prompt5", 0)
    for k in (1, 2, 3, 4):
        sampling_case(f"e2e/draft/k{k}/plain", "draft", PLAIN, "prompt5", k)
    for name, sampling in SAMPLER_SETTINGS.items():
        sampling_case(f"e2e/draft/k{NUM_DRAFT}/{name}", "draft", sampling, "prompt5", NUM_DRAFT)
    for name, sampling in PROCESSOR_SETTINGS.items():
        for prompt in PROMPTS:
            sampling_case(f"e2e/draft/k{NUM_DRAFT}/{name}/{prompt}", "draft", sampling, prompt, NUM_DRAFT)
    for prompt in PROMPTS:
        sampling_case(f"e2e/draft/k2/all_on/{prompt}", "draft", ALL_ON[prompt], prompt, 2)
    first_token_cases(add, no_draft)
    no_server = None if adapter.features.get("server") else "mlx_lm has no server module"
    server_cases(add, no_draft or no_server, no_server)
    for k in (1, 2, 3, 4):
        add(
            f"e2e/greedy/k{k}",
            f"temperature 0: stream_generate with the draft model (num_draft_tokens={k}) equals greedy decoding of the float64 "
            "reference (prompts of 1 to 8 tokens)",
            lambda device, k=k: GreedyExperiment(StreamGenerate(k), speculative=k >= 2),
            no_draft,
        )
    add(
        "e2e/greedy/repetition/k3",
        "temperature 0, repetition penalty 1.5: stream_generate with the draft model (num_draft_tokens=3) equals greedy "
        "decoding of the float64 reference with the penalty over prompt and output (prompts of 1 to 8 tokens)",
        lambda device: GreedyExperiment(StreamGenerate(NUM_DRAFT), processors=PROCESSOR_SETTINGS["repetition"]),
        no_draft,
    )
    add(
        "e2e/greedy/generate_text/k3",
        "temperature 0: mlx_lm.generate with the draft model (num_draft_tokens=3) returns the text of greedy decoding of "
        "the float64 reference",
        lambda device: GreedyExperiment(StreamGenerate(NUM_DRAFT, text=True), speculative=False),
        no_draft,
    )
    add(
        "e2e/forward/reference",
        f"MLX's forward of the tiny target equals the float64 reference within {FORWARD_TOLERANCE:g} (8 random sequences)",
        lambda device: ForwardExperiment(forward_difference, vocab=VOCAB, tolerance=FORWARD_TOLERANCE, engine="MLX"),
    )
    return tuple(cases)
