"""The vLLM end-to-end acceptance check against Σ min(p, q) (runs without vLLM: simulated verification records)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from specwatch.conditional import pit_null
from specwatch.stats import log_e_dirichlet_mixture
from specwatch.targets.vllm.acceptance import Drafting, Step, acceptance_batch, accepted_within, coverage_of, verification_steps

V, H, GAMMA = 8, 12, 3


def _fixture(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Context-free target rows and draft logits per output index (the check takes one row per index)."""
    rng = np.random.default_rng(seed)
    rows = rng.dirichlet(np.full(V, 0.7), size=H)
    draft_logits = np.log(rows) + rng.normal(0.0, 0.8, size=(H, V))  # a draft close to the target
    return rows, draft_logits


def _simulate(rows: np.ndarray, draft_logits: np.ndarray, rng: np.random.Generator, accept_scale: float) -> tuple[list[int], list[Step]]:
    """One request of greedy-draft speculative sampling as vLLM runs it: a prefill token, then steps of GAMMA
    drafts (also past the horizon) accepted with probability p(d) * accept_scale (1: the standard verifier)."""
    greedy = draft_logits.argmax(axis=1)
    tokens = [int(rng.choice(V, p=rows[0]))]
    steps: list[Step] = []
    while len(tokens) < H:
        accepted = 0
        for _ in range(GAMMA):
            t = len(tokens)
            row, draft = rows[min(t, H - 1)], int(greedy[min(t, H - 1)])
            if rng.random() < row[draft] * accept_scale:
                tokens.append(draft)
                accepted += 1
                continue
            residual = row.copy()
            residual[draft] = 0.0
            tokens.append(int(rng.choice(V, p=residual / residual.sum())))
            break
        else:
            tokens.append(int(rng.choice(V, p=rows[min(len(tokens), H - 1)])))
        steps.append(Step(GAMMA, accepted))
    return tokens[:H], steps


def _run(accept_scale: float, trials: int = 400) -> tuple[np.ndarray, int, float]:
    rows, draft_logits = _fixture()
    rng = np.random.default_rng(1)
    counts, accepted, expected = np.zeros(16, dtype=np.int64), 0, 0.0
    for _ in range(trials):
        tokens, steps = _simulate(rows, draft_logits, rng, accept_scale)
        batch = acceptance_batch(
            rows, np.ones(H, dtype=bool), draft_logits, tokens, steps, w=rng.random(H), drafting=Drafting.GREEDY, temperature=1.0
        )
        assert batch.violation is None
        counts += batch.counts
        accepted += batch.accepted
        expected += batch.expected
    return counts, accepted, expected


def test_a_standard_verifier_accepts_as_often_as_expected_and_its_acceptance_pits_are_uniform() -> None:
    counts, accepted, expected = _run(1.0)
    assert counts.sum() > 1000
    assert abs(accepted - expected) < 4 * math.sqrt(expected)
    assert log_e_dirichlet_mixture(counts, pit_null()) < math.log(100)


def test_a_verifier_that_accepts_half_as_often_is_refuted() -> None:
    counts, accepted, expected = _run(0.5)
    assert accepted < 0.7 * expected
    assert log_e_dirichlet_mixture(counts, pit_null()) > math.log(1e6)


def test_drafts_are_placed_by_the_steps_and_an_accepted_token_must_be_the_greedy_draft() -> None:
    """Prefill token at 0; a step of 3 drafts with 2 accepted covers indices 1-2 (accepted) and 3 (rejected);
    the next step starts at 4. Expected = p_1(d_1) + p_2(d_2) + p_3(d_3) + p_4(d_4)."""
    rows = np.full((6, 4), 0.25)
    rows[1:5] = [[0.1, 0.6, 0.2, 0.1], [0.5, 0.2, 0.2, 0.1], [0.3, 0.3, 0.3, 0.1], [0.1, 0.1, 0.1, 0.7]]
    draft_logits = np.zeros((6, 4))
    draft_logits[np.arange(6), [0, 1, 0, 3, 3, 0]] = 2.0  # greedy drafts per index
    tokens = [2, 1, 0, 2, 1, 3]
    steps = [Step(3, 2), Step(3, 0)]
    batch = acceptance_batch(
        rows, np.ones(6, dtype=bool), draft_logits, tokens, steps, w=np.full(6, 0.5), drafting=Drafting.GREEDY, temperature=1.0
    )
    assert (batch.tested, batch.accepted) == (4, 2)
    assert batch.expected == pytest.approx(0.6 + 0.5 + 0.1 + 0.7)
    assert batch.violation is None
    wrong = acceptance_batch(
        rows, np.ones(6, dtype=bool), draft_logits, [2, 1, 3, 2, 1, 3], steps, w=np.full(6, 0.5), drafting=Drafting.GREEDY, temperature=1.0
    )
    assert wrong.violation == "index 2: accepted token 3 is not the greedy draft 0"


