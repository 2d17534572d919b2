"""No import circle in the lab tool or the services, read from the source
itself: every import statement of every module under streamlab/ and services/,
the ones inside functions and under TYPE_CHECKING included (a circle hidden in
a function-level import is still two modules that cannot be read, or changed,
one without the other).

import-linter (test_import_contract.py) keeps the layers; this keeps the
modules inside a layer from leaning on each other: the strongly connected
components of the module graph are all single modules. A tiny package written
here shows the walk finding a circle that only function-level imports close.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

Graph = dict[str, set[str]]


def modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name → (file, is a package's __init__) of every module under it."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool
              ) -> Iterator[str]:
    """The dotted names an import statement may reach (a module, or a module's member)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:  # relative: from the module's own package up
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(package: Path) -> Graph:
    """Module → the package's modules it imports anywhere in its source: `from m
    import x` counts as m, or as the module m.x where there is one (a package's
    own __init__, which Python runs first, is not an arrow: it would tie every
    module to its package)."""
    known = modules(package)

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: Graph = {name: set() for name in known}
    for name, (path, is_package) in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets = {owner(d) for d in _imported(node, name, is_package)}
                graph[name] |= {t for t in targets if t is not None and t != name}
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's
    algorithm, iterative): each is a set of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
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


def describe(graph: Mapping[str, set[str]], circle: list[str]) -> str:
    inside = set(circle)
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & inside))}" for m in circle)


def test_no_module_of_the_lab_tool_is_in_an_import_circle() -> None:
    graph = import_graph(ROOT / "streamlab")
    found = circles(graph)
    assert not found, "modules that import each other:\n" + "\n\n".join(
        describe(graph, c) for c in found)


def test_no_module_of_the_services_is_in_an_import_circle() -> None:
    """The gateway's lease is handed what it uses of the state (lease.py's
    LeaseGateway) and the broken modes what they use of the lease, so the state
    imports them and neither imports it back, for types either."""
    graph = import_graph(ROOT / "services")
    found = circles(graph)
    assert not found, "modules that import each other:\n" + "\n\n".join(
        describe(graph, c) for c in found)


def test_no_arrow_runs_from_the_lab_to_the_console() -> None:
    """The lab starts the console, with its settings (lab/console_settings.py),
    and imports nothing of it: the console is a client of the lab."""
    graph = import_graph(ROOT / "streamlab")
    arrows = sorted(f"{m} -> {t}" for m, targets in graph.items() if m.startswith("streamlab.lab")
                    for t in targets if t.startswith("streamlab.console"))
    assert arrows == []


def test_the_walk_finds_a_circle_closed_only_inside_functions(tmp_path: Path) -> None:
    package = tmp_path / "tiny"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from tiny.sub import b\n")
    (package / "sub" / "b.py").write_text(
        "def later() -> None:\n    from ..c import thing\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import tiny.a\n"
        "thing = 1\n")
    (package / "d.py").write_text("import tiny.a\n")  # leans on the circle, not in it
    graph = import_graph(package)
    assert graph["tiny.a"] == {"tiny.sub.b"}
    assert graph["tiny.sub.b"] == {"tiny.c"}
    assert circles(graph) == [["tiny.a", "tiny.c", "tiny.sub.b"]]
    (package / "sub" / "b.py").write_text("")
    assert circles(import_graph(package)) == []
