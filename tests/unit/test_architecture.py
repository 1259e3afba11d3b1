"""Guards that keep the house standing: the import graph of the installed packages has no circle
and runs downward through the layers, modules and functions stay small enough to read, and the
installed packages carry no shell scripts and nothing from tests/ or tools/.

The graph is read from the source (every ``import`` statement, those inside functions included),
so a circle hidden behind an in-function import is found as well.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("bench", "strategies", "reports")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

#: Layers, lowest first: a module may import from its own layer or any layer below it, never above.
#: The first matching prefix decides a module's layer.
LAYERS: list[tuple[str, ...]] = [
    ("bench", "bench.core"),
    ("bench.workloads",),
    ("strategies",),
    ("bench.measure", "bench.stats"),
    ("bench.results", "bench.runtime", "bench.plan", "bench.multinode"),
    ("bench.decide",),
    ("bench.train", "bench.comm", "bench.serve", "bench.gate"),
    ("reports",),
    ("bench.cli", "bench.__main__"),
]


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the installed packages."""
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _targets(mods: dict[str, Path], name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The project modules one import statement of module ``name`` loads."""
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            here = name.split(".") if mods[name].name == "__init__.py" else name.split(".")[:-1]
            here = here[: len(here) - node.level + 1]
            base = ".".join(here + ([base] if base else []))
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    found = []
    for w in wanted:
        while w and w not in mods:
            w = w.rpartition(".")[0]
        if w:
            found.append(w)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name].update(t for t in _targets(mods, name, node) if t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def layer(name: str) -> int:
    best, depth = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > depth:
                best, depth = i, len(p)
    assert best >= 0, f"module {name} is in no layer: add its package to LAYERS"
    return best


def test_the_circle_finder_finds_a_circle_and_only_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_no_import_circle_among_the_project_modules():
    assert circles(import_graph()) == []


def test_imports_run_downward_through_the_layers():
    upward = [f"{a} -> {b}" for a, targets in import_graph().items() for b in sorted(targets)
              if layer(b) > layer(a)]
    assert upward == []


def test_the_installed_packages_import_nothing_from_tests_or_tools():
    bad = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{name}: {n}" for n in names if n.split(".")[0] in ("tests", "tools")]
    assert bad == []


def test_the_installed_packages_hold_no_shell_scripts():
    scripts = [str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
               if p.is_file() and (p.suffix == ".sh" or p.read_bytes()[:2] == b"#!")]
    assert scripts == []


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_module_is_longer_than_the_limit(pkg):
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_function_is_longer_than_the_limit(pkg):
    long = {}
    for p in (ROOT / pkg).rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}
