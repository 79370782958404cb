"""MLX-LM's logits processors and sampler as an exact law, in the order they run (``mlx_lm/sample_utils.py``,
``mlx_lm/generate.py``).

The order in force, read from mlx-lm 0.32.2:

- ``generate_step`` applies the logits processors to the raw logits of the next token, in the order
  ``make_logits_processors`` lists them: logit bias, repetition penalty, presence penalty, frequency penalty; each
  sees the token history (prompt and generated tokens), of which it keeps the last ``context_size`` (20 by default);
- it normalises the result to log-probabilities (``logits - logsumexp(logits)``) and hands them to the sampler;
- ``make_sampler`` (temperature > 0) chains top-p (``0 < p < 1``), min-p (``p != 0``), XTC (probability > 0), top-k
  (``k > 0``), each on the *untempered* log-probabilities left by the one before, then draws from
  ``softmax(x / T)`` (``categorical_sampling``); temperature 0 is ``argmax``.

Semantics:

- repetition penalty ``r``: each distinct token of the window, a logit ``< 0`` multiplied by ``r``, any other divided;
- presence penalty ``a``: ``a`` subtracted once from the logit of each distinct token of the window
  (``logits[:, tokens] -= a``: a scatter, repeated ids write the same value);
- frequency penalty ``f``: ``f`` subtracted once per occurrence (``logits.at[:, tokens].subtract(f)`` accumulates);
- top-p keeps a token when the mass of the tokens more likely than it is below ``p`` times the total (the shortest
  prefix by decreasing probability that reaches p; tokens tied at the cut value are all kept);
- min-p removes the tokens whose log-probability is below ``max + log(min_p)``;
- XTC, with probability ``xtc_probability`` (one uniform draw per call of the sampler), removes every token whose
  probability (softmax over what is left) is above the least probability above ``xtc_threshold``: of the tokens
  above the threshold only the least likely survives (nothing is removed with fewer than two above it);
- top-k keeps the k largest (``argpartition``: ties at the k-th place are the partition's business, fixtures keep
  away from them).

The law of one token is therefore ``(1 - P) softmax(chain(x) / T) + P softmax(chain_xtc(x) / T)``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from specwatch.laws import sequence_law

FloatArray = NDArray[np.float64]

#: The least mass each active processor moves at each position of a fixture's joint law, on average over its rows
#: (the total variation between the law and the law without that processor): less, and the case would not test it.
LEAST_EFFECT = 0.01
#: mlx-lm's default window of the three penalties (``*_context_size``).
CONTEXT_SIZE = 20


class LawFixtureError(ValueError):
    """A fixture that would not test what it names: a row within float noise of a boundary, or an active processor
    that changes (almost) nothing at some position."""


@dataclass(frozen=True)
class MlxSampling:
    """The settings of ``make_sampler`` and ``make_logits_processors``, with mlx-lm's defaults (off)."""

    temperature: float = 1.0
    top_p: float = 0.0
    min_p: float = 0.0
    top_k: int = 0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    context_size: int = CONTEXT_SIZE

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0 (temperature 0 is argmax: no law to sample)")
        if not 0 <= self.min_p <= 1 or not 0 <= self.xtc_probability <= 1 or not 0 <= self.xtc_threshold <= 0.5:
            raise ValueError("min_p and xtc_probability must be in [0, 1], xtc_threshold in [0, 0.5]")
        if self.top_k < 0 or self.context_size < 1:
            raise ValueError("top_k must be >= 0 and context_size >= 1")

    # ------------------------------------------------------------------------------------ which parts are on
    @property
    def active(self) -> dict[str, bool]:
        """Which processors and cuts change the law (mlx-lm's own conditions for adding each to its chain)."""
        return {
            "repetition": self.repetition_penalty is not None and self.repetition_penalty not in {0, 1},
            "presence": bool(self.presence_penalty),
            "frequency": bool(self.frequency_penalty),
            "top-p": 0 < self.top_p < 1.0,
            "min-p": self.min_p != 0.0,
            "xtc": self.xtc_probability > 0.0,
            "top-k": self.top_k > 0,
        }

    def without(self, name: str) -> MlxSampling:
        """These settings with ``name`` (a key of :attr:`active`) off."""
        off = {
            "repetition": {"repetition_penalty": None},
            "presence": {"presence_penalty": None},
            "frequency": {"frequency_penalty": None},
            "top-p": {"top_p": 0.0},
            "min-p": {"min_p": 0.0},
            "xtc": {"xtc_probability": 0.0},
            "top-k": {"top_k": 0},
        }[name]
        return dataclasses.replace(self, **off)  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------------ the law
    def processed(self, logits: NDArray[np.floating], history: Sequence[int]) -> FloatArray:
        """The logits after the processors (repetition, presence, frequency) given the token ``history``."""
        x = np.array(logits, dtype=np.float64)
        window = [int(t) for t in history][-self.context_size :] if history else []
        if not window:
            return x
        distinct = sorted(set(window))
        if self.active["repetition"]:
            r = float(self.repetition_penalty)  # type: ignore[arg-type]
            x[distinct] = np.where(x[distinct] < 0, x[distinct] * r, x[distinct] / r)
        if self.active["presence"]:
            x[distinct] -= float(self.presence_penalty)  # type: ignore[arg-type]
        if self.active["frequency"]:
            for token, count in Counter(window).items():
                x[token] -= float(self.frequency_penalty) * count  # type: ignore[arg-type]
        return x

    def logprobs(self, logits: NDArray[np.floating], history: Sequence[int]) -> FloatArray:
        """What the sampler receives: the processed logits normalised to log-probabilities."""
        x = self.processed(logits, history)
        out: FloatArray = x - _logsumexp(x)
        return out

    def stages(self, logprobs: NDArray[np.floating], *, xtc: bool) -> list[FloatArray]:
        """The log-probabilities after top-p, min-p, XTC (applied when ``xtc``) and top-k (removed: -inf)."""
        x = np.array(logprobs, dtype=np.float64)
        out = []
        if self.active["top-p"]:
            p = _softmax(x)
            order = np.argsort(-x, kind="stable")
            before = np.cumsum(p[order]) - p[order]  # mass of the tokens ranked before each
            kept = order[before < self.top_p * p.sum()]
            threshold = x[kept].min()
            x = np.where(x < threshold, -np.inf, x)
        out.append(x.copy())
        if self.active["min-p"]:
            x = np.where(x < x.max() + math.log(self.min_p), -np.inf, x)
        out.append(x.copy())
        if xtc and self.active["xtc"]:
            p = _softmax(x)
            above = p > self.xtc_threshold
            if above.any():
                x = np.where(p > p[above].min(), -np.inf, x)
        out.append(x.copy())
        if self.active["top-k"] and self.top_k < np.isfinite(x).sum():
            kth = np.sort(x)[::-1][self.top_k - 1]
            x = np.where(x < kth, -np.inf, x)
        out.append(x)
        return out

    def probs(self, logits: NDArray[np.floating], history: Sequence[int]) -> FloatArray:
        """The law of the next token (float64) given the raw ``logits`` and the token ``history``."""
        lp = self.logprobs(logits, history)
        plain = _softmax(self.stages(lp, xtc=False)[-1] / self.temperature)
        if not self.active["xtc"]:
            return plain
        cut = _softmax(self.stages(lp, xtc=True)[-1] / self.temperature)
        out: FloatArray = (1.0 - self.xtc_probability) * plain + self.xtc_probability * cut
        return out

    def greedy(self, logits: NDArray[np.floating], history: Sequence[int]) -> tuple[int, float]:
        """Temperature 0: the argmax of the processed log-probabilities and its gap to the runner-up."""
        lp = self.logprobs(logits, history)
        top = np.sort(lp)[::-1]
        return int(np.argmax(lp)), float(top[0] - top[1])

    def margin(self, logits: NDArray[np.floating], history: Sequence[int]) -> float:
        """How far the row is from changing its support under float32 noise: each cumulative probability from top-p's
        cut, each log-probability from min-p's threshold, each probability from XTC's threshold and from the least one
        above it, the top-k gap (relative); ``inf`` with every cut off."""
        lp = self.logprobs(logits, history)
        margins = [math.inf]
        for xtc in (False, True) if self.active["xtc"] else (False,):
            s = self.stages(lp, xtc=xtc)
            if self.active["top-p"] and xtc is False:
                p = np.sort(_softmax(lp))[::-1]
                cumulative = np.cumsum(p[p > 0])[:-1]
                if cumulative.size:
                    margins.append(float(np.abs(cumulative - self.top_p).min()))
            if self.active["min-p"] and xtc is False:
                x = s[0][np.isfinite(s[0])]
                threshold = x.max() + math.log(self.min_p)
                margins.append(float(np.abs(x - threshold).min()) / max(1.0, abs(threshold)))
            if xtc:
                p = _softmax(s[1])
                p = p[p > 0]
                margins.append(float(np.abs(p - self.xtc_threshold).min()))
                above = np.sort(p[p > self.xtc_threshold])
                if above.size >= 2:
                    margins.append(float(above[1] - above[0]))
            if self.active["top-k"]:
                x = s[2]
                desc = np.sort(x[np.isfinite(x)])[::-1]
                if self.top_k < desc.size:
                    margins.append(float(desc[self.top_k - 1] - desc[self.top_k]) / max(1.0, abs(float(desc[self.top_k - 1]))))
        return min(margins)

    def removed(self, logits: NDArray[np.floating], history: Sequence[int]) -> dict[str, float]:
        """Per active processor, the mass it moves of the law it acts on: for a penalty, the total variation between
        the softmax of the logits before and after it; for top-p, min-p and top-k, the mass of their input (untempered,
        renormalised) that they remove, top-k's averaged over XTC's two branches; for XTC, its probability times the
        mass it removes when applied. Alone, each is the total variation between the law with and without it."""
        out: dict[str, float] = {}
        x = np.array(logits, dtype=np.float64)
        for name in ("repetition", "presence", "frequency"):
            if self.active[name]:
                only = MlxSampling(**{**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, **_ONLY[name]})
                y = only.processed(x, history)
                out[name] = 0.5 * float(np.abs(_softmax(y) - _softmax(x)).sum())
                x = y
        lp = x - _logsumexp(x)
        branches = [(1.0 - self.xtc_probability, self.stages(lp, xtc=False))]
        if self.active["xtc"]:
            branches.append((self.xtc_probability, self.stages(lp, xtc=True)))
        inputs = {"top-p": -1, "min-p": 0, "xtc": 1, "top-k": 2}
        for name, before in inputs.items():
            if not self.active[name]:
                continue
            moved = 0.0
            for weight, s in branches if name != "xtc" else branches[1:]:
                start = lp if before < 0 else s[before]
                gone = np.isfinite(start) & ~np.isfinite(s[before + 1])
                moved += (1.0 if name == "xtc" else weight) * float(_softmax(start)[gone].sum())
            out[name] = moved * (self.xtc_probability if name == "xtc" else 1.0)
        return out

    # -------------------------------------------------------------------------------------- a fixture's law
    def fixture_law(
        self,
        next_logits: Callable[[tuple[int, ...]], NDArray[np.floating]],
        prompt: Sequence[int],
        length: int,
        vocab: int,
        *,
        margin: float = 1e-4,
    ) -> FloatArray:
        """The exact law of the first ``length`` tokens after ``prompt`` (``next_logits(prefix)``: the raw logits after
        prompt + prefix), refusing (:class:`LawFixtureError`) a fixture with an enumerated row within ``margin`` of a
        boundary, or with a position where an active processor moves less than :data:`LEAST_EFFECT` of the mass it
        acts on (:meth:`removed`), on average over the rows (prefixes weighted by their probability under the law)."""
        effects: dict[tuple[int, ...], dict[str, float]] = {}
        names = [name for name, on in self.active.items() if on]

        def oracle(prefix: tuple[int, ...]) -> FloatArray:
            logits = np.asarray(next_logits(prefix), dtype=np.float64)
            history = (*prompt, *prefix)
            if self.margin(logits, history) < margin:
                raise LawFixtureError(f"prefix {prefix}: a processing boundary is within {margin:g} of a token; choose another fixture")
            effects[prefix] = self.removed(logits, history)
            return self.probs(logits, history)

        law = sequence_law(oracle, length, vocab)
        cube = law.reshape((vocab,) * length)
        for t in range(length):
            reach = cube.sum(axis=tuple(range(t, length)))  # probability of each prefix of length t (a scalar at t = 0)
            rows = [(float(reach[prefix]) if t else 1.0, e) for prefix, e in effects.items() if len(prefix) == t]
            for name in names:
                moved = sum(weight * e[name] for weight, e in rows)
                if moved < LEAST_EFFECT:
                    raise LawFixtureError(
                        f"{name} moves only {moved:.3g} of the mass at position {t} (on average over its rows): choose another fixture"
                    )
        return law

    def describe(self) -> str:
        parts = [f"T={self.temperature:g}"]
        parts += [f"top_p={self.top_p:g}"] if self.active["top-p"] else []
        parts += [f"min_p={self.min_p:g}"] if self.active["min-p"] else []
        parts += [f"xtc={self.xtc_probability:g}@{self.xtc_threshold:g}"] if self.active["xtc"] else []
        parts += [f"top_k={self.top_k}"] if self.active["top-k"] else []
        parts += [f"repetition={self.repetition_penalty:g}"] if self.active["repetition"] else []
        parts += [f"presence={self.presence_penalty:g}"] if self.active["presence"] else []
        parts += [f"frequency={self.frequency_penalty:g}"] if self.active["frequency"] else []
        return ",".join(parts)

    def sampler_kwargs(self) -> dict[str, float | int]:
        """The arguments of ``mlx_lm.sample_utils.make_sampler`` for these settings."""
        return {
            "temp": self.temperature,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "top_k": self.top_k,
            "xtc_probability": self.xtc_probability,
            "xtc_threshold": self.xtc_threshold,
        }

    def processor_kwargs(self) -> dict[str, float | int | None]:
        """The arguments of ``mlx_lm.sample_utils.make_logits_processors`` for these settings."""
        return {
            "repetition_penalty": self.repetition_penalty,
            "repetition_context_size": self.context_size,
            "presence_penalty": self.presence_penalty,
            "presence_context_size": self.context_size,
            "frequency_penalty": self.frequency_penalty,
            "frequency_context_size": self.context_size,
        }


#: The settings that leave one penalty on (the others off): :meth:`MlxSampling.removed` applies them one at a time.
_ONLY: dict[str, dict[str, float | None]] = {
    "repetition": {"presence_penalty": None, "frequency_penalty": None},
    "presence": {"repetition_penalty": None, "frequency_penalty": None},
    "frequency": {"repetition_penalty": None, "presence_penalty": None},
}


def _logsumexp(x: FloatArray) -> float:
    finite = x[np.isfinite(x)]
    top = float(finite.max())
    return top + math.log(float(np.exp(finite - top).sum()))


def _softmax(x: FloatArray) -> FloatArray:
    finite = np.isfinite(x)
    out = np.zeros_like(x, dtype=np.float64)
    if not finite.any():
        return out
    z = np.exp(x[finite] - x[finite].max())
    out[finite] = z / z.sum()
    return out
