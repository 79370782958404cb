"""OpenVINO GenAI pipelines over the tiny IR models, driven with token ids: plain generation, draft-model speculative
decoding and prompt-lookup decoding, each with prefix caching on (GenAI's default) or off, every call seeded.

Every call returns the generated ids and, for a speculative pipeline, how many tokens were drafted and accepted
(``extended_perf_metrics``): a pipeline that stopped speculating drafts nothing, and coverage is checked on that.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specwatch.targets.openvino.models import DEFAULT_FAMILY, DEVICE_CONFIG, Family, exported

#: The paths the target drives: ``plain`` (the control), ``draft`` (draft-model speculative decoding) and ``lookup``
#: (prompt-lookup decoding).
PATHS = ("plain", "draft", "lookup")


@dataclass(frozen=True)
class Call:
    tokens: tuple[int, ...]
    #: Tokens the call drafted and accepted (``extended_perf_metrics``). The prompt-lookup pipeline of 2026.4.1.0
    #: returns no speculative metrics: drafted is None and accepted counts the tokens a target step emitted beyond
    #: its one (``perf_metrics.raw_metrics.m_batch_sizes``: tokens per step).
    drafted: int | None
    accepted: int
    #: Tokens each target step emitted (``perf_metrics.raw_metrics.m_batch_sizes``): the first step is the prompt's
    #: forward (one token), each later one a verification round (its accepted drafts and the target's own token).
    steps: tuple[int, ...] = ()


class Pipeline:
    """One ``LLMPipeline`` of ``path`` over ``family``'s IR."""

    def __init__(self, path: str, *, prefix_caching: bool = True, family: Family = DEFAULT_FAMILY) -> None:
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        self.genai = importlib.import_module("openvino_genai")
        self.ov = importlib.import_module("openvino")
        self.path = path
        models = exported(family)
        scheduler = self.genai.SchedulerConfig()
        scheduler.enable_prefix_caching = prefix_caching
        kwargs: dict[str, Any] = {**DEVICE_CONFIG, "scheduler_config": scheduler}
        if path == "draft":
            kwargs["draft_model"] = self.genai.draft_model(str(models.draft), "CPU", **DEVICE_CONFIG)
        elif path == "lookup":
            kwargs["prompt_lookup"] = True
        self.pipe = self.genai.LLMPipeline(str(models.target), "CPU", **kwargs)

    def config(
        self,
        max_new_tokens: int,
        *,
        assistant_tokens: int = 0,
        confidence: float = 0.0,
        ngram: int = 0,
        sample: dict[str, float | int] | None = None,
    ) -> Any:
        """A generation config of ``max_new_tokens`` (``ignore_eos``): greedy unless ``sample`` gives the sampling
        parameters; ``assistant_tokens`` drafts per round, or ``confidence`` (``assistant_confidence_threshold``: the
        draft drafts until its sampled token's probability falls below it; the two are exclusive in GenAI)."""
        config = self.genai.GenerationConfig()
        config.max_new_tokens = max_new_tokens
        config.min_new_tokens = 0
        config.ignore_eos = True
        config.do_sample = sample is not None
        for name, value in (sample or {}).items():
            setattr(config, name, value)
        if assistant_tokens:
            config.num_assistant_tokens = assistant_tokens
        if confidence:
            config.assistant_confidence_threshold = confidence
        if ngram:
            config.max_ngram_size = ngram
        return config

    def generate(self, prompt: Sequence[int], config: Any, *, seed: int | None = None) -> Call:
        """One call; an exception of the pipeline propagates with its text."""
        if seed is not None:
            config.rng_seed = seed
        ids = self.ov.Tensor(np.array([list(prompt)], dtype=np.int64))
        result = self.pipe.generate(ids, config)
        tokens = tuple(int(t) for t in result.tokens[0])
        drafted: int | None = 0
        accepted = 0
        if self.path != "plain":
            metrics = result.extended_perf_metrics
            if metrics is not None:
                drafted, accepted = int(metrics.get_num_draft_tokens()), int(metrics.get_num_accepted_tokens())
            else:
                sizes = [int(size) for size in result.perf_metrics.raw_metrics.m_batch_sizes]
                drafted, accepted = None, sum(sizes) - len(sizes)
        steps = tuple(int(size) for size in result.perf_metrics.raw_metrics.m_batch_sizes)
        return Call(tokens, drafted, accepted, steps)
