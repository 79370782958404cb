"""OpenVINO GenAI 2026.4.1.0, draft-model speculative decoding at temperature > 0 with top-k: reproduction.

Two findings on the same pipeline (tiny random Llama target and draft, fp32 IR, ``INFERENCE_PRECISION_HINT=f32``,
the IR matching a float64 forward of the same weights within 1.5e-6):

1. Prefix caching off: with ``do_sample``, ``temperature=1``, ``top_k=5`` and 1 or 3 assistant tokens, about 6 % of
   seeded calls (124 of 2000 in both) emit a first-two-token sequence that top-k excludes (a token outside the five
   most likely of its row), which plain generation with the same config never does (0 of 2000). The law of plain
   generation matches GenAI's processing law (chi-square p = 0.83); the speculative one does not (p = 0).
2. Prefix caching on (the default): after a few calls the pipeline raises
   ``Check 'content_length <= prompt_ids.size() + m_generated_ids.size()' failed at ... sequence_group.cpp:32`` and
   then stops drafting altogether (0 tokens drafted over the next 300 calls per config): its output then is plain
   generation's, and a check without coverage would call it exact. Upstream's open report of crashes and corrupted
   text with a draft model and sampling (openvinotoolkit/openvino.genai#4190) matches.

Mechanism (``src/cpp/src/sampling/sampler.cpp`` as stored for openvinotoolkit/openvino.genai: not yet matched to the
2026.4.1.0 tag), ``Sampler::sample_from_sequence_group`` and ``Sampler::validate_candidate``: at a drafted position
the target's row is processed and a *fresh* token x is drawn from it (``_multinomial_sample``); the draft token d is
then accepted when ``r_i <= p_i / q_i`` with ``p_i = std::exp(*it_log_prob)`` (the log probability stored with the
drafted token: the draft's) and ``q_i = std::exp(sampled_token.m_log_prob)`` (the target's probability of x, not of
d), and on acceptance ``sampled_token.m_index = *it_token_id`` emits d. The ratio compares the draft's probability of
d with the target's probability of an unrelated token, so d is emitted even where the target's top-k excludes it
(its probability there is 0): the support violation seen. The coin is ``uniform_int_distribution<>(0, 100)`` / 100
(101 values, not a uniform on [0, 1)), and on rejection ``get_p_prime`` rescales x's log probability by
``max(0, p_n - q_n) / std::log(cumulative_prob)`` without ever drawing from the residual ``max(0, p - q)``.
Lossless speculative sampling (Leviathan et al.; Chen et al.) accepts d with ``min(1, p(d) / q(d))``, p and q the
target's and the draft's processed laws at d, and on rejection draws from ``max(0, p - q)`` normalised; a minimal
patch replaces the ratio by ``p_target(d) / q_draft(d)`` (the target's processed probability of the drafted token,
read from the processed row before the draw) and the rejection draw by one from the residual.

Usage (the release and optimum-intel first on PYTHONPATH, e.g. ``specwatch``'s release cache entry; the tiny models are
built and exported by ``specwatch.targets.openvino.models`` into ``SPECWATCH_CACHE_DIR``):

    PYTHONPATH=<cache>/pip/openvino-genai__2026.4.1.0:. python docs/repro/openvino_draft_sampling.py [CALLS]
"""

from __future__ import annotations

import sys

import numpy as np
import openvino as ov
import openvino_genai as genai

from specwatch.targets.openvino.models import DEVICE_CONFIG, all_logits, exported

PROMPT = [0, 3, 1, 4, 0, 3, 1]
TOP_K = 5


def pipeline(draft: bool, prefix_caching: bool) -> genai.LLMPipeline:
    models = exported()
    scheduler = genai.SchedulerConfig()
    scheduler.enable_prefix_caching = prefix_caching
    extra = {"draft_model": genai.draft_model(str(models.draft), "CPU", **DEVICE_CONFIG)} if draft else {}
    return genai.LLMPipeline(str(models.target), "CPU", scheduler_config=scheduler, **DEVICE_CONFIG, **extra)


def run(pipe: genai.LLMPipeline, calls: int, assistant: int, confidence: float = 0.0) -> tuple[int, int, int, list[str]]:
    config = genai.GenerationConfig()
    config.max_new_tokens, config.ignore_eos, config.do_sample = 4, True, True
    config.temperature, config.top_k = 1.0, TOP_K
    if assistant:
        config.num_assistant_tokens = assistant
    if confidence:
        config.assistant_confidence_threshold = confidence
    outside = drafted = 0
    errors: list[str] = []
    ids = ov.Tensor(np.array([PROMPT], dtype=np.int64))
    for seed in range(calls):
        config.rng_seed = seed
        try:
            result = pipe.generate(ids, config)
        except RuntimeError as error:
            errors.append(str(error).splitlines()[0])
            continue
        tokens = list(result.tokens[0])
        for t in range(2):
            row = all_logits([*PROMPT, *tokens[:t]])[-1]
            if tokens[t] not in np.argsort(-row)[:TOP_K]:
                outside += 1
                break
        metrics = result.extended_perf_metrics
        drafted += int(metrics.get_num_draft_tokens()) if metrics is not None else 0
    return calls - len(errors), outside, drafted, errors


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for name, draft, prefix_caching, assistant, confidence in (
        ("plain", False, True, 0, 0.0),
        ("draft, 1 assistant token, prefix caching off", True, False, 1, 0.0),
        ("draft, 3 assistant tokens, prefix caching off", True, False, 3, 0.0),
        ("draft, 3 assistant tokens, prefix caching on", True, True, 3, 0.0),
        ("draft, assistant_confidence_threshold 0.3, prefix caching off", True, False, 0, 0.3),
        ("draft, assistant_confidence_threshold 0.3, prefix caching on", True, True, 0, 0.3),
    ):
        done, outside, drafted, errors = run(pipeline(draft, prefix_caching), calls, assistant, confidence)
        print(f"{name}: {done} calls, {outside} outside top-{TOP_K}, {drafted} tokens drafted, {len(errors)} errors")  # noqa: T201
        for error in sorted(set(errors)):
            print(f"  {error}")  # noqa: T201


if __name__ == "__main__":
    main()
