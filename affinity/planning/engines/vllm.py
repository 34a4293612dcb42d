"""vLLM's CPU backend, in its own words (pure).

What vLLM reads, as its source says (``vllm/envs.py``, ``vllm/v1/worker/cpu_worker.py``
``CPUWorker.init_device`` and ``_get_autobind_cpu_ids``, ``csrc/cpu/utils.cpp``
``init_cpu_threads_env``):

* ``VLLM_CPU_OMP_THREADS_BIND`` (default ``auto``): ``nobind`` binds nothing;
  ``auto`` binds worker rank ``r`` to the ``r``-th NUMA node that holds allowed
  CPUs, one CPU per core (on x86 the core's highest-numbered sibling), less the
  last ``VLLM_CPU_NUM_OF_RESERVED_CPU`` CPUs; anything else is split at ``|``
  and the worker takes the entry of its rank (with data parallelism the entries
  ``d*world .. (d+1)*world - 1`` of local DP rank ``d``).
* An entry goes to libnuma's ``numa_parse_cpustring`` (``0-31``, ``0,2,4``,
  ``0-3,8``; CPUs outside the process's allowed set make it fail): the threads
  are then as many as the CPUs, thread ``i`` on the ``i``-th CPU in increasing
  order, one CPU each; memory is bound strictly (``numa_set_membind`` +
  ``numa_set_strict``) to the node of the entry's lowest CPU.
* ``VLLM_CPU_NUM_OF_RESERVED_CPU`` is read only under ``auto``; its default
  there is 1 with several ranks, else 0.

What cannot be said: a thread on several CPUs, two threads on one CPU, a rank's
memory on several nodes (vLLM binds it to one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...cpulist import format_list
from ...errors import EngineError
from ...machine.topology import Topology
from .words import EngineWords, check_disjoint, one_cpu_per_thread, rank_memory

__all__ = ["BIND", "RESERVED", "vllm_default", "vllm_words"]

BIND = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED = "VLLM_CPU_NUM_OF_RESERVED_CPU"
_RULE = "vLLM's init_cpu_threads_env (csrc/cpu/utils.cpp)"


def vllm_words(plans: Sequence[Any]) -> EngineWords:
    """``VLLM_CPU_OMP_THREADS_BIND`` for one plan per tensor-parallel rank (rank
    order), each rank's threads one per CPU.

    Raises
    ------
    EngineError
        No plan; a thread on several CPUs or two threads on one CPU (vLLM binds
        thread ``i`` to the ``i``-th listed CPU); ranks sharing CPUs.
    """
    if not plans:
        raise EngineError("vLLM: no rank to bind (give one plan per tensor-parallel rank)")
    sets = [one_cpu_per_thread("vLLM", _RULE, i, p.cpusets) for i, p in enumerate(plans)]
    check_disjoint("vLLM", sets)
    memory = []
    notes = []
    for i, (p, cpus) in enumerate(zip(plans, sets)):
        nodes = rank_memory(p, cpus)
        lowest = rank_memory(p, frozenset({min(cpus)}))
        memory.append(lowest)
        if len(nodes) > 1:
            notes.append(f"rank {i} runs on NUMA nodes {format_list(nodes)}, but vLLM binds its memory to node "
                         f"{format_list(lowest)} only (the node of its lowest CPU, strictly): remote for the rest")
    notes.append(f"{RESERVED} is read only with {BIND}=auto: the CPUs kept for the API server are those "
                 f"left out of the list")
    value = "|".join(format_list(s) for s in sets)
    return EngineWords("vllm", ((BIND, value),), (), tuple(memory), tuple(notes))


def vllm_default(topology: Topology, world_size: int, reserved: int | None = None,
                 smt_pick: str = "last") -> tuple[frozenset[int], ...]:
    """The CPUs vLLM binds each rank to by itself (``auto``): rank ``r`` on the
    ``r``-th NUMA node holding allowed CPUs, one CPU per core (``smt_pick="last"``:
    the highest sibling, as on x86; ``"all"``: every sibling, as on AArch64), the
    last ``reserved`` CPUs of that list left out (default: 1 when ``world_size > 1``).

    Raises :class:`EngineError` where vLLM asserts: fewer such nodes than ranks,
    or no CPU left after the reservation."""
    nodes = [n for n in topology.numa_nodes if n.cpuset & topology.allowed]
    if world_size < 1:
        raise EngineError(f"vLLM: world size must be >= 1, got {world_size}")
    if len(nodes) < world_size:
        raise EngineError(f"vLLM ({BIND}=auto): {world_size} ranks need as many NUMA nodes with allowed CPUs; "
                          f"{topology.describe()} has {len(nodes)}")
    keep = (1 if world_size > 1 else 0) if reserved is None else reserved
    out = []
    for r in range(world_size):
        cpus = nodes[r].cpuset & topology.allowed
        by_core: dict[int, list[int]] = {}
        for c in sorted(cpus):
            by_core.setdefault(topology.pu(c).core, []).append(c)
        picked = sorted(c for sib in by_core.values() for c in (sib[-1:] if smt_pick == "last" else sib))
        if len(picked) <= keep:
            raise EngineError(f"vLLM ({BIND}=auto): {RESERVED} ({keep}) should be less than the {len(picked)} "
                              f"CPUs of rank {r}")
        out.append(frozenset(picked[:len(picked) - keep]))
    return tuple(out)
