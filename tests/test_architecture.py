"""The house rules of docs/architecture.md, checked on the source (AST only, nothing runs):

* every module of ``affinity/`` sits in a layer folder (or is one of the ground-floor
  modules), and imports only from its own layer or the ones below;
* the import graph of ``affinity/`` (function-local imports included) has no circle;
* a function-local import of an ``affinity`` module says why it is local (``# lazy: ...``);
* no function is longer than 100 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGE = ROOT / "affinity"
#: layer -> rank; a module may import modules of its own rank or below
LAYERS = {"errors": 0, "cpulist": 0, "version": 0, "machine": 1, "planning": 2, "binding": 3, "launcher": 4,
          "tuning": 5, "tools": 6, "__init__": 7, "__main__": 7}
MAX_LINES = 100


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _layer(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> list[str]:
    """The affinity modules an ``import from`` statement loads."""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        base = package[:len(package) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("affinity"):
        return []
    found = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    if len(found) < len(node.names):
        found.append(target)
    return [m for m in found if m in MODULES]


def _imports() -> list[tuple[str, str, int, bool, str]]:
    """(importer, imported, line, function-local?, source line) for every import of affinity."""
    out = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        tree = ast.parse(path.read_text())
        local: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(module, path, node)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name in MODULES]
            else:
                continue
            text = lines[node.lineno - 1] + " " + (lines[node.lineno - 2] if node.lineno > 1 else "")
            for t in targets:
                if t != module:
                    out.append((module, t, node.lineno, id(node) in local, text))
    return out


IMPORTS = _imports()


def test_every_module_is_in_a_known_layer():
    unknown = sorted(m for m in MODULES if _layer(m) not in LAYERS)
    assert not unknown, f"modules outside the layer folders: {unknown}"
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert len(folders) >= 3 and folders <= set(LAYERS), folders


def test_imports_go_only_downward():
    upward = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)}) at line {line}"
              for a, b, line, _, _ in IMPORTS if LAYERS[_layer(b)] > LAYERS[_layer(a)]]
    assert not upward, "\n".join(upward)


def test_the_import_graph_has_no_circle():
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b, *_ in IMPORTS:
        if not (a == "affinity" or b == "affinity"):  # the package's lazy re-exports are its roof
            graph[a].add(b)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            circle = visit(m)
            assert circle is None, " -> ".join(circle)


def test_function_local_imports_say_why():
    silent = [f"{a}:{line} imports {b} inside a function without '# lazy: <why>'"
              for a, b, line, local, text in IMPORTS if local and "lazy" not in text]
    assert not silent, "\n".join(silent)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_over_100_lines(module):
    tree = ast.parse(MODULES[module].read_text())
    long = [f"{n.name} at line {n.lineno}: {n.end_lineno - n.lineno + 1} lines" for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_LINES]
    assert not long, long
