"""Acceptance of the vLLM end-to-end cases against Σ min(p, q), from vLLM's own per-request verification record.

**Where the counts come from.** ``LLM.get_metrics()`` cannot give one engine's drafts and acceptances when a
process holds several engines: every ``PrometheusStatLogger.__init__`` calls ``unregister_vllm_metrics()``, and
``get_metrics()`` reads prometheus' process-global ``REGISTRY``, so each new engine removes the counters of the
ones built before it (and they all carry the same labels: the model path and engine 0). Instead the engines
are built with ``per_request_spec_decode_metrics="detailed"`` (vLLM 0.32's ``ObservabilityConfig``): each
request's output then carries ``spec_decode_metrics.per_step_drafted`` and ``per_step_accepted``, the drafts
and accepted drafts of each of its verification steps, in order, counted by the scheduler. With the output
tokens this places every draft: the first token comes from the prefill; a step that starts at output index
``s`` with ``d`` drafts and ``a`` accepted verifies drafts at ``s .. s+d-1``, emits them up to ``s+a-1`` and
a recovered or bonus token at ``s+a``; the next step starts at ``s+a+1``.

**Expected acceptance.** The draft at output index ``t`` is reached when the step's earlier drafts were
accepted; its context is prompt + output[:t]. Given the past, a lossless standard verifier accepts it with
probability ``β_t = Σ_y min(p_t(y), q_t(y))``, with ``p_t`` the target's processed law there and ``q_t`` the
drafter's law: one-hot on the draft model's argmax for greedy drafting (vLLM's default; ``β_t = p_t(d_t)``), and
softmax(draft logits / temperature) for probabilistic drafting (vLLM's ``compute_probs_and_sample_next_token``
applies the temperature only). Both are computed in float64 from the saved weights.

**Check.** Each reached, tested draft's acceptance ``A_t`` is Bernoulli(``β_t``) given the past, so its
randomized PIT over the two-cell law ``(1 - β_t, β_t)`` is Uniform(0, 1) and independent of the past
(Rosenblatt; :mod:`specwatch.conditional`): the binned PITs feed the suite's Dirichlet-mixture e-process,
a conformance check (a lossless verifier that accepts less is slower, not wrong). Drafts are left out by
rules that depend on the past only: beyond the returned horizon (their context is not in the output), rows
whose target processing boundary is within float32 noise, and, for greedy drafting, rows whose two largest
draft logits are within float32 noise (the argmax could differ). An accepted draft that is not the greedy
draft, or an acceptance where ``β_t = 0``, is a certain violation. The case reports the accepted and the
expected accepted drafts per trial over the tested drafts (``acceptance.observed`` / ``acceptance.expected``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from specwatch.conditional import FLOAT32_MARGIN, PIT_BINS, TokenOrder, conditional_batch
from specwatch.experiments import Coverage

#: The check's name in the case result.
ACCEPTANCE_CHECK = "conformance/acceptance"


class Drafting(enum.StrEnum):
    """How the drafter proposes, which sets q."""

    GREEDY = "greedy"
    PROBABILISTIC = "probabilistic"


@dataclass(frozen=True)
class Step:
    """One verification step of a request: drafts proposed and drafts accepted."""

    drafted: int
    accepted: int


def verification_steps(completion: Any) -> tuple[Step, ...] | None:
    """The steps vLLM recorded for one completion (``spec_decode_metrics``, detailed level), or None without them."""
    metrics = getattr(completion, "spec_decode_metrics", None)
    drafted = getattr(metrics, "per_step_drafted", None)
    accepted = getattr(metrics, "per_step_accepted", None)
    if metrics is None or drafted is None or accepted is None or len(drafted) != len(accepted):
        return None
    proposed: int = getattr(metrics, "num_draft_tokens", 0)
    if not drafted and proposed:
        return None  # counted but not itemised: the summary level
    return tuple(Step(int(d), int(a)) for d, a in zip(drafted, accepted, strict=True))


def coverage_of(steps: Sequence[Sequence[Step]]) -> Coverage:
    """Drafts and accepted drafts per verification, rounds per request, and full/partial steps of >= 2 drafts."""
    drafts: dict[int, int] = {}
    accepted: dict[int, int] = {}
    rounds: dict[int, int] = {}
    full = partial = 0
    for request in steps:
        rounds[len(request)] = rounds.get(len(request), 0) + 1
        for step in request:
            drafts[step.drafted] = drafts.get(step.drafted, 0) + 1
            accepted[step.accepted] = accepted.get(step.accepted, 0) + 1
            if step.drafted >= 2:
                full += step.accepted == step.drafted
                partial += 0 < step.accepted < step.drafted
    return Coverage(dict(sorted(drafts.items())), dict(sorted(accepted.items())), dict(sorted(rounds.items())), full, partial)


def accepted_within(steps: Sequence[Step], horizon: int) -> int:
    """Accepted drafts at output indices below ``horizon`` (what an unmeasured case still reports as observed)."""
    total, start = 0, 1
    for step in steps:
        total += max(0, min(step.accepted, horizon - start))
        start += step.accepted + 1
    return total


@dataclass(frozen=True)
class AcceptanceBatch:
    """PIT bin counts of the tested drafts' acceptances, accepted and expected accepted drafts among them, and
    the first certain violation."""

    counts: NDArray[np.int64]
    accepted: int
    expected: float
    tested: int
    violation: str | None


def acceptance_batch(
    target_rows: NDArray[np.float64],
    target_keep: NDArray[np.bool_],
    draft_logits: NDArray[np.float64],
    tokens: Sequence[int],
    steps: Sequence[Step],
    *,
    w: NDArray[np.float64],
    drafting: Drafting,
    temperature: float,
) -> AcceptanceBatch:
    """One request: ``target_rows`` (H, V) the processed target law at each output index, ``target_keep`` (H,)
    the rows clear of float noise, ``draft_logits`` (H, V) the draft model's raw logits there, ``tokens`` the H
    returned tokens, ``steps`` vLLM's record, ``w`` (H,) independent uniforms (module docstring)."""
    horizon = len(tokens)
    betas: list[float] = []
    outcomes: list[int] = []
    uniforms: list[float] = []
    violation: str | None = None
    start = 1
    for step in steps:
        for i in range(step.drafted):
            t = start + i
            if t >= horizon:
                break
            took = i < step.accepted
            beta, draft = _beta(target_rows[t], draft_logits[t], drafting, temperature)
            if target_keep[t] and draft is not None and took and tokens[t] != draft and violation is None:
                violation = f"index {t}: accepted token {tokens[t]} is not the greedy draft {draft}"
            if target_keep[t] and (drafting is Drafting.PROBABILISTIC or draft is not None):
                betas.append(beta)
                outcomes.append(int(took))
                uniforms.append(float(w[t]))
            if not took:
                break
        start += step.accepted + 1
    if not betas:
        return AcceptanceBatch(np.zeros(PIT_BINS, dtype=np.int64), 0, 0.0, 0, violation)
    beta_arr, took_arr = np.asarray(betas), np.asarray(outcomes, dtype=np.int64)
    # The two-cell law of each acceptance: cell 1 = accepted. An outcome of probability 0 is left out of the
    # counts by conditional_batch and reported here.
    batch = conditional_batch(np.stack((1.0 - beta_arr, beta_arr), axis=1), took_arr, np.asarray(uniforms))
    if batch.impossible is not None and violation is None:
        never = int(np.flatnonzero(np.where(took_arr == 1, beta_arr <= 0.0, beta_arr >= 1.0))[0])
        what = "accepted with acceptance probability 0" if took_arr[never] else "rejected with acceptance probability 1"
        violation = f"a draft was {what}"
    return AcceptanceBatch(batch.counts[TokenOrder.ID], int(took_arr.sum()), float(beta_arr.sum()), len(betas), violation)


def _beta(p: NDArray[np.float64], draft_logits: NDArray[np.float64], drafting: Drafting, temperature: float) -> tuple[float, int | None]:
    """Σ min(p, q) at one draft position, and the greedy draft (None when too close to call, or probabilistic)."""
    if drafting is Drafting.PROBABILISTIC:
        scaled = draft_logits / temperature
        q = np.exp(scaled - scaled.max())
        q /= q.sum()
        return float(np.minimum(p, q).sum()), None
    top2 = np.sort(draft_logits)[-2:]
    if (top2[1] - top2[0]) / max(1.0, abs(top2[1])) < FLOAT32_MARGIN:
        return 0.0, None
    draft = int(np.argmax(draft_logits))
    return float(p[draft]), draft
