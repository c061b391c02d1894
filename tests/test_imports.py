"""No import cycle in rsgen, between modules or between packages (imports inside functions count: a deferred
import is still a dependency). The layer contract in pyproject.toml (`lint-imports`) orders the top-level packages;
this test also covers the modules inside one package and a package's `__init__` and its own modules."""

from __future__ import annotations

import grimp
import pytest


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("rsgen", cache_dir=None)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _described(graph: grimp.ImportGraph, cycle: list[str], owner) -> str:
    lines = []
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = owner(importer), owner(imported)
            if a != b and a in cycle and b in cycle:
                details = graph.get_import_details(importer=importer, imported=imported)
                where = details[0]["line_number"] if details else "?"
                lines.append(f"  {importer}:{where} imports {imported}")
    return " <-> ".join(cycle) + "\n" + "\n".join(sorted(lines))


def test_no_module_imports_itself_back(graph):
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = _cycles(edges)
    assert not cycles, "import cycles between modules:\n" + "\n".join(
        _described(graph, c, lambda m: m) for c in cycles)


def test_no_package_imports_itself_back(graph):
    """Inside every package, its children (subpackages taken whole, with everything under them) form no cycle."""
    packages = sorted(m for m in graph.modules if graph.find_children(m))
    problems = []
    for package in packages:
        children = graph.find_children(package)
        depth = package.count(".") + 1

        def owner(module: str, depth=depth, children=children) -> str | None:
            name = ".".join(module.split(".")[: depth + 1])
            return name if name in children else None

        edges: dict[str, set[str]] = {child: set() for child in children}
        for importer in graph.modules:
            a = owner(importer)
            if a is None:
                continue
            for imported in graph.find_modules_directly_imported_by(importer):
                b = owner(imported)
                if b is not None and b != a:
                    edges[a].add(b)
        problems += [_described(graph, c, owner) for c in _cycles(edges)]
    assert not problems, "import cycles between packages:\n" + "\n".join(problems)


def test_the_check_finds_a_cycle():
    """The cycle finder itself: a three-module loop and a two-module loop are found, a chain is not."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "f"}, "f": set()}
    assert sorted(_cycles(edges)) == [["a", "b", "c"], ["d", "e"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
