"""llama.cpp's sampler chain as an exact law, in the order it runs (``src/llama-sampler.cpp``, ``common/sampling.cpp``).

The order in force, read from the vendored tree of llama-cpp-python 0.3.36 (llama.cpp 0c1e57098):

- ``common_sampler_init`` (``llama-speculative``, ``llama-server``): logit bias (``--ignore-eos`` puts -inf on the
  end-of-generation tokens) first, then ``params.samplers``, by default penalties, DRY, top-n-sigma, top-k,
  typical, top-p, min-p, XTC, temperature, then ``dist``;
- llama-cpp-python's ``Llama._init_sampler``: penalties, top-k, typical, top-p, min-p, temperature, ``dist``.

With penalties, DRY, top-n-sigma, typical and XTC at their neutral settings both reduce to
logit bias -> top-k -> top-p -> min-p -> temperature -> softmax: top-k, top-p and min-p act on the *untempered*
logits (unlike Hugging Face's order, where temperature comes first). Semantics:

- top-k (``k <= 0``: off) keeps the k largest logits;
- top-p (``p >= 1``: off) keeps the shortest prefix, by decreasing probability (softmax of the current
  candidates), whose cumulative probability reaches p;
- min-p (``p <= 0``: off) keeps the tokens whose logit is at least ``max + log(p)`` (probability >= p * max);
- temperature divides the logits of what is left.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from specwatch.laws import sequence_law

FloatArray = NDArray[np.float64]


#: The least mass an active cut removes at each position of a processed fixture (:meth:`LlamaChain.fixture_law`).
LEAST_CUT = 0.01


class ChainFixtureError(ValueError):
    """A processed fixture that would not test what it names: a row within float noise of a boundary, or a
    processor that cuts nothing on some enumerated row."""


@dataclass(frozen=True)
class LlamaChain:
    """The neutral-penalty llama.cpp chain: logit bias (``banned``: -inf) -> top-k -> top-p -> min-p -> temperature."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    banned: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0 (temperature 0 is greedy: no law to test)")
        if not 0 < self.top_p <= 1 or not 0 <= self.min_p < 1:
            raise ValueError("top_p must be in (0, 1], min_p in [0, 1)")

    @property
    def cuts(self) -> dict[str, bool]:
        """Which of top-k, top-p and min-p are active."""
        return {"top-k": self.top_k > 0, "top-p": self.top_p < 1.0, "min-p": self.min_p > 0.0}

    def stages(self, logits: NDArray[np.floating]) -> list[FloatArray]:
        """The logits after the bias, after top-k, after top-p and after min-p (removed: -inf), untempered."""
        x = np.array(logits, dtype=np.float64)
        if self.banned:
            x[list(self.banned)] = -np.inf
        out = [x.copy()]
        if self.top_k > 0 and self.top_k < np.isfinite(x).sum():
            kth = np.sort(x)[::-1][self.top_k - 1]
            x = np.where(x < kth, -np.inf, x)
        out.append(x.copy())
        if self.top_p < 1.0:
            p = _softmax(x)
            order = np.argsort(-p, kind="stable")
            cumulative = np.cumsum(p[order])
            last = int(np.searchsorted(cumulative, self.top_p, side="left"))  # first index with cum >= top_p
            drop = order[last + 1 :]
            x = x.copy()
            x[drop] = -np.inf
        out.append(x.copy())
        if self.min_p > 0.0:
            x = np.where(x < x.max() + math.log(self.min_p), -np.inf, x)
        out.append(x)
        return out

    def probs(self, logits: NDArray[np.floating]) -> FloatArray:
        """The law ``dist`` samples from after the chain (float64)."""
        return _softmax(self.stages(logits)[-1] / self.temperature)

    def removed(self, logits: NDArray[np.floating]) -> dict[str, float]:
        """Mass each cut removes on this row, of the untempered law it acts on."""
        s = self.stages(logits)
        out: dict[str, float] = {}
        for i, name in enumerate(("top-k", "top-p", "min-p")):
            before = _softmax(s[i])
            out[name] = float(before[~np.isfinite(s[i + 1]) & np.isfinite(s[i])].sum())
        return out

    def margin(self, logits: NDArray[np.floating]) -> float:
        """How far the row is from changing its support under float noise: the top-k gap (relative to the k-th
        logit), the distance of each cumulative probability from top-p, and of each logit from min-p's threshold
        (relative); ``inf`` when no cut is active."""
        s = self.stages(logits)
        margin = math.inf
        x = s[0]
        if self.top_k > 0 and self.top_k < np.isfinite(x).sum():
            desc = np.sort(x[np.isfinite(x)])[::-1]
            margin = min(margin, float(desc[self.top_k - 1] - desc[self.top_k]) / max(1.0, abs(float(desc[self.top_k - 1]))))
        if self.top_p < 1.0:
            p = np.sort(_softmax(s[1]))[::-1]
            cumulative = np.cumsum(p[p > 0])[:-1]
            if cumulative.size:
                margin = min(margin, float(np.abs(cumulative - self.top_p).min()))
        if self.min_p > 0.0:
            x = s[2][np.isfinite(s[2])]
            threshold = x.max() + math.log(self.min_p)
            margin = min(margin, float(np.abs(x - threshold).min()) / max(1.0, abs(threshold)))
        return margin

    def fixture_law(
        self, next_logits: Callable[[tuple[int, ...]], NDArray[np.floating]], length: int, vocab: int, *, margin: float = 1e-4
    ) -> FloatArray:
        """The exact law of the first ``length`` tokens, refusing (:class:`ChainFixtureError`) a fixture with an
        enumerated row within ``margin`` of a boundary, or with a position where an active cut removes less than
        :data:`LEAST_CUT` of the mass on average over the rows (prefixes weighted by their probability under the law):
        at every position, a chain that skipped the cut would emit another law. (Every row of a vocabulary of 8
        cannot lose mass to each of three cuts in a row without the law collapsing onto a few sequences.)"""
        removed: dict[tuple[int, ...], dict[str, float]] = {}

        def oracle(prefix: tuple[int, ...]) -> FloatArray:
            logits = np.asarray(next_logits(prefix), dtype=np.float64)
            if self.margin(logits) < margin:
                raise ChainFixtureError(f"prefix {prefix}: a processing boundary is within {margin:g} of a token; choose another fixture")
            removed[prefix] = self.removed(logits)
            return self.probs(logits)

        law = sequence_law(oracle, length, vocab)
        cube = law.reshape((vocab,) * length)
        for t in range(length):
            reach = cube.sum(axis=tuple(range(t, length)))  # probability of each prefix of length t (a scalar at t = 0)
            rows = [(float(reach[prefix]) if t else 1.0, r) for prefix, r in removed.items() if len(prefix) == t]
            for name, active in self.cuts.items():
                mass = sum(weight * r[name] for weight, r in rows)
                if active and mass < LEAST_CUT:
                    raise ChainFixtureError(
                        f"{name} removes only {mass:.3g} of the mass at position {t} (on average over its rows): choose another fixture"
                    )
        return law

    def describe(self) -> str:
        parts = [f"T={self.temperature:g}"]
        parts += [f"top_k={self.top_k}"] if self.top_k > 0 else []
        parts += [f"top_p={self.top_p:g}"] if self.top_p < 1 else []
        parts += [f"min_p={self.min_p:g}"] if self.min_p > 0 else []
        return ",".join(parts)