def test_probabilistic_drafting_expects_the_overlap_of_p_and_the_tempered_draft_law() -> None:
    rows = np.array([[0.5, 0.5], [0.9, 0.1]])
    draft_logits = np.array([[0.0, 0.0], [0.0, math.log(3.0)]])  # q at index 1 = (0.25, 0.75) at temperature 1
    batch = acceptance_batch(
        rows,
        np.ones(2, dtype=bool),
        draft_logits,
        [0, 0],
        [Step(1, 0)],
        w=np.full(2, 0.5),
        drafting=Drafting.PROBABILISTIC,
        temperature=1.0,
    )
    assert batch.expected == pytest.approx(0.25 + 0.1)
    tempered = acceptance_batch(
        rows,
        np.ones(2, dtype=bool),
        draft_logits * 2,
        [0, 0],
        [Step(1, 0)],
        w=np.full(2, 0.5),
        drafting=Drafting.PROBABILISTIC,
        temperature=2.0,
    )
    assert tempered.expected == pytest.approx(batch.expected)


def test_rows_too_close_to_call_are_left_out_and_impossible_outcomes_are_certain_violations() -> None:
    rows = np.array([[0.5, 0.5], [0.0, 1.0], [0.5, 0.5]])
    tied = np.array([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])  # a tie at index 1: the greedy draft is not known
    left_out = acceptance_batch(
        rows, np.ones(3, dtype=bool), tied, [0, 0, 1], [Step(2, 0)], w=np.full(3, 0.5), drafting=Drafting.GREEDY, temperature=1.0
    )
    assert (left_out.tested, left_out.violation) == (0, None)
    draft_logits = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])  # greedy draft 0 at index 1, where p = 0
    accepted = acceptance_batch(
        rows, np.ones(3, dtype=bool), draft_logits, [0, 0, 1], [Step(1, 1)], w=np.full(3, 0.5), drafting=Drafting.GREEDY, temperature=1.0
    )
    assert accepted.violation == "a draft was accepted with acceptance probability 0"
    noise = acceptance_batch(
        rows,
        np.array([True, False, True]),
        draft_logits,
        [0, 0, 1],
        [Step(1, 1)],
        w=np.full(3, 0.5),
        drafting=Drafting.GREEDY,
        temperature=1.0,
    )
    assert (noise.tested, noise.violation) == (0, None)


def test_verification_steps_and_coverage_come_from_the_detailed_record() -> None:
    detailed = SimpleNamespace(
        spec_decode_metrics=SimpleNamespace(per_step_drafted=[3, 3, 2], per_step_accepted=[3, 1, 0], num_draft_tokens=8)
    )
    summary = SimpleNamespace(spec_decode_metrics=SimpleNamespace(per_step_drafted=[], per_step_accepted=[], num_draft_tokens=8))
    assert verification_steps(detailed) == (Step(3, 3), Step(3, 1), Step(2, 0))
    assert verification_steps(summary) is None
    assert verification_steps(SimpleNamespace()) is None
    coverage = coverage_of([verification_steps(detailed) or (), (Step(3, 2),)])
    assert (coverage.drafts, coverage.accepted, coverage.rounds) == ({2: 1, 3: 3}, {0: 1, 1: 1, 2: 1, 3: 1}, {1: 1, 3: 1})
    assert (coverage.full, coverage.partial) == (1, 2)


def test_accepted_drafts_within_the_horizon() -> None:
    """Steps (3, 3), (3, 1), (3, 3) from index 1: accepted drafts at 1-3, 5, 7-9; a horizon of 9 keeps 1-3, 5, 7-8."""
    assert accepted_within([Step(3, 3), Step(3, 1), Step(3, 3)], 9) == 6
    assert accepted_within([Step(3, 3), Step(3, 1), Step(3, 3)], 12) == 7
