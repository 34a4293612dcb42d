"""affinity: put TensorFlow, OpenMP and process threads on the right cores.

Nothing is loaded at import: the compiled core, hwloc and TensorFlow are only
touched when a function that needs them is called.
"""

from __future__ import annotations

import importlib

from typing import TYPE_CHECKING

# name -> submodule that defines it; resolved on first access (PEP 562).  Of the errors,
# the handful a user catches (as psutil exports its few); every class is in affinity.errors.
_LAZY = {
    "Topology": "machine.topology",
    "AffinityError": "errors",
    "BindError": "errors",
    "SpecError": "errors",
    "TopologyError": "errors",
    "UnsupportedError": "errors",
    "PlanError": "errors",
    "AffinityWarning": "errors",
    "NoSuchThread": "errors",
    "AccessDenied": "errors",
    "TuneError": "errors",
    "apply": "binding.apply",
    "pinned": "binding.apply",
    "Binding": "binding.apply",
    "report": "binding.bindmap",
    "doctor": "binding.doctor",
    "plan": "binding.here",
    "plan_env": "binding.here",
    "Plan": "planning.planner",
    "Settings": "planning.spec",
    "KmpAffinity": "planning.spec",
    "OmpPlaces": "planning.spec",
    "OmpProcBind": "planning.spec",
    "KmpHwSubset": "planning.spec",
    "NumThreads": "planning.spec",
    "ProcList": "planning.spec",
    "tune": "tuning.search",
    "TuneResult": "tuning.search",
    "__version__": "version",  # from the package metadata, read on first use
}

# modules documented as ``affinity.<name>``, where they live now
_MODULES = {
    "errors": "errors",  # every error class (the top level exports the handful a user catches)
    "threads": "binding.threads",
    "numa": "binding.numa",
    "spec": "planning.spec",
    "torch": "binding.torch",
    "onnxruntime": "binding.ort",  # not binding/onnxruntime.py: no module of ours bears an engine's name
    "openvino": "binding.ov",
}

__all__ = sorted(_LAZY) + sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(f".{_MODULES[name]}", __name__)
    elif name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    else:
        raise AttributeError(f"module 'affinity' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - the same names as _LAZY (tests/test_api_exports.py)
    from typing import Any

    from .binding.apply import Binding, apply, pinned
    from .binding.bindmap import report
    from .binding.doctor import doctor
    from .errors import (AccessDenied, AffinityError, AffinityWarning, BindError, NoSuchThread, PlanError,
                         SpecError, TopologyError, TuneError, UnsupportedError)
    from .machine.topology import Topology
    from .binding.here import plan, plan_env
    from .planning.planner import Plan
    from .planning.spec import KmpAffinity, KmpHwSubset, NumThreads, OmpPlaces, OmpProcBind, ProcList, Settings
    from .tuning.search import TuneResult, tune
    from .version import __version__
