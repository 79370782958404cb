"""Targets: what the suite tests. ``reference``, ``mutant:NAME``, ``module:function`` or a library
adapter (``transformers``, ``vllm``, ``sglang``: the installed package, whatever version is importable;
``transformers+mutant:NAME``: transformers with a library-level mutant planted in it; ``llamacpp``: llama.cpp
through llama-cpp-python and the tools built with it; ``mlx``: MLX-LM on MLX).

Adapters for real libraries are the packages beside this module (:mod:`.transformers`, :mod:`.vllm`, :mod:`.sglang`);
:mod:`.install` decides which copy of a library is tested (a pip release or a source checkout).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from specwatch.cases import CASES, Case
from specwatch.mutants import MUTANTS
from specwatch.sampling import Sampler, reference_sampler


class TargetError(Exception):
    """The target cannot be loaded: a usage or import problem, not a violation."""


@dataclass(frozen=True)
class Target:
    """A sampler for direct cases, the case catalogue it runs, and the library it comes from."""

    spec: str
    sampler: Sampler
    cases: tuple[Case, ...] = CASES
    library: dict[str, str] | None = None


def _transformers(spec: str) -> Target:
    from specwatch.targets.transformers import AdapterError, TransformersAdapter  # noqa: PLC0415 - optional library

    if spec != "transformers":
        from specwatch.targets.transformers.mutants import apply_mutant  # noqa: PLC0415 - optional library

        try:
            apply_mutant(spec.removeprefix("transformers+mutant:"))
        except KeyError as exc:
            raise TargetError(str(exc.args[0])) from exc
    try:
        adapter = TransformersAdapter.load()
        return Target(spec, adapter.sampler(), adapter.cases(), adapter.describe())
    except AdapterError as exc:
        raise TargetError(str(exc)) from exc


def _vllm(spec: str) -> Target:
    from specwatch.targets.vllm import AdapterError, VllmAdapter  # noqa: PLC0415 - optional library

    try:
        adapter = VllmAdapter.load()
        return Target(spec, adapter.sampler(), adapter.cases(), adapter.describe())
    except AdapterError as exc:
        raise TargetError(str(exc)) from exc


def _llamacpp(spec: str) -> Target:
    from specwatch.targets.llamacpp.adapter import LlamaCppAdapter  # noqa: PLC0415 - optional library

    adapter = LlamaCppAdapter.load()  # AdapterError is a TargetError
    return Target(spec, adapter.sampler(), adapter.cases(), adapter.describe())


def _mlx(spec: str) -> Target:
    from specwatch.targets.mlx.adapter import MlxAdapter  # noqa: PLC0415 - optional library

    adapter = MlxAdapter.load()  # AdapterError is a TargetError
    return Target(spec, adapter.sampler(), adapter.cases(), adapter.describe())


def _sglang(spec: str) -> Target:
    from specwatch.targets.sglang import AdapterError, SglangAdapter  # noqa: PLC0415 - optional library

    try:
        adapter = SglangAdapter.load()
        return Target(spec, adapter.sampler(), adapter.cases(), adapter.describe())
    except AdapterError as exc:
        raise TargetError(str(exc)) from exc


def _user_function(spec: str) -> Target:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise TargetError(
            "target must be 'reference', 'mutant:NAME', 'transformers', 'transformers+mutant:NAME', 'vllm', 'sglang', 'llamacpp', 'mlx' or "
            f"'module:function', got {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TargetError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise TargetError(f"{module_name!r} has no callable {attr!r}")
    try:
        inspect.signature(fn).bind(None, 1, None)
    except TypeError as exc:
        raise TargetError(f"{spec} must accept (step, n, generator): {exc}") from exc
    except ValueError:
        pass  # builtins without a signature: trust them
    return Target(spec, fn)


def resolve(spec: str) -> Target:
    """Load the sampler a target spec names; raises TargetError with a one-line reason."""
    if spec == "reference":
        return Target(spec, reference_sampler)
    if spec == "transformers" or spec.startswith("transformers+mutant:"):
        return _transformers(spec)
    libraries = {"vllm": _vllm, "sglang": _sglang, "llamacpp": _llamacpp, "mlx": _mlx}
    if spec in libraries:
        return libraries[spec](spec)
    if spec.startswith("mutant:"):
        name = spec.removeprefix("mutant:")
        if name not in MUTANTS:
            raise TargetError(f"unknown mutant {name!r}; known: {', '.join(sorted(MUTANTS))}")
        return Target(spec, MUTANTS[name].sampler)
    return _user_function(spec)
