"""Where a serving engine's instances (or tensor-parallel ranks) go: pure.

:func:`serving_layout` cuts the allowed CPUs of a machine with
:func:`affinity.planning.partition.partition` -- one share per NUMA node (SNC domain,
NPS node) by default, or one per L3 group (``by="llc"``, AMD's CCX) -- keeps
``reserve`` cores of each share (or of each node) off the engine for the API
server and tokenizer, and plans the engine's threads on the rest: one thread per
core, on one PU of it (``smt=True``: every PU), each share's memory on its own
nodes.  On a hybrid machine the engine's threads go on the fastest cores and the
reserved cores are taken from the slowest: a tensor-parallel step waits for its
slowest thread, and the API server and tokenizer do light, latency-bound work.

What it cannot do: see more than the topology says (a machine whose firmware
hides SNC shows one node per package); weigh shares by memory size; place the
API server itself (the reserved cores are left free for the scheduler to use).
"""

from __future__ import annotations

from typing import Any

from ...cpulist import format_list
from ...errors import PlanError
from ...machine.topology import Topology
from ...record import record
from ..planner import Plan, plan
from ..partition import Share, kinds_note, partition

__all__ = ["EngineShare", "ServingLayout", "serving_layout"]

#: one engine thread per core, on the core's PUs in the order the planner gives:
#: every core before any sibling (``compact,1,0``)
_SPEC = "granularity=fine,compact,1,0"


@record
class EngineShare:
    """One rank's or instance's part of the machine."""

    index: int
    cpus: frozenset[int]  #: the engine threads' CPUs, one thread each
    reserved: frozenset[int]  #: CPUs of its share kept off the engine (API server, tokenizer)
    memory: frozenset[int]  #: NUMA nodes (OS indexes) of ``cpus``: where its memory goes
    plan: Plan  #: thread ``i`` -> its CPU

    def describe(self, unit: str) -> str:
        kept = f", kept for the server: {format_list(self.reserved)}" if self.reserved else ""
        nodes = f", memory on node{'s' if len(self.memory) != 1 else ''} {format_list(self.memory)}" \
            if self.memory else ""
        return f"{unit} {self.index}: {len(self.cpus)} threads on {format_list(self.cpus)}{nodes}{kept}"


@record
class ServingLayout:
    """:func:`serving_layout`'s answer."""

    topology: Topology
    shares: tuple[EngineShare, ...]
    unit: str  #: what a share is called: "rank" (tensor parallel) or "instance"
    by: str  #: "numa" or "llc"
    reserve: int
    reserve_per: str  #: "instance" or "node"
    notes: tuple[str, ...] = ()
    node_reserved: frozenset[int] = frozenset()  #: with ``reserve_per="node"``: the CPUs kept in each node


    @property
    def plans(self) -> tuple[Plan, ...]:
        return tuple(s.plan for s in self.shares)

    @property
    def reserved(self) -> frozenset[int]:
        return frozenset().union(self.node_reserved, *(s.reserved for s in self.shares))

    def lines(self) -> list[str]:
        kept = [f"kept for the server in each node: {format_list(self.node_reserved)}"] if self.node_reserved else []
        return [s.describe(self.unit) for s in self.shares] + kept + [f"note: {n}" for n in self.notes]

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "by": self.by, "reserve": self.reserve, "reserve_per": self.reserve_per,
                "reserved": format_list(self.reserved), "shares": [{"index": s.index, "cpus": format_list(s.cpus), "reserved": format_list(s.reserved),
                            "memory": format_list(s.memory), "threads": [format_list(c) for c in s.plan.cpusets]}
                           for s in self.shares],
                "notes": list(self.notes)}


def _domains(topology: Topology, by: str) -> list[frozenset[int]]:
    """The allowed CPUs of each NUMA node (or L3 cache) that holds some."""
    if by == "numa":
        sets = [n.cpuset for n in topology.numa_nodes] or [p.cpuset for p in topology.packages]
    elif by == "llc":
        sets = [c.cpuset for c in topology.llcs] or [p.cpuset for p in topology.packages]
    else:
        raise PlanError(f"serving_layout: by must be 'numa' or 'llc', not {by!r}")
    return [s & topology.allowed for s in sets if s & topology.allowed]


def _by_speed(topology: Topology, cores: tuple[int, ...]) -> list[int]:
    """Core logical indexes, fastest kind first (topology order within a kind)."""
    return sorted(cores, key=lambda i: -(topology.cores[i].efficiency or 0))


def _kept(topology: Topology, cores: tuple[int, ...], k: int, where: str) -> list[int]:
    """The ``k`` cores of ``cores`` kept off the engine: the slowest, the last ones."""
    if k >= len(cores):
        raise PlanError(f"serving_layout: {where} has {len(cores)} core{'s' if len(cores) != 1 else ''}, "
                        f"so {k} cannot be kept for the server and leave one for the engine")
    return _by_speed(topology, cores)[len(cores) - k:] if k else []


def _cpus_of(topology: Topology, cores: list[int]) -> frozenset[int]:
    return frozenset().union(*(topology.cores[i].cpuset & topology.allowed for i in cores)) if cores \
        else frozenset()


