"""docs/architecture.md lists every module of the library, the service and the workers, and no module that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specwatch", "service", "workers")
DOC = ROOT / "docs" / "architecture.md"


def _modules() -> set[str]:
    return {path.relative_to(ROOT).as_posix() for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def _listed() -> set[str]:
    """Every module the page names in its tables' first column."""
    return set(re.findall(r"^\| `((?:specwatch|service|workers)/[\w/]+\.py)` \|", DOC.read_text(), re.MULTILINE))


def test_every_module_is_listed_in_the_architecture_page() -> None:
    missing = sorted(_modules() - _listed())
    assert not missing, f"modules missing from docs/architecture.md, section 4: {missing}"


def test_the_architecture_page_lists_no_module_that_is_gone() -> None:
    gone = sorted(_listed() - _modules())
    assert not gone, f"docs/architecture.md lists modules that do not exist: {gone}"
