"""llama.cpp as a target, through llama-cpp-python: what the installed build offers, found by looking.

The build's identity comes from :data:`~specwatch.targets.llamacpp.build.BUILD_INFO` when the package was built by
the suite (``--pip llama-cpp-python==X``): the vendored llama.cpp commit, the library folder (set as
``LLAMA_CPP_LIB_PATH`` before ``llama_cpp`` is imported: the package loads its library at import) and the tools.
A llama-cpp-python installed otherwise runs with its own library and without the tools' cases (they say why). A
llama.cpp checkout's build (``--source``, :mod:`.checkout`) has the tools only: ``llama_cpp`` is not imported, and the
cases of llama-cpp-python's paths say why they are skipped.

llama.cpp exposes no rejection-sampling function to call on a fixture: the target has end-to-end cases only
(:mod:`.e2e`); the direct sampler refuses with the reason.
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from specwatch.cases import Case
from specwatch.protocol import LibraryIdentity
from specwatch.sampling import Sampler
from specwatch.targets.base import Adapter, AdapterError, refusing_sampler
from specwatch.targets.llamacpp import DISTRIBUTION, SOURCE_DISTRIBUTION
from specwatch.targets.llamacpp.build import TOOLS, build_info, tool_path
from specwatch.targets.llamacpp.e2e import e2e_cases


@dataclass
class LlamaCppAdapter(Adapter):
    #: ``llama_cpp``; None for a llama.cpp checkout's build (``--source``: the tools only).
    module: ModuleType | None
    version: str
    info: dict[str, Any] | None
    features: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def load(cls) -> LlamaCppAdapter:
        info = build_info()
        if info is not None and info.get("distribution") == SOURCE_DISTRIBUTION:
            return cls(None, str(info.get("version")), info, {tool: tool_path(info, tool) is not None for tool in TOOLS})
        if info is not None:
            os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(info["lib"]))
        try:
            llama_cpp = importlib.import_module("llama_cpp")
        except Exception as exc:
            raise AdapterError(f"cannot import llama_cpp: {type(exc).__name__}: {exc}") from exc
        features = {
            "prompt_lookup_decoding": _has("llama_cpp.llama_speculative", "LlamaPromptLookupDecoding"),
            "generate_draft_model": "draft_model" in inspect.signature(llama_cpp.Llama.__init__).parameters,
        }
        for tool in ("llama-speculative", "llama-server"):
            features[tool] = tool_path(info, tool) is not None
        return cls(llama_cpp, str(getattr(llama_cpp, "__version__", "unknown")), info, features)

    def describe(self) -> LibraryIdentity:
        """The build's identity: the distribution, its version, the llama.cpp commit it vendors and where it is."""
        source = self.module is None and self.info is not None
        out: dict[str, str] = {"torch": str(torch.__version__)}
        commit = str(self.info["llama_cpp_commit"]) if self.info is not None and self.info.get("llama_cpp_commit") else None
        if commit:
            out["llama_cpp_commit"] = commit
        if self.info is not None:
            out["build_seconds"] = str(self.info.get("build_seconds"))
            options = [str(o) for o in self.info.get("cmake_options", [])]
            out["cmake_options"] = " ".join(options)
            # Builds record -DGGML_CUDA=ON|OFF; an identity written before that recorded the option only when on.
            out["cuda"] = "on" if "-DGGML_CUDA=ON" in options else "off"
            if source:
                out["dirty"] = str(bool(self.info.get("dirty"))).lower()
        return LibraryIdentity(
            name="llamacpp",
            distribution=SOURCE_DISTRIBUTION if source else DISTRIBUTION,
            version=self.version,
            path=str((self.info or {}).get("source", "")) if source else str(getattr(self.module, "__file__", "") or ""),
            git_sha=commit,
            details=out,
        )

    def sampler(self) -> Sampler:
        return refusing_sampler("llama.cpp has no rejection-sampling function to call on a fixture: its cases are end to end")

    def cases(self) -> tuple[Case, ...]:
        return e2e_cases(self)


def _has(name: str, attr: str) -> bool:
    try:
        return hasattr(importlib.import_module(name), attr)
    except ImportError:
        return False
