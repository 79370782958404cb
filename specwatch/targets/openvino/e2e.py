"""End-to-end cases of the OpenVINO GenAI target: ``LLMPipeline`` with a draft model, with prompt lookup, and plain
(the control), against exact laws of the tiny IR models (the experiments: :mod:`.experiments`).

Sampling cases (temperature > 0) per path: processing off, top-k, top-p, each penalty and all together; 1 and
several assistant tokens, or the draft's confidence threshold instead; prefix caching on (GenAI's default) and off.
Greedy cases (temperature 0) per speculative path against greedy decoding of the float64 reference, with and without
a repetition penalty, prefix caching on and off. The IR's forward against the float64 reference. A path the release
lacks is skipped with the reason.
"""

from __future__ import annotations

from typing import Any, Protocol

from specwatch.cases import Case
from specwatch.targets.base import ForwardExperiment
from specwatch.targets.openvino.chain import GenAIChain
from specwatch.targets.openvino.experiments import HORIZON, LENGTH, GenerateExperiment, GreedyExperiment, PathSpec
from specwatch.targets.openvino.models import FORWARD_TOLERANCE, VOCAB, forward_difference

#: Each active cut removes at least 1 % of the mass at every position of the joint law after the prompt, and no
#: enumerated row lies within float noise of a boundary (checked when the law is built: ChainFixtureError).
SETTINGS: dict[str, GenAIChain] = {
    "plain": GenAIChain(),
    "top_k": GenAIChain(top_k=5),
    "top_p": GenAIChain(top_p=0.8),
    "repetition": GenAIChain(repetition_penalty=1.5),
    "presence": GenAIChain(presence_penalty=1.0),
    "frequency": GenAIChain(frequency_penalty=0.7),
    "all_on": GenAIChain(temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3),
}
#: Assistant tokens per round where a case does not say otherwise.
K = 3
#: The draft's confidence threshold of the threshold cases (``assistant_confidence_threshold``, instead of a number of
#: assistant tokens): the draft drafts until the probability of its sampled token falls below it, which for the tiny
#: draft at temperature 1 ends rounds after 1 to several drafts. At temperature 0 GenAI pauses after every greedy
#: draft (its greedy token carries log probability 0), so a greedy round drafts one token.
CONFIDENCE = 0.3


class Installed(Protocol):
    @property
    def features(self) -> dict[str, bool]: ...


def e2e_cases(adapter: Installed) -> tuple[Case, ...]:
    """The end-to-end catalogue (every case in the quick profile)."""
    f = adapter.features
    no_draft = None if f.get("draft_model") and f.get("num_assistant_tokens") else "openvino_genai has no draft_model"
    no_lookup = None if f.get("prompt_lookup") else "openvino_genai's GenerationConfig has no max_ngram_size (prompt lookup)"
    no_cache = None if f.get("prefix_caching") else "openvino_genai's SchedulerConfig has no enable_prefix_caching"
    no_threshold = no_draft or (None if f.get("assistant_confidence_threshold") else "openvino_genai has no assistant_confidence_threshold")
    skips = {"plain": None, "draft": no_draft, "lookup": no_lookup}
    described = f"joint law of the first {LENGTH} tokens, every token of {HORIZON} against its conditional law"
    cases: list[Case] = []

    def add(case_id: str, what: str, make: Any, skip: str | None) -> None:
        cases.append(Case(id=case_id, family="e2e", description=what, epsilon=0.1, make_experiment=make, skip_reason=skip))

    def sampling(kind: str, setting: str, k: int = K, *, cache: bool = True, confidence: float = 0.0) -> None:
        path = PathSpec(kind, cache, 0 if kind == "plain" or confidence else k, confidence)
        chain = SETTINGS[setting]
        name = kind if kind == "plain" else f"{kind}/c{confidence:g}" if confidence else f"{kind}/k{k}"
        add(
            f"e2e/{name}/{setting}" + ("" if cache else "/no_prefix_cache"),
            f"LLMPipeline.generate ({path.describe()}; {chain.describe()}): {described}",
            lambda device, p=path, c=chain: GenerateExperiment(p, c),
            (no_threshold if confidence else skips[kind]) or (None if cache else no_cache),
        )

    for setting in ("plain", "all_on"):
        sampling("plain", setting)
    for kind in ("draft", "lookup"):
        sampling(kind, "plain", 1)
        for setting in SETTINGS:
            sampling(kind, setting)
        sampling(kind, "plain", cache=False)
        sampling(kind, "all_on", 1, cache=False)
    for setting, cache in (("plain", True), ("all_on", True), ("plain", False)):
        sampling("draft", setting, cache=cache, confidence=CONFIDENCE)
    greedy = [
        (kind, k, 0.0, cache, p)
        for kind in ("draft", "lookup")
        for k, cache, p in ((1, True, None), (K, True, None), (K, False, None), (K, True, SETTINGS["repetition"]))
    ]
    greedy += [("draft", 0, CONFIDENCE, cache, None) for cache in (True, False)]
    for kind, k, confidence, cache, penalties in greedy:
        path = PathSpec(kind, cache, k, confidence)
        extra = "/repetition" if penalties else ""
        add(
            f"e2e/greedy/{kind}/{f'c{confidence:g}' if confidence else f'k{k}'}{extra}" + ("" if cache else "/no_prefix_cache"),
            f"temperature 0{', repetition penalty 1.5' if penalties else ''}: LLMPipeline.generate ({path.describe()}) "
            "equals greedy decoding of the float64 reference (prompts of 1 to 8 tokens)",
            lambda device, p=path, r=penalties: GreedyExperiment(p, penalties=r),
            (no_threshold if confidence else skips[kind]) or (None if cache else no_cache),
        )
    add(
        "e2e/forward/ir_reference",
        f"OpenVINO's forward of the tiny target IR (f32) equals the float64 reference within {FORWARD_TOLERANCE:g} (8 random sequences)",
        lambda device: ForwardExperiment(forward_difference, vocab=VOCAB, tolerance=FORWARD_TOLERANCE, engine="OpenVINO"),
        None,
    )
    return tuple(cases)
