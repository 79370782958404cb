"""End-to-end cases of the vLLM target: ``LLM.generate`` with tiny offline models against exact laws.

The tiny models and the engines are in :mod:`specwatch.targets.vllm.engines`: one ``LLM`` per engine
configuration (plain, ngram, draft model, draft model with probabilistic drafting, EAGLE and EAGLE-3 heads where
the release has them), reused by every case that shares it. Each request carries its own seed drawn from the
case's generator, so a run is reproducible from the recorded seed.

The check of a sampling case is the joint law of the first ``E2E_LENGTH`` generated tokens, prod_t
p(y_t | prompt, y_<t) with p the target's next-token law after vLLM's processing (temperature, then top-k,
then top-p), computed by transformers in float64 from the same saved weights. The first token comes from
the prefill, before any draft; tokens 2 and 3 come from verification steps with ``GAMMA`` drafts, so the
joint law covers the speculative positions. The control case (no speculation) checks the reference law.
Greedy cases check that speculative greedy output equals plain greedy output exactly.

Each trial generates ``E2E_HORIZON`` tokens (several verification rounds of ``GAMMA`` drafts) and the
long-horizon conditional check tests every one of them: one no-cache float64 forward of the target over
prompt + output gives each position's exact conditional law, and the randomized PIT under two token
orders (:mod:`specwatch.conditional`) turns the tokens into i.i.d. uniforms under H0. Rows whose
processing boundary lies within float32 noise of a token are left out, decided from the prefix only.
The joint law of the first tokens sizes the run; the conditional checks ride along (they count in the
Bonferroni m and can reject, but the trial cap is not designed on them).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Protocol

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.cases import Case
from specwatch.conditional import FLOAT32_MARGIN, PIT_BINS, TokenOrder, pit_null, processing_margin
from specwatch.experiments import CheckSpec, CoverageDesign, Observation, Violation
from specwatch.protocol import Layer
from specwatch.sampling import FixtureError, Processing, TargetRaised
from specwatch.targets.base import LibraryExperiment, conditional_pit, e2e_checks, e2e_draws, joint_cell, pit_check
from specwatch.targets.vllm.acceptance import (
    ACCEPTANCE_CHECK,
    Drafting,
    Step,
    acceptance_batch,
    accepted_within,
    coverage_of,
    verification_steps,
)
from specwatch.targets.vllm.engines import (
    GAMMA,
    EngineError,
    discard_engines,
    engine,
    records_verification_steps,
    sampling_params,
    unavailable,
)
from specwatch.targets.vllm.models import E2E_VOCAB, EAGLE3_DRAFT_TOKENS, conditional_logits, next_token_logits, tiny_models

E2E_LENGTH = 3
#: Tokens each trial generates; the conditional check tests all of them (about three verification rounds).
E2E_HORIZON = 12
#: TV distance every end-to-end sampling case is designed for in the default profile (``--quick``: QUICK_EPSILON).
E2E_EPSILON = 0.03
#: Repeats an n-gram so that ngram lookup proposes drafts from the first step on.
PROMPT: tuple[int, ...] = (1, 2, 3, 1, 2, 3, 1, 2)
#: Cuts real mass on every row the joint law enumerates (:func:`processed_law`): top-k 6 of 8 removes at least
#: 7 % of the tempered mass, then top-p 0.85 at least 6 % of what top-k kept; 31 prefixes are reachable.
PROCESSING_ON = Processing(temperature=0.8, top_k=6, top_p=0.85)


def processed_law(processing: Processing, prompt: Sequence[int], length: int) -> NDArray[np.float64]:
    """The exact law of the first ``length`` tokens after ``processing``, refusing a fixture that does not test it
    (:meth:`Processing.fixture_law`: rows within float noise of a boundary, a processor that cuts nothing on some
    reachable row). Raises :class:`EngineError`.
    """
    try:
        return processing.fixture_law(lambda prefix: next_token_logits(tiny_models(), prompt, prefix), length, E2E_VOCAB)
    except FixtureError as exc:
        raise EngineError(str(exc)) from exc


def _coverage_design(engine_name: str) -> CoverageDesign | None:
    """What a speculative engine's trials must exercise. ngram proposes nothing where the context has no match (a
    step without drafts is no verification, and vLLM records none), so a request may have as few as one."""
    if engine_name == "plain":
        return None
    return CoverageDesign(min_rounds=1) if engine_name == "ngram" else CoverageDesign()


def _acceptance_plan(engine_name: str, itemised: bool, version: str) -> tuple[Drafting | None, str | None]:
    """How the engine drafts (None: acceptance is not measured) and, for a speculative engine that cannot be
    measured honestly, why."""
    if engine_name == "plain":
        return None, None
    if not itemised:
        return None, f"vllm {version} does not itemise each request's verification steps (no per_request_spec_decode_metrics)"
    if engine_name == "ngram":
        return None, "ngram drafts come from vLLM's prompt lookup and a rejected draft is not in the output, so q is not known"
    if engine_name in ("eagle", "eagle3"):
        return None, "an EAGLE head's q depends on the target's hidden states and its own, which the suite does not recompute"
    return (Drafting.PROBABILISTIC if engine_name == "draft_model_probabilistic" else Drafting.GREEDY), None


# ------------------------------------------------------------------------------------- experiments
class GenerateExperiment(LibraryExperiment):
    """Trials of ``LLM.generate`` (one request per trial, all trials of a batch in one call) of ``horizon``
    tokens. Checks: ``lossless/first{length}``, the joint law of the first ``length`` tokens (cell = base-V
    number of the tokens; it sizes the run), and ``lossless/pit_id`` / ``lossless/pit_prob``, every token of
    the horizon against its exact conditional law (module docstring). With ``ignore_eos`` a request returns
    exactly ``max_tokens`` tokens: any other length is a certain lossless violation, never cropped."""

    probe_trials = 64

    def __init__(
        self,
        engine_name: str,
        processing: Processing,
        *,
        length: int = E2E_LENGTH,
        horizon: int = E2E_HORIZON,
        prompt: Sequence[int] = PROMPT,
    ) -> None:
        self.engine_name = engine_name
        self.processing = processing
        self.length, self.horizon = length, max(length, horizon)
        self.prompt = tuple(prompt)
        self.law = processed_law(processing, self.prompt, length)  # before the engine: a bad fixture fails fast
        self.vllm = importlib.import_module("vllm")
        engine(engine_name)  # built now, so that a release that cannot build it errors when the case is built
        itemised = records_verification_steps(self.vllm)
        self.coverage_design = _coverage_design(engine_name) if itemised else None
        self.drafting, self.acceptance_unmeasured = _acceptance_plan(engine_name, itemised, self.vllm.__version__)
        self._itemised = itemised
        self._checks = (
            # Designed on the conditional checks (every token of the horizon, 16 cells); the joint law of 8**3 cells
            # rides along (designed, it would take 35 times the trials at TV 0.03: no early pass at 512 cells).
            *e2e_checks(self.law, length=length, horizon=self.horizon, designed="pit"),
            # Not designed: how many drafts a trial reaches depends on the path it takes (about 1 to horizon - 1).
            *((CheckSpec(ACCEPTANCE_CHECK, Layer.CONFORMANCE, pit_null(), 1.0, designed=False),) if self.drafting else ()),
        )

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    @property
    def accepted_per_trial_max(self) -> int | None:
        """``horizon - 1`` for a speculative engine whose verification steps are itemised: a trial counts accepted
        drafts at distinct output indices 1 .. horizon - 1 (index 0 is the prefill's token; :func:`accepted_within`,
        :func:`acceptance_batch`). None for the plain engine, or when the release does not itemise the steps
        (nothing is counted)."""
        return self.horizon - 1 if self.engine_name != "plain" and self._itemised else None

    def run(self, n: int, generator: torch.Generator) -> Observation:
        seeds, pit_w = e2e_draws(n, self.horizon, generator)
        accept_w = torch.rand((n, self.horizon), generator=generator, dtype=torch.float64).numpy()
        params = [sampling_params(self.vllm, self.processing, self.horizon, s) for s in seeds]
        try:
            # Looked up per batch, not held: after a raise every engine is shut down and rebuilt on demand.
            outputs = engine(self.engine_name).generate([{"prompt_token_ids": list(self.prompt)}] * n, params, use_tqdm=False)
        except Exception as exc:  # the library raised on a valid request: a finding (``failure: raised``)
            discard_engines()  # its scheduler may still hold the failed requests
            raise TargetRaised(exc) from exc
        counts = np.zeros(len(self.law), dtype=np.int64)
        generated: list[list[int]] = []
        steps: list[tuple[Step, ...]] = []
        for out in outputs:
            new = list(out.outputs[0].token_ids)
            if len(new) != self.horizon or any(not 0 <= t < E2E_VOCAB for t in new):
                wrong = Violation(Layer.LOSSLESS, f"generate returned {len(new)} tokens {new} for {self.horizon} new tokens")
                return Observation({}, (wrong,), 0, b"")
            generated.append(new)
            steps.append(verification_steps(out.outputs[0]) or ())
            counts[joint_cell(new, E2E_VOCAB, self.length)] += 1
        rows, keep = self._target_rows(generated)
        pit, violations = conditional_pit(zip(generated, rows, keep, strict=True), pit_w)
        found = {self._checks[0].name: counts, **{pit_check(o): pit[o] for o in TokenOrder}}
        accepted, expected = sum(accepted_within(record, self.horizon) for record in steps), None
        if self.drafting is not None and generated:
            accept_counts, accepted, expected, violation = self._acceptance(generated, steps, rows, keep, accept_w)
            found[ACCEPTANCE_CHECK] = accept_counts
            violations += () if violation is None else (violation,)
        coverage = coverage_of(steps) if self.coverage_design is not None else None
        return Observation(found, violations, accepted, counts.tobytes(), coverage, expected)

    def _target_rows(self, generated: Sequence[Sequence[int]]) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
        """The processed target law at every output position (trials, horizon, V) and the rows clear of float noise."""
        p = self.processing
        if not generated:
            return np.zeros((0, self.horizon, E2E_VOCAB)), np.zeros((0, self.horizon), dtype=bool)
        logits = conditional_logits(tiny_models(), self.prompt, generated)
        rows = p.probs(torch.from_numpy(logits)).numpy()
        keep = np.array([[processing_margin(row, p.temperature, p.top_k, p.top_p) >= FLOAT32_MARGIN for row in trial] for trial in logits])
        return rows, keep

    def _acceptance(
        self,
        generated: Sequence[Sequence[int]],
        steps: Sequence[Sequence[Step]],
        rows: NDArray[np.float64],
        keep: NDArray[np.bool_],
        w: NDArray[np.float64],
    ) -> tuple[NDArray[np.int64], int, float, Violation | None]:
        """The acceptance check's PIT counts, accepted and expected accepted drafts (:mod:`.acceptance`)."""
        assert self.drafting is not None
        draft_logits = conditional_logits(tiny_models(), self.prompt, generated, draft=True)
        counts = np.zeros(PIT_BINS, dtype=np.int64)
        accepted, expected = 0, 0.0
        violation: Violation | None = None
        for i, out in enumerate(generated):
            batch = acceptance_batch(
                rows[i], keep[i], draft_logits[i], out, steps[i], w=w[i], drafting=self.drafting, temperature=self.processing.temperature
            )
            counts += batch.counts
            accepted += batch.accepted
            expected += batch.expected
            if batch.violation is not None and violation is None:
                record = [(step.drafted, step.accepted) for step in steps[i]]
                violation = Violation(Layer.CONFORMANCE, f"output {list(out)}, (drafted, accepted) per step {record}: {batch.violation}")
        return counts, accepted, expected, violation


