"""Hugging Face transformers as a target: its real speculative code paths, adapted by feature detection.

Direct cases run the fixture battery through ``transformers.generation.utils._speculative_sampling``
(arguments bound by keyword from its signature, which changed across releases). End-to-end cases run
``generate()`` with tiny randomly initialised models built offline from configs and compare the joint
law of the first generated tokens with the exact law computed from the target model after the same
logits processing (temperature, then top-k, then top-p). A path the installed version lacks is
skipped with its reason.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import logging
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from workers.suite.cases import DIRECT_CASES, EDGE_CASES, Case
from workers.suite.conditional import PIT_BINS, ConditionalBatch, TokenOrder, conditional_batch, pit_null, processing_margin
from workers.suite.experiments import CheckSpec, Coverage, CoverageDesign, Experiment, Layer, Observation, Violation
from workers.suite.laws import sequence_law
from workers.suite.sampling import Processing, Sampler, SpecOutput, SpecStep, sample_rows, uniforms

#: Arguments older releases require that have a single lossless value here.
_FIXED_ARGUMENTS: dict[str, Callable[[int], Any]] = {
    "is_done_candidate": lambda gamma: False,  # 4.40 - 5.17: the last draft is not EOS
    "last_assistant_token_is_eos": lambda gamma: False,  # 4.37 - 4.39
    "max_matches": lambda gamma: gamma,  # 4.37 - 4.39: room for every draft
}


class AdapterError(Exception):
    """The installed library cannot be adapted (a missing entry point, an unknown required argument)."""


def bind_speculative_sampling(
    fn: Callable[..., Any],
    *,
    candidate_input_ids: torch.Tensor,
    candidate_logits: torch.Tensor,
    candidate_length: int,
    new_logits: torch.Tensor,
) -> dict[str, Any]:
    """Keyword arguments for any historical ``_speculative_sampling`` signature.

    Binding by name matters: on 5.18+ a fifth positional argument would become
    ``assistant_ensemble_weight`` (lossy by design), which is always left at its default ``None``.
    """
    params = inspect.signature(fn).parameters
    core = {
        "candidate_input_ids": candidate_input_ids,
        "candidate_logits": candidate_logits,
        "candidate_length": candidate_length,
        "new_logits": new_logits,
    }
    missing = [name for name in core if name not in params]
    if missing:
        raise AdapterError(f"_speculative_sampling has no parameter(s) {missing}; signature {inspect.signature(fn)}")
    kwargs = dict(core)
    for name, param in params.items():
        if name in kwargs or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name == "assistant_ensemble_weight":
            if param.default is not None:
                raise AdapterError("assistant_ensemble_weight defaults to a value: the lossless path needs None")
            continue
        if name in _FIXED_ARGUMENTS:
            kwargs[name] = _FIXED_ARGUMENTS[name](candidate_length)
        elif param.default is param.empty:
            raise AdapterError(f"_speculative_sampling requires unknown argument {name!r}; signature {inspect.signature(fn)}")
    return kwargs


def _log_rows(probs: torch.Tensor) -> torch.Tensor:
    """Logits whose softmax is ``probs`` exactly (zeros become -inf)."""
    return torch.log(probs).to(torch.float32)


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


def speculative_sampling_sampler(fn: Callable[..., Any]) -> Sampler:
    """A Sampler that drafts from q itself (the candidate generator's job) and verifies with ``fn``.

    ``fn`` draws from torch's global RNG, which is seeded once per batch from the case's private
    generator (never inside the loop), so results stay reproducible from the recorded seed.
    """

    def sampler(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
        gamma = step.gamma
        drafts = sample_rows(step.draft_probs, uniforms(n, gamma, generator, step.device))
        q_logits = _log_rows(step.draft_probs)[None]
        p_logits = _log_rows(step.target_probs)[None]
        prompt = torch.zeros((1, 1), dtype=torch.long, device=step.device)
        tokens = torch.full((n, gamma + 1), -1, dtype=torch.long, device=step.device)
        accepted = torch.empty(n, dtype=torch.long, device=step.device)
        ids = torch.cat((prompt.expand(n, 1), drafts), dim=1)
        kwargs = bind_speculative_sampling(
            fn, candidate_input_ids=ids[:1], candidate_logits=q_logits, candidate_length=gamma, new_logits=p_logits
        )
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=step.device))
        torch.manual_seed(seed)
        for i in range(n):
            kwargs["candidate_input_ids"] = ids[i : i + 1]
            valid, n_matches = fn(**kwargs)
            row = valid.reshape(-1)
            tokens[i, : row.numel()] = row
            accepted[i] = int(n_matches)
        return SpecOutput(drafts=drafts, tokens=tokens, n_accepted=accepted)

    return sampler


# ---------------------------------------------------------------------------------------------------
# End-to-end cases: tiny models, generate(), exact sequence laws.

#: TV distance the direct battery is designed for through the library (each trial is one call).
DIRECT_EPSILON = 0.1
LARGE_VOCAB_EPSILON = 0.25
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
#: Tiny vocabulary of the end-to-end models, and how many generated tokens are tested jointly.
E2E_VOCAB = 6
E2E_LENGTH = 2
#: Tokens each end-to-end trial generates (the conditional check tests all of them) and drafts asked per
#: verification: 10 tokens at most 4 per round means at least 3 verification rounds per call.
E2E_HORIZON = 10
E2E_DRAFTS = 3
#: What every speculative end-to-end case must exercise (checked against the observed coverage).
E2E_COVERAGE = CoverageDesign(min_drafts=2, min_rounds=3)
#: An end-of-sequence (and padding) id outside the vocabulary: generation never stops early (4.37
#: needs some EOS) and no generated token is mistaken for padding.
_UNREACHABLE_EOS = E2E_VOCAB
#: The prompt repeats an n-gram so that prompt lookup finds candidates.
_PROMPT: tuple[int, ...] = (1, 2, 3, 4, 1, 2)
#: Processing that bites on the 6-token models: on every row the joint law enumerates, top-k removes at
#: least 0.15 of the tempered mass and top-p at least 0.01 of what top-k kept, with boundary margins of 0.025
#: (asserted when a case is built). The earlier T 0.7, top-k 3, top-p 0.9 never let top-p remove a token.
_PROCESSING_ON = Processing(temperature=2.0, top_k=4, top_p=0.7)
PROCESSING_DESCRIPTION = "temperature 2, top-k 4, top-p 0.7"
#: Larger vocabularies for the conditional check (the quick profile keeps the smaller), their processing
#: (top-k at the library's usual 50) and head scale (peaked rows, most of the mass on a few dozen tokens).
LARGE_VOCABS: tuple[tuple[int, bool], ...] = ((256, False), (1024, False))
LARGE_VOCAB_PROCESSING = Processing(temperature=0.7, top_k=50, top_p=0.9)
LARGE_VOCAB_SCALE = 8.0


@dataclass
class TransformersAdapter:
    """What the installed transformers offers, found by looking, not by version tables."""

    module: ModuleType
    version: str
    speculative_sampling: Callable[..., Any] | None
    features: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def load(cls) -> TransformersAdapter:
        try:
            transformers = importlib.import_module("transformers")
            utils = importlib.import_module("transformers.generation.utils")
        except Exception as exc:
            raise AdapterError(f"cannot import transformers: {type(exc).__name__}: {exc}") from exc
        logging.getLogger("transformers").setLevel(logging.ERROR)
        fn = getattr(utils, "_speculative_sampling", None)
        generate_params = _generation_config_fields(transformers)
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

    def describe(self) -> dict[str, str]:
        """Library name, version, location, the versions of the dependencies that shape its behaviour here
        (a release's are whatever pip resolved when it was installed) and, for a git checkout, its commit."""
        info = {"name": "transformers", "version": self.version, "path": self.path, "dependencies": _dependency_versions()}
        sha = _git_head(Path(self.path).parent) if self.path else None  # the package folder, as imported
        if sha:
            info["git_sha"] = sha
        return info

    def sampler(self) -> Sampler:
        """The direct-case sampler (direct cases are skipped when the version has none)."""
        fn = self.speculative_sampling
        if fn is None:

            def missing(step: SpecStep, n: int, generator: torch.Generator) -> SpecOutput:
                raise AdapterError(f"transformers {self.version} has no generation.utils._speculative_sampling")

            return missing
        return speculative_sampling_sampler(fn)

    def cases(self) -> tuple[Case, ...]:
        """Direct cases (skipped without _speculative_sampling) and the end-to-end cases."""
        if self.speculative_sampling is None:
            direct = tuple(_skipped(c, "this version has no _speculative_sampling") for c in DIRECT_CASES + EDGE_CASES)
        else:
            # One Python call per trial (60 us; 1.4 ms at V = 50,257): the battery is designed at TV 0.1
            # here, 0.25 for the large vocabulary, and a cheap subset forms the quick profile.
            direct = tuple(
                replace(
                    c,
                    epsilon=max(c.epsilon, LARGE_VOCAB_EPSILON if c.step().vocab_size >= 10_000 else DIRECT_EPSILON),
                    quick=c.id in QUICK_DIRECT,
                )
                for c in DIRECT_CASES
            )
            direct += EDGE_CASES  # deterministic: a few calls each, in every profile
        return direct + self._e2e_cases()

    def _e2e_cases(self) -> tuple[Case, ...]:
        cases: list[Case] = []
        for processing, label in ((Processing(), "plain"), (_PROCESSING_ON, "processed")):
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
        from workers.suite.targets.transformers_heads import head_cases  # noqa: PLC0415 - imports this module

        cases.extend(head_cases(self))  # multi-token prediction, DFlash, model-specific assistants
        return tuple(cases)

    def _sampling_case(
        self, case_id: str, description: str, processing: Processing, options: dict[str, Any], feature: str | None = None
    ) -> Case:
        skip = None if feature is None or self.features.get(feature) else f"transformers {self.version} has no {feature} path"

        def make(device: torch.device) -> Experiment:
            return GenerateExperiment(self.module, processing, options, device, coverage=E2E_COVERAGE)

        # Quick profile: the speculative paths with processors on (they exercise the most code).
        quick = processing is _PROCESSING_ON and feature is not None
        return Case(id=case_id, family="e2e", description=description, epsilon=0.1, make_experiment=make, skip_reason=skip, quick=quick)

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
            epsilon=0.1,
            make_experiment=make,
            skip_reason=skip,
            quick=quick,
        )

    def _greedy_case(self, case_id: str, options: dict[str, Any], feature: str) -> Case:
        skip = None if self.features.get(feature) else f"transformers {self.version} has no {feature} path"
        models = near_copy_models if options.get("assistant_model") is True else None

        def make(device: torch.device) -> Experiment:
            return GreedyEquivalenceExperiment(
                self.module, options, device, pad_token_id=_UNREACHABLE_EOS, models=models, coverage=E2E_COVERAGE
            )

        return Case(
            id=case_id,
            family="e2e",
            description="do_sample=False: assisted output equals plain greedy output exactly (64 prompts)",
            epsilon=0.1,
            make_experiment=make,
            skip_reason=skip,
        )


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


def _generation_config_fields(transformers: ModuleType) -> set[str]:
    config = transformers.GenerationConfig()
    return set(vars(config)) | set(inspect.signature(transformers.GenerationConfig.__init__).parameters)


#: Builds (target, draft) models on a device; the draft stands in for ``options["assistant_model"] = True``.
ModelFactory = Callable[[ModuleType, torch.device], tuple[Any, Any]]


def tiny_models(transformers: ModuleType, device: torch.device) -> tuple[Any, Any]:
    """A 2-layer target and a different 1-layer draft Llama over a 6-token vocabulary (seeded).

    The output heads are scaled so next-token laws are peaked but not degenerate.
    """

    return _tiny_llama(transformers, device, seed=1, layers=2), _tiny_llama(transformers, device, seed=2, layers=1)


def near_copy_models(transformers: ModuleType, device: torch.device, *, vocab: int = E2E_VOCAB, scale: float = 12.0) -> tuple[Any, Any]:
    """The tiny target and, as draft, a copy of it with seeded noise on the output head (scale 0.5 of the
    head's spread): greedy drafts agree with the target often but not always, so verifications accept all
    of several drafts as well as some of them (a free-standing random draft almost never agrees)."""
    target = _tiny_llama(transformers, device, seed=1, layers=2, vocab=vocab, scale=scale)
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        head = draft.lm_head.weight
        head.add_(0.5 * head.std() * torch.randn(head.shape, generator=generator).to(head.device))
    return target, draft


def _tiny_llama(
    transformers: ModuleType, device: torch.device, *, seed: int, layers: int, vocab: int = E2E_VOCAB, scale: float = 12.0
) -> Any:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=max(vocab, _UNREACHABLE_EOS),
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).eval().to(device)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


