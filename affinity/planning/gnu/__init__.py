"""GNU libgomp's placement rules (the ``"gnu"`` and ``"gnu-torch"`` runtimes of the planner).

:func:`plan_gomp` is the entry point; :mod:`.builds` names the libgomp builds
followed (GCC 12, and PyTorch's bundled GCC 8.5), :mod:`.sysfs` derives what
libgomp reads from ``/sys`` from a :class:`~affinity.machine.topology.Topology`,
:mod:`.places` parses ``OMP_PLACES``/``GOMP_CPU_AFFINITY`` and builds the
abstract place lists, :mod:`.runtime` places the team, :mod:`.exports` says what
to export for libgomp, :mod:`.rules` registers it with the planner.  Pure: no
system call.  The names below load on first use (``envvars`` imports
:mod:`.exports` alone, without the machine layer).
"""

from __future__ import annotations

import importlib
from typing import Any


__all__ = ["BUILDS", "DEFAULT_BUILD", "Build", "build_of", "GOMP_VARIABLES", "GompPlan", "plan_gomp",
           "SysfsView", "sysfs_view", "view_from_files"]

_WHERE = {"BUILDS": "builds", "DEFAULT_BUILD": "builds", "Build": "builds", "build_of": "builds",
          "GOMP_VARIABLES": "runtime", "GompPlan": "runtime", "plan_gomp": "runtime",
          "SysfsView": "sysfs", "sysfs_view": "sysfs", "view_from_files": "sysfs"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
