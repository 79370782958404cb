"""Every module of the library, the service and the workers stays readable: at most 400 lines, and no function over
80 lines. What is still over is named below, with its size, so that the list can only shrink."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specwatch", "service", "workers")
MODULE_LINES = 400
FUNCTION_LINES = 80
#: Modules over the limit today (path: lines at most), to be split.
PENDING_MODULES: dict[str, int] = {}
#: Functions over the limit today (path:function: lines at most), to be split.
PENDING_FUNCTIONS: dict[str, int] = {}


def _modules() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def test_no_module_is_over_400_lines() -> None:
    over = {}
    for path in _modules():
        name = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > max(MODULE_LINES, PENDING_MODULES.get(name, 0)):
            over[name] = lines
    assert not over, f"modules over {MODULE_LINES} lines: {over}"


def test_no_function_is_over_80_lines() -> None:
    over = {}
    for path in _modules():
        name = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"{name}:{node.name}"
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > max(FUNCTION_LINES, PENDING_FUNCTIONS.get(key, 0)):
                    over[key] = lines
    assert not over, f"functions over {FUNCTION_LINES} lines: {over}"


def test_the_pending_lists_name_only_what_is_still_over() -> None:
    """A module or function split since is taken off its list (the list can only shrink)."""
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines()) for path in _modules()}
    assert all(sizes.get(name, 0) > MODULE_LINES for name in PENDING_MODULES), PENDING_MODULES
    functions = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = (node.end_lineno or node.lineno) - node.lineno + 1
    assert all(functions.get(name, 0) > FUNCTION_LINES for name in PENDING_FUNCTIONS), PENDING_FUNCTIONS
