"""The TV distance a library target designs its direct cases at (``cases.library_epsilon``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specwatch.cases import DIRECT_CASES, LARGE_VOCAB_EPSILON, LIBRARY_DIRECT_EPSILON, library_epsilon, select


@pytest.mark.unit
def test_direct_cases_are_designed_at_0_05_and_a_vocabulary_of_10_000_or_more_at_0_1() -> None:
    designs = {c.id: library_epsilon(c) for c in DIRECT_CASES}
    assert designs["direct/large_vocab/V50257/g1"] == LARGE_VOCAB_EPSILON == 0.1
    assert designs["direct/llm_like/V1024/g4"] == LIBRARY_DIRECT_EPSILON == 0.05
    assert {e for i, e in designs.items() if i != "direct/large_vocab/V50257/g1"} == {0.05}


@pytest.mark.unit
def test_a_higher_floor_or_a_case_designed_coarser_wins() -> None:
    (large,) = select(["direct/large_vocab/V50257/g1"], DIRECT_CASES)
    (small,) = select(["direct/far_apart/V8/g1"], DIRECT_CASES)
    assert library_epsilon(large, 0.3) == 0.3  # Triton's interpreter designs every case at 0.3
    assert library_epsilon(small, 0.3) == 0.3
    assert library_epsilon(replace(small, epsilon=0.2)) == 0.2
    assert library_epsilon(replace(small, id="direct/far_apart/V10000/g1")) == 0.1
    assert library_epsilon(replace(small, id="direct/far_apart/V9999/g1")) == 0.05
