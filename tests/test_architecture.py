"""The house rules of docs/architecture.md, checked on the source (AST only, nothing runs):

* every module of ``affinity/`` sits in a layer folder (or is one of the ground-floor
  modules), and imports only from its own layer or the ones below;
* the import graph of ``affinity/`` (function-local imports included) has no circle;
* a function-local import of an ``affinity`` module says why it is local (``# lazy: ...``);
* no function is longer than 100 lines, its docstring not counted;
* no function's cyclomatic complexity is above 25 (decisions counted on the AST);
* every exception class is defined in ``affinity/errors.py``;
* optuna is imported only by the tuner (``affinity/tuning/``);
* value classes are records (``affinity.record``), never dataclasses.

Where code another issue is moving still breaks a rule, it is listed below with
the issue that fixes it; an entry that no longer applies fails the test, so the
lists only shrink.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from helpers import ROOT

PACKAGE = ROOT / "affinity"
#: layer -> rank; a module may import modules of its own rank or below
LAYERS = {"errors": 0, "cpulist": 0, "version": 0, "record": 0, "machine": 1, "planning": 2, "binding": 3, "launcher": 4,
          "tuning": 5, "tools": 6, "__init__": 7, "__main__": 7}
MAX_LINES = 100
#: the most decisions (+1) a function may hold; why 25: docs/architecture.md
MAX_COMPLEXITY = 25
#: (module, function) over MAX_COMPLEXITY, in code other engineers are reshaping (issue #19)
COMPLEX_ALLOWED = {
    ("affinity.machine.topology", "_assemble"): "#19: machine/ topology readers (owner: machine)",
    ("affinity.machine.topology", "_from_native"): "#19: machine/ topology readers (owner: machine)",
    ("affinity.machine.topology", "_from_cpuinfo_text"): "#19: machine/ topology readers (owner: machine)",
    ("affinity.launcher.options", "options_from_args"): "#19 item 3: the launcher's options (owner: tune/launcher)",
}
#: (module, class) exception classes not yet in affinity/errors.py (issue #19 item 4 moves them)
EXCEPTIONS_ALLOWED = {
}


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


def _functions(module: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(MODULES[module].read_text())
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _length(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the end, the docstring left out."""
    lines = fn.end_lineno - fn.lineno + 1
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        lines -= body[0].end_lineno - body[0].lineno + 1
    return lines


def complexity(fn: ast.AST) -> int:
    """McCabe's cyclomatic complexity on the AST: 1 + one per ``if``/``elif``,
    conditional expression, loop, ``except``, ``case``, comprehension and each of
    its ``if`` clauses, and extra operand of ``and``/``or``.  Nested functions and
    classes count on their own."""
    n = 1
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler,
                             ast.match_case)):
            n += 1
        elif isinstance(node, ast.BoolOp):
            n += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            n += 1 + len(node.ifs)
        stack.extend(ast.iter_child_nodes(node))
    return n


def test_complexity_counts_decisions():
    fn = ast.parse("def f(a, b):\n    if a and b or a:\n        return [x for x in a if x]\n"
                   "    for i in b:\n        try:\n            pass\n        except E:\n            pass\n"
                   "    return 1 if a else 2\n").body[0]
    assert complexity(fn) == 1 + 1 + 2 + 2 + 1 + 1 + 1
    two = ast.parse('def g():\n    """Doc\n    string."""\n    return 1\n').body[0]
    assert _length(two) == 2


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_over_100_lines(module):
    long = [f"{n.name} at line {n.lineno}: {_length(n)} lines without its docstring"
            for n in _functions(module) if _length(n) > MAX_LINES]
    assert not long, long


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_over_the_complexity_cap(module):
    over = {n.name: complexity(n) for n in _functions(module) if complexity(n) > MAX_COMPLEXITY}
    allowed = {name for (m, name) in COMPLEX_ALLOWED if m == module}
    new = [f"{name}: complexity {c} > {MAX_COMPLEXITY}" for name, c in over.items() if name not in allowed]
    assert not new, new
    stale = sorted(allowed - set(over))
    assert not stale, f"no longer over the cap, remove from COMPLEX_ALLOWED: {stale}"


def _exception_names() -> set[str]:
    names = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
             and issubclass(getattr(builtins, n), BaseException)}
    errors = ast.parse((PACKAGE / "errors.py").read_text())
    return names | {c.name for c in ast.walk(errors) if isinstance(c, ast.ClassDef)}


def test_every_exception_class_is_in_errors_py():
    known = _exception_names()
    found = set()
    for module, path in MODULES.items():
        if module == "affinity.errors":
            continue
        for c in ast.walk(ast.parse(path.read_text())):
            if isinstance(c, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in c.bases}
                if bases & known or any(b.endswith(("Error", "Exception", "Warning")) for b in bases):
                    found.add((module, c.name))
                    known.add(c.name)  # its subclasses are exceptions too
    new = sorted(found - set(EXCEPTIONS_ALLOWED))
    assert not new, f"exception classes outside affinity/errors.py: {new}"
    stale = sorted(set(EXCEPTIONS_ALLOWED) - found)
    assert not stale, f"moved to errors.py, remove from EXCEPTIONS_ALLOWED: {stale}"


def test_optuna_is_imported_only_by_the_tuner():
    outside = []
    for module, path in MODULES.items():
        if module.startswith("affinity.tuning"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == "optuna" or n.startswith("optuna.") for n in names):
                outside.append(f"{module}:{node.lineno}")
    assert not outside, f"optuna imported outside affinity/tuning/: {outside}"


def test_value_classes_are_records_not_dataclasses():
    """dataclasses compiles 5-6 methods per class at import and imports inspect: half
    of ``affinity run``'s start-up once; ``affinity.record`` declares the same classes."""
    users = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if "dataclasses" in names:
                users.append(f"{module}:{node.lineno}")
    assert not users, f"dataclasses imported (declare records with affinity.record): {users}"


#: the most positional arguments a record (a value class) is built with; more are given by
#: keyword, so that a reader sees which value is which (issue #36: Outcome, Topology and
#: Instance were built with 9-13 positional arguments)
MAX_POSITIONAL = 5
#: (module, record) calls still positional, in code another issue is reshaping
POSITIONAL_ALLOWED: dict[tuple[str, str], str] = {}


def _record_classes() -> set[str]:
    names = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    (isinstance(d, ast.Name) and d.id == "record")
                    or (isinstance(d, ast.Call) and getattr(d.func, "id", None) == "record") for d in node.decorator_list):
                names.add(node.name)
    return names


def test_records_are_built_by_keyword():
    records = _record_classes() | {"cls"}  # cls(...) in a record's own classmethods
    found = set()
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or len(node.args) <= MAX_POSITIONAL:
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in records:
                found.add((module, name, node.lineno))
    new = sorted(f"{m}:{line} {n}({'...'})" for m, n, line in found if (m, n) not in POSITIONAL_ALLOWED)
    assert not new, f"records built with more than {MAX_POSITIONAL} positional arguments: {new}"
    stale = sorted(set(POSITIONAL_ALLOWED) - {(m, n) for m, n, _ in found})
    assert not stale, f"built by keyword now, remove from POSITIONAL_ALLOWED: {stale}"
