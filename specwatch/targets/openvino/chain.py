"""OpenVINO GenAI's logit processing as an exact law, in the order it runs (``src/cpp/src/sampling/``).

The order, read from ``logit_processor.hpp`` (``LogitProcessor``'s constructor) of openvino.genai:

- repetition penalty (prompt and generated tokens), presence penalty, frequency penalty (generated tokens only),
  for greedy and multinomial decoding alike;
- then, for multinomial decoding only: top-k, temperature (a softmax of the top-k survivors, or of the whole row,
  at ``1/T``), min-p, top-p.

Semantics, from ``logit_transformers.hpp``:

- repetition penalty ``r``: a logit ``>= 0`` is divided by ``r``, a negative one multiplied by it, once per distinct
  token of the prompt or of the generated text;
- presence penalty ``a`` and frequency penalty ``f`` (``f * count``) are *subtracted from a logit >= 0 and added to a
  negative one*: they move the logit towards 0, not down (unlike OpenAI's definition, which always subtracts);
- top-k (``k = 0`` or ``k >= vocabulary``: off) keeps the k largest logits (a min-heap: among tied logits at the k-th
  place, which survive is the heap's business; fixtures keep away from ties, :meth:`GenAIChain.margin`);
- temperature normalises ``exp((x - max) / T)`` over what top-k left;
- top-p (``p = 1``: off) sorts the *tempered* probabilities decreasingly and keeps the prefix up to and including the
  first token at which the running sum exceeds p *strictly* (``probability_sum > m_top_p``): with ``p`` exactly equal
  to a cumulative sum one more token is kept than Hugging Face's rule keeps; the draw is proportional to what is left.

Min-p is left out of this law: the ``MinPFilter`` the processor names is not in the ``logit_transformers.hpp`` read
alongside it, so its semantics could not be confirmed from the same source.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from specwatch.laws import sequence_law

FloatArray = NDArray[np.float64]

#: The least mass an active cut removes, on average over the rows at each position of a fixture.
LEAST_CUT = 0.01


class ChainFixtureError(ValueError):
    """A fixture that would not test what it names: a row within float noise of a boundary, or an active cut that
    removes (almost) nothing at some position."""


@dataclass(frozen=True)
class GenAIChain:
    """GenAI's multinomial processing: penalties -> top-k -> temperature -> top-p."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0 (temperature 0 is greedy: no law to test)")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0: off)")
        if not self.repetition_penalty > 0:
            raise ValueError("repetition_penalty must be > 0 (1: off)")

    @property
    def cuts(self) -> dict[str, bool]:
        """Which of top-k and top-p are active."""
        return {"top-k": self.top_k > 0, "top-p": self.top_p < 1.0}

    def penalised(self, logits: NDArray[np.floating], prompt: Sequence[int] = (), generated: Sequence[int] = ()) -> FloatArray:
        """The row after the repetition, presence and frequency penalties (in that order)."""
        x = np.array(logits, dtype=np.float64)
        if self.repetition_penalty != 1.0:
            for token in sorted(set(prompt) | set(generated)):
                x[token] = x[token] / self.repetition_penalty if x[token] >= 0 else x[token] * self.repetition_penalty
        counts: dict[int, int] = {}
        for token in generated:
            counts[token] = counts.get(token, 0) + 1
        if self.presence_penalty != 0.0:
            for token in counts:
                x[token] = x[token] - self.presence_penalty if x[token] >= 0 else x[token] + self.presence_penalty
        if self.frequency_penalty != 0.0:
            for token, count in counts.items():
                step = self.frequency_penalty * count
                x[token] = x[token] - step if x[token] >= 0 else x[token] + step
        return x

    def stages(self, logits: NDArray[np.floating]) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Of an already penalised row: the logits after top-k (removed: -inf), the tempered probabilities of what is
        left, and those probabilities after top-p (removed: 0, not renormalised)."""
        x = np.array(logits, dtype=np.float64)
        if 0 < self.top_k < x.size:
            kth = np.sort(x)[::-1][self.top_k - 1]
            x = np.where(x < kth, -np.inf, x)
        tempered = _softmax(x / self.temperature)
        nucleus = tempered.copy()
        if self.top_p < 1.0:
            order = np.argsort(-tempered, kind="stable")
            cumulative = np.cumsum(tempered[order])
            exceeding = np.flatnonzero(cumulative > self.top_p)
            last = int(exceeding[0]) if exceeding.size else order.size - 1
            nucleus[order[last + 1 :]] = 0.0
        return x, tempered, nucleus

    def probs(self, logits: NDArray[np.floating], prompt: Sequence[int] = (), generated: Sequence[int] = ()) -> FloatArray:
        """The law the multinomial draw samples from (float64)."""
        nucleus = self.stages(self.penalised(logits, prompt, generated))[2]
        law: FloatArray = nucleus / nucleus.sum()
        return law

    def removed(self, logits: NDArray[np.floating]) -> dict[str, float]:
        """Of a penalised row: the mass top-k removes (of the untempered softmax) and top-p removes (of the tempered
        law top-k left)."""
        x, tempered, nucleus = self.stages(logits)
        before = _softmax(np.array(logits, dtype=np.float64))
        return {"top-k": float(before[~np.isfinite(x)].sum()), "top-p": float(tempered.sum() - nucleus.sum())}

    def margin(self, logits: NDArray[np.floating]) -> float:
        """Of a penalised row: how far it is from changing its support under float noise (the top-k gap relative to
        the k-th logit, the distance of each cumulative tempered probability from top-p); ``inf`` with no cut."""
        x = np.array(logits, dtype=np.float64)
        margin = math.inf
        if 0 < self.top_k < x.size:
            desc = np.sort(x)[::-1]
            margin = min(margin, float(desc[self.top_k - 1] - desc[self.top_k]) / max(1.0, abs(float(desc[self.top_k - 1]))))
        if self.top_p < 1.0:
            tempered = self.stages(x)[1]
            p = np.sort(tempered[tempered > 0])[::-1]
            cumulative = np.cumsum(p)[:-1]
            if cumulative.size:
                margin = min(margin, float(np.abs(cumulative - self.top_p).min()))
        return margin

    def fixture_law(
        self,
        next_logits: Callable[[tuple[int, ...]], NDArray[np.floating]],
        length: int,
        vocab: int,
        *,
        prompt: Sequence[int] = (),
        margin: float = 1e-4,
    ) -> FloatArray:
        """The exact law of the first ``length`` generated tokens after ``prompt`` (penalties applied with the
        prefix generated so far), refusing (:class:`ChainFixtureError`) a fixture with a row within ``margin`` of a
        boundary or a position where an active cut removes less than :data:`LEAST_CUT` on average over its rows."""
        removed: dict[tuple[int, ...], dict[str, float]] = {}

        def oracle(prefix: tuple[int, ...]) -> FloatArray:
            row = self.penalised(next_logits(prefix), prompt, prefix)
            if self.margin(row) < margin:
                raise ChainFixtureError(f"prefix {prefix}: a processing boundary is within {margin:g} of a token; choose another fixture")
            removed[prefix] = self.removed(row)
            nucleus = self.stages(row)[2]
            law: FloatArray = nucleus / nucleus.sum()
            return law

        law = sequence_law(oracle, length, vocab)
        cube = law.reshape((vocab,) * length)
        for t in range(length):
            reach = cube.sum(axis=tuple(range(t, length)))
            rows = [(float(reach[prefix]) if t else 1.0, r) for prefix, r in removed.items() if len(prefix) == t]
            for name, active in self.cuts.items():
                mass = sum(weight * r[name] for weight, r in rows)
                if active and mass < LEAST_CUT:
                    raise ChainFixtureError(f"{name} removes only {mass:.3g} of the mass at position {t}: choose another fixture")
        return law

    def config(self) -> Mapping[str, float | int]:
        """The ``GenerationConfig`` fields this law stands for (``do_sample`` on)."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
        }

    def describe(self) -> str:
        parts = [f"T={self.temperature:g}"]
        parts += [f"top_k={self.top_k}"] if self.top_k > 0 else []
        parts += [f"top_p={self.top_p:g}"] if self.top_p < 1 else []
        parts += [f"rep={self.repetition_penalty:g}"] if self.repetition_penalty != 1 else []
        parts += [f"presence={self.presence_penalty:g}"] if self.presence_penalty else []
        parts += [f"frequency={self.frequency_penalty:g}"] if self.frequency_penalty else []
        return ",".join(parts)


def _softmax(x: FloatArray) -> FloatArray:
    finite = np.isfinite(x)
    out = np.zeros_like(x, dtype=np.float64)
    if not finite.any():
        return out
    z = np.exp(x[finite] - x[finite].max())
    out[finite] = z / z.sum()
    return out
