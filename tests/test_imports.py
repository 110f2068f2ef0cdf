"""Data flows one way: no import circle between tunebook's modules.

Every import is read with `ast` from every module of lib/tunebook, subpackages included:
module-level ones and those inside functions (a late import that only dodges a circle is
still a circle). Imports under `if TYPE_CHECKING:` are left out: they never run. Importing
`tunebook.a.b` counts as an edge to `tunebook.a.b` only, not to the package `tunebook.a`
whose __init__ Python runs first: a package that imports its own submodules is no circle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tunebook

PKG = Path(tunebook.__file__).resolve().parent


def module_name(path: Path, root: Path = PKG) -> str:
    parts = ("tunebook", *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PKG) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except in `if TYPE_CHECKING:` bodies."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def imports_of(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """The tunebook modules ``name`` imports, each with the line of its first import."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target in known and target != name:
            out.setdefault(target, line)

    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
            continue
        base = node.module or ""
        if node.level:  # relative: from . import x, from ..a import b
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            add(sub if sub in known else base, node.lineno)
    return out


def graph(root: Path = PKG) -> dict[str, dict[str, int]]:
    mods = modules(root)
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def find_cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return [_cycle_in(g, set(comp)) for comp in sccs]


def _cycle_in(g: dict[str, dict[str, int]], comp: set[str]) -> list[str]:
    """A concrete path start -> ... -> start inside one component (breadth-first)."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(g[v]):
                if w not in comp:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle in {comp}")


def describe(cycle: list[str], g: dict[str, dict[str, int]]) -> str:
    mods = modules()
    steps = []
    for a, b in zip(cycle, cycle[1:], strict=False):
        rel = mods[a].relative_to(PKG.parent) if a in mods else a
        steps.append(f"{a} imports {b} ({rel}:{g[a][b]})")
    return " -> ".join(cycle) + "\n    " + "\n    ".join(steps)


def test_no_import_circle_in_tunebook() -> None:
    g = graph()
    assert len(g) >= 20 and "tunebook.measure.sweep" in g, sorted(g)
    cycles = find_cycles(g)
    assert not cycles, "import circle(s) in lib/tunebook:\n  " + "\n  ".join(
        describe(c, g) for c in cycles)


def test_the_walker_sees_late_relative_and_subpackage_imports(tmp_path: Path) -> None:
    """The walker itself: a circle through a late import inside a subpackage is found, a
    TYPE_CHECKING import and a package importing its own submodules are not circles."""
    pkg = tmp_path / "tunebook"
    (pkg / "figures").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "store.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from tunebook import sweep\n")
    (pkg / "sweep.py").write_text("from tunebook import store\n\ndef f():\n"
                                  "    from tunebook.figures import ch01\n")
    (pkg / "figures" / "__init__.py").write_text("from . import ch01\nfrom .registry import R\n")
    (pkg / "figures" / "registry.py").write_text("R = {}\n")
    (pkg / "figures" / "ch01.py").write_text("from .registry import R\n\ndef g():\n"
                                             "    import tunebook.sweep\n")
    g = graph(pkg)
    assert g["tunebook.sweep"] == {"tunebook.store": 1, "tunebook.figures.ch01": 4}
    assert g["tunebook.store"] == {}  # TYPE_CHECKING only
    assert g["tunebook.figures"] == {"tunebook.figures.ch01": 1, "tunebook.figures.registry": 2}
    assert find_cycles(g) == [["tunebook.figures.ch01", "tunebook.sweep",
                               "tunebook.figures.ch01"]]
