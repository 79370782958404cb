"""The OpenVINO GenAI target's experiments: a pipeline's calls against exact laws of the tiny IR models.

Each trial is one seeded ``LLMPipeline.generate`` call of ``HORIZON`` tokens from its prompt (``rng_seed`` drawn from
the case's generator, ``ignore_eos``). Checks (:class:`GenerateExperiment`): ``lossless/pit_id`` /
``lossless/pit_prob``, every token of the horizon against its exact conditional law under GenAI's processing
(:mod:`.chain`; one float64 forward over prompt + output, rows within float32 noise of a boundary left out), which
size the run (281 trials at TV 0.1), and ``lossless/first3``, the joint law of the first ``LENGTH`` tokens, riding
along. :class:`GreedyExperiment` (temperature 0, penalties optional) compares the pipeline's output with greedy
decoding of the float64 reference on random prompts, leaving out prompts whose top-2 gap is within float noise.

Coverage: the draft-model pipeline reports the tokens a call drafted and accepted
(``extended_perf_metrics.get_num_draft_tokens`` / ``get_num_accepted_tokens``), not its rounds (the target's step
sizes in ``perf_metrics`` count the tokens it processed, not those it emitted, at temperature > 0), so a call is
recorded as one round of its totals: the design asks for a call of 2 or more drafts accepting all and one accepting
some; a batch in which the draft-model pipeline drafted nothing at all (it stopped speculating) is a :class:`PathError`,
never a pass, whatever the number of assistant tokens or the confidence threshold. Each experiment builds
its own pipeline (a pipeline that failed in one case does not carry its state into another). Prompt lookup reports no
speculative metrics and drafts only where an n-gram matches, so its rounds' drafts are unknown: its cases record no
coverage histogram, and a batch in which no step emitted more than one token (lookup stopped speculating) is a
:class:`PathError`, never a pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.conditional import FLOAT32_MARGIN, TokenOrder
from specwatch.experiments import CheckSpec, CoverageDesign, Observation, Violation
from specwatch.protocol import Layer
from specwatch.sampling import TargetRaised
from specwatch.targets.base import LibraryExperiment, conditional_pit, e2e_checks, e2e_draws, joint_cell, pit_check, rounds_coverage
from specwatch.targets.openvino.chain import ChainFixtureError, GenAIChain
from specwatch.targets.openvino.models import VOCAB, all_logits, reference
from specwatch.targets.openvino.pipeline import Call, Pipeline

LENGTH = 3
HORIZON = 12
#: Repeats bigrams, so that prompt lookup finds matches from the first step on.
PROMPT: tuple[int, ...] = (0, 3, 1, 4, 0, 3, 1)
#: The least trials of a sampling case (the conditional design needs 281 at TV 0.1).
MIN_TRIALS = 256


class PathError(Exception):
    """A path did not produce what the case needs (not a finding by itself: the case errors with it)."""


@dataclass(frozen=True)
class PathSpec:
    """One pipeline configuration: ``kind`` (plain, draft, lookup), prefix caching, assistant tokens per round or (draft
    model) the draft's confidence threshold instead (``assistant_confidence_threshold``; ``assistant`` then 0)."""

    kind: str
    prefix_caching: bool = True
    assistant: int = 0
    confidence: float = 0.0
    _pipe: Pipeline | None = field(default=None, compare=False, repr=False)

    @property
    def speculative(self) -> bool:
        return self.kind != "plain"

    def fresh(self) -> PathSpec:
        """The same path without a pipeline yet (an experiment's own)."""
        return PathSpec(self.kind, self.prefix_caching, self.assistant, self.confidence)

    @property
    def designed(self) -> bool:
        """Whether a call of this path is built to draft 2 or more tokens, accepting all or some (coverage design):
        the draft model with 2 or more assistant tokens, or with a confidence threshold."""
        return self.kind == "draft" and (self.assistant >= 2 or self.confidence > 0)

    def pipeline(self) -> Pipeline:
        """The experiment's pipeline of this path (built once per experiment); an exception building it is the
        library's (:class:`TargetRaised`)."""
        if self._pipe is None:
            try:
                object.__setattr__(self, "_pipe", Pipeline(self.kind, prefix_caching=self.prefix_caching))
            except Exception as exc:
                raise TargetRaised(exc) from exc
        assert self._pipe is not None
        return self._pipe

    def describe(self) -> str:
        what = {"plain": "no speculation", "draft": "draft model", "lookup": "prompt lookup (max_ngram_size 2)"}[self.kind]
        k = f", num_assistant_tokens={self.assistant}" if self.speculative and not self.confidence else ""
        k += f", assistant_confidence_threshold={self.confidence:g}" if self.confidence else ""
        return f"{what}{k}, prefix caching {'on' if self.prefix_caching else 'off'}"

    def call(
        self,
        pipe: Pipeline,
        prompt: Sequence[int],
        horizon: int,
        chain: GenAIChain | None,
        seed: int,
        *,
        penalties: GenAIChain | None = None,
    ) -> Call:
        """One seeded call of ``pipe`` (``chain`` None: greedy, with ``penalties``' penalties when given); the
        pipeline's exception becomes :class:`TargetRaised`."""
        sample = dict(chain.config()) if chain is not None else None
        ngram = 2 if self.kind == "lookup" else 0
        config = pipe.config(horizon, assistant_tokens=self.assistant, confidence=self.confidence, ngram=ngram, sample=sample)
        if chain is None and penalties is not None:
            for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
                setattr(config, name, getattr(penalties, name))
        try:
            call = pipe.generate(prompt, config, seed=seed)
        except Exception as exc:  # the library raised on a valid request: a finding
            raise TargetRaised(exc) from exc
        if len(call.tokens) != horizon or any(not 0 <= t < VOCAB for t in call.tokens):
            raise PathError(f"generated {list(call.tokens)} for {horizon} tokens")
        return call


