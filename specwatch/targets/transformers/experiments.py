"""What the end-to-end cases run: ``generate()`` trials against exact laws, and greedy equivalence.

The exact law of the first generated tokens is computed from the target model after the same logits processing
(Hugging Face's order: temperature, then top-k, then top-p); every emitted token of a long horizon is also
tested against its exact conditional law (:mod:`specwatch.conditional`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from specwatch.conditional import (
    FLOAT32_MARGIN,
    PIT_BINS,
    TokenOrder,
    conditional_batch,
    pit_null,
    processing_margins,
)
from specwatch.experiments import CheckSpec, CoverageDesign, Observation, Violation
from specwatch.protocol import Layer
from specwatch.sampling import FixtureError, Processing, TargetRaised
from specwatch.targets.base import AdapterError, LibraryExperiment
from specwatch.targets.transformers.bindings import generation_config_fields
from specwatch.targets.transformers.models import E2E_VOCAB, UNREACHABLE_EOS, ModelFactory, resolve_options, tiny_models
from specwatch.targets.transformers.observer import DraftObserver

#: How many generated tokens are tested jointly.
E2E_LENGTH = 2
#: Tokens each end-to-end trial generates (the conditional check tests all of them) and drafts asked per
#: verification: 10 tokens at most 4 per round means at least 3 verification rounds per call.
E2E_HORIZON = 10
E2E_DRAFTS = 3
#: TV distance every end-to-end sampling case is designed for in the default profile (``--quick`` raises it to
#: ``runner.QUICK_EPSILON``): the conditional checks' PIT law, 11 times the observations of TV 0.1.
E2E_EPSILON = 0.03
#: What every speculative end-to-end case must exercise (checked against the observed coverage).
E2E_COVERAGE = CoverageDesign(min_drafts=2, min_rounds=3)
#: Outputs whose conditional laws one forward of the target computes.
CONDITIONAL_CHUNK = 64
#: Trials one plain-sampling ``generate()`` call draws: the rows of one batch of the same prompt are independent
#: draws of the same law, and the library's per-token cost is paid once for all of them. Assisted generation is
#: batch-1 in the library, so its trials stay one call each.
PLAIN_ROWS_PER_CALL = 64
#: A context every batch of ``generate()`` calls runs in, given the target (e.g. the MTP layers loaded once per process).
AroundCalls = Callable[[Any], contextlib.AbstractContextManager[None]]
#: The prompt repeats an n-gram so that prompt lookup finds candidates.
_PROMPT: tuple[int, ...] = (1, 2, 3, 4, 1, 2)


def speculative_settings(transformers: ModuleType, models: Sequence[Any]) -> dict[str, Any]:
    """generate() options that make every verification draft up to :data:`E2E_DRAFTS` tokens, for the
    versions that have them: a constant schedule (no heuristic shrinking between rounds) and the
    assistant's confidence threshold off (4.45+ stops drafting below 0.4 by default). The same values go
    into the generation config of each drafting model (``models``), where the candidate generators read them.
    """
    fields = generation_config_fields(transformers)
    wanted = {"num_assistant_tokens": E2E_DRAFTS, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    settings = {k: v for k, v in wanted.items() if k in fields}
    for model in models:
        config = getattr(model, "generation_config", None)
        if config is None:
            continue
        for key, value in settings.items():
            setattr(config, key, value)
    return settings


def _processing_kwargs(processing: Processing) -> dict[str, Any]:
    return {
        "temperature": processing.temperature,
        "top_k": processing.top_k if processing.top_k is not None else 0,
        "top_p": processing.top_p if processing.top_p is not None else 1.0,
    }


def accepted_per_call_max(horizon: int) -> int:
    """The most drafts one ``generate()`` call of ``horizon`` new tokens accepts: ``horizon - 1``.

    Every verification round appends the drafts it accepted and then one token of the target's own (the
    correction, or the bonus after a full acceptance); the library reports ``num_matches`` = tokens appended - 1
    (4.37-4.39 cap the matches at ``max_length - cur_len - 1``; later candidate generators draft at most that
    many, and 5.x crops a round that would pass ``max_length``). A call appends exactly ``horizon`` tokens (its
    EOS is unreachable) in R >= 1 rounds, so it accepts horizon - R <= horizon - 1 drafts.
    """
    return horizon - 1


def accepted_in_call(reported: int, horizon: int) -> int:
    """A call's accepted drafts as a trial counts them: the library's report, at most :func:`accepted_per_call_max`.

    A report above the bound counts drafts that are not among the call's ``horizon`` tokens (a release that
    verified past ``max_length``); they are not emitted, so they are not counted, and the bound holds by
    construction.
    """
    return min(reported, accepted_per_call_max(horizon))


class GenerateExperiment(LibraryExperiment):
    """Trials of ``generate(do_sample=True)`` over a long horizon, against exact laws.

    Each trial generates ``horizon`` tokens (at least 8, several verification rounds). Checks:

    * ``lossless/first{L}``: the joint law of the first L new tokens, one cell of V**L per trial, against
      the exact law prod_t p(y_t | prompt, y_<t) with p the target's next-token law after ``processing``
      (Hugging Face's order: temperature, top-k, top-p).
    * ``lossless/pit_id`` and ``lossless/pit_prob``: every emitted token of the horizon against its exact
      conditional law (one no-cache forward of the target over prompt + output), by the randomized PIT
      under two token orders (:mod:`specwatch.conditional`). Rows whose processing boundary lies
      within float noise of a token are left out (decided from the prefix only, which keeps validity).

    Speculative paths also record their coverage (:class:`DraftObserver`) against ``coverage_design``, and
    their accepted drafts per trial (:func:`accepted_in_call`).

    The end-of-sequence id is out of reach, so plain ``generate()`` returns exactly ``horizon`` tokens: an output of
    another length (prompt lookup's one token too many on 4.40-5.13) is a certain lossless violation, never cropped.
    """

    #: Fingerprint probe: one generate() call per trial.
    probe_trials = 16
    #: The cap is what the design needs (the conditional checks see ``horizon`` tokens per trial), at least
    #: this many trials, not the runner's default floor of one first batch.
    min_trials = 256

    def __init__(
        self,
        transformers: ModuleType,
        processing: Processing,
        options: dict[str, Any],
        device: torch.device,
        *,
        models: ModelFactory | None = None,
        length: int = E2E_LENGTH,
        horizon: int = E2E_HORIZON,
        vocab: int = E2E_VOCAB,
        prompt: Sequence[int] = _PROMPT,
        coverage: CoverageDesign | None = None,
        tuned: bool = True,
        around_calls: AroundCalls | None = None,
    ) -> None:
        """``tuned=False`` leaves the library's drafting defaults (heuristic schedule, confidence threshold):
        the suite's earlier design, kept for the side-by-side comparison in ``bench/transformers_mutants.py``.
        ``around_calls``: the context each batch of ``generate()`` calls runs in (:data:`AroundCalls`)."""
        self.around_calls = around_calls
        self.transformers = transformers
        self.processing = processing
        self.device = device
        self.length, self.horizon, self.vocab = length, max(length, horizon), vocab
        self.target, self.draft = (models or tiny_models)(transformers, device)
        self.options = resolve_options(transformers, options, self.draft, device)
        self.speculative = bool(options)
        if self.speculative and tuned:
            drafting = [m for m in (self.target, self.options.get("assistant_model")) if m is not None]
            self.options = {**speculative_settings(transformers, drafting), **self.options}
        self.coverage_design = coverage if self.speculative else None
        self.prompt = torch.tensor([tuple(prompt)], device=device)
        try:
            self.law = processing.fixture_law(self._next_logits, length, vocab)
        except FixtureError as exc:
            raise AdapterError(str(exc)) from exc
        self._checks = (
            # Designed on the conditional check (10 observations per trial); the joint law rides along.
            CheckSpec(f"lossless/first{length}", Layer.LOSSLESS, self.law, 1.0, designed=False),
            *(CheckSpec(f"lossless/pit_{order.value}", Layer.LOSSLESS, pit_null(), float(self.horizon)) for order in TokenOrder),
        )

    def _next_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        """Raw target logits of the next token after the prompt + ``prefix``."""
        prefix_ids = torch.tensor([prefix], dtype=torch.long, device=self.device)
        ids = torch.cat((self.prompt, prefix_ids), dim=1) if prefix else self.prompt
        with torch.no_grad():
            logits: torch.Tensor = self.target(ids).logits[0, -1]
        return logits

    def _conditional_logits(self, prompt: torch.Tensor, outputs: Sequence[Sequence[int]]) -> NDArray[np.float64]:
        """Raw target logits (float64, shape (n, H, V)) of the next token after prompt + output[:t], for each of the
        n ``outputs`` (all of length H) and t = 0..H-1: one no-cache forward of the n sequences."""
        body = torch.tensor([list(o) for o in outputs], dtype=torch.long, device=self.device)
        ids = torch.cat((prompt.expand(len(outputs), -1), body), dim=1)
        start = prompt.shape[1] - 1
        with torch.no_grad():
            logits = self.target(ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[:, start : start + body.shape[1]]
        rows: NDArray[np.float64] = logits.double().cpu().numpy()
        return rows

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    @property
    def accepted_per_trial_max(self) -> int | None:
        """Speculative paths: :func:`accepted_per_call_max` of the horizon; plain sampling drafts nothing (None)."""
        return accepted_per_call_max(self.horizon) if self.speculative else None

    @property
    def rows_per_call(self) -> int:
        """Trials one ``generate()`` call draws: :data:`PLAIN_ROWS_PER_CALL` for plain sampling, 1 when assisted."""
        return 1 if self.speculative else PLAIN_ROWS_PER_CALL

    def generation_kwargs(self) -> dict[str, Any]:
        return {
            "do_sample": True,
            "max_new_tokens": self.horizon,
            **_processing_kwargs(self.processing),
            # An id outside the vocabulary: batch size 1 never pads; a generated pad id changes masks in 4.40.
            "pad_token_id": max(self.vocab, UNREACHABLE_EOS),
            "eos_token_id": max(self.vocab, UNREACHABLE_EOS),
            **self.options,
        }

    def run(self, n: int, generator: torch.Generator) -> Observation:
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        pit_w = torch.rand((n, self.horizon), generator=generator, dtype=torch.float64).numpy()
        counts = np.zeros(len(self.law), dtype=np.int64)
        pit = {order: np.zeros(PIT_BINS, dtype=np.int64) for order in TokenOrder}
        kwargs = self.generation_kwargs()
        prompt, mask = self.prompt, torch.ones_like(self.prompt)
        observer = DraftObserver()
        violations: list[Violation] = []
        outputs: list[list[int]] = []
        with observer.watching() if self.speculative else contextlib.nullcontext(), _around(self.around_calls, self.target):
            while len(outputs) < n:
                batch = min(self.rows_per_call, n - len(outputs))
                with torch.no_grad():
                    out = _generate(self.target, prompt.expand(batch, -1), mask.expand(batch, -1), kwargs)
                if self.speculative:
                    observer.call_done()
                for row in out:
                    new = row[prompt.shape[1] :].tolist()
                    if len(new) != self.horizon or any(not 0 <= t < self.vocab for t in new):
                        wrong = Violation(Layer.LOSSLESS, f"generate returned {len(new)} tokens {new} for {self.horizon} new tokens")
                        return Observation({}, (wrong,), 0, b"")
                    outputs.append(new)
        rows, keep = self._conditional_rows(outputs)
        tokens = np.asarray(outputs, dtype=np.int64).reshape(len(outputs), self.horizon)
        cells = tokens[:, : self.length] @ (self.vocab ** np.arange(self.length - 1, -1, -1))
        counts += np.bincount(cells, minlength=len(self.law))
        # All trials' positions at once: the counts are the sums of the per-trial ones.
        tested = conditional_batch(rows.reshape(-1, self.vocab), tokens.reshape(-1), pit_w.reshape(-1), keep=keep.reshape(-1))
        for order in TokenOrder:
            pit[order] += tested.counts[order]
        if tested.impossible is not None:
            violations.append(self._first_impossible(outputs, rows, keep, pit_w))
        found = {self._checks[0].name: counts, **{f"lossless/pit_{o.value}": pit[o] for o in TokenOrder}}
        sample = counts.tobytes() if n >= 1 else b""
        coverage = observer.coverage() if self.speculative else None
        accepted = sum(accepted_in_call(a, self.horizon) for a in observer.call_accepted) if self.speculative else 0
        return Observation(found, tuple(violations), accepted, sample, coverage)

    def _first_impossible(
        self, outputs: Sequence[Sequence[int]], rows: NDArray[np.float64], keep: NDArray[np.bool_], pit_w: NDArray[np.float64]
    ) -> Violation:
        """The certain violation of the first output with a kept token of conditional probability 0."""
        for i, new in enumerate(outputs):
            impossible = conditional_batch(rows[i], np.asarray(new, dtype=np.int64), pit_w[i], keep=keep[i]).impossible
            if impossible is not None:
                return Violation(Layer.LOSSLESS, f"output {list(new)}: {impossible}")
        raise AssertionError("the batched check found an impossible token that no output has")

    def _conditional_rows(self, outputs: Sequence[Sequence[int]]) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
        """Exact processed conditional laws (n, horizon, V) of every position of every output, and which rows the
        conditional check keeps (:func:`~specwatch.conditional.processing_margins`, decided from the prefix only).

        One no-cache forward of the target per :data:`CONDITIONAL_CHUNK` outputs: the outputs all have ``horizon``
        tokens after the same prompt, so they stack without padding, and each row's logits depend on its own
        prefix only (causal attention, no cache), as in one forward per output.
        """
        p = self.processing
        if not outputs:
            return np.zeros((0, self.horizon, self.vocab)), np.zeros((0, self.horizon), dtype=bool)
        logits = np.concatenate(
            [self._conditional_logits(self.prompt, outputs[i : i + CONDITIONAL_CHUNK]) for i in range(0, len(outputs), CONDITIONAL_CHUNK)]
        )
        flat = logits.reshape(-1, logits.shape[-1])
        rows = p.probs(torch.from_numpy(flat)).numpy().reshape(logits.shape)
        if p.top_k is None and p.top_p is None:
            keep = np.ones(logits.shape[:2], dtype=bool)
        else:
            keep = (processing_margins(flat, p.temperature, p.top_k, p.top_p) >= FLOAT32_MARGIN).reshape(logits.shape[:2])
        return rows, keep


def _around(around_calls: AroundCalls | None, target: Any) -> contextlib.AbstractContextManager[None]:
    return around_calls(target) if around_calls is not None else contextlib.nullcontext()


def _generate(model: Any, prompt: torch.Tensor, mask: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """``model.generate``; an exception on these valid inputs is a finding about the library (``failure: raised``),
    not a fault of the suite. Cases whose options a release lacks are left out by the adapter's feature detection."""
    try:
        out: torch.Tensor = model.generate(prompt, attention_mask=mask, **kwargs)
    except Exception as exc:
        raise TargetRaised(exc) from exc
    return out


class GreedyEquivalenceExperiment(LibraryExperiment):
    """``do_sample=False``: assisted generation must return exactly plain greedy's tokens."""

    prompts = 64
    #: Fingerprint probe: two generate() calls per prompt.
    probe_trials = 8

    def __init__(
        self,
        transformers: ModuleType,
        options: dict[str, Any],
        device: torch.device,
        *,
        pad_token_id: int,
        models: ModelFactory | None = None,
        vocab: int = E2E_VOCAB,
        coverage: CoverageDesign | None = None,
        around_calls: AroundCalls | None = None,
    ) -> None:
        self.around_calls = around_calls
        self.target, self.draft = (models or tiny_models)(transformers, device)
        self.vocab = vocab
        self.options = resolve_options(transformers, options, self.draft, device)
        drafting = [m for m in (self.target, self.options.get("assistant_model")) if m is not None]
        self.options = {**speculative_settings(transformers, drafting), **self.options}
        self.coverage_design = coverage
        self.device = device
        self.pad_token_id = pad_token_id

    @property
    def accepted_per_trial_max(self) -> int:
        """A trial is one assisted call of :data:`E2E_HORIZON` new tokens: :func:`accepted_per_call_max`."""
        return accepted_per_call_max(E2E_HORIZON)

    @property
    def fixed_trials(self) -> int:
        return self.prompts

    def run(self, n: int, generator: torch.Generator) -> Observation:
        base = {"do_sample": False, "max_new_tokens": E2E_HORIZON, "pad_token_id": self.pad_token_id, "eos_token_id": UNREACHABLE_EOS}
        violations: list[Violation] = []
        samples: list[int] = []
        observer = DraftObserver()
        with _around(self.around_calls, self.target):
            for _ in range(n):
                length = int(torch.randint(2, 7, (1,), generator=generator))
                prompt = torch.randint(0, self.vocab, (1, length), generator=generator).to(self.device)
                mask = torch.ones_like(prompt)
                with torch.no_grad():
                    plain = _generate(self.target, prompt, mask, base)
                    with observer.watching():
                        assisted = _generate(self.target, prompt, mask, {**base, **self.options})
                    observer.call_done()
                samples.extend(assisted[0].tolist())
                if not torch.equal(plain, assisted):
                    violations.append(
                        Violation(
                            Layer.LOSSLESS, f"prompt {prompt[0].tolist()}: greedy {plain[0].tolist()} != assisted {assisted[0].tolist()}"
                        )
                    )
                    break
        coverage = observer.coverage()
        accepted = sum(accepted_in_call(a, E2E_HORIZON) for a in observer.call_accepted)  # drafts accepted in the assisted calls
        return Observation({}, tuple(violations), accepted, np.asarray(samples, dtype=np.int64).tobytes(), coverage)
