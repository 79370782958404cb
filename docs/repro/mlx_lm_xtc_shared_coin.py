"""mlx-lm 0.32.2: XTC draws one coin per sampler call, shared by every row of the call (not yet a suite finding).

``apply_xtc`` (``mlx_lm/sample_utils.py``, line 265) decides whether to cut with ``mx.random.uniform(0, 1) >
xtc_probability``: a scalar, drawn once per call whatever the number of rows. ``generate_step`` samples one row a
call, but ``speculative_generate_step`` without logits processors samples the target's ``num_draft_tokens + 1`` rows
of a round in one call (``_process_and_sample(None, logits.squeeze(0))``, ``mlx_lm/generate.py`` line 585): the
tokens of a round that are emitted together (the accepted drafts and the target's next token) share one XTC
decision, where plain generation draws one per token. The law of each token alone is unchanged; their joint law is
not. On the suite's tiny target (prompt ``abcab``, 3 drafts, XTC 0.5 at threshold 0.2) the exact total variation of
the first two tokens from the plain law is 0.006, at threshold 0.1 0.05: below the 0.1 the quick design detects,
so ``e2e/draft/k3/xtc`` passes. With processors the path samples row by row and draws a coin per row.

This script shows the shared coin on two identical rows (probabilities 0.6, 0.3, 0.05, 0.05; XTC 0.5 at 0.1 removes
the top token when applied): independent coins would emit the top token in both rows with probability
0.3 ** 2 = 0.09, a shared one with 0.5 * 0.6 ** 2 = 0.18. Seen: 0.193 in 4000 calls (row 0 alone: 0.325).

Minimal patch: draw the coin per row, ``mx.random.uniform(0, 1, shape=logits.shape[:-1] + (1,))``.

    PYTHONPATH=<cache>/pip/mlx-lm__0.32.2 python docs/repro/mlx_lm_xtc_shared_coin.py [CALLS]
"""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import make_sampler


def main(calls: int) -> None:
    sampler = make_sampler(temp=1.0, xtc_probability=0.5, xtc_threshold=0.1)
    row = np.log(np.array([0.6, 0.3, 0.05, 0.05], dtype=np.float32))
    rows = mx.array(np.stack([row, row]))
    mx.random.seed(0)
    both = first = 0
    for _ in range(calls):
        tokens = np.array(sampler(rows)).tolist()
        both += tokens == [0, 0]
        first += tokens[0] == 0
    print(f"P(row 0 emits the top token) {first / calls:.3f}; P(both rows do) {both / calls:.3f}")  # noqa: T201
    print(f"independent coins: {(first / calls) ** 2:.3f} (exact 0.09); one shared coin: exact 0.18")  # noqa: T201


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4000)
