"""Exact reference laws of speculative sampling.

All functions are pure, work in float64 numpy and never mutate their inputs. Notation follows
Leviathan et al. 2023 / Chen et al. 2023 and docs/statistics.md §2: a chain step drafts
gamma tokens, target rows p_1..p_{gamma+1} and draft rows q_1..q_gamma, m_i = min(p_i, q_i),
beta_i = sum(m_i).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

#: Joint laws of a whole step are enumerated up to this many cells (pairwise laws beyond).
MAX_JOINT_CELLS = 50_000
#: How far a law's total may be from 1 (float64 products of rows that each sum to 1 within 1e-9).
LAW_SUM_TOLERANCE = 1e-6


def validate_law(name: str, law: NDArray[np.floating]) -> FloatArray:
    """``law`` as a float64 vector if it is a probability law over its cells; ValueError naming it otherwise.

    Finite, non-negative, summing to 1 within ``LAW_SUM_TOLERANCE``: the e-process and the support check
    assume all three (a NaN cell is neither a support violation nor counted; the mixture assumes sum 1).
    """
    arr = np.asarray(law, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"law of {name} must be a non-empty vector, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"law of {name} is not finite: {bad.size} cell(s) are {arr[bad[0]]} (first: cell {int(bad[0])})")
    negative = np.flatnonzero(arr < 0)
    if negative.size:
        raise ValueError(f"law of {name} has {negative.size} negative cell(s) (first: cell {int(negative[0])} = {arr[negative[0]]:.3g})")
    total = float(arr.sum())
    if abs(total - 1.0) > LAW_SUM_TOLERANCE:
        raise ValueError(f"law of {name} sums to {total:.12g}, not 1")
    return arr


def step_joint_cells(vocab_size: int, gamma: int) -> int:
    """Cells of the law of (K, Y_1..Y_{K+1}): sum_{k=0}^{gamma} V^(k+1)."""
    return sum(vocab_size ** (k + 1) for k in range(gamma + 1))


def _outer(rows: Sequence[FloatArray]) -> FloatArray:
    """The product law of independent rows, flattened in base-V order (the first row is the most significant)."""
    out = np.ones(1, dtype=np.float64)
    for row in rows:
        out = (out[:, None] * row[None, :]).reshape(-1)
    return out


def _as_rows(x: NDArray[np.floating] | Sequence[Sequence[float]], name: str) -> FloatArray:
    rows = np.array(x, dtype=np.float64, copy=True)
    if rows.ndim != 2:
        raise ValueError(f"{name} must be 2-D (positions, vocab), got shape {rows.shape}")
    if np.any(rows < 0) or not np.all(np.isfinite(rows)):
        raise ValueError(f"{name} must be finite and non-negative")
    sums = rows.sum(axis=1)
    if not np.allclose(sums, 1.0, atol=1e-9):
        raise ValueError(f"{name} rows must sum to 1, got {sums}")
    rows.setflags(write=False)
    return rows


@dataclass(frozen=True)
class ChainLaw:
    """Exact law of one chain speculative step with context-free rows.

    ``p`` has shape (gamma + 1, V) (the last row is the bonus position), ``q`` has shape (gamma, V).
    Hypothesis it encodes: the Leviathan/Chen sampler. Guarantee: every emitted position t has
    law p_t given that it was emitted (losslessness), with P(K = k) = prod_{i<=k} beta_i (1 -
    beta_{k+1}). Reference: Leviathan, Kalman & Matias 2023, Theorem 1; docs/statistics.md §2.
    """

    p: FloatArray
    q: FloatArray

    def __post_init__(self) -> None:
        p = _as_rows(self.p, "p")
        q = _as_rows(self.q, "q")
        if p.shape[0] != q.shape[0] + 1 or p.shape[1] != q.shape[1]:
            raise ValueError(f"p must be (gamma+1, V) and q (gamma, V); got {p.shape} and {q.shape}")
        object.__setattr__(self, "p", p)
        object.__setattr__(self, "q", q)

    @property
    def gamma(self) -> int:
        return int(self.q.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.p.shape[1])

    @cached_property
    def accept_mass(self) -> FloatArray:
        """m_i(y) = min(p_i(y), q_i(y)): P(draft i = y and accepted | position i reached)."""
        return np.minimum(self.p[: self.gamma], self.q)

    @cached_property
    def beta(self) -> FloatArray:
        """Acceptance probability of each draft position given it is reached.

        Exactly 1 where p_i <= q_i everywhere (no excess mass), so p == q gives a certain K law.
        """
        beta = np.clip(self.accept_mass.sum(axis=1), 0.0, 1.0)
        return np.where(self.excess.sum(axis=1) == 0.0, 1.0, beta)

    @cached_property
    def excess(self) -> FloatArray:
        """(p_i - q_i)_+: P(position i rejected and resampled as y | position i reached)."""
        return np.maximum(self.p[: self.gamma] - self.q, 0.0)

    @cached_property
    def reach(self) -> FloatArray:
        """P(position t is emitted) for t = 1..gamma+1: prod_{i<t} beta_i."""
        return np.concatenate(([1.0], np.cumprod(self.beta)))

    @cached_property
    def k_law(self) -> FloatArray:
        """P(K = k) for k = 0..gamma, K the number of accepted drafts."""
        stop = np.concatenate((1.0 - self.beta, [1.0]))
        law: FloatArray = self.reach * stop
        normalised: FloatArray = law / law.sum()
        return normalised

    @cached_property
    def expected_accepted(self) -> float:
        """E[K] = sum_{k=1}^{gamma} prod_{i<=k} beta_i."""
        return float(self.reach[1:].sum())

    def emitted(self, t: int) -> FloatArray:
        """Law of the token at position t (0-based) given that it was emitted: p_t."""
        row: FloatArray = self.p[t]
        return row

    def residual(self, t: int) -> FloatArray | None:
        """Law of the resampled token at draft position t given rejection there (None if beta_t = 1)."""
        mass = self.excess[t].sum()
        if mass <= 0.0:
            return None
        row: FloatArray = self.excess[t] / mass
        return row

    def accepted(self, t: int) -> FloatArray | None:
        """Law of an accepted draft at position t (None if beta_t = 0)."""
        if self.beta[t] <= 0.0:
            return None
        row: FloatArray = self.accept_mass[t] / self.beta[t]
        return row

    def position_joint(self, t: int) -> FloatArray:
        """Law of (accepted?, token) at draft position t given it is reached, over 2V cells.

        Cell y: the draft y was accepted; cell V + y: the draft was rejected and y resampled.
        Its two halves sum to p_t, so it refines losslessness with the acceptance behaviour.
        """
        return np.concatenate((self.accept_mass[t], self.excess[t]))

    def step_joint(self) -> FloatArray:
        """Exact law of the whole step (K, Y_1..Y_{K+1}), blocks k = 0..gamma of V^(k+1) cells each.

        P(K = k, Y = y) = prod_{i<=k} m_i(y_i) * (p_{k+1} - q_{k+1})_+(y_{k+1}) for k < gamma, the last factor
        being p_{gamma+1}(y_{gamma+1}) for k = gamma (Leviathan et al. 2023, Theorem 1;
        docs/statistics.md §2). Cell of (k, y): sum_{j<k} V^(j+1) + sum_t y_t V^(k-t) (t = 1..k+1). It refines every
        per-position law with the dependence between positions. Use ``step_joint_cells`` to size it first.
        """
        gamma = self.gamma
        blocks = []
        for k in range(gamma + 1):
            last = self.excess[k] if k < gamma else self.p[gamma]
            blocks.append(_outer([*self.accept_mass[:k], last]))
        return np.concatenate(blocks)

    def completed_joint(self) -> FloatArray:
        """Law of the step completed to gamma + 1 tokens: prod_t p_t over V^(gamma+1) cells (base-V order).

        Positions the step did not emit are drawn afresh from p_t (independently). Losslessness of the whole
        step means exactly this product law (the speculative output, continued autoregressively, is the
        target's own sampling; Leviathan et al. 2023, Theorem 1): a per-position check cannot see a sampler
        that couples its positions (one uniform for every draft), this one can.
        """
        return _outer(list(self.p))

    def completed_pair(self, t: int) -> FloatArray:
        """Law of the completed step's tokens at positions t, t + 1 (0-based): p_t x p_{t+1}, cell a * V + b."""
        return _outer([self.p[t], self.p[t + 1]])


NextTokenOracle = Callable[[tuple[int, ...]], NDArray[np.floating]]


def sequence_law(next_token: NextTokenOracle, length: int, vocab_size: int) -> FloatArray:
    """Exact law of the first ``length`` generated tokens, flattened in base-V order.

    ``next_token(prefix)`` returns the target's next-token distribution after the library's
    processing, given the generated prefix (the prompt is part of the oracle). The law is
    prod_t p(y_t | y_<t) over all V**length sequences; index = sum_t y_t * V**(length-1-t).
    Reference: the chain rule; docs/statistics.md §3 (test whole sequences, not pooled positions).
    """
    if length < 1:
        raise ValueError("length must be at least 1")
    if vocab_size**length > 50_000_000:
        raise ValueError(f"V**L = {vocab_size}**{length} cells is too many for an exact sequence law")
    law = np.ones(1, dtype=np.float64)
    prefixes: list[tuple[int, ...]] = [()]
    for _ in range(length):
        rows = np.zeros((len(prefixes), vocab_size), dtype=np.float64)
        for i, prefix in enumerate(prefixes):
            if law[i] == 0.0:
                continue  # unreachable prefix: its continuations have probability 0
            row = np.asarray(next_token(prefix), dtype=np.float64)
            if row.shape != (vocab_size,):
                raise ValueError(f"oracle returned shape {row.shape}, expected ({vocab_size},)")
            validate_law(f"the next token after prefix {prefix}", row)
            rows[i] = row
        law = (law[:, None] * rows).reshape(-1)
        prefixes = [(*prefix, y) for prefix in prefixes for y in range(vocab_size)]
    return validate_law(f"the first {length} generated tokens", law)