def _softmax(x: FloatArray) -> FloatArray:
    finite = np.isfinite(x)
    out = np.zeros_like(x, dtype=np.float64)
    if not finite.any():
        return out
    z = np.exp(x[finite] - x[finite].max())
    out[finite] = z / z.sum()
    return out


def speculative_example_law(p: Sequence[float] | FloatArray, q: Sequence[float] | FloatArray) -> FloatArray:
    """The law of the token ``llama-speculative`` emits at a drafted position at temperature > 0, one draft sequence
    (``examples/speculative/speculative.cpp``): the draft is the *most likely* token of the draft's processed law q
    (``cur_p->data[0]`` after ``common_sampler_get_candidates(..., true)`` sorts by probability), accepted when
    ``r <= p(d) / q(d)``, otherwise the token is drawn from ``max(0, p - q)`` normalised. Lossless would need the
    draft drawn from q; with d = argmax q this law differs from p unless q is one-hot or p = q. Both rows are full
    vocabulary laws (processing off: the candidate lists align after sorting by id)."""
    p_arr = np.asarray(p, dtype=np.float64)
    q_arr = np.asarray(q, dtype=np.float64)
    d = int(np.argmax(q_arr))
    accept = min(1.0, float(p_arr[d] / q_arr[d]))
    residual = np.clip(p_arr - q_arr, 0.0, None)
    total = residual.sum()
    out = (1.0 - accept) * (residual / total if total > 0 else np.zeros_like(p_arr))
    out[d] += accept
    return out
