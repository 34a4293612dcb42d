"""SGLang's CPU backend, in its own words (pure).

What SGLang reads (``python/sglang/srt/utils/numa_utils.py`` ``init_threads_binding``,
``python/sglang/srt/utils/common.py`` ``get_physical_cpus_by_numa`` and
``get_cpu_memory_capacity``, ``sgl-kernel/csrc/cpu/numa_utils.cpp``
``init_cpu_threads_env``; sglang 0.5.23):

* ``SGLANG_CPU_OMP_THREADS_BIND`` unset (``all``): rank ``i`` on the ``i``-th NUMA
  node holding allowed CPUs, the first-listed CPU of each physical core (a core
  whose first sibling is not allowed is left out); more ranks than nodes is an
  assertion error.
* Set: split at ``|``, rank ``i`` (its global index over dp x tp x pp) takes entry
  ``i``; the entries must be as many as the ranks.  An entry goes to libnuma's
  ``numa_parse_cpustring``; thread ``i`` is bound to the ``i``-th CPU in increasing
  order, one CPU each, and memory strictly to the node of the lowest CPU -- the same
  binder as vLLM's.
* With the variable set, SGLang cannot size each rank's memory pool from its node
  (``get_cpu_memory_capacity`` returns none): give ``--max-total-tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...cpulist import format_list
from ...errors import EngineError
from ...machine.topology import Topology
from .words import EngineWords, check_disjoint, one_cpu_per_thread, rank_memory

__all__ = ["BIND", "sglang_default", "sglang_words"]

BIND = "SGLANG_CPU_OMP_THREADS_BIND"
_RULE = "SGLang's init_cpu_threads_env (sgl-kernel/csrc/cpu/numa_utils.cpp)"


def sglang_words(plans: Sequence[Any]) -> EngineWords:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for one plan per rank (in rank order: dp x tp
    x pp ranks), each rank's threads one per CPU.

    Raises
    ------
    EngineError
        No plan; a thread on several CPUs or two threads on one CPU; ranks
        sharing CPUs.
    """
    if not plans:
        raise EngineError("SGLang: no rank to bind (give one plan per rank)")
    sets = [one_cpu_per_thread("SGLang", _RULE, i, p.cpusets) for i, p in enumerate(plans)]
    check_disjoint("SGLang", sets)
    memory, notes = [], []
    for i, (p, cpus) in enumerate(zip(plans, sets)):
        lowest = rank_memory(p, frozenset({min(cpus)}))
        memory.append(lowest)
        nodes = rank_memory(p, cpus)
        if len(nodes) > 1:
            notes.append(f"rank {i} runs on NUMA nodes {format_list(nodes)}, but SGLang binds its memory to node "
                         f"{format_list(lowest)} only (the node of its lowest CPU, strictly)")
    notes.append(f"with {BIND} set, SGLang cannot size each rank's memory from its node: give --max-total-tokens; "
                 f"the entries must be as many as dp x tp x pp ranks ({len(plans)} here)")
    value = "|".join(format_list(s) for s in sets)
    return EngineWords("sglang", ((BIND, value),), (), tuple(memory), tuple(notes))


def sglang_default(topology: Topology, world_size: int) -> tuple[frozenset[int], ...]:
    """The CPUs SGLang binds each rank to with ``SGLANG_CPU_OMP_THREADS_BIND``
    unset: rank ``i`` on the ``i``-th NUMA node's first-listed CPU of each core,
    if allowed.  :class:`EngineError` where SGLang asserts (more ranks than such
    nodes)."""
    per_node: list[frozenset[int]] = []
    for n in topology.numa_nodes:
        firsts = {min(topology.cores[topology.pu(c).core].cpuset & n.cpuset) for c in n.cpuset}
        allowed = frozenset(firsts & topology.allowed)
        if allowed:
            per_node.append(allowed)
    if world_size > len(per_node):
        raise EngineError(f"SGLang ({BIND} unset): {world_size} ranks need as many NUMA nodes with allowed CPUs; "
                          f"{topology.describe()} has {len(per_node)}")
    return tuple(per_node[:world_size])
