"""``affinity.plan()`` and ``affinity.plan_env()``: the planner's own functions
(:func:`affinity.planning.planner.plan`, :func:`~affinity.planning.planner.plan_env`),
given what only a process can know.

There is one ``plan``: the pure planner's.  The public names are that function seen
from this process (:func:`on_this_machine`): ``topology`` defaults to this machine
(:meth:`Topology.from_system`, loaded once through hwloc) and takes every form
``Topology.load`` reads, ``runtime="auto"`` is the OpenMP runtime loaded here
(:func:`affinity.binding.which.resolve_runtime`), and a variable of ``spec`` the
runtime never reads (``"compact"`` under libgomp's rules) is an
:class:`~affinity.errors.AffinityWarning` at the caller's line, as ``apply()`` and
``affinity plan`` say it (the plan's own ``warnings`` stay the runtime's).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import AffinityWarning
from ..machine.topology import Topology
from ..planning import planner
from .which import resolve_runtime

__all__ = ["on_this_machine", "plan", "plan_env"]


def on_this_machine(fn: Callable[..., planner.Plan]) -> Callable[..., planner.Plan]:
    """``fn`` (a planner function with ``topology`` and ``runtime`` parameters) with
    ``topology=None`` meaning this machine, ``runtime="auto"`` resolved in this
    process, and the settings its runtime never reads warned."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def face(*args: Any, **kwargs: Any) -> planner.Plan:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        given["topology"] = Topology.load(given["topology"])
        given["runtime"] = resolve_runtime(given["runtime"], caller=fn.__name__)
        result = fn(*bound.args, **bound.kwargs)
        for n in planner.unread(given.get("spec"), given["runtime"]):
            warnings.warn(f"affinity: {n}", AffinityWarning, stacklevel=2)
        return result

    face.__doc__ = (fn.__doc__ or "") + (
        "\n\n    Here (``affinity." + fn.__name__ + "``): ``topology=None`` plans for the machine this\n"
        "    process runs on, ``runtime=\"auto\"`` follows the OpenMP runtime loaded in it, and a\n"
        "    variable the runtime never reads is an ``AffinityWarning``.\n")
    return face


plan = on_this_machine(planner.plan)
plan_env = on_this_machine(planner.plan_env)
