"""OpenVINO's CPU plugin, told what it can be told (pure).

OpenVINO exposes no per-thread CPU set: its CPU properties are counts and switches
(``INFERENCE_NUM_THREADS``, ``NUM_STREAMS``, ``ENABLE_CPU_PINNING``,
``ENABLE_HYPER_THREADING``, ``SCHEDULING_CORE_TYPE``), and the CPUs it may use are
those of the thread that compiles the process's first model (measured on 2026.4.1:
its CPU map is read from that thread's affinity then and kept; a later narrower
mask changes nothing).  With pinning on it pins its stream threads itself, one
CPU each, in an order of its own.  Its latency default (one stream) on Linux:
the cores of one socket, hyper-threading off, pinning on -- except on a hybrid
machine running P- and E-cores together, where it pins nothing.
"""

from __future__ import annotations

from typing import Any

from ...cpulist import format_list
from ...machine.topology import Topology
from ...record import record

__all__ = ["NOT_TOLD", "OvProperties", "ov_default_threads", "ov_properties"]

#: what OpenVINO cannot be told, in one line
NOT_TOLD = ("OpenVINO takes no per-thread CPU set: its threads get the plan's CPUs (the compiling thread's "
            "mask) and their count, and it pins each to a CPU of its choosing among them")


@record
class OvProperties:
    """The CPU properties a plan gives ``compile_model`` (string keys and values,
    as ``core.compile_model(model, "CPU", ov_properties(plan).config())`` takes them)."""

    inference_num_threads: int
    num_streams: int
    enable_cpu_pinning: bool
    enable_hyper_threading: bool
    scheduling_core_type: str  #: "ANY_CORE", "PCORE_ONLY" or "ECORE_ONLY"
    cpus: frozenset[int]  #: the CPUs OpenVINO must see: the compiling thread's mask
    notes: tuple[str, ...] = ()

    def config(self) -> dict[str, str]:
        return {"INFERENCE_NUM_THREADS": str(self.inference_num_threads), "NUM_STREAMS": str(self.num_streams),
                "ENABLE_CPU_PINNING": "YES" if self.enable_cpu_pinning else "NO",
                "ENABLE_HYPER_THREADING": "YES" if self.enable_hyper_threading else "NO",
                "SCHEDULING_CORE_TYPE": self.scheduling_core_type}


def _kinds(topology: Topology, cpus: frozenset[int]) -> tuple[int | None, ...]:
    return tuple(sorted({topology.core_of(c).efficiency for c in cpus}, key=lambda e: -1 if e is None else e))


def ov_properties(plan: Any) -> OvProperties:
    """One stream of the plan's intra-op thread count on the plan's CPUs, pinned;
    hyper-threading on when the plan runs threads on two PUs of one core; on a
    hybrid machine the core type of the plan's cores."""
    topo: Topology = plan.topology
    cpus = frozenset().union(*plan.cpusets)
    per_core: dict[int, int] = {}
    for c in cpus:
        per_core[topo.pu(c).core] = per_core.get(topo.pu(c).core, 0) + 1
    ht = any(v > 1 for v in per_core.values()) and plan.granularity == "thread"
    machine_kinds = {c.efficiency for c in topo.cores}
    used = _kinds(topo, cpus)
    core_type = "ANY_CORE"
    notes = [NOT_TOLD]
    if len(machine_kinds) > 1 and len(used) == 1:
        fastest = max(e if e is not None else -1 for e in machine_kinds)
        core_type = "PCORE_ONLY" if (used[0] if used[0] is not None else -1) == fastest else "ECORE_ONLY"
    elif len(machine_kinds) > 1:
        notes.append("the plan runs P- and E-cores together, where OpenVINO's own default pins nothing: "
                     "ENABLE_CPU_PINNING=YES asked (OpenVINO may still turn it off; read back)")
    return OvProperties(inference_num_threads=int(plan.intra_op_threads), num_streams=1, enable_cpu_pinning=True,
                        enable_hyper_threading=ht, scheduling_core_type=core_type, cpus=cpus, notes=tuple(notes))


def ov_default_threads(topology: Topology) -> int:
    """OpenVINO's latency default thread count: the cores of one socket (its
    fastest cores on a hybrid machine), of the CPUs allowed."""
    best = 0
    for p in topology.packages:
        cores = {topology.pu(c).core for c in p.cpuset & topology.allowed}
        kinds = {topology.cores[i].efficiency for i in cores}
        fast = max((e for e in kinds if e is not None), default=None)
        n = sum(1 for i in cores if topology.cores[i].efficiency == fast) if len(kinds) > 1 else len(cores)
        best = max(best, n)
    return best


def describe(props: OvProperties) -> str:
    """One line: the properties and the CPUs."""
    return (", ".join(f"{k}={v}" for k, v in props.config().items()) + f" on CPUs {format_list(props.cpus)}")