#: Word-level vocabularies: the target's ids are the model's ids; the assistant's vocabulary shares
#: a, b, c, d, lacks e and adds x, y (so some drafts have no target token and are re-encoded).
_TARGET_WORDS = ("<u>", "a", "b", "c", "d", "e")
_ASSISTANT_WORDS = ("<u>", "a", "b", "c", "x", "y", "d")


def word_tokenizer(transformers: ModuleType, words: Sequence[str]) -> Any:
    """A whitespace word-level fast tokenizer built offline with the tokenizers library.

    ``get_vocab()`` lists the tokens in a fixed order (by the SHA-256 of each token), not in the order of
    the library's hash map, which changes from process to process: code that depends on that order
    (universal assisted generation's translator does) then behaves the same in every run, as the recorded
    seed promises. Like most real vocabularies', the order is not the id order.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: PLC0415 - optional

    backend = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=words[0], pad_token=words[0])
    unordered = tokenizer.get_vocab

    def get_vocab() -> dict[str, int]:
        vocab = unordered()
        return {token: vocab[token] for token in sorted(vocab, key=lambda t: hashlib.sha256(t.encode()).hexdigest())}

    tokenizer.get_vocab = get_vocab
    return tokenizer


def _resolve_options(transformers: ModuleType, options: dict[str, Any], draft: Any, device: torch.device) -> dict[str, Any]:
    """generate() options with placeholders replaced by tiny models and tokenizers."""
    resolved = dict(options)
    if resolved.get("assistant_model") is True:
        resolved["assistant_model"] = draft
    elif resolved.get("assistant_model") == "other_vocabulary":
        resolved["assistant_model"] = _tiny_llama(transformers, device, seed=3, layers=1, vocab=len(_ASSISTANT_WORDS))
        resolved["tokenizer"] = word_tokenizer(transformers, _TARGET_WORDS)
        resolved["assistant_tokenizer"] = word_tokenizer(transformers, _ASSISTANT_WORDS)
    return resolved


class DraftObserver:
    """Counts what the library's candidate generators do, by wrapping their own calls without changing them.

    While :meth:`watching` is open, ``get_candidates`` and ``update_candidate_strategy`` of every class in
    ``transformers.generation.candidate_generator`` that defines them are replaced by wrappers that call
    the original with the same arguments, return its result unchanged and record: drafts per
    verification (candidate length returned), accepted drafts (``num_matches`` the library reports after
    the round) and verification rounds per ``generate()`` call. A nested call (a subclass's
    ``super().get_candidates``) is counted once. Process-wide: the suite runs one case at a time per process.
    """

    _METHODS = ("get_candidates", "update_candidate_strategy")

    def __init__(self) -> None:
        self.drafts: dict[int, int] = {}
        self.accepted: dict[int, int] = {}
        self.rounds: dict[int, int] = {}
        self.full = 0
        self.partial = 0
        self._depth = 0
        self._pending: int | None = None
        self._rounds_this_call = 0

    def _got_candidates(self, drafts: int) -> None:
        self._pending = drafts
        self._rounds_this_call += 1
        self.drafts[drafts] = self.drafts.get(drafts, 0) + 1

    def _verified(self, accepted: int) -> None:
        self.accepted[accepted] = self.accepted.get(accepted, 0) + 1
        drafts = self._pending if self._pending is not None else 0
        if drafts >= 2 and accepted >= drafts:
            self.full += 1
        elif drafts >= 2 and 0 < accepted < drafts:
            self.partial += 1
        self._pending = None

    def call_done(self) -> None:
        """Close one generate() call: its number of verification rounds goes into the histogram."""
        self.rounds[self._rounds_this_call] = self.rounds.get(self._rounds_this_call, 0) + 1
        self._rounds_this_call = 0
        self._pending = None

    def coverage(self) -> Coverage:
        return Coverage(
            dict(sorted(self.drafts.items())),
            dict(sorted(self.accepted.items())),
            dict(sorted(self.rounds.items())),
            self.full,
            self.partial,
        )

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        observer = self

        @functools.wraps(original)
        def wrapper(generator: Any, *args: Any, **kwargs: Any) -> Any:
            observer._depth += 1
            try:
                result = original(generator, *args, **kwargs)
            finally:
                observer._depth -= 1
            if observer._depth == 0:
                if name == "get_candidates":
                    input_ids = args[0] if args else kwargs["input_ids"]
                    observer._got_candidates(int(result[0].shape[-1]) - int(input_ids.shape[-1]))
                else:
                    matches = args[2] if len(args) > 2 else kwargs["num_matches"]
                    observer._verified(int(matches))
            return result

        return wrapper

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        module = importlib.import_module("transformers.generation.candidate_generator")
        patched: list[tuple[type, str, Any]] = []
        for cls in vars(module).values():
            if not isinstance(cls, type) or cls.__module__ != module.__name__:
                continue
            for name in self._METHODS:
                if name in vars(cls):
                    original = vars(cls)[name]
                    patched.append((cls, name, original))
                    setattr(cls, name, self._wrap(name, original))
        try:
            yield
        finally:
            for cls, name, original in reversed(patched):
                setattr(cls, name, original)


def speculative_settings(transformers: ModuleType, models: Sequence[Any]) -> dict[str, Any]:
    """generate() options that make every verification draft up to :data:`E2E_DRAFTS` tokens, for the
    versions that have them: a constant schedule (no heuristic shrinking between rounds) and the
    assistant's confidence threshold off (4.45+ stops drafting below 0.4 by default). The same values go
    into the generation config of each drafting model (``models``), where the candidate generators read them.
    """
    fields = _generation_config_fields(transformers)
    wanted = {"num_assistant_tokens": E2E_DRAFTS, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    settings = {k: v for k, v in wanted.items() if k in fields}
    for model in models:
        config = getattr(model, "generation_config", None)
        if config is None:
            continue
        for key, value in settings.items():
            setattr(config, key, value)
    return settings


def _processing_kwargs(processing: Processing) -> dict[str, Any]:
    return {
        "temperature": processing.temperature,
        "top_k": processing.top_k if processing.top_k is not None else 0,
        "top_p": processing.top_p if processing.top_p is not None else 1.0,
    }


class GenerateExperiment:
    """Trials of ``generate(do_sample=True)`` over a long horizon, against exact laws.

    Each trial generates ``horizon`` tokens (at least 8, several verification rounds). Checks:

    * ``lossless/first{L}``: the joint law of the first L new tokens, one cell of V**L per trial, against
      the exact law prod_t p(y_t | prompt, y_<t) with p the target's next-token law after ``processing``
      (Hugging Face's order: temperature, top-k, top-p).
    * ``lossless/pit_id`` and ``lossless/pit_prob``: every emitted token of the horizon against its exact
      conditional law (one no-cache forward of the target over prompt + output), by the randomized PIT
      under two token orders (:mod:`workers.suite.conditional`). Rows whose processing boundary lies
      within float noise of a token are left out (decided from the prefix only, which keeps validity).

    Speculative paths also record their coverage (:class:`DraftObserver`) against ``coverage_design``.
    """

    #: Fingerprint probe: one generate() call per trial.
    probe_trials = 48
    #: The cap is what the design needs (the conditional checks see ``horizon`` tokens per trial), at least
    #: this many trials, not the runner's default floor of one first batch.
    min_trials = 256

    def __init__(
        self,
        transformers: ModuleType,
        processing: Processing,
        options: dict[str, Any],
        device: torch.device,
        *,
        models: ModelFactory | None = None,
        length: int = E2E_LENGTH,
        horizon: int = E2E_HORIZON,
        vocab: int = E2E_VOCAB,
        prompt: Sequence[int] = _PROMPT,
        coverage: CoverageDesign | None = None,
        tuned: bool = True,
    ) -> None:
        """``tuned=False`` leaves the library's drafting defaults (heuristic schedule, confidence threshold):
        the suite's earlier design, kept for the side-by-side comparison in ``bench/transformers_mutants.py``."""
        self.transformers = transformers
        self.processing = processing
        self.device = device
        self.length, self.horizon, self.vocab = length, max(length, horizon), vocab
        self.target, self.draft = (models or tiny_models)(transformers, device)
        self.options = _resolve_options(transformers, options, self.draft, device)
        self.speculative = bool(options)
        if self.speculative and tuned:
            drafting = [m for m in (self.target, self.options.get("assistant_model")) if m is not None]
            self.options = {**speculative_settings(transformers, drafting), **self.options}
        self.coverage_design = coverage if self.speculative else None
        self.prompt = torch.tensor([tuple(prompt)], device=device)
        self._bites: list[tuple[float, float]] = []
        self.law = sequence_law(self._next_token(self.prompt), length, vocab)
        _assert_processing_bites(processing, self._bites)
        self._checks = (
            # Designed on the conditional check (10 observations per trial); the joint law rides along.
            CheckSpec(f"lossless/first{length}", Layer.LOSSLESS, self.law, 1.0, designed=False),
            *(CheckSpec(f"lossless/pit_{order.value}", Layer.LOSSLESS, pit_null(), float(self.horizon)) for order in TokenOrder),
        )

    def _next_token(self, prompt: torch.Tensor) -> Callable[[tuple[int, ...]], NDArray[np.float64]]:
        """The processed next-token law after prompt + prefix; every row it gives must clear :data:`MARGIN`."""
        p = self.processing

        def oracle(prefix: tuple[int, ...]) -> NDArray[np.float64]:
            ids = torch.cat((prompt, torch.tensor([prefix], dtype=torch.long, device=self.device)), dim=1) if prefix else prompt
            with torch.no_grad():
                logits = self.target(ids).logits[0, -1].double()
            margin = processing_margin(logits.cpu().numpy(), p.temperature, p.top_k, p.top_p)
            if margin < MARGIN:
                raise AdapterError(
                    f"prefix {prefix}: the processing boundary (top-k gap or top-p cut) is {margin:.2g} from a token, below "
                    f"{MARGIN:g}: float noise could change the support; choose another fixture"
                )
            self._bites.append(_removed_mass(logits, p))
            return p.probs(logits).cpu().numpy()

        return oracle

    def _conditional_logits(self, prompt: torch.Tensor, output: Sequence[int]) -> NDArray[np.float64]:
        """Raw target logits (float64) of the next token after prompt + output[:t], for t = 0..len(output)-1."""
        ids = torch.cat((prompt, torch.tensor([list(output)], dtype=torch.long, device=self.device)), dim=1)
        with torch.no_grad():
            logits = self.target(ids, use_cache=False).logits[0, prompt.shape[1] - 1 : prompt.shape[1] - 1 + len(output)]
        rows: NDArray[np.float64] = logits.double().cpu().numpy()
        return rows

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return self._checks

    @property
    def expected_acceptance(self) -> None:
        return None

    @property
    def fixed_trials(self) -> None:
        return None

    def generation_kwargs(self) -> dict[str, Any]:
        return {
            "do_sample": True,
            "max_new_tokens": self.horizon,
            **_processing_kwargs(self.processing),
            # An id outside the vocabulary: batch size 1 never pads; a generated pad id changes masks in 4.40.
            "pad_token_id": max(self.vocab, _UNREACHABLE_EOS),
            "eos_token_id": max(self.vocab, _UNREACHABLE_EOS),
            **self.options,
        }

    def run(self, n: int, generator: torch.Generator) -> Observation:
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        pit_w = torch.rand((n, self.horizon), generator=generator, dtype=torch.float64).numpy()
        counts = np.zeros(len(self.law), dtype=np.int64)
        pit = {order: np.zeros(PIT_BINS, dtype=np.int64) for order in TokenOrder}
        kwargs = self.generation_kwargs()
        prompt, mask = self.prompt, torch.ones_like(self.prompt)
        observer = DraftObserver()
        violations: list[Violation] = []
        outputs: list[list[int]] = []
        with observer.watching() if self.speculative else contextlib.nullcontext():
            for _ in range(n):
                with torch.no_grad():
                    out = self.target.generate(prompt, attention_mask=mask, **kwargs)
                observer.call_done()
                new = out[0, prompt.shape[1] :].tolist()
                if len(new) < self.horizon or any(not 0 <= t < self.vocab for t in new[: self.horizon]):
                    return Observation({}, (Violation(Layer.LOSSLESS, f"generate returned {new} for {self.horizon} new tokens"),), 0, b"")
                outputs.append(new[: self.horizon])
        for i, new in enumerate(outputs):
            counts[sum(t * self.vocab ** (self.length - 1 - j) for j, t in enumerate(new[: self.length]))] += 1
            batch = self._conditional(new, pit_w[i])
            for order in TokenOrder:
                pit[order] += batch.counts[order]
            if batch.impossible is not None and not violations:
                violations.append(Violation(Layer.LOSSLESS, f"output {new}: {batch.impossible}"))
        found = {self._checks[0].name: counts, **{f"lossless/pit_{o.value}": pit[o] for o in TokenOrder}}
        sample = counts.tobytes() if n >= 1 else b""
        coverage = observer.coverage() if self.speculative else None
        accepted = sum(k * v for k, v in coverage.accepted.items()) if coverage else 0  # drafts accepted in the batch
        return Observation(found, tuple(violations), accepted, sample, coverage)

    def _conditional(self, output: Sequence[int], w: NDArray[np.float64]) -> ConditionalBatch:
        logits = self._conditional_logits(self.prompt, output)
        p = self.processing
        rows = p.probs(torch.from_numpy(logits)).numpy()
        keep = np.array([processing_margin(row, p.temperature, p.top_k, p.top_p) >= MARGIN for row in logits])
        return conditional_batch(rows, np.asarray(output, dtype=np.int64), w, keep=keep)


#: Mass top-k and top-p must each remove on every row the joint law enumerates, when they are set.
MIN_REMOVED = 0.01


def _removed_mass(logits: torch.Tensor, processing: Processing) -> tuple[float, float]:
    """Mass removed by top-k from the tempered law, and by top-p from what top-k kept."""
    tempered = (logits / processing.temperature).softmax(-1)
    after_k = Processing(temperature=processing.temperature, top_k=processing.top_k).probs(logits)
    after_p = processing.probs(logits)
    return float(tempered[after_k == 0].sum()), float(after_k[(after_p == 0) & (after_k > 0)].sum())


def _assert_processing_bites(processing: Processing, removed: Sequence[tuple[float, float]]) -> None:
    """A processed fixture whose top-k or top-p removes less than :data:`MIN_REMOVED` on some enumerated row
    does not test that processor there: refuse it when the case is built."""
    for index, name, active in ((0, "top-k", processing.top_k is not None), (1, "top-p", processing.top_p not in (None, 1.0))):
        least = min((r[index] for r in removed), default=0.0)
        if active and least < MIN_REMOVED:
            raise AdapterError(
                f"{name} removes only {least:.3g} of the mass on some enumerated row (< {MIN_REMOVED}): choose another fixture"
            )


#: Rows whose processing boundary (top-k gap, top-p cut) is closer than this are too close to call in
#: float32, where the library processes: the conditional check leaves them out, the joint law refuses them.
MARGIN = 1e-4


class GreedyEquivalenceExperiment:
    """``do_sample=False``: assisted generation must return exactly plain greedy's tokens."""

    prompts = 64
    #: Fingerprint probe: two generate() calls per prompt.
    probe_trials = 8

    def __init__(
        self,
        transformers: ModuleType,
        options: dict[str, Any],
        device: torch.device,
        *,
        pad_token_id: int,
        models: ModelFactory | None = None,
        vocab: int = E2E_VOCAB,
        coverage: CoverageDesign | None = None,
    ) -> None:
        self.target, self.draft = (models or tiny_models)(transformers, device)
        self.vocab = vocab
        self.options = _resolve_options(transformers, options, self.draft, device)
        drafting = [m for m in (self.target, self.options.get("assistant_model")) if m is not None]
        self.options = {**speculative_settings(transformers, drafting), **self.options}
        self.coverage_design = coverage
        self.device = device
        self.pad_token_id = pad_token_id

    @property
    def checks(self) -> Sequence[CheckSpec]:
        return ()

    @property
    def expected_acceptance(self) -> None:
        return None

    @property
    def fixed_trials(self) -> int:
        return self.prompts

    def run(self, n: int, generator: torch.Generator) -> Observation:
        base = {"do_sample": False, "max_new_tokens": E2E_HORIZON, "pad_token_id": self.pad_token_id, "eos_token_id": _UNREACHABLE_EOS}
        violations: list[Violation] = []
        samples: list[int] = []
        observer = DraftObserver()
        for _ in range(n):
            length = int(torch.randint(2, 7, (1,), generator=generator))
            prompt = torch.randint(0, self.vocab, (1, length), generator=generator).to(self.device)
            mask = torch.ones_like(prompt)
            with torch.no_grad():
                plain = self.target.generate(prompt, attention_mask=mask, **base)
                with observer.watching():
                    assisted = self.target.generate(prompt, attention_mask=mask, **base, **self.options)
                observer.call_done()
            samples.extend(assisted[0].tolist())
            if not torch.equal(plain, assisted):
                violations.append(
                    Violation(Layer.LOSSLESS, f"prompt {prompt[0].tolist()}: greedy {plain[0].tolist()} != assisted {assisted[0].tolist()}")
                )
                break
        coverage = observer.coverage()
        accepted = sum(k * v for k, v in coverage.accepted.items())  # drafts accepted in the batch's assisted calls
        return Observation({}, tuple(violations), accepted, np.asarray(samples, dtype=np.int64).tobytes(), coverage)
