"""A target spec to what the suite runs: its sampler for the direct cases, its case catalogue and its library's identity.

``reference``, ``mutant:NAME``, a registered library target (:mod:`specwatch.targets.registry`; ``NAME+VARIANT`` for a
variant its adapter prepares, e.g. ``transformers+mutant:NAME``) or ``module:function`` (a sampler of your own).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from specwatch.cases import CASES, Case
from specwatch.mutants import MUTANTS
from specwatch.protocol import LibraryIdentity
from specwatch.sampling import Sampler, reference_sampler
from specwatch.targets import TargetError
from specwatch.targets.registry import RegistryError, TargetInfo, registry


@dataclass(frozen=True)
class Target:
    """A sampler for direct cases, the case catalogue it runs, and the library it comes from."""

    spec: str
    sampler: Sampler
    cases: tuple[Case, ...] = CASES
    library: LibraryIdentity | None = None


def _library(spec: str, info: TargetInfo, variant: str | None) -> Target:
    """The registered target ``info``'s adapter, loaded (after preparing ``variant``)."""
    try:
        adapter_class = info.adapter_class()
    except RegistryError as exc:
        raise TargetError(str(exc)) from exc
    if variant is not None:
        adapter_class.prepare(variant)
    adapter = adapter_class.load()
    return Target(spec, adapter.sampler(), adapter.cases(), adapter.describe())


def known() -> str:
    """The target forms, in words (for a usage error)."""
    forms = ["'reference'", "'mutant:NAME'"]
    for name, info in registry().runnable().items():
        forms.append(f"'{name}'")
        if info.variants:
            forms.append(f"'{name}+{info.variants}'")
    return ", ".join(forms) + " or 'module:function'"


def _user_function(spec: str) -> Target:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        broken = registry().broken.get(spec.partition("+")[0])
        if broken is not None:
            raise TargetError(f"target {spec!r} is registered but cannot be loaded: {broken}")
        hint = "" if registry().targets else " (no library target is registered: reinstall specwatch, e.g. pip install -e .)"
        raise TargetError(f"target must be {known()}, got {spec!r}{hint}")
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
    if spec.startswith("mutant:"):
        name = spec.removeprefix("mutant:")
        if name not in MUTANTS:
            raise TargetError(f"unknown mutant {name!r}; known: {', '.join(sorted(MUTANTS))}")
        return Target(spec, MUTANTS[name].sampler)
    name, plus, variant = spec.partition("+")
    info = registry().get(name)
    if info is not None and (not plus or info.variants):
        return _library(spec, info, variant if plus else None)
    return _user_function(spec)
