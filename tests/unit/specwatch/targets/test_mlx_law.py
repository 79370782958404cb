"""MLX-LM's processors and sampler as an exact law (specwatch.targets.mlx.law), against values worked by hand; the
rounds read from ``from_draft`` (specwatch.targets.mlx.paths.rounds_of). No MLX needed: the law is numpy, and the
target's tests against the installed release (tests/e2e/test_mlx_target.py, ``make test-mlx``) compare it with
mlx-lm's own functions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specwatch.targets.mlx.law import LawFixtureError, MlxSampling
from specwatch.targets.mlx.paths import PathError, rounds_of

PROBS = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS = np.log(PROBS) + 2.0  # any shift: the sampler sees log-probabilities


def test_each_penalty_acts_on_the_window_of_the_history_as_mlx_lm_defines_it() -> None:
    x = np.array([2.0, -1.0, 0.5, -3.0])
    history = [0, 1, 1, 3]
    # repetition: a negative logit multiplied, any other divided, once per distinct token
    assert MlxSampling(repetition_penalty=2.0).processed(x, history).tolist() == [1.0, -2.0, 0.5, -6.0]
    # presence: subtracted once per distinct token (token 1 twice in the window: once)
    assert MlxSampling(presence_penalty=0.5).processed(x, history).tolist() == [1.5, -1.5, 0.5, -3.5]
    # frequency: subtracted once per occurrence
    assert MlxSampling(frequency_penalty=0.5).processed(x, history).tolist() == [1.5, -2.0, 0.5, -3.5]
    # the window is the last context_size tokens
    assert MlxSampling(presence_penalty=0.5, context_size=2).processed(x, history).tolist() == [2.0, -1.5, 0.5, -3.5]
    assert MlxSampling(repetition_penalty=2.0).processed(x, []).tolist() == x.tolist()


def test_the_penalties_run_repetition_then_presence_then_frequency() -> None:
    both = MlxSampling(repetition_penalty=2.0, presence_penalty=1.0, frequency_penalty=0.25)
    # 1 / 2 - 1 - 0.25: repetition first (presence first would give (1 - 1) / 2 - 0.25 = -0.25)
    assert both.processed(np.array([1.0, 0.0]), [0]).tolist() == [-0.75, 0.0]


def test_top_p_keeps_a_token_while_the_mass_more_likely_than_it_is_below_p() -> None:
    # mass before tokens 0..3: 0, 0.5, 0.8, 0.95: p = 0.8 keeps {0, 1} (0.8 is not below 0.8), p = 0.81 keeps {0, 1, 2}
    assert np.allclose(MlxSampling(top_p=0.8).probs(LOGITS, []), [0.625, 0.375, 0, 0])
    assert np.allclose(MlxSampling(top_p=0.81).probs(LOGITS, []), np.array([0.5, 0.3, 0.15, 0]) / 0.95)


def test_top_p_keeps_every_token_tied_at_its_cut() -> None:
    tied = np.log(np.array([0.4, 0.2, 0.2, 0.2]))
    assert np.allclose(MlxSampling(top_p=0.5).probs(tied, []), [0.4, 0.2, 0.2, 0.2])


def test_min_p_removes_what_is_less_likely_than_min_p_times_the_top() -> None:
    assert np.allclose(MlxSampling(min_p=0.2).probs(LOGITS, []), np.array([0.5, 0.3, 0.15, 0]) / 0.95)


def test_xtc_removes_the_tokens_above_the_threshold_but_the_least_likely_of_them_with_its_probability() -> None:
    # above 0.2: 0.5 and 0.3; the least of them (0.3) stays: the cut law is (0, 0.3, 0.15, 0.05) / 0.5
    mixed = MlxSampling(xtc_probability=0.5, xtc_threshold=0.2).probs(LOGITS, [])
    assert np.allclose(mixed, 0.5 * PROBS + 0.5 * np.array([0, 0.6, 0.3, 0.1]))
    # one token above the threshold: nothing removed
    assert np.allclose(MlxSampling(xtc_probability=1.0, xtc_threshold=0.4).probs(LOGITS, []), PROBS)


def test_top_k_runs_after_xtc_and_every_cut_before_the_temperature() -> None:
    both = MlxSampling(xtc_probability=0.5, xtc_threshold=0.2, top_k=2)
    assert np.allclose(both.probs(LOGITS, []), 0.5 * np.array([0.625, 0.375, 0, 0]) + 0.5 * np.array([0, 2 / 3, 1 / 3, 0]))
    # top-p on the untempered law keeps {0, 1}; the temperature then sharpens what is left
    cold = MlxSampling(temperature=0.5, top_p=0.8).probs(LOGITS, [])
    assert np.allclose(cold, np.array([0.25, 0.09, 0, 0]) / 0.34)


def test_the_processors_act_before_the_sampler() -> None:
    # presence 10 on token 0 removes it from the lead: top-k 1 keeps token 1
    assert np.allclose(MlxSampling(top_k=1, presence_penalty=10.0).probs(LOGITS, [0]), [0, 1, 0, 0])
    assert MlxSampling(presence_penalty=10.0).greedy(LOGITS, [0]) == (1, pytest.approx(math.log(0.3 / 0.15)))


def test_removed_is_the_mass_each_processor_moves() -> None:
    removed = MlxSampling(top_p=0.8, xtc_probability=0.5, xtc_threshold=0.2).removed(LOGITS, [])
    assert removed["top-p"] == pytest.approx(0.2)
    assert removed["xtc"] == pytest.approx(0.5 * 0.625)  # applied half the time, then removes 0.5 / 0.8 of what top-p left
    presence = MlxSampling(presence_penalty=1.0)
    alone = presence.removed(LOGITS, [0])["presence"]
    assert alone == pytest.approx(0.5 * np.abs(presence.probs(LOGITS, [0]) - PROBS).sum())


def test_margin_is_zero_on_a_boundary_and_a_fixture_on_one_is_refused() -> None:
    on_cut = MlxSampling(top_p=0.8)
    assert on_cut.margin(LOGITS, []) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(LawFixtureError, match="boundary"):
        on_cut.fixture_law(lambda prefix: LOGITS, (), 2, 4)
    assert MlxSampling(top_p=0.7).margin(LOGITS, []) == pytest.approx(0.1)


def test_a_fixture_whose_cut_removes_nothing_is_refused_and_a_good_one_gives_the_product_law() -> None:
    with pytest.raises(LawFixtureError, match="top-k moves only 0"):
        MlxSampling(top_k=3, min_p=0.2).fixture_law(lambda prefix: LOGITS, (), 2, 4)
    law = MlxSampling(top_p=0.7).fixture_law(lambda prefix: LOGITS, (), 2, 4)
    row = np.array([0.625, 0.375, 0, 0])
    assert np.allclose(law, np.outer(row, row).ravel())


def test_bad_settings_are_refused() -> None:
    for bad in ({"temperature": 0.0}, {"min_p": 1.5}, {"xtc_threshold": 0.7}, {"top_k": -1}, {"context_size": 0}):
        with pytest.raises(ValueError, match="must be"):
            MlxSampling(**bad)  # type: ignore[arg-type]


def test_rounds_are_read_from_the_from_draft_flags() -> None:
    # 3 drafts a round, 8 tokens: 2 accepted + the target's own, 0 + own, 3 accepted + own
    flags = [True, True, False, False, True, True, True, False]
    assert rounds_of(flags, 3, 8) == [(3, 2), (3, 0), (3, 3)]
    assert rounds_of([False, True, True], 2, 3) == [(2, 0), (2, 2)]
    assert rounds_of([False, False], 0, 2) == []
    with pytest.raises(PathError, match="ended inside a round"):
        rounds_of([False, True], 3, 3)
    with pytest.raises(PathError, match="flagged from_draft"):
        rounds_of([True, True, True, True], 3, 8)
    with pytest.raises(PathError, match="without a draft model"):
        rounds_of([True], 0, 1)
