"""``affinity.plan()`` and ``affinity.plan_env()``: the pure planner, for this
machine when no topology is given.

Planning (``affinity.planning``) never reads the machine; this is where the
public API supplies :meth:`Topology.from_system` (loaded once, through hwloc)
as the default ``topology``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import AffinityWarning
from ..machine.topology import Topology
from ..planning import planner
from ..planning.planner import DEFAULT_RUNTIME, Plan
from .which import resolve_runtime

__all__ = ["plan", "plan_env"]


def _here(topology: Topology | str | None) -> Topology:
    """This machine for None; a Topology, ``"system"``, ``"synthetic:..."`` or a file read by
    :meth:`Topology.load` -- the forms ``plan``, ``apply`` and ``tune`` all take."""
    return Topology.load(topology)


def plan(spec: Any = None, threads: int | None = None, topology: Topology | None = None, *,
         strict: bool = True, env: Mapping[str, str] | None = None,
         initial_mask: Iterable[int] | str | None = None, runtime: str = DEFAULT_RUNTIME) -> Plan:
    """:func:`affinity.planning.planner.plan` with ``topology`` defaulting to this machine's.

    Parameters and errors are those of :func:`affinity.planning.planner.plan`;
    ``topology=None`` plans for the machine this process runs on;
    ``runtime="auto"`` follows the rules of the OpenMP runtime loaded in this process
    (:func:`affinity.binding.which.resolve_runtime`; Intel's when none is), and
    ``Plan.runtime`` names the rules it resolved to.  A variable of ``spec`` that the
    runtime never reads (``"compact"`` under libgomp's rules) is an
    :class:`~affinity.errors.AffinityWarning` (:func:`affinity.planning.planner.unread`).
    """
    rules = resolve_runtime(runtime, caller="plan")
    p = planner.plan(spec, threads, _here(topology), strict=strict, env=env, initial_mask=initial_mask,
                     runtime=rules)
    for n in planner.unread(spec, rules):  # said as apply() and affinity plan say it; Plan.warnings
        warnings.warn(f"affinity: {n}", AffinityWarning, stacklevel=2)  # stay the runtime's own
    return p


def plan_env(env: Mapping[str, Any], *, topology: Topology | None = None,
             initial_mask: Iterable[int] | str | None = None, runtime: str = DEFAULT_RUNTIME) -> Plan:
    """:func:`affinity.planning.planner.plan_env` with ``topology`` defaulting to this machine's.

    Parameters and errors are those of :func:`affinity.planning.planner.plan_env`;
    ``topology=None`` plans for the machine this process runs on; ``runtime="auto"``
    as for :func:`plan`.
    """
    return planner.plan_env(env, topology=_here(topology), initial_mask=initial_mask,
                            runtime=resolve_runtime(runtime, caller="plan_env"))
