"""Triton's interpreter as vLLM's kernels need it on the CPU (a kernels-only install: ``TRITON_INTERPRET=1``).

The interpreter runs each program instance of a kernel's grid in Python, with numpy for the arithmetic. These
are added before vLLM's kernels run, each stated in the build identity (:func:`prepare` returns them):

- ``libdevice.log1p``: the interpreter has no libdevice (its functions are stubs that return None), and the
  resampling kernel's residual ``log(p) + log1p(-q/p)`` calls it; numpy's ``log1p`` in the operand's dtype stands in
  (CUDA's ``__nv_log1pf`` is within 1 ulp; so is numpy's).
- compute units: vLLM's top-k/top-p kernel sizes its persistent grid by the platform's compute units, which the
  platform vLLM detects without a GPU does not report; :data:`COMPUTE_UNITS` stands in (:func:`give_compute_units`).
- ``tl.range``: the interpreter runs it as Python's ``range``, whose ints lack the tensor methods a compiled loop
  variable has (``row_id.to(tl.int64)`` in vLLM's top-k/top-p kernel); it yields scalar tensors here, as
  compiled code sees them (:func:`_tensor_loop_variables`).
- floating point: each launch runs with numpy's floating-point warnings off, as device arithmetic is quiet.
- speed: the interpreter re-patches ``triton.language`` on every call of a nested ``@triton.jit`` function, though
  the launch it runs in has patched the same modules (the patches are process-wide and idempotent); that repeat is
  skipped. It was about half the time of a call of ``rejection_sample``.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from typing import Any

#: Compute units the platform reports under the interpreter, where it has none (vLLM's platform without a GPU is
#: "unspecified"): the persistent top-k/top-p kernel launches min(units, rows) programs, each looping over rows.
COMPUTE_UNITS = 8


def active() -> bool:
    """Whether this process runs Triton kernels through the interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def prepare() -> str:
    """Ready the interpreter for vLLM's kernels; the kernels' description for the build identity (with
    :func:`give_compute_units`'s, once vLLM's platform is loaded)."""
    triton = importlib.import_module("triton")  # a kernels-only install's own Triton
    added = []
    if _add_log1p():
        added.append("libdevice.log1p as numpy.log1p")
    if _tensor_loop_variables():
        added.append("tl.range yields scalar tensors")
    if _skip_nested_patching():
        added.append("nested-call re-patching skipped")
    extra = f"; {', '.join(added)}" if added else ""
    return f"triton {triton.__version__} interpreter (CPU, TRITON_INTERPRET=1{extra})"


def _add_log1p() -> bool:
    import numpy as np  # noqa: PLC0415

    tl = importlib.import_module("triton.language")
    libdevice: Any = importlib.import_module("triton.language.extra.libdevice")
    handle = importlib.import_module("triton.runtime.interpreter").TensorHandle

    if getattr(libdevice.log1p, "_specwatch", False):
        return True

    def log1p(arg0: Any, _semantic: Any = None) -> Any:
        data = arg0.handle.data
        result = np.log1p(data).astype(data.dtype, copy=False)
        return tl.core.tensor(handle(result, arg0.handle.dtype), arg0.type)

    log1p.__module__ = libdevice.__name__  # what Triton's dependency finder treats as a libdevice stub
    log1p._specwatch = True  # type: ignore[attr-defined]  # marks the function as added
    libdevice.log1p = log1p
    return True


def _tensor_loop_variables() -> bool:
    """``tl.range`` under the interpreter yields scalar tensors (``_implicit_cvt`` of each int, as a launch argument
    is converted), not ints; ``tl.static_range`` keeps ints (its variables are compile-time constants)."""
    interpreter: Any = importlib.import_module("triton.runtime.interpreter")
    core = getattr(interpreter, "_patch_lang_core", None)
    convert = getattr(interpreter, "_implicit_cvt", None)
    if core is None or convert is None:
        return False
    if getattr(core, "_specwatch", False):
        return True

    def tensor_range(arg1: Any, arg2: Any = None, step: Any = None, **kwargs: Any) -> Any:
        start, end = (0, arg1) if arg2 is None else (arg1, arg2)
        return (convert(i) for i in range(int(start), int(end), 1 if step is None else int(step)))

    def patch_core(lang: Any, scope: Any) -> None:
        core(lang, scope)
        scope.set_attr(lang, "range", tensor_range)

    patch_core._specwatch = True  # type: ignore[attr-defined]  # marks the function as added
    interpreter._patch_lang_core = patch_core
    return True


def _skip_nested_patching() -> bool:
    """Patch ``triton.language`` once per kernel launch, not again in every nested call (same modules); and run
    each launch with numpy's floating-point warnings off."""
    import numpy as np  # noqa: PLC0415

    interpreter: Any = importlib.import_module("triton.runtime.interpreter")

    grid = getattr(interpreter, "GridExecutor", None)
    patch = getattr(interpreter, "_patch_lang", None)
    scope = getattr(interpreter, "_LangPatchScope", None)
    if grid is None or patch is None or scope is None:
        return False
    if getattr(patch, "_specwatch", False):
        return True
    langs = (interpreter.tl, interpreter.tl.core)
    patched: set[tuple[int, ...]] = set()
    launches = [0]

    def once_per_launch(fn: Any) -> Any:
        key = tuple(sorted(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in langs))
        if launches[0] and key in patched:
            return scope()
        patched.add(key)
        return patch(fn)

    launch: Callable[..., Any] = grid.__call__

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        launches[0] += 1
        try:
            # Device arithmetic is quietly NaN or infinite (-inf - -inf in the residual's log space); numpy's
            # floating-point warnings would turn into errors where warnings are errors (the tests).
            with np.errstate(all="ignore"):
                return launch(self, *args, **kwargs)
        finally:
            launches[0] -= 1
            if not launches[0]:
                patched.clear()

    once_per_launch._specwatch = True  # type: ignore[attr-defined]
    interpreter._patch_lang = once_per_launch
    grid.__call__ = run
    return True


def give_compute_units(platform: Any) -> str | None:
    """Where ``platform.num_compute_units`` is not implemented, make it report :data:`COMPUTE_UNITS`; what was done."""
    try:
        platform.num_compute_units(0)
    except NotImplementedError:
        platform.num_compute_units = lambda device_id=0: COMPUTE_UNITS
        return f"num_compute_units {COMPUTE_UNITS} (the platform reports none)"
    return None
