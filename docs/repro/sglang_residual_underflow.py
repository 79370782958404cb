"""SGLang's chain rejection sampler emits the last vocabulary id, which the target forbids, when the residual
underflows in float32: a standalone reproduction through the release's own ``chain_speculative_sampling_triton``.

One request, one draft, V = 10 (transformers' target-distribution fixture, first row): the target puts all its
mass on token 1 (as after top-k 1 or a grammar mask); the draft is confident in token 1 too (logits -10 everywhere
but +10 on token 1: q(1) = 1 - 1.9e-8, which float32 softmax rounds to 1.0; q = 2.1e-9 on each other token). The
drafter proposes token 9 (or 0), which p forbids: it is rejected for any coin, and the residual max(p - q, 0) is
all zeros in float32 (1.0 - 1.0 on token 1). The kernel's inverse CDF then finds no bucket and falls back to
``VOCAB_SIZE - 1`` (its comment: "acceptable since this case is numerically near-impossible"), a token of target
probability 0. In exact arithmetic the residual is 1.9e-8 on token 1 alone: the emitted token must be 1.

    pip install --no-deps --target /tmp/sglang-0.5.23 sglang==0.5.23  # plus triton and the few modules it imports
    TRITON_INTERPRET=1 PYTHONPATH=/tmp/sglang-0.5.23 python docs/repro/sglang_residual_underflow.py  # or on CUDA

Exits 1 when an emitted token has target probability 0.
"""

from __future__ import annotations

import sys

import torch

from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton

device = "cuda" if torch.cuda.is_available() else "cpu"
V = 10
target = torch.zeros((1, 2, V), device=device)
target[0, 0, 1] = 1.0  # p for the draft's position: all mass on token 1
target[0, 1] = 1.0 / V  # the bonus row (not reached)
draft_logits = torch.full((V,), -10.0)
draft_logits[1] = 10.0
q = torch.softmax(draft_logits, dim=0).to(device)  # float32: q[1] == 1.0
print(f"q[1] = {float(q[1])!r} in float32, q[other] = {float(q[0]):.3g}; p[1] = 1.0")
bad = 0
for draft_token in (9, 0):
    for coin in (0.0, 0.5, 1.0 - 2**-24):
        predicts = torch.full((2,), -1, dtype=torch.int32, device=device)
        accept_index = torch.full((1, 2), -1, dtype=torch.int32, device=device)
        accept_num = torch.zeros(1, dtype=torch.int32, device=device)
        chain_speculative_sampling_triton(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_num,
            candidates=torch.tensor([[1, draft_token]], dtype=torch.int64, device=device),
            retrive_index=torch.tensor([[0, 1]], dtype=torch.int64, device=device),
            retrive_next_token=torch.tensor([[1, -1]], dtype=torch.int64, device=device),
            retrive_next_sibling=torch.tensor([[-1, -1]], dtype=torch.int64, device=device),
            uniform_samples=torch.tensor([[coin, coin]], dtype=torch.float32, device=device),
            uniform_samples_for_final_sampling=torch.tensor([coin], dtype=torch.float32, device=device),
            target_probs=target,
            draft_probs=q.reshape(1, 1, V).contiguous(),
            threshold_single=1.0,
            threshold_acc=1.0,
            deterministic=True,
        )
        emitted = int(predicts[int(accept_index[0, int(accept_num[0])])])
        p = float(target[0, 0, emitted]) if int(accept_num[0]) == 0 else float("nan")
        bad += p == 0.0
        print(f"draft {draft_token}, coins {coin:.8f}: accepted {int(accept_num[0])}, emitted token {emitted} (target probability {p})")
print("A TOKEN THE TARGET FORBIDS WAS EMITTED" if bad else "every emitted token has positive target probability")
sys.exit(1 if bad else 0)