@dataclass(frozen=True)
class Trial:
    tokens: tuple[int, ...]
    rounds: list[tuple[int, int]] | None


def trial_of(path: PathSpec, call: Call) -> Trial:
    """The call's tokens and, on the draft-model path, its drafted and accepted tokens as one round (module
    docstring)."""
    if path.kind != "draft":
        return Trial(call.tokens, None)
    if call.drafted is None or not 0 <= call.accepted <= call.drafted:
        raise PathError(f"the draft-model pipeline reported {call.accepted} accepted of {call.drafted} drafted tokens")
    return Trial(call.tokens, [(call.drafted, call.accepted)])


def gained(calls: Sequence[Call]) -> int:
    """Tokens emitted beyond one per target step over ``calls`` (what speculation gained)."""
    return sum(sum(c.steps) - len(c.steps) for c in calls)


def require_speculation(path: PathSpec, calls: Sequence[Call]) -> None:
    """:class:`PathError` when a speculative path did not speculate in a whole batch of ``calls``: the draft model
    drafted no token, or prompt lookup emitted one token per target step (its output then says nothing of speculation,
    and agreeing with the law would be a pass of plain decoding)."""
    if path.kind == "draft" and calls and sum(c.drafted or 0 for c in calls) == 0:
        raise PathError(f"the draft-model pipeline drafted no token in all {len(calls)} calls: it did not speculate")
    if path.kind == "lookup" and calls and gained(calls) == 0:
        raise PathError(f"prompt lookup emitted one token per step in all {len(calls)} calls: it did not speculate")


def conditional_logits(prompt: Sequence[int], outputs: Sequence[Sequence[int]]) -> NDArray[np.float64]:
    """Raw float64 logits of the target at every output position, (trials, horizon, V), in one forward."""
    ids = torch.tensor([(*prompt, *out) for out in outputs], dtype=torch.long)
    with torch.no_grad():
        rows: NDArray[np.float64] = reference("target")(ids, use_cache=False).logits[:, len(prompt) - 1 : -1].double().numpy()
    return rows


