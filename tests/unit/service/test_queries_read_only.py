"""The read-side queries (service.queries) only read: what writes lives in its domain module (service.findings,
service.alerts, ...), so that a reader (the API's GET routes, the dashboard, the CLI's listings) cannot change data."""

from __future__ import annotations

import ast
from pathlib import Path

QUERIES = Path(__file__).resolve().parents[3] / "service" / "queries"
#: Session methods and SQL statements that write.
WRITES = {"add", "add_all", "delete", "flush", "commit", "merge", "bulk_save_objects", "insert", "update", "with_for_update"}


def test_no_query_module_writes() -> None:
    found = []
    for path in sorted(QUERIES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in WRITES:
                    found.append(f"{path.name}:{node.lineno} {name}")
    assert not found, f"writes in service.queries: {found}"
