"""Import rules (docs/architecture.md, "Import rules"): the library (specwatch) imports only what a plain install of it
brings, its suite torch, numpy and scipy only; the control plane never imports workers or torch. import-linter checks
package edges in `make lint`; this checks external ones."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
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


#: The libraries the target adapters test (the user's own install, or a run's).
ADAPTED = {"transformers", "tokenizers", "safetensors", "vllm", "triton"}


def _adapted(name: str, file: str) -> bool:
    return name in ADAPTED and file.startswith("specwatch/targets/")


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower().replace("-", "_") for r in requirements}


def test_the_library_imports_only_what_a_plain_install_of_it_brings():
    """`pip install specwatch` (no extra) must be enough for every module of the library: its declared
    dependencies and the standard library, plus pytest for the plugin that only pytest loads, plus the library
    a target adapter (specwatch/targets/) tests, which is the user's or a run's own install."""
    declared = _requirement_names(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert {"torch", "numpy", "scipy"} <= declared
    assert not declared & {"fastapi", "celery", "sqlalchemy", "alembic", "psycopg", "uvicorn", "slack_sdk", "pydantic_settings"}
    imports = _imports(ROOT / "specwatch")
    assert {"torch", "numpy", "scipy"} <= set(imports)
    bad = {
        name: {f for f in files if not _adapted(name, f) and not (name == "pytest" and f == "specwatch/pytest_plugin.py")}
        for name, files in imports.items()
        if name not in set(sys.stdlib_module_names) | declared and name != "specwatch"
    }
    assert not {name: files for name, files in bad.items() if files}


def test_the_suite_itself_imports_torch_numpy_scipy_and_nothing_of_the_command_line():
    """The statistics, laws, cases, runner and targets run inside the sandbox against a release's own packages:
    only torch, numpy and scipy (and the adapted library), no typer, rich or packaging."""
    front = ("specwatch/cli/", "specwatch/findings/", "specwatch/report.py", "specwatch/pytest_plugin.py")
    allowed = set(sys.stdlib_module_names) | {"torch", "numpy", "scipy", "specwatch"}
    bad = {
        name: {f for f in files if not f.startswith(front) and not _adapted(name, f)}
        for name, files in _imports(ROOT / "specwatch").items()
        if name not in allowed
    }
    assert not {name: files for name, files in bad.items() if files}


def test_the_control_plane_never_imports_workers_or_torch():
    imports = _imports(ROOT / "service")
    bad = {name: files for name, files in imports.items() if name == "torch" or name == "workers" or name.startswith("workers.")}
    assert not bad
