"""The public names: ``affinity._LAZY`` and the ``TYPE_CHECKING`` imports of
``affinity/__init__.py`` name the same things from the same modules, and every
exception class is defined in ``affinity/errors.py`` and exported there once."""

from __future__ import annotations

import ast
import inspect

import affinity
import affinity.errors
from helpers import ROOT


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse((ROOT / "affinity" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING")
    out = {}
    for node in block.body:
        if isinstance(node, ast.ImportFrom) and node.module == "typing":
            continue  # for the annotations of affinity/__init__.py itself
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            out[alias.asname or alias.name] = node.module
    return out


def test_lazy_and_type_checking_agree():
    assert _type_checking_imports() == affinity._LAZY


def test_every_lazy_name_resolves_to_what_its_module_defines():
    for name, module in affinity._LAZY.items():
        if name == "__version__":
            continue
        assert getattr(affinity, name) is getattr(__import__(f"affinity.{module}", fromlist=[name]), name), name


def test_every_exception_class_is_exported_once_from_errors():
    classes = {n for n, v in vars(affinity.errors).items()
               if inspect.isclass(v) and issubclass(v, BaseException | Warning) and v.__module__ == "affinity.errors"}
    assert classes <= set(affinity.errors.__all__)
    # the top level exports what a user catches, as psutil does: a handful (issue #36)
    exported = {n for n in classes if affinity._LAZY.get(n) == "errors"}
    assert exported == {"AffinityError", "AffinityWarning", "SpecError", "PlanError", "TopologyError", "BindError",
                        "NoSuchThread", "AccessDenied", "UnsupportedError", "TuneError"}
    # the rest reach a user as one of those (each a subclass), or are the parsers' control flow
    internal = {"MalformedValue", "FrozenInstanceError", "AffinityWarning", "Signalled"}  # a warning; a BaseException
    assert [n for n in classes - internal if not issubclass(getattr(affinity.errors, n), affinity.AffinityError)] == []
    assert affinity.TuneError is affinity.errors.TuneError  # documented by tune()