class GreedyEquivalenceExperiment(LibraryExperiment):
    """``temperature=0``: the speculative engine's output equals the plain engine's exactly, on random prompts."""

    prompts = 64
    probe_trials = 8

    def __init__(self, engine_name: str, *, new_tokens: int = 6) -> None:
        self.vllm = importlib.import_module("vllm")
        self.engine_name = engine_name
        engine("plain")  # built now (see GenerateExperiment), looked up per batch
        engine(engine_name)
        self.new_tokens = new_tokens

    @property
    def accepted_per_trial_max(self) -> None:
        """Greedy equivalence compares outputs only; it counts no acceptance."""
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
            plain = [list(o.outputs[0].token_ids) for o in engine("plain").generate(prompts, params, use_tqdm=False)]
            spec = [list(o.outputs[0].token_ids) for o in engine(self.engine_name).generate(prompts, params, use_tqdm=False)]
        except Exception as exc:  # the library raised on a valid request: a finding (``failure: raised``)
            discard_engines()
            raise TargetRaised(exc) from exc
        violations = [
            Violation(Layer.LOSSLESS, f"prompt {p['prompt_token_ids']}: greedy {a} != speculative {b}")
            for p, a, b in zip(prompts, plain, spec, strict=True)
            if a != b
        ][:1]
        return Observation({}, tuple(violations), 0, np.asarray([t for s in spec for t in s], dtype=np.int64).tobytes())


