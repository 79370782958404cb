"""The generation paths of MLX-LM the end-to-end cases drive, each turning seeds into generated tokens.

:class:`StreamGenerate` calls ``mlx_lm.stream_generate`` on the tiny target (:mod:`.models`), with the tiny draft
model and ``num_draft_tokens`` drafts (``speculative_generate_step``: the draft samples its tokens with the same
sampler and processors, the target samples every drafted position in one block and a draft is kept while the
target's own sampled token equals it), or without (``generate_step``). Each trial calls ``mx.random.seed`` with its
own seed first. ``text=True`` calls ``mlx_lm.generate`` instead (the text of the same stream) and reads the tokens
back from it (one character a token).

A trial records the generated tokens and its verification rounds as (drafted, accepted) pairs, read from each
response's ``from_draft``: a round drafts ``min(num_draft_tokens, tokens still to generate)`` tokens, its accepted
drafts come out flagged, then the target's own token unflagged (none when the accepted drafts reach ``max_tokens``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specwatch.targets.mlx.law import MlxSampling
from specwatch.targets.mlx.models import PIECES, mlx_model, tokenizer, tokens_of


class PathError(Exception):
    """A path did not produce what the case needs (not a finding by itself: the case errors with it)."""


@dataclass(frozen=True)
class Trial:
    tokens: list[int]
    #: (drafted, accepted) per verification round; empty without a draft model, None where the path cannot see them.
    rounds: list[tuple[int, int]] | None = field(default_factory=list)


@dataclass(frozen=True)
class StreamGenerate:
    """``stream_generate`` with the draft model and ``num_draft_tokens`` drafts (0: no draft model)."""

    num_draft_tokens: int = 0
    text: bool = False

    def run(
        self, prompt: Sequence[int], sampling: MlxSampling | None, horizon: int, seeds: Sequence[int], *, greedy: bool = False
    ) -> list[Trial]:
        """``horizon`` tokens per seed with the sampler and processors of ``sampling``; ``greedy``: temperature 0
        (``make_sampler``'s argmax) with the processors of ``sampling`` (None: none)."""
        mx = importlib.import_module("mlx.core")
        mlx_lm = importlib.import_module("mlx_lm")
        utils = importlib.import_module("mlx_lm.sample_utils")
        kwargs: dict[str, Any] = {"max_tokens": horizon}
        if self.num_draft_tokens:
            kwargs.update(draft_model=mlx_model("draft"), num_draft_tokens=self.num_draft_tokens)
        if sampling is None and not greedy:
            raise ValueError("a sampling run needs its settings")
        kwargs["sampler"] = utils.make_sampler(temp=0.0) if greedy or sampling is None else utils.make_sampler(**sampling.sampler_kwargs())
        if sampling is not None:
            kwargs["logits_processors"] = utils.make_logits_processors(**sampling.processor_kwargs())
        model, wrapper = mlx_model("target"), tokenizer()
        out: list[Trial] = []
        for seed in seeds:
            mx.random.seed(int(seed))
            if self.text:
                generated = mlx_lm.generate(model, wrapper, list(prompt), **kwargs)
                if any(c not in PIECES for c in generated):
                    raise PathError(f"generate returned {generated!r}: not text of the tiny vocabulary")
                out.append(Trial(tokens_of(generated)))
                continue
            responses = list(mlx_lm.stream_generate(model, wrapper, list(prompt), **kwargs))
            tokens = [int(r.token) for r in responses]
            out.append(Trial(tokens, rounds_of([bool(r.from_draft) for r in responses], self.num_draft_tokens, horizon)))
        return out


def rounds_of(from_draft: Sequence[bool], num_draft_tokens: int, horizon: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per verification round from the responses' ``from_draft`` flags (module docstring); a
    sequence no round structure explains raises :class:`PathError`."""
    if not num_draft_tokens:
        if any(from_draft):
            raise PathError("a call without a draft model returned tokens flagged from_draft")
        return []
    rounds: list[tuple[int, int]] = []
    i = 0
    while i < len(from_draft):
        drafted = min(num_draft_tokens, horizon - i)
        accepted = 0
        while i < len(from_draft) and from_draft[i]:
            accepted, i = accepted + 1, i + 1
        if accepted > drafted:
            raise PathError(f"{accepted} tokens flagged from_draft in a round of {drafted} drafts: {list(from_draft)}")
        if i < len(from_draft):
            i += 1  # the target's own token closes the round
        elif accepted < drafted:
            raise PathError(f"the call ended inside a round ({accepted} of {drafted} drafts accepted): {list(from_draft)}")
        rounds.append((drafted, accepted))
    return rounds
