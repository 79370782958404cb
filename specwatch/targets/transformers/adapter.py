"""The transformers adapter: what the installed library offers, found by looking, and the cases it runs.

Direct cases run the fixture battery through ``_speculative_sampling`` (:mod:`.bindings`). End-to-end cases run
``generate()`` with tiny models (:mod:`.models`) against exact laws (:mod:`.experiments`), including the drafting
heads (:mod:`.heads`). A path the installed version lacks is skipped with its reason.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from specwatch.cases import DIRECT_CASES, EDGE_CASES, Case, library_epsilon
from specwatch.experiments import Experiment
from specwatch.protocol import LibraryIdentity
from specwatch.sampling import Processing, Sampler
from specwatch.targets import TargetError
from specwatch.targets.base import Adapter, AdapterError, refusing_sampler
from specwatch.targets.transformers.bindings import generation_config_fields, speculative_sampling_sampler
from specwatch.targets.transformers.experiments import (
    E2E_COVERAGE,
    E2E_DRAFTS,
    E2E_EPSILON,
    GenerateExperiment,
    GreedyEquivalenceExperiment,
)
from specwatch.targets.transformers.heads import head_cases
from specwatch.targets.transformers.models import UNREACHABLE_EOS, near_copy_models

#: The direct battery is designed at ``cases.library_epsilon`` in the default profile (each trial is one call; 1.4 ms
#: at V = 50,257); ``--quick`` tests this subset at ``runner.QUICK_EPSILON``.
QUICK_DIRECT = frozenset(
    {
        "direct/far_apart/V8/g1",
        "direct/close/V64/g5",
        "direct/near_identical/V64/g5",
        "direct/temperature_target/V64/g3",
        "direct/top_p_target/V64/g3",
        "direct/disjoint/V8/g3",
        "direct/p_equals_q/V64/g3",
        "direct/transformers_target_distribution/V10/g3",
    }
)
#: Processing that bites on the 6-token models: on every row the joint law enumerates, top-k removes at
#: least 0.15 of the tempered mass and top-p at least 0.01 of what top-k kept, with boundary margins of 0.025
#: (asserted when a case is built). The earlier T 0.7, top-k 3, top-p 0.9 never let top-p remove a token.
PROCESSING_ON = Processing(temperature=2.0, top_k=4, top_p=0.7)
PROCESSING_DESCRIPTION = "temperature 2, top-k 4, top-p 0.7"
#: Larger vocabularies for the conditional check (the quick profile keeps the smaller), their processing
#: (top-k at the library's usual 50) and head scale (peaked rows, most of the mass on a few dozen tokens).
LARGE_VOCABS: tuple[tuple[int, bool], ...] = ((256, False), (1024, False))
LARGE_VOCAB_PROCESSING = Processing(temperature=0.7, top_k=50, top_p=0.9)
LARGE_VOCAB_SCALE = 8.0


@dataclass
class TransformersAdapter(Adapter):
    """What the installed transformers offers, found by looking, not by version tables."""

    module: ModuleType
    version: str
    speculative_sampling: Callable[..., Any] | None
    features: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def prepare(cls, variant: str) -> None:
        """``mutant:NAME``: plant the library-level mutant NAME in the imported library (target
        ``transformers+mutant:NAME``, :mod:`.mutants`)."""
        from specwatch.targets.transformers.mutants import apply_mutant  # noqa: PLC0415 - only for a mutant target

        if not variant.startswith("mutant:"):
            raise TargetError(f"transformers takes the variant mutant:NAME, got {variant!r}")
        try:
            apply_mutant(variant.removeprefix("mutant:"))
        except KeyError as exc:
            raise TargetError(str(exc.args[0])) from exc

    @classmethod
    def load(cls) -> TransformersAdapter:
        try:
            transformers = importlib.import_module("transformers")
            utils = importlib.import_module("transformers.generation.utils")
        except Exception as exc:
            raise AdapterError(f"cannot import transformers: {type(exc).__name__}: {exc}") from exc
        logging.getLogger("transformers").setLevel(logging.ERROR)
        fn = getattr(utils, "_speculative_sampling", None)
        generate_params = generation_config_fields(transformers)
        try:
            candidates = importlib.import_module("transformers.generation.candidate_generator")
        except ImportError:
            candidates = None
        features = {
            "speculative_sampling": fn is not None,
            "assistant_model": candidates is not None and hasattr(candidates, "AssistedCandidateGenerator"),
            "prompt_lookup": "prompt_lookup_num_tokens" in generate_params,
            "different_tokenizers": candidates is not None and hasattr(candidates, "AssistedCandidateGeneratorDifferentTokenizers"),
            "early_exit": "assistant_early_exit" in generate_params,
            "mtp": "use_mtp" in generate_params,
            "dflash": candidates is not None and hasattr(candidates, "DFlashTokenCandidateGenerator"),
        }
        return cls(module=transformers, version=str(transformers.__version__), speculative_sampling=fn, features=features)

    @property
    def path(self) -> str:
        return str(getattr(self.module, "__file__", "") or "")

    def describe(self) -> LibraryIdentity:
        """Library name, version, location, the versions of the dependencies that shape its behaviour here
        (a release's are whatever pip resolved when it was installed) and, for a git checkout, its commit."""
        sha = _git_head(Path(self.path).parent) if self.path else None  # the package folder, as imported
        return LibraryIdentity(
            name="transformers",
            distribution="transformers",
            version=self.version,
            path=self.path,
            git_sha=sha,
            details={"dependencies": _dependency_versions()},
        )

    def sampler(self) -> Sampler:
        """The direct-case sampler (direct cases are skipped when the version has none)."""
        fn = self.speculative_sampling
        if fn is None:
            return refusing_sampler(f"transformers {self.version} has no generation.utils._speculative_sampling")
        return speculative_sampling_sampler(fn)

    def cases(self) -> tuple[Case, ...]:
        """Direct cases (skipped without _speculative_sampling) and the end-to-end cases."""
        if self.speculative_sampling is None:
            direct = tuple(_skipped(c, "this version has no _speculative_sampling") for c in DIRECT_CASES + EDGE_CASES)
        else:
            # One Python call per trial (60 us; 1.4 ms at V = 50,257): the battery is designed at TV 0.05
            # here, 0.1 for the large vocabulary, and a cheap subset forms the quick profile.
            direct = tuple(
                replace(
                    c,
                    epsilon=library_epsilon(c),
                    quick=c.id in QUICK_DIRECT,
                )
                for c in DIRECT_CASES
            )
            direct += EDGE_CASES  # deterministic: a few calls each, in every profile
        return direct + self._e2e_cases()

    def _e2e_cases(self) -> tuple[Case, ...]:
        cases: list[Case] = []
        for processing, label in ((Processing(), "plain"), (PROCESSING_ON, "processed")):
            desc = "processors off" if label == "plain" else PROCESSING_DESCRIPTION
            cases.append(
                self._sampling_case(
                    f"e2e/control/{label}", f"plain sampling, no assistant ({desc}): checks the reference law", processing, {}
                )
            )
            cases.append(
                self._sampling_case(
                    f"e2e/assistant_model/{label}",
                    f"assistant model with the same tokenizer ({desc})",
                    processing,
                    {"assistant_model": True},
                    feature="assistant_model",
                )
            )
            cases.append(
                self._sampling_case(
                    f"e2e/early_exit/{label}",
                    f"early-exit assistant: the target's first layer drafts ({desc})",
                    processing,
                    {"assistant_early_exit": 1},
                    feature="early_exit",
                )
            )
            cases.append(
                self._sampling_case(
                    f"e2e/different_tokenizers/{label}",
                    f"assistant with a different, partly overlapping vocabulary: universal assisted generation ({desc})",
                    processing,
                    {"assistant_model": "other_vocabulary", "tokenizer": "target", "assistant_tokenizer": "assistant"},
                    feature="different_tokenizers",
                )
            )
            cases.append(
                self._sampling_case(
                    f"e2e/prompt_lookup/{label}",
                    f"prompt lookup decoding ({desc})",
                    processing,
                    {"prompt_lookup_num_tokens": E2E_DRAFTS},
                    feature="prompt_lookup",
                )
            )
        for vocab, quick in LARGE_VOCABS:
            cases.append(self._large_vocab_case(vocab, quick=quick))
        cases.append(self._greedy_case("e2e/greedy/assistant_model", {"assistant_model": True}, "assistant_model"))
        cases.append(self._greedy_case("e2e/greedy/prompt_lookup", {"prompt_lookup_num_tokens": E2E_DRAFTS}, "prompt_lookup"))
        cases.extend(head_cases(self))  # multi-token prediction, DFlash, model-specific assistants
        return tuple(cases)

    def _sampling_case(
        self, case_id: str, description: str, processing: Processing, options: dict[str, Any], feature: str | None = None
    ) -> Case:
        skip = None if feature is None or self.features.get(feature) else f"transformers {self.version} has no {feature} path"

        def make(device: torch.device) -> Experiment:
            return GenerateExperiment(self.module, processing, options, device, coverage=E2E_COVERAGE)

        # Quick profile: the speculative paths with processors on (they exercise the most code).
        quick = processing is PROCESSING_ON and feature is not None
        return Case(
            id=case_id, family="e2e", description=description, epsilon=E2E_EPSILON, make_experiment=make, skip_reason=skip, quick=quick
        )

    def _large_vocab_case(self, vocab: int, *, quick: bool) -> Case:
        """The assistant-model path over a V-token vocabulary: the conditional check needs no enumeration, so
        every emitted token is tested against its law; the joint check is the first token's law (V cells)."""
        skip = None if self.features.get("assistant_model") else f"transformers {self.version} has no assistant_model path"

        def models(transformers: ModuleType, device: torch.device) -> tuple[Any, Any]:
            return near_copy_models(transformers, device, vocab=vocab, scale=LARGE_VOCAB_SCALE)

        def make(device: torch.device) -> Experiment:
            return GenerateExperiment(
                self.module,
                LARGE_VOCAB_PROCESSING,
                {"assistant_model": True},
                device,
                models=models,
                length=1,
                vocab=vocab,
                coverage=E2E_COVERAGE,
            )

        return Case(
            id=f"e2e/assistant_model/V{vocab}",
            family="e2e",
            description=f"assistant model over a {vocab}-token vocabulary (temperature 0.7, top-k 50, top-p 0.9): every emitted "
            "token against its exact conditional law",
            epsilon=E2E_EPSILON,
            make_experiment=make,
            skip_reason=skip,
            quick=quick,
        )

    def _greedy_case(self, case_id: str, options: dict[str, Any], feature: str) -> Case:
        skip = None if self.features.get(feature) else f"transformers {self.version} has no {feature} path"
        models = near_copy_models if options.get("assistant_model") is True else None

        def make(device: torch.device) -> Experiment:
            return GreedyEquivalenceExperiment(
                self.module, options, device, pad_token_id=UNREACHABLE_EOS, models=models, coverage=E2E_COVERAGE
            )

        return Case(
            id=case_id,
            family="e2e",
            description="do_sample=False: assisted output equals plain greedy output exactly (64 prompts)",
            epsilon=0.1,
            make_experiment=make,
            skip_reason=skip,
        )


#: Dependencies of transformers that the cases exercise (tokenizers build the vocabularies, the hub and
#: safetensors load and save configs and weights).
_DEPENDENCIES = ("tokenizers", "huggingface-hub", "safetensors")


def _dependency_versions() -> str:
    """``name==version`` of each of :data:`_DEPENDENCIES` that is installed, space-separated."""
    found = []
    for name in _DEPENDENCIES:
        try:
            found.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return " ".join(found)


def _git_head(package: Path) -> str | None:
    """The commit of the checkout the package was imported from, if git tracks it there.

    Git runs in the import root (the package's parent, not resolved through links) and must track the
    package itself: a library installed in a virtual environment inside some other repository gets no
    commit from that repository.
    """

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=package.parent, capture_output=True, text=True, timeout=10, check=False)  # noqa: S603, S607

    try:
        tracked = git("ls-files", "--error-unmatch", package.name)
        head = git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() if tracked.returncode == 0 and head.returncode == 0 else None


def _skipped(case: Case, reason: str) -> Case:
    return replace(case, make_step=None, skip_reason=reason)
