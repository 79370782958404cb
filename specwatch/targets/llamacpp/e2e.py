"""End-to-end cases of the llama.cpp target: its speculative paths against exact laws of the tiny GGUF models.

Per path and chain (processing off and on) a sampling case, a greedy case per speculative path, and the forward of
the target GGUF against its float64 reference (the experiments: :mod:`.experiments`); the server's cases
(:mod:`.server_cases`) join them. A path this build lacks (no llama-cpp-python, no prompt lookup, a tool that did not
build) is skipped with the reason.
"""

from __future__ import annotations

from typing import Any, Protocol

from specwatch.cases import Case
from specwatch.targets.base import ForwardExperiment
from specwatch.targets.llamacpp.build import tool_missing, tool_path
from specwatch.targets.llamacpp.chain import LlamaChain
from specwatch.targets.llamacpp.experiments import HORIZON, LENGTH, GenerateExperiment, GreedyExperiment
from specwatch.targets.llamacpp.models import FORWARD_TOLERANCE, VOCAB
from specwatch.targets.llamacpp.paths import GAMMA, IGNORE_EOS, PythonGenerate, SpeculativeTool, forward_difference
from specwatch.targets.llamacpp.server_cases import server_cases

#: Each cut removes at least 1 % of the mass at every position of the joint law, with EOS banned or not (checked
#: when the law is built: ChainFixtureError); no enumerated row lies within float noise of a boundary.
PROCESSING_ON = {"temperature": 0.8, "top_k": 5, "top_p": 0.92, "min_p": 0.15}
PROCESSING_DESCRIPTION = "T 0.8, top-k 5, top-p 0.92, min-p 0.15"


class Installed(Protocol):
    @property
    def module(self) -> Any: ...
    @property
    def info(self) -> dict[str, Any] | None: ...
    @property
    def features(self) -> dict[str, bool]: ...


def e2e_cases(adapter: Installed) -> tuple[Case, ...]:
    speculative = tool_path(adapter.info, "llama-speculative")
    no_tool = None if speculative is not None else tool_missing(adapter.info, "llama-speculative")
    no_python = None if adapter.module is not None else "no llama-cpp-python: a llama.cpp checkout (--source) builds the tools only"
    no_lookup = no_python or (None if adapter.features.get("prompt_lookup_decoding") else "llama_cpp has no LlamaPromptLookupDecoding")
    chains = {"plain": ({}, "processing off"), "processed": (PROCESSING_ON, PROCESSING_DESCRIPTION)}
    cases: list[Case] = []
    described = f"joint law of the first {LENGTH} tokens, every token of {HORIZON} against its conditional law"

    def add(case_id: str, what: str, make: Any, skip: str | None) -> None:
        cases.append(Case(id=case_id, family="e2e", description=what, epsilon=0.1, make_experiment=make, skip_reason=skip))

    for label, (settings, desc) in chains.items():
        chain = LlamaChain(**settings)  # type: ignore[arg-type]
        banned = LlamaChain(**settings, banned=IGNORE_EOS)  # type: ignore[arg-type]
        add(
            f"e2e/python_control/{label}",
            f"llama-cpp-python Llama.generate, no drafting ({desc}): {described}",
            lambda device, c=chain: GenerateExperiment(PythonGenerate(lookup=False), c, speculative=False),
            no_python,
        )
        add(
            f"e2e/python_prompt_lookup/{label}",
            f"llama-cpp-python Llama.generate with LlamaPromptLookupDecoding ({GAMMA} drafts, exact-match verification; "
            f"{desc}): {described}",
            lambda device, c=chain: GenerateExperiment(PythonGenerate(lookup=True), c, speculative=True),
            no_lookup,
        )
        add(
            f"e2e/speculative/{label}",
            f"llama-speculative (a process per trial; the joint law rides along), draft model, up to {GAMMA} drafts, "
            f"--ignore-eos ({desc}; temperature > 0: r <= p/q against the draft's top candidate, residual max(0, p - q)): "
            f"{described}",
            lambda device, c=banned: GenerateExperiment(SpeculativeTool(speculative), c, speculative=True, process_per_trial=True),  # type: ignore[arg-type]
            no_tool,
        )
    add(
        "e2e/greedy/python_prompt_lookup",
        "temperature 0: Llama.generate with prompt lookup equals plain greedy decoding of the float64 reference",
        lambda device: GreedyExperiment(PythonGenerate(lookup=True)),
        no_lookup,
    )
    add(
        "e2e/greedy/speculative",
        "temperature 0: llama-speculative (draft model, --ignore-eos) equals plain greedy decoding of the float64 reference",
        lambda device: GreedyExperiment(SpeculativeTool(speculative), banned=IGNORE_EOS),  # type: ignore[arg-type]
        no_tool,
    )
    add(
        "e2e/forward/gguf_reference",
        f"llama.cpp's forward of the tiny target GGUF equals the float64 reference within {FORWARD_TOLERANCE:g} (8 random sequences)",
        lambda device: ForwardExperiment(forward_difference, vocab=VOCAB, tolerance=FORWARD_TOLERANCE, engine="llama.cpp"),
        no_python,
    )
    cases += server_cases(adapter)
    return tuple(cases)
