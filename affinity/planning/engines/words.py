"""What the serving engines are told: the value every engine's words take, and the
checks their one-CPU-per-thread binders share (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...cpulist import format_list
from ...errors import EngineError
from ...record import record
from ..serving import ENGINES

__all__ = ["ENGINES", "EngineWords", "check_disjoint", "one_cpu_per_thread", "rank_memory"]


@record
class EngineWords:
    """An engine's own words for one plan per tensor-parallel rank or instance.

    ``env`` is for the server's environment (vLLM, SGLang: one variable lists every
    rank); ``argv`` holds one tuple of flags per instance (llama.cpp); ``memory``
    the NUMA nodes (OS indexes) each rank's or instance's memory lands on, as the
    engine binds it (vLLM, SGLang: the node of the rank's lowest CPU) or as the
    launcher must bind it (llama.cpp binds none); ``notes`` what the words cannot
    carry or what the engine would have done by itself.
    """

    engine: str
    env: tuple[tuple[str, str], ...] = ()
    argv: tuple[tuple[str, ...], ...] = ()
    memory: tuple[frozenset[int], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def environ(self) -> dict[str, str]:
        return dict(self.env)

    def lines(self) -> list[str]:
        """One line per variable (``NAME=value``) or instance (its flags)."""
        out = [f"{k}={v}" for k, v in self.env]
        out += [f"instance {i}: {' '.join(a)}" for i, a in enumerate(self.argv)]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "env": dict(self.env), "argv": [list(a) for a in self.argv],
                "memory": [format_list(m) for m in self.memory], "notes": list(self.notes)}


def one_cpu_per_thread(engine: str, rule: str, index: int, cpusets: Sequence[frozenset[int]]) -> frozenset[int]:
    """The CPUs of one rank's plan for an engine that binds thread ``i`` to the
    ``i``-th CPU of a list it reads as a set (``rule`` names where): every thread
    on one CPU of its own.  A thread on several CPUs, or two threads on one CPU,
    cannot be said that way: :class:`EngineError` naming the thread."""
    seen: dict[int, int] = {}
    for t, s in enumerate(cpusets):
        if len(s) != 1:
            raise EngineError(f"{engine}: rank {index} thread {t} may run on CPUs {{{format_list(s)}}}; {rule} "
                              f"binds each thread to one CPU of its list: plan one CPU per thread "
                              f"(granularity=fine)")
        (cpu,) = s
        if cpu in seen:
            raise EngineError(f"{engine}: rank {index} threads {seen[cpu]} and {t} share CPU {cpu}; {rule} "
                              f"reads the list as a set of CPUs, one thread each")
        seen[cpu] = t
    return frozenset(seen)


def check_disjoint(engine: str, sets: Sequence[frozenset[int]], noun: str = "rank") -> None:
    """Ranks (instances) of one server on disjoint CPUs, else :class:`EngineError`."""
    for i, a in enumerate(sets):
        for j in range(i + 1, len(sets)):
            common = a & sets[j]
            if common:
                raise EngineError(f"{engine}: {noun}s {i} and {j} share CPUs {format_list(common)}; each {noun}'s "
                                  f"threads need CPUs of their own")


def rank_memory(plan: Any, cpus: frozenset[int]) -> frozenset[int]:
    """The NUMA nodes (OS indexes) of ``cpus`` on the plan's machine."""
    topo = plan.topology
    return frozenset(topo.numa_nodes[topo.pu(c).numa].os_index for c in cpus if topo.pu(c).numa is not None)

