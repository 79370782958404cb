"""Import rules (docs/architecture.md §3, "Import rules"): the suite uses torch, numpy and scipy only; the control plane never
imports workers or torch; the public face (specwatch) imports the suite and pytest only. import-linter checks package edges
in `make lint`; this checks external ones."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(package: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0] if not name.startswith("workers.") else name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_suite_imports_only_torch_numpy_scipy_and_itself():
    """Target adapters (workers/suite/targets/) may also import the library they adapt."""
    allowed = set(sys.stdlib_module_names) | {"torch", "numpy", "scipy"}
    libraries = {"transformers", "tokenizers", "safetensors"}
    bad = {
        name: {f for f in files if not (name in libraries and f.startswith("workers/suite/targets/"))}
        for name, files in _imports(ROOT / "workers" / "suite").items()
        if name not in allowed and not name.startswith("workers.suite")
    }
    assert not {name: files for name, files in bad.items() if files}


def test_the_control_plane_never_imports_workers_or_torch():
    imports = _imports(ROOT / "service")
    bad = {name: files for name, files in imports.items() if name == "torch" or name == "workers" or name.startswith("workers.")}
    assert not bad


def test_the_public_face_imports_only_the_suite_and_pytest():
    """`specwatch` wraps the suite for a library's own tests: the suite, torch (through it) and pytest (the plugin)."""
    allowed = set(sys.stdlib_module_names) | {"torch", "pytest"}
    bad = {
        name: files
        for name, files in _imports(ROOT / "specwatch").items()
        if name not in allowed and not name.startswith("workers.suite") and name != "specwatch"
    }
    assert not bad
