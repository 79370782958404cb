"""OpenVINO GenAI's logit-processing law against a literal float32 replay of its C++ transforms and exact cases."""

from __future__ import annotations

import heapq

import numpy as np
import pytest
from scipy import stats

from specwatch.targets.llamacpp.chain import LlamaChain
from specwatch.targets.openvino.chain import ChainFixtureError, GenAIChain

ROW = np.array([2.0, 1.4, 1.1, 0.3, -0.2, -0.9, -1.5, -2.4])


def replay(chain: GenAIChain, logits: np.ndarray, prompt: list[int], generated: list[int], rng: np.random.Generator) -> int:
    """One draw, transcribing ``LogitProcessor::apply`` and the multinomial draw step by step in float32."""
    data = [np.float32(v) for v in logits]
    for token in sorted(set(prompt) | set(generated)) if chain.repetition_penalty != 1 else []:
        data[token] = (
            data[token] / np.float32(chain.repetition_penalty) if data[token] >= 0 else data[token] * np.float32(chain.repetition_penalty)
        )
    counts = {t: generated.count(t) for t in set(generated)}
    for token in sorted(counts) if chain.presence_penalty else []:
        data[token] = (
            data[token] - np.float32(chain.presence_penalty) if data[token] >= 0 else data[token] + np.float32(chain.presence_penalty)
        )
    for token in sorted(counts) if chain.frequency_penalty else []:
        step = np.float32(chain.frequency_penalty * counts[token])
        data[token] = data[token] - step if data[token] >= 0 else data[token] + step
    vector = list(enumerate(data))
    if 0 < chain.top_k < len(data):
        heap = [(v, i) for i, v in vector[: chain.top_k]]
        heapq.heapify(heap)
        for i, v in vector[chain.top_k :]:
            if v > heap[0][0]:
                heapq.heapreplace(heap, (v, i))
        vector = [(i, v) for v, i in heap]
    top = max(v for _, v in vector)
    exps = [(i, np.float32(np.exp(np.float32((v - top) / np.float32(chain.temperature))))) for i, v in vector]
    total = np.float32(sum(e for _, e in exps))
    vector = [(i, e / total) for i, e in exps]
    if chain.top_p < 1:
        vector.sort(key=lambda item: -item[1])
        running, size = np.float32(0), 0
        for _, p in vector:
            running += p
            size += 1
            if running > chain.top_p:
                break
        vector = vector[:size]
    weights = np.array([p for _, p in vector], dtype=np.float64)
    return int(vector[int(rng.choice(len(vector), p=weights / weights.sum()))][0])


CHAINS = [
    GenAIChain(temperature=0.7, top_k=5),
    GenAIChain(temperature=1.6, top_p=0.8),
    GenAIChain(temperature=1.3, top_k=6, top_p=0.7),
    GenAIChain(temperature=0.9, top_p=0.85, repetition_penalty=1.5, presence_penalty=0.4, frequency_penalty=0.3),
]


@pytest.mark.parametrize("chain", CHAINS, ids=lambda c: c.describe())
def test_the_law_matches_a_replay_of_the_transforms(chain: GenAIChain) -> None:
    rng = np.random.default_rng(40)
    prompt, generated = [3, 5], [0, 0, 6]
    law = chain.probs(ROW, prompt, generated)
    draws = 20_000
    counts = np.bincount([replay(chain, ROW, prompt, generated, rng) for _ in range(draws)], minlength=ROW.size)
    assert np.all(counts[law == 0] == 0)
    support = law > 0
    assert stats.chisquare(counts[support], law[support] * draws).pvalue > 1e-4


def test_top_p_acts_on_the_tempered_law_after_top_k() -> None:
    # llama.cpp's order (top-p on the untempered row) is another law on this row; a replay of GenAI's tells them apart.
    genai = GenAIChain(temperature=2.0, top_k=6, top_p=0.6)
    other = LlamaChain(temperature=2.0, top_k=6, top_p=0.6).probs(ROW)
    law = genai.probs(ROW)
    assert np.abs(law - other).sum() > 0.1
    rng = np.random.default_rng(7)
    draws = 20_000
    counts = np.bincount([replay(genai, ROW, [], [], rng) for _ in range(draws)], minlength=ROW.size)
    assert stats.chisquare(counts[law > 0], law[law > 0] * draws).pvalue > 1e-4
    assert (
        np.any(counts[other == 0] > 0)
        or stats.chisquare(counts[other > 0], other[other > 0] * counts[other > 0].sum() / other[other > 0].sum()).pvalue < 1e-6
    )


def test_top_p_keeps_the_token_at_which_the_sum_exceeds_p_strictly() -> None:
    probs = np.array([0.5, 0.25, 0.125, 0.125])
    logits = np.log(probs)
    assert np.count_nonzero(GenAIChain(top_p=0.75).probs(logits)) == 3  # 0.5 + 0.25 is not > 0.75: one more is kept
    assert np.count_nonzero(GenAIChain(top_p=0.7).probs(logits)) == 2


def test_presence_and_frequency_penalties_move_logits_towards_zero() -> None:
    chain = GenAIChain(presence_penalty=0.5, frequency_penalty=0.25)
    row = chain.penalised(np.array([1.0, -1.0, 2.0]), prompt=[2], generated=[0, 1, 1])
    assert row.tolist() == [1.0 - 0.5 - 0.25, -1.0 + 0.5 + 0.5, 2.0]  # the prompt's token is not penalised


def test_repetition_penalty_covers_prompt_and_generated_tokens_once() -> None:
    row = GenAIChain(repetition_penalty=2.0).penalised(np.array([1.0, -1.0, 2.0, 4.0]), prompt=[2, 2], generated=[1, 1])
    assert row.tolist() == [1.0, -2.0, 1.0, 4.0]


def test_a_fixture_whose_cut_removes_nothing_is_refused() -> None:
    with pytest.raises(ChainFixtureError, match="top-k removes only"):
        GenAIChain(top_k=7).fixture_law(lambda _prefix: np.array([0.0] * 7 + [-40.0]), 2, 8)


def test_the_fixture_law_applies_penalties_with_the_prefix() -> None:
    chain = GenAIChain(temperature=1.0, frequency_penalty=1.0)
    law = chain.fixture_law(lambda _prefix: np.array([1.0, 0.5, 0.2]), 2, 3).reshape(3, 3)
    first = chain.probs(np.array([1.0, 0.5, 0.2]))
    np.testing.assert_allclose(law[0], first[0] * chain.probs(np.array([1.0, 0.5, 0.2]), generated=[0]), rtol=1e-12)
