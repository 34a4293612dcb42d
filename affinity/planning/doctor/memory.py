"""Check of where a process's memory is against where its threads run, from its
``numa_maps``.  Pure: a function of a :class:`~affinity.planning.doctor.values.Snapshot`."""

from __future__ import annotations

from ...cpulist import format_list
from .masks import run_line
from .values import Finding, ProcessState, Snapshot

__all__ = ["remote_memory"]

#: share of a process's memory on other nodes than its threads' that is an error ("mostly")
MOSTLY = 0.5
#: ... and that is worth a warning (TensorRT-LLM#18117 measured 22% remote)
NOTABLE = 0.2
#: processes with less memory mapped are not judged (an idle interpreter's few MiB)
MIN_BYTES = 1 << 20


def _nodes_of(snap: Snapshot, cpus: frozenset[int]) -> frozenset[int]:
    """The NUMA nodes (OS ids) of ``cpus``."""
    return frozenset(n.os_index for n in snap.topology.numa_nodes if n.cpuset & cpus)


def _mib(b: int) -> str:
    return f"{b / (1 << 20):.0f} MiB" if b >= 10 << 20 else f"{b / (1 << 20):.1f} MiB"


def remote_memory(snap: Snapshot) -> list[Finding]:
    """A process whose memory is mostly (> 50%: error) or notably (>= 20%: warning)
    on NUMA nodes other than those its threads run on: memory bound to one node,
    threads moved to another (or first touched by a thread on the wrong node).

    The threads' nodes are those of the CPUs of its runnable threads' masks (all
    its threads' when none is runnable); a process whose threads may run on every
    node holding its memory is not judged.

    What it cannot do: pages of shared libraries are left out (they sit where the
    first process read them); pages swapped out are on no node."""
    if len(snap.topology.numa_nodes) < 2:
        return []
    out = []
    for p in snap.processes:
        f = _remote(snap, p)
        if f is not None:
            out.append(f)
    return out


def _remote(snap: Snapshot, p: ProcessState) -> Finding | None:
    mem = p.memory
    if mem is None or mem.total < MIN_BYTES or not p.threads:
        return None
    threads = p.runnable or p.threads
    cpus = frozenset().union(*(t.cpus for t in threads))
    nodes = _nodes_of(snap, cpus)
    holding = {n for n, b in mem.by_node if b}
    if not nodes or holding <= nodes:
        return None
    remote = mem.total - mem.on(nodes)
    share = remote / mem.total
    if share < NOTABLE:
        return None
    other = frozenset(holding - nodes)
    here, there = format_list(nodes), format_list(other)
    ev = [f"{share:.0%} of its {_mib(mem.total)} of memory (numa_maps, shared libraries left out) is on node"
          f"{'s' if len(other) > 1 else ''} {there}; its {'runnable ' if p.runnable else ''}threads run on node"
          f"{'s' if len(nodes) > 1 else ''} {here} (CPU{'s' if len(cpus) > 1 else ''} {format_list(cpus)})",
          "by node: " + ", ".join(f"node {n} {_mib(b)} ({b / mem.total:.0%})" for n, b in mem.by_node if b)]
    ev += [f"memory policy {pol}: {b / mem.total:.0%} of it" for pol, b in mem.by_policy[:3]]
    sev = "error" if share > MOSTLY else "warning"
    return Finding(
        kind="remote-memory", severity=sev, pids=(p.pid,),
        summary=f"pid {p.pid}: {share:.0%} of its memory is on node{'s' if len(other) > 1 else ''} {there}, "
        f"its threads on node{'s' if len(nodes) > 1 else ''} {here}", evidence=tuple(ev),
        fix=f"{run_line(p, f'-N {here} -m {here}')} (threads and memory on node{'s' if len(nodes) > 1 else ''} "
        f"{here}), or affinity.apply(membind='auto') before the allocations; the pages already placed: "
        f"migratepages {p.pid} {there} {here}",
        facts=(("remote_share", round(share, 4)), ("thread_nodes", nodes), ("memory_nodes", frozenset(holding)),
        ("bytes_by_node", dict(mem.by_node))))