# ------------------------------------------------------------------------------------------ catalogue
_LABELS = {"plain": (Processing(), "processors off"), "processed": (PROCESSING_ON, "temperature 0.8, top-k 6, top-p 0.85")}
_ENGINE_DESCRIPTIONS = {
    "plain": "plain sampling, no speculation: checks the reference law",
    "ngram": f"ngram (prompt lookup) drafting, {GAMMA} drafts per step",
    "draft_model": f"draft model, greedy drafting (the default: q one-hot), {GAMMA} drafts per step",
    "draft_model_probabilistic": f"draft model, probabilistic drafting (q = the draft's law), {GAMMA} drafts per step",
    "eagle": f"EAGLE head (random, one layer, built from a config; the target's embeddings and LM head), {GAMMA} drafts per step",
    "eagle3": f"EAGLE-3 head (random, one layer over 3 of the target's hidden states; its own LM head over "
    f"{len(EAGLE3_DRAFT_TOKENS)} of the {E2E_VOCAB} tokens, mapped by d2t), {GAMMA} drafts per step",
}
_CASE_NAMES = {
    "plain": "control",
    "ngram": "ngram",
    "draft_model": "draft_model",
    "draft_model_probabilistic": "draft_model_probabilistic",
    "eagle": "eagle",
    "eagle3": "eagle3",
}
#: In the quick profile: the control and the default methods (ngram, greedy-drafting draft model), each with
#: processors off and on (the probabilistic draft model, EAGLE, EAGLE-3 and greedy equivalence are in the default
#: profile).
_QUICK = {"control", "ngram", "draft_model"}


