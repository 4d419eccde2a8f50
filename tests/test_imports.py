"""The package's import graph has no cycles.

A cycle works until someone imports its modules in a new order (a worker process, a
test, a lazy import moved up), and then fails with a half-initialized module. The graph
is read from the source with ``ast``: module-level imports and function-local ones
alike (a local import is still a dependency, only a later one), except those under
``if TYPE_CHECKING:``, which never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import corral

ROOT = Path(corral.__file__).parent

# Edges left out of the graph, each with the reason it is the right design. Keep it short.
ALLOWED: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The ``corral`` modules a module's code imports (anywhere but under ``TYPE_CHECKING``).

    ``from corral.x import y`` depends on ``corral.x.y`` when that is a module, else on
    ``corral.x``. Importing ``corral.a.b`` also runs ``corral.a``'s ``__init__``, so the
    packages above a target are dependencies too, except the importer's own packages:
    Python initializes those before the importer, so they are not an edge unless named."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in known else mod)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    deps = set()
    for mod in found:
        if mod != "corral" and not mod.startswith("corral."):
            continue
        parts = mod.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if not (name == parent or name.startswith(parent + ".")):
                deps.add(parent)
        while mod not in known:  # a name inside a module: `from corral.x import y` with y not a module
            mod = mod.rpartition(".")[0]
        if mod != name:
            deps.add(mod)
    return deps


def import_graph(allowed: dict = ALLOWED) -> dict[str, set[str]]:
    """Module -> the ``corral`` modules it imports, less the ``allowed`` edges."""
    files = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
    known = set(files)
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        deps = imported_modules(tree, name, path.name == "__init__.py", known)
        graph[name] = {d for d in deps if (name, d) not in allowed}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep not in state and (cycle := dfs(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)):
            return cycle
    return None


def test_graph_sees_the_package():
    graph = import_graph()
    assert "corral.config" in graph and "corral.envs.base" in graph
    assert "corral.errors" in graph["corral.config"]


def test_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_local_imports_count_but_type_checking_does_not():
    src = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from corral.b import B\n"
        "def f():\n    from corral.c import g\n"
    )
    deps = imported_modules(ast.parse(src), "corral.a", False, {"corral", "corral.a", "corral.b", "corral.c"})
    assert deps == {"corral.c"}


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_allowed_edges_exist():
    """An exclusion whose import is gone is stale: drop it from ALLOWED."""
    full = import_graph(allowed={})
    for src, dst in ALLOWED:
        assert dst in full.get(src, set()), f"ALLOWED has {src} -> {dst}, which it no longer imports"
