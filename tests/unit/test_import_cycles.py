"""No import cycle among the project's modules (the import-linter layers contracts hold per adapter; this holds for
the whole of specwatch, service and workers). Every import statement counts, function-level ones included (they
hid llama.cpp's two cycles: targets.install <-> llamacpp.build/checkout, llamacpp.adapter <-> e2e <-> server_cases);
imports only a type checker follows (``if TYPE_CHECKING:``) do not run and are left out."""

from __future__ import annotations

import grimp


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_the_project_has_no_import_cycle() -> None:
    graph = grimp.build_graph("specwatch", "service", "workers", exclude_type_checking_imports=True)
    assert import_cycles(graph) == []


def test_a_cycle_is_found() -> None:
    graph = grimp.ImportGraph()
    for name in ("a", "a.one", "a.two", "a.three"):
        graph.add_module(name)
    graph.add_import(importer="a.one", imported="a.two")
    graph.add_import(importer="a.two", imported="a.three")
    assert import_cycles(graph) == []
    graph.add_import(importer="a.three", imported="a.one")
    assert import_cycles(graph) == [["a.one", "a.three", "a.two"]]
