"""Long-horizon conditional check: every emitted token against its exact conditional law, no enumeration.

Inputs (target-agnostic): the tokens a sampler emitted at positions 1..L of one trial and, for each
position, the exact conditional law ``p_t = p(. | prompt, y_<t)`` of the process under test (for a
language model: one no-cache forward of the target over prompt + output, then the same logits
processing the library applies). Nothing is enumerated, so any horizon L and any vocabulary works.

**Randomized probability integral transform (PIT).** Fix an order of the vocabulary for each row (by
token id, or by decreasing probability with ties broken by id). With ``F_t(y)`` the mass of the tokens
ordered strictly before ``y`` and ``W_t ~ Uniform(0, 1)`` drawn independently of everything else,

    U_t = F_t(y_t) + W_t * p_t(y_t).

**Validity.** H0: given the past (earlier trials and the prefix ``y_<t``), ``y_t ~ p_t``. Then given the
past, ``U_t`` is exactly Uniform(0, 1): the intervals ``[F_t(y), F_t(y) + p_t(y))`` tile [0, 1) and ``U_t``
is uniform on the one chosen with probability equal to its length (Rosenblatt 1952; Brockwell 2007 for
the randomized discrete case). Its conditional law does not depend on the past, so the U's of all
positions of all trials, in the order they are produced, are i.i.d. Uniform(0, 1) (Rosenblatt). Binning
``floor(B * U)`` gives i.i.d. draws from the uniform law over B cells, so the suite's Dirichlet-mixture
e-process (:func:`specwatch.stats.log_e_dirichlet_mixture`) over the bin counts is a test
martingale for this filtration and Ville's inequality holds under continuous monitoring:
P(sup E >= 1/a) <= a. Dropping a position by a rule that depends only on the past (here: rows whose
processing boundary is too close to call in floating point, see :func:`processing_margin`) is optional
skipping and keeps the guarantee. A token with ``p_t(y_t) = 0`` cannot occur under H0: a certain
violation. The two orders are two tests; the caller counts both in the Bonferroni m.

**Power.** Under an alternative ``y_t ~ p'_t`` the density of ``U_t`` is ``p'_t(y) / p_t(y)`` on token
``y``'s interval. The id order sees mass moved between tokens far apart in id; the probability order
sees mass moved towards or away from the likely tokens (too greedy, too flat, a processor applied on
one side only), which the id order can average out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Bins of the PIT histogram: the null law is uniform over them.
PIT_BINS = 16
#: Rows whose processing boundary (top-k gap, top-p cut) is closer than this (:func:`processing_margin`) are
#: too close to call in float32, where libraries process: the conditional checks leave them out, and an
#: adapter refuses such a row among those its joint law enumerates.
FLOAT32_MARGIN = 1e-4
#: Mass top-k and top-p must each remove on every row a processed fixture's joint law enumerates, when they are
#: set: less, and the case would not test that processor there (the adapters refuse such a fixture).
MIN_REMOVED = 0.01


class TokenOrder(enum.StrEnum):
    """How the vocabulary is ordered before the PIT: by token id, or by decreasing probability (ties by id)."""

    ID = "id"
    PROBABILITY = "prob"


@dataclass(frozen=True)
class ConditionalBatch:
    """PIT bin counts per order, positions tested and skipped, and the first impossible token seen."""

    counts: dict[TokenOrder, IntArray]
    tested: int
    skipped: int
    impossible: str | None


def pit_null(bins: int = PIT_BINS) -> FloatArray:
    """The exact null law of the binned PIT: uniform over ``bins`` cells."""
    return np.full(bins, 1.0 / bins)


def randomized_pit(rows: FloatArray, tokens: IntArray, w: FloatArray, order: TokenOrder) -> FloatArray:
    """``U_t = F_t(y_t) + W_t p_t(y_t)`` for each row t (shape (n, V)), token ``y_t`` and uniform ``W_t``.

    Under H0 (``y_t ~ rows[t]`` given the past, ``W_t`` independent uniform) each ``U_t`` is exactly
    Uniform(0, 1) and independent of the past (module docstring). ``rows`` must be non-negative and sum to 1.
    """
    p = np.asarray(rows, dtype=np.float64)
    y = np.asarray(tokens, dtype=np.int64)
    n = p.shape[0]
    if order is TokenOrder.ID:
        before = np.cumsum(p, axis=1) - p  # mass of ids < y
        f = before[np.arange(n), y]
    else:
        vocab = np.arange(p.shape[1])
        # Ordered before y: strictly more likely, or equally likely with a smaller id.
        py = p[np.arange(n), y][:, None]
        ahead = (p > py) | ((p == py) & (vocab[None, :] < y[:, None]))
        f = np.where(ahead, p, 0.0).sum(axis=1)
    u: FloatArray = f + np.asarray(w, dtype=np.float64) * p[np.arange(n), y]
    return np.clip(u, 0.0, np.nextafter(1.0, 0.0))


def pit_bins(u: FloatArray, bins: int = PIT_BINS) -> IntArray:
    """Counts of ``floor(bins * U)``."""
    cells = np.minimum((np.asarray(u) * bins).astype(np.int64), bins - 1)
    return np.bincount(cells, minlength=bins).astype(np.int64)


def conditional_batch(
    rows: FloatArray,
    tokens: IntArray,
    w: FloatArray,
    *,
    keep: NDArray[np.bool_] | None = None,
    bins: int = PIT_BINS,
) -> ConditionalBatch:
    """PIT bin counts under both orders for emitted ``tokens`` with exact conditional ``rows``.

    ``keep`` (default: all) marks the positions to test; it must be decided from the past only (e.g. by
    :func:`processing_margin` on the row), which keeps the e-process valid. A kept token of probability
    0 is reported in ``impossible`` (a certain violation) and left out of the counts.
    """
    p = np.asarray(rows, dtype=np.float64)
    y = np.asarray(tokens, dtype=np.int64)
    mask = np.ones(len(y), dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    out_of_range = (y < 0) | (y >= p.shape[1])
    impossible = None
    if bool(out_of_range[mask].any()):
        t = int(np.flatnonzero(out_of_range & mask)[0])
        impossible = f"position {t + 1}: token id {int(y[t])} outside [0, {p.shape[1]})"
        mask = mask & ~out_of_range
    y_safe = np.where(out_of_range, 0, y)
    zero = p[np.arange(len(y)), y_safe] <= 0
    if impossible is None and bool((zero & mask).any()):
        t = int(np.flatnonzero(zero & mask)[0])
        impossible = f"position {t + 1}: token {int(y[t])} has conditional probability 0"
    mask = mask & ~zero
    counts = {order: pit_bins(randomized_pit(p[mask], y_safe[mask], np.asarray(w)[mask], order), bins) for order in TokenOrder}
    return ConditionalBatch(counts=counts, tested=int(mask.sum()), skipped=int(len(y) - mask.sum()), impossible=impossible)


def processing_margin(logits: FloatArray, temperature: float, top_k: int | None, top_p: float | None) -> float:
    """How far a row is from changing its support under float noise (Hugging Face order: T, top-k, top-p).

    The smaller of: the gap in tempered logits between the k-th and (k+1)-th largest (top-k), relative to
    their size, and the distance of the cumulative kept mass (ascending order, after top-k) from
    ``1 - top_p`` at every cut (top-p). ``inf`` without processing that can remove tokens.
    """
    x = np.asarray(logits, dtype=np.float64) / temperature
    margin = np.inf
    v = x.shape[-1]
    if top_k is not None and top_k < v:
        desc = np.sort(x)[::-1]
        kth, nxt = desc[top_k - 1], desc[top_k]
        if np.isfinite(kth):
            gap = kth - nxt if np.isfinite(nxt) else np.inf
            margin = min(margin, gap / max(1.0, abs(kth)))
            x = np.where(x < kth, -np.inf, x)
    if top_p is not None and top_p < 1.0:
        finite = np.sort(x[np.isfinite(x)])
        probs = np.exp(finite - finite.max())
        probs /= probs.sum()
        cumulative = np.cumsum(probs)[:-1]  # the last (largest) token is always kept
        if cumulative.size:
            margin = min(margin, float(np.abs(cumulative - (1.0 - top_p)).min()))
    return float(margin)


def processing_margins(logits: FloatArray, temperature: float, top_k: int | None, top_p: float | None) -> FloatArray:
    """:func:`processing_margin` of every row of ``logits`` (shape (n, V)) at once, vectorised: the same margins up to
    float rounding in the top-p normalisation (sums over the row's padded ascending order)."""
    x = np.array(logits, dtype=np.float64, ndmin=2) / temperature
    n, v = x.shape
    margin = np.full(n, np.inf)
    if top_k is not None and top_k < v:
        desc = -np.sort(-x, axis=1)
        kth, nxt = desc[:, top_k - 1], desc[:, top_k]
        active = np.isfinite(kth)
        with np.errstate(invalid="ignore"):
            gap = np.where(np.isfinite(nxt), kth - nxt, np.inf)
            margin = np.where(active, np.minimum(margin, gap / np.maximum(1.0, np.abs(kth))), margin)
        x = np.where(active[:, None] & (x < kth[:, None]), -np.inf, x)
    if top_p is not None and top_p < 1.0:
        ordered = np.sort(x, axis=1)  # ascending: the removed (-inf) tokens first, the largest last
        finite = np.isfinite(ordered)
        top = ordered[:, -1:]
        probs = np.where(finite, np.exp(np.where(finite, ordered - top, 0.0)), 0.0)
        probs /= probs.sum(axis=1, keepdims=True)
        cumulative = np.cumsum(probs, axis=1)
        cuts = finite & (np.arange(v) < v - 1)[None, :]  # the last (largest) token is always kept
        distance = np.where(cuts, np.abs(cumulative - (1.0 - top_p)), np.inf)
        margin = np.minimum(margin, distance.min(axis=1))
    return margin
