"""mlx-lm 0.32.2, speculative decoding with a draft model and logits processors: reproduction.

``speculative_generate_step`` hands its logits processors (repetition, presence and frequency penalties, or the
user's) a token history without the prompt but its last token, where ``generate_step`` hands them the whole prompt
and the output. A penalty over a prompt of several tokens therefore acts on other logits with a draft model than
without one: at temperature 0 the output differs from plain greedy decoding, at temperature > 0 the law differs.

Mechanism (``mlx_lm/generate.py`` of 0.32.2):

- ``generate_step``: the prefill loop adds each processed chunk of the prompt to ``tokens`` (lines 452-453,
  ``tokens = mx.concat([tokens, processed]) ...``) and ``_step`` adds the last prompt token and each sampled token
  (lines 417-418) before calling the processors: the history is prompt + output;
- ``speculative_generate_step``: ``prev_tokens = None`` (line 532); ``_prefill`` (line 587) runs the model over all
  but the last prompt token and never touches ``prev_tokens``; ``_step`` (lines 577-580) starts the history at the
  remaining ``y``, the last prompt token. Every later trim (lines 623-625, 660-661) keeps it relative to that start,
  so the prompt's other tokens are never seen by a processor, at any position.

Minimal patch: seed the history with the prompt before the first round, e.g. after the two ``_prefill`` calls,
``if logits_processors: prev_tokens = prompt.astype(mx.uint32)[:-1]`` (the ``_step`` of the first round then adds
the last prompt token, and the trims at lines 623-625 and 660-661 keep working relative to it). The reproduction
checks this patch too (``--patched``: the history then equals ``generate_step``'s and so do the outputs).

Upstream: the open report about stale processor history in the MTP path (ml-explore/mlx-lm#1175) concerns the
same bookkeeping (``prev_tokens``) in another path; this one is the draft-model path of 0.32.2.

Usage (mlx-lm and MLX first on PYTHONPATH, e.g. ``specwatch``'s release cache entry; on Linux ``mlx[cpu]``):

    PYTHONPATH=<cache>/pip/mlx-lm__0.32.2 python docs/repro/mlx_lm_speculative_penalty_history.py [PROMPTS]
"""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models import llama
from mlx_lm.sample_utils import make_logits_processors, make_sampler

VOCAB = 8


def tiny(seed: int) -> llama.Model:
    """A random 2-layer Llama over 8 tokens with a peaked head (MLX's own initialisation, seeded)."""
    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = llama.Model(args)
    model.lm_head.weight = model.lm_head.weight * 10.0
    mx.eval(model.parameters())
    return model


def histories(path: str, model: llama.Model, draft: llama.Model, prompt: list[int], tokens: int) -> list[list[int]]:
    """The histories a recording processor is handed, per call, on ``path``."""
    seen: list[list[int]] = []

    def record(history: mx.array, logits: mx.array) -> mx.array:
        seen.append(np.array(history).tolist())
        return logits

    run = _run(path, model, draft, prompt, tokens, [record], make_sampler(temp=0.0))
    list(run)
    return seen


def _run(path: str, model, draft, prompt, tokens, processors, sampler):  # noqa: PLR0917 - a script
    p = mx.array(prompt)
    if path == "plain":
        return (int(t) for t, _ in generate_step(p, model, max_tokens=tokens, sampler=sampler, logits_processors=processors))
    return (
        int(t)
        for t, _, _ in speculative_generate_step(
            p, model, draft, num_draft_tokens=3, max_tokens=tokens, sampler=sampler, logits_processors=processors
        )
    )


def patch() -> None:
    """Seed ``prev_tokens`` with the prompt (the minimal patch above), by rewriting the function's source."""
    generate = importlib.import_module("mlx_lm.generate")  # the package's ``generate`` attribute is the function

    source = textwrap.dedent(inspect.getsource(generate.speculative_generate_step))
    anchor = "        y = _prefill(model, model_cache, y)\n"
    assert anchor in source, "0.32.2's source expected"
    source = source.replace(anchor, anchor + "        if logits_processors:\n            prev_tokens = prompt.astype(mx.uint32)[:-1]\n")
    namespace = dict(vars(generate))
    exec(compile(source, generate.__file__, "exec"), namespace)  # noqa: S102 - the patched function, for the check
    globals()["speculative_generate_step"] = namespace["speculative_generate_step"]


def main(prompts: int, patched: bool) -> None:
    if patched:
        patch()
    model = tiny(1)
    draft = tiny(1)
    draft.lm_head.weight = draft.lm_head.weight + 0.5 * mx.random.normal(draft.lm_head.weight.shape) * mx.std(draft.lm_head.weight)
    mx.eval(draft.parameters())
    prompt = [0, 1, 2, 0, 1]
    print("histories handed to a processor, prompt", prompt)  # noqa: T201
    print("  generate_step:           ", histories("plain", model, draft, prompt, 3))  # noqa: T201
    print("  speculative_generate_step:", histories("speculative", model, draft, prompt, 3))  # noqa: T201
    rng = np.random.default_rng(0)
    differ = {1: [0, 0], 2: [0, 0]}  # prompt length 1 or several -> [prompts, outputs that differ]
    for _ in range(prompts):
        length = int(rng.integers(1, 9))
        prompt = rng.integers(0, VOCAB, length).tolist()
        processors = make_logits_processors(repetition_penalty=1.5)
        plain = list(_run("plain", model, draft, prompt, 8, processors, make_sampler(temp=0.0)))
        spec = list(_run("speculative", model, draft, prompt, 8, make_logits_processors(repetition_penalty=1.5), make_sampler(temp=0.0)))
        key = 1 if length == 1 else 2
        differ[key][0] += 1
        differ[key][1] += plain != spec
    print(f"temperature 0, repetition penalty 1.5, 8 tokens{' (patched)' if patched else ''}:")  # noqa: T201
    print(f"  prompts of 1 token: {differ[1][1]} of {differ[1][0]} outputs differ from generate_step's")  # noqa: T201
    print(f"  prompts of 2-8 tokens: {differ[2][1]} of {differ[2][0]} outputs differ from generate_step's")  # noqa: T201


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--patched"]
    main(int(args[0]) if args else 200, "--patched" in sys.argv[1:])