class Installed(Protocol):
    """What the adapter found (:class:`~specwatch.targets.vllm.adapter.VllmAdapter`)."""

    @property
    def module(self) -> ModuleType: ...
    @property
    def version(self) -> str: ...


def e2e_cases(adapter: Installed) -> tuple[Case, ...]:
    """The end-to-end catalogue; configurations the release lacks are skipped with the reason."""
    missing = unavailable(adapter.module)
    cases: list[Case] = []
    for engine_name, case_name in _CASE_NAMES.items():
        skip = missing.get(engine_name)
        accepted = ", accepted drafts against Σ min(p, q)" if engine_name.startswith("draft_model") else ""
        for label, (processing, desc) in _LABELS.items():

            def make(device: torch.device, engine_name: str = engine_name, processing: Processing = processing) -> GenerateExperiment:
                return GenerateExperiment(engine_name, processing)

            cases.append(
                Case(
                    id=f"e2e/{case_name}/{label}",
                    family="e2e",
                    description=f"LLM.generate: {_ENGINE_DESCRIPTIONS[engine_name]} ({desc}); joint law of the first {E2E_LENGTH} tokens, "
                    f"every token of {E2E_HORIZON} against its conditional law{accepted}",
                    epsilon=E2E_EPSILON,
                    make_experiment=make,
                    skip_reason=skip,
                    quick=case_name in _QUICK,
                )
            )
    for engine_name in ("ngram", "draft_model", "eagle", "eagle3"):

        def make_greedy(device: torch.device, engine_name: str = engine_name) -> GreedyEquivalenceExperiment:
            return GreedyEquivalenceExperiment(engine_name)

        cases.append(
            Case(
                id=f"e2e/greedy/{engine_name}",
                family="e2e",
                description=f"temperature 0: {_ENGINE_DESCRIPTIONS[engine_name]} equals plain greedy output exactly (64 prompts)",
                epsilon=0.1,
                make_experiment=make_greedy,
                skip_reason=missing.get(engine_name),
                quick=False,
            )
        )
    return tuple(cases)