class GenerateExperiment(LibraryExperiment):
    """Calls of one path at one setting: every token's conditional law (designed) and the joint law of the first
    tokens (riding along). At least :data:`MIN_TRIALS` trials."""

    min_trials = MIN_TRIALS
    probe_trials = 32

    def __init__(self, path: PathSpec, chain: GenAIChain, prompt: Sequence[int] = PROMPT, *, horizon: int = HORIZON) -> None:
        self.path, self.chain, self.prompt, self.horizon = path.fresh(), chain, tuple(prompt), horizon
        try:
            self.law = chain.fixture_law(lambda prefix: all_logits([*self.prompt, *prefix])[-1], LENGTH, VOCAB, prompt=self.prompt)
        except ChainFixtureError as exc:
            raise PathError(str(exc)) from exc
        self.coverage_design = CoverageDesign(min_drafts=2, min_rounds=1) if path.designed else None
        self._checks = e2e_checks(self.law, length=LENGTH, horizon=horizon, designed="pit")

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    def run(self, n: int, generator: torch.Generator) -> Observation:
        seeds, pit_w = e2e_draws(n, self.horizon, generator)
        pipe = self.path.pipeline()
        calls = [self.path.call(pipe, self.prompt, self.horizon, self.chain, seed) for seed in seeds]
        require_speculation(self.path, calls)
        trials = [trial_of(self.path, c) for c in calls]
        counts = np.zeros(len(self.law), dtype=np.int64)
        for trial in trials:
            counts[joint_cell(trial.tokens, VOCAB, LENGTH)] += 1
        logits = conditional_logits(self.prompt, [t.tokens for t in trials])
        pit, violations = conditional_pit((self._laws(t.tokens, logits[i]) for i, t in enumerate(trials)), pit_w)
        found = {self._checks[0].name: counts, **{pit_check(o): pit[o] for o in TokenOrder}}
        coverage = rounds_coverage(trials) if self.coverage_design is not None else None
        return Observation(found, violations, 0, counts.tobytes(), coverage)

    def _laws(self, out: Sequence[int], rows: NDArray[np.float64]) -> tuple[Sequence[int], NDArray[np.float64], NDArray[np.bool_]]:
        """Per position of ``out``: the exact law after GenAI's processing and whether the row is clear of noise."""
        laws, keep = [], []
        for t, row in enumerate(rows):
            penalised = self.chain.penalised(row, self.prompt, out[:t])
            laws.append(self.chain.probs(row, self.prompt, out[:t]))
            keep.append(self.chain.margin(penalised) >= FLOAT32_MARGIN)
        return out, np.stack(laws), np.array(keep)


def greedy_reference(prompt: Sequence[int], horizon: int, penalties: GenAIChain | None) -> tuple[list[int], float]:
    """Greedy decoding of the float64 reference (after ``penalties``' penalties, when given): the tokens and the
    smallest top-2 gap met."""
    out: list[int] = []
    gap = np.inf
    for _ in range(horizon):
        row = all_logits([*prompt, *out])[-1]
        if penalties is not None:
            row = penalties.penalised(row, prompt, out)
        top = np.sort(row)[::-1]
        gap = min(gap, float(top[0] - top[1]))
        out.append(int(np.argmax(row)))
    return out, float(gap)


class GreedyExperiment(LibraryExperiment):
    """Temperature 0: the path's output equals greedy decoding of the float64 reference (with ``penalties``'
    penalties, when given) on random prompts of 1 to 8 tokens."""

    prompts = 48
    probe_trials = 8

    def __init__(self, path: PathSpec, *, penalties: GenAIChain | None = None, horizon: int = 10) -> None:
        self.path, self.penalties, self.horizon = path.fresh(), penalties, horizon
        self.coverage_design = CoverageDesign(min_drafts=2, min_rounds=1) if path.designed else None

    @property
    def fixed_trials(self) -> int:
        return self.prompts

    def run(self, n: int, generator: torch.Generator) -> Observation:
        violations: list[Violation] = []
        sample: list[int] = []
        calls: list[Call] = []
        pipe = self.path.pipeline()
        for _ in range(n):
            length = int(torch.randint(1, 9, (1,), generator=generator))
            prompt = torch.randint(0, VOCAB, (length,), generator=generator).tolist()
            expected, gap = greedy_reference(prompt, self.horizon, self.penalties)
            if gap < 1e-3:
                continue  # float noise could flip an argmax: undecidable, left out
            calls.append(self.path.call(pipe, prompt, self.horizon, None, 0, penalties=self.penalties))
            got = list(calls[-1].tokens)
            sample += got
            if got != expected and not violations:
                violations.append(Violation(Layer.LOSSLESS, f"prompt {prompt}: greedy {expected} != {self.path.kind} {got}"))
        require_speculation(self.path, calls)
        coverage = rounds_coverage([trial_of(self.path, c) for c in calls]) if self.coverage_design is not None else None
        return Observation({}, tuple(violations), 0, np.asarray(sample, dtype=np.int64).tobytes(), coverage)