def _cut(topology: Topology, count: int, by: str, reserve: int,
         reserve_per: str) -> tuple[list[Share], frozenset[int]]:
    """The shares, and the CPUs kept per node (``reserve_per="node"``)."""
    kept: frozenset[int] = frozenset()
    topo = topology
    if reserve_per == "node" and reserve:
        for n in (topology.numa_nodes or topology.packages):
            cores = tuple(sorted({topology.pu(c).core for c in n.cpuset & topology.allowed}))
            if cores:
                kept |= _cpus_of(topology, _kept(topology, cores, reserve, f"NUMA node {n.os_index}"))
        topo = topology.with_allowed(topology.allowed - kept)
    if by == "llc":
        llc_cores = [len({topo.pu(c).core for c in d}) for d in _domains(topo, "llc")]
        shares = partition(topo, count, cores_per_share=min(llc_cores)) if count <= len(llc_cores) \
            else partition(topo, count)
    else:
        shares = partition(topo, count)
    return list(shares), kept


def serving_layout(topology: Topology, count: int | None = None, *, reserve: int = 0,
                   reserve_per: str = "instance", by: str = "numa", unit: str = "instance",
                   smt: bool = False) -> ServingLayout:
    """Instances (or tensor-parallel ranks) of a serving engine, one per NUMA node
    (``by="llc"``: per L3 group) of the allowed CPUs, ``reserve`` cores of each
    (``reserve_per="node"``: of each NUMA node) kept for the API server and
    tokenizer, the engine's threads one per remaining core.

    Parameters
    ----------
    topology : Topology
        The machine; ``allowed`` is what the server may use.
    count : int, optional
        Instances or ranks (default: one per NUMA node, or per L3 group).
    reserve : int
        Cores kept off the engine's threads in each share (or node).
    reserve_per : {"instance", "node"}
    by : {"numa", "llc"}
    unit : str
        What a share is called in the notes: ``"rank"`` or ``"instance"``.
    smt : bool
        Engine threads on every PU of their cores (default: one PU per core).

    Raises
    ------
    PlanError
        ``count`` below 1; shares that cannot be disjoint; a share (node) with no
        more cores than ``reserve``; a bad ``by`` or ``reserve_per``.
    """
    if reserve < 0:
        raise PlanError(f"serving_layout: reserve must be >= 0, got {reserve}")
    if reserve_per not in ("instance", "node"):
        raise PlanError(f"serving_layout: reserve_per must be 'instance' or 'node', not {reserve_per!r}")
    domains = _domains(topology, by)
    n = len(domains) if count is None else count
    if n < 1:
        raise PlanError(f"serving_layout: need at least one {unit}, got {n}")
    shares, node_kept = _cut(topology, n, by, reserve, reserve_per)
    out, notes = [], []
    for s in shares:
        cores = tuple(s.cores)
        kept = _kept(topology, cores, reserve if reserve_per == "instance" else 0, f"{unit} {s.index}")
        engine = [c for c in _by_speed(topology, cores) if c not in kept]
        pus = frozenset(min(topology.cores[c].cpuset & topology.allowed) for c in engine) if not smt \
            else _cpus_of(topology, engine)
        p = plan(_SPEC, threads=len(pus), topology=topology.with_allowed(pus), initial_mask=pus)
        reserved = (s.cpus - _cpus_of(topology, engine)) | _cpus_of(topology, kept)
        out.append(EngineShare(s.index, pus, reserved, s.numa_nodes, p))
    notes += _notes(topology, out, shares, unit, len(domains), by)
    return ServingLayout(topology=topology, shares=tuple(out), unit=unit, by=by, reserve=reserve,
                         reserve_per=reserve_per, notes=tuple(notes), node_reserved=node_kept)


def _notes(topology: Topology, out: list[EngineShare], shares: list[Share], unit: str, domains: int,
           by: str) -> list[str]:
    notes = []
    where = "NUMA nodes" if by == "numa" else "L3 groups"
    if len(out) > domains:
        notes.append(f"{len(out)} {unit}s on {domains} {where if domains != 1 else where[:-1]}: {unit}s share them")
    for s in out:
        if len(s.memory) > 1:
            notes.append(f"{unit} {s.index} spans NUMA nodes {format_list(s.memory)}: its memory cannot all be local")
    if any(c.efficiency is not None for c in topology.cores) and len({c.efficiency for c in topology.cores}) > 1:
        fast = max(c.efficiency or 0 for c in topology.cores)
        slow_used = [s.index for s in out if any((topology.core_of(c).efficiency or 0) < fast for c in s.cpus)]
        said = (f"; {unit}{'s' if len(slow_used) != 1 else ''} {format_list(slow_used)} also "
                f"run{'' if len(slow_used) != 1 else 's'} on slower cores (not enough fast ones)" if slow_used else "")
        notes.append("hybrid machine: engine threads on the fastest cores first and the cores kept for the server "
                     "taken from the slowest, since a parallel step waits for its slowest thread and the API "
                     "server and tokenizer do light work" + said)
        said_kinds = kinds_note(topology, shares, noun=unit)
        if said_kinds:
            notes.append(said_kinds)
    return notes
