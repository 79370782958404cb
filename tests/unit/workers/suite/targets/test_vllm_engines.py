"""The oracle of the vLLM end-to-end cases (runs without vLLM: the tiny models are saved with transformers)."""

from __future__ import annotations

import numpy as np
import torch

from workers.suite.sampling import Processing
from workers.suite.targets.vllm.e2e import PROCESSING_ON, PROMPT
from workers.suite.targets.vllm.engines import E2E_VOCAB, conditional_logits, target_oracle, tiny_models


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
