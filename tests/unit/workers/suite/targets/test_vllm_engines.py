"""The oracle of the vLLM end-to-end cases (runs without vLLM: the tiny models are saved with transformers)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from workers.suite.conditional import MIN_REMOVED
from workers.suite.laws import sequence_law
from workers.suite.sampling import Processing
from workers.suite.targets.vllm.e2e import PROCESSING_ON, PROMPT, processed_law
from workers.suite.targets.vllm.engines import E2E_VOCAB, EngineError, conditional_logits, next_token_logits, target_oracle, tiny_models


def test_the_batched_conditional_rows_are_the_oracles_law_at_every_prefix() -> None:
    """Row t of one no-cache forward over prompt + output is p(. | prompt, output[:t]): the conditional check
    and the joint law use the same exact laws, with no off-by-one between them."""
    models = tiny_models()
    generator = torch.Generator().manual_seed(7)
    outputs = torch.randint(0, E2E_VOCAB, (3, 5), generator=generator).tolist()
    logits = conditional_logits(models, PROMPT, outputs)
    assert logits.shape == (3, 5, E2E_VOCAB)
    for processing in (Processing(), PROCESSING_ON):
        oracle = target_oracle(models, processing, PROMPT)
        for i, out in enumerate(outputs):
            for t in range(len(out)):
                row = processing.probs(torch.from_numpy(logits[i, t])).numpy()
                np.testing.assert_allclose(row, oracle(tuple(out[:t])), atol=1e-12)


def test_the_processed_fixture_cuts_real_mass_with_both_processors_on_every_reachable_row() -> None:
    """PROCESSING_ON is accepted when the case is built, and its law is the oracle's joint law."""
    law = processed_law(PROCESSING_ON, PROMPT, 3)
    np.testing.assert_allclose(law, sequence_law(target_oracle(tiny_models(), PROCESSING_ON, PROMPT), 3, E2E_VOCAB), atol=1e-15)
    by_k, by_p = PROCESSING_ON.removed_mass(next_token_logits(tiny_models(), PROMPT, ()))
    assert by_k >= MIN_REMOVED
    assert by_p >= MIN_REMOVED


@pytest.mark.parametrize(
    ("processing", "refusal"),
    [
        # At temperature 0.5 the smallest of 8 tokens carries 0.6 % of the mass on some row: top-k 7 barely cuts.
        (Processing(temperature=0.5, top_k=7), "top-k removes only 0.00582"),
        # Top-p 0.99 after top-k 6 keeps all six tokens on some reachable row: it cuts nothing there.
        (Processing(temperature=0.8, top_k=6, top_p=0.99), "top-p removes only 0 "),
        # Top-p 0.85 alone leaves a cut 1.8e-6 from a token's cumulative mass after prefix (2, 5).
        (Processing(temperature=0.8, top_p=0.85), "prefix (2, 5): the processing boundary"),
    ],
)
def test_a_processing_that_does_not_bite_on_a_reachable_row_is_refused_when_the_case_is_built(processing: Processing, refusal: str) -> None:
    with pytest.raises(EngineError, match=re.escape(refusal)):
        processed_law(processing, PROMPT, 3)
