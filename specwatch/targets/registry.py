"""The target registry: every library target the suite knows, found through the entry point group ``specwatch.targets``.

A target is one package. Its entry point names a :class:`TargetInfo` (a light descriptor: its name, what it tests,
the distributions whose releases it tests and how they are installed, how a source checkout of it is recognised and
built, and where its adapter class is); the adapter itself (:class:`specwatch.targets.base.Adapter`, which imports
torch and the library) is loaded only when the target runs (:meth:`TargetInfo.adapter_class`). So the registry is read
torch-free by everything that only needs the tables: the sandbox (:mod:`specwatch.sandbox`: which releases are
installed kernels-only, which are built into their own cache folder), the installer (:mod:`specwatch.targets.install`),
``python -m specwatch`` (the target of a ``--pip`` or ``--source`` library) and the server (the adapters a watched
target may name, the package a release of it comes from).

The built-in targets are declared in specwatch's own ``pyproject.toml``; another package registers its own the same
way::

    [project.entry-points."specwatch.targets"]
    mylib = "mylib_specwatch:TARGET"

with ``TARGET = TargetInfo(name="mylib", description="...", adapter="mylib_specwatch.adapter:MyLibAdapter",
distributions=(Distribution("mylib"),))`` in a module that imports no more than this one. The entry point's name is the
target's (``--target mylib``). An entry that cannot be loaded is left out and says why when its target is asked for.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.metadata import entry_points
from typing import Any

#: The entry point group through which a package registers a target: ``name = "module:TARGET"`` (a :class:`TargetInfo`).
GROUP = "specwatch.targets"
#: A target's name: what ``--target`` and a watched target's adapter say.
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class RegistryError(Exception):
    """A registered target cannot be used: its entry point does not load, or its descriptor is not one."""


def normalize(name: str) -> str:
    """A project name in its normal form (PEP 503: ``Llama_CPP.python`` -> ``llama-cpp-python``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def load_object(reference: str) -> Any:
    """The object a ``module:attribute`` reference names (``module:Outer.inner`` for a nested one), imported now."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise RegistryError(f"not a module:attribute reference: {reference!r}")
    found: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


@dataclass(frozen=True)
class Distribution:
    """A distribution whose releases a target tests (``--pip NAME==X``) and how they are installed.

    - ``name``: its project name on the package index, normalized (:func:`normalize`);
    - ``kernels_only_since``: the first release, ``(major, minor)``, installed *kernels-only* where torch sees no CUDA
      device (a CUDA wheel without its dependencies, its Triton kernels run by Triton's interpreter:
      :mod:`specwatch.targets.install`); ``kernel_chain``: the requirements its kernels' import chain needs there;
    - ``beside``: requirements installed beside each release, into its folder;
    - ``macos_only``: ``(dependency, extras)``: a requirement the release's metadata limits to macOS, installed beside it
      elsewhere with these extras at the range the release asks for (mlx-lm's ``mlx``: ``mlx[cpu]>=X`` on Linux);
    - ``built``: the cache's top folder of a distribution whose releases are built rather than pip-installed (one
      folder per version under it: the only cache entry its sandboxed build may write); ``build``: the function
      (``module:function``, called as ``build(requirement, cache, log=...)``) that builds an exact release there and
      returns the folder to put first on ``PYTHONPATH``;
    - ``prepare``: a function (``module:function``, called as ``prepare(folder, log=...)``) run after each install of a
      release into its folder, in the install step (the only step that may write the folder): what the target's cases
      need made once per release (OpenVINO GenAI: its tiny models exported to IR by the release's own exporter);
    - ``cpu_build``: the distribution that publishes CPU builds of the same releases (a CPU worker tests that one);
    - ``package``: the import package a ``--source`` checkout of it holds (``src/<package>/__init__.py`` or
      ``<package>/__init__.py``); default: the name with ``_`` for ``-``.
    """

    name: str
    kernels_only_since: tuple[int, int] | None = None
    kernel_chain: tuple[str, ...] = ()
    beside: tuple[str, ...] = ()
    macos_only: tuple[str, str] | None = None
    built: str | None = None
    build: str | None = None
    prepare: str | None = None
    cpu_build: str | None = None
    package: str = ""

    def __post_init__(self) -> None:
        if normalize(self.name) != self.name:
            raise RegistryError(f"distribution {self.name!r}: give its normalized name {normalize(self.name)!r}")
        if (self.built is None) != (self.build is None):
            raise RegistryError(f"distribution {self.name!r}: a built distribution names both its cache folder and its build")
        if not self.package:
            object.__setattr__(self, "package", self.name.replace("-", "_"))


@dataclass(frozen=True)
class Checkout:
    """A kind of source checkout that is built before it is tested (``--source PATH``): ``recognise`` (``module:function``,
    ``(Path) -> bool``) says whether a folder is one, ``build`` (``module:function``, ``(Path, cache, *, tree=False) -> Path``)
    builds it into the cache and returns the folder to put first on ``PYTHONPATH`` (``tree=True``: the sandbox's build
    step, into the cache entry of the checkout's tree only); ``distribution`` names what it is."""

    distribution: str
    recognise: str
    build: str


@dataclass(frozen=True)
class TargetInfo:
    """A registered target (the entry point's object): its ``name`` (``--target NAME``), what it tests in one line,
    its adapter class (``module:Class``, a :class:`specwatch.targets.base.Adapter`; None: registered for its
    installs, not runnable yet), the distributions whose releases it tests (the first: the package a watched target
    named like the adapter tests), a source checkout built before it is tested, and ``variants``: the form of a
    ``NAME+VARIANT`` spec it takes (for help; :meth:`~specwatch.targets.base.Adapter.prepare` applies it)."""

    name: str
    description: str
    adapter: str | None
    distributions: tuple[Distribution, ...] = ()
    checkout: Checkout | None = None
    variants: str | None = None
    #: Where the descriptor came from (set by the registry: the entry point's value).
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise RegistryError(f"target name {self.name!r}: lower-case letters, digits and '_', starting with a letter")

    def adapter_class(self) -> Any:
        """The adapter class, imported now (it imports torch and, on :meth:`load`, the library)."""
        if self.adapter is None:
            raise RegistryError(f"target {self.name!r} has no adapter yet: {self.description}")
        return load_object(self.adapter)


@dataclass(frozen=True)
class Registry:
    """The targets found, by name, and the entries that could not be loaded (name -> why)."""

    targets: dict[str, TargetInfo]
    broken: dict[str, str]

    def get(self, name: str) -> TargetInfo | None:
        return self.targets.get(name)

    def runnable(self) -> dict[str, TargetInfo]:
        """The targets with an adapter (what ``--target`` and a watched target may name)."""
        return {name: info for name, info in self.targets.items() if info.adapter is not None}

    def distribution(self, name: str) -> tuple[TargetInfo, Distribution] | None:
        """The target testing the distribution ``name`` (exactly as given, after :func:`normalize`), and it."""
        wanted = normalize(name)
        for info in self.targets.values():
            for dist in info.distributions:
                if dist.name == wanted:
                    return info, dist
        return None


def _load(entry: Any) -> TargetInfo:
    try:
        info = entry.load()
    except Exception as exc:
        raise RegistryError(f"entry point {entry.name} = {entry.value} does not load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(info, TargetInfo):
        raise RegistryError(f"entry point {entry.name} = {entry.value} is a {type(info).__name__}, not a TargetInfo")
    if info.name != entry.name:
        raise RegistryError(f"entry point {entry.name} = {entry.value} describes the target {info.name!r}")
    return replace(info, origin=entry.value)


@cache
def registry() -> Registry:
    """Every target registered under :data:`GROUP` in the installed distributions' metadata (read once per process;
    the first of two entries of one name wins, as Python's own ``sys.path`` order has it)."""
    targets: dict[str, TargetInfo] = {}
    broken: dict[str, str] = {}
    for entry in entry_points(group=GROUP):
        if entry.name in targets or entry.name in broken:
            continue
        try:
            targets[entry.name] = _load(entry)
        except RegistryError as exc:
            broken[entry.name] = str(exc)
    return Registry(dict(sorted(targets.items())), broken)


def hook(reference: str) -> Callable[..., Any]:
    """A descriptor's function (``module:function``), imported now."""
    found = load_object(reference)
    if not callable(found):
        raise RegistryError(f"{reference} is not callable")
    return found  # type: ignore[no-any-return]
