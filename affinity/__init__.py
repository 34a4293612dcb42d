"""affinity: put TensorFlow, OpenMP and process threads on the right cores.

Nothing is loaded at import: the compiled core, hwloc and TensorFlow are only
touched when a function that needs them is called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> submodule that defines it; resolved on first access (PEP 562).
_LAZY = {
    "Topology": "topology",
    "AffinityError": "errors",
    "BindError": "errors",
    "SpecError": "errors",
    "TopologyError": "errors",
    "UnsupportedError": "errors",
    "NativeUnavailableError": "errors",
    "PlanError": "errors",
    "AffinityWarning": "errors",
    "apply": "bind",
    "pinned": "bind",
    "Binding": "bind",
    "report": "bindmap",
    "plan": "planner",
    "plan_env": "planner",
    "Plan": "planner",
    "Settings": "spec",
    "KmpAffinity": "spec",
    "OmpPlaces": "spec",
    "OmpProcBind": "spec",
    "KmpHwSubset": "spec",
    "NumThreads": "spec",
    "ProcList": "spec",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'affinity' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from .errors import (AffinityError, AffinityWarning, BindError, NativeUnavailableError,
                         PlanError, SpecError, TopologyError, UnsupportedError)
    from .bind import Binding, apply, pinned
    from .planner import Plan, plan, plan_env
    from .bindmap import report
    from .spec import KmpAffinity, KmpHwSubset, NumThreads, OmpPlaces, OmpProcBind, ProcList, Settings
    from .topology import Topology
