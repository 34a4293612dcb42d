"""``affinity run``'s reports in numactl's words: ``--dry-run`` as numactl/taskset
shell lines (:func:`shell_text`), ``--hardware`` (:func:`hardware_text`) and
``--show`` (:func:`show_text`).  Text only: nothing here changes the process."""

from __future__ import annotations

import os
import shlex

from ..cpulist import format_list
from ..machine.topology import Topology
from .build import MEM_OPTION, Launch

__all__ = ["hardware_text", "shell_text", "show_text"]


def shell_text(launch: Launch) -> str:
    """The launch as shell lines built from numactl/taskset and env.

    Parameters
    ----------
    launch : Launch
        What to describe.

    Returns
    -------
    str
        One line per instance (``&`` and a final ``wait`` when several are started).
    """
    lines = []
    for inst in launch.instances:
        if inst.mempolicy is not None:
            mem = ("--localalloc" if inst.mempolicy == "local"
                   else f"--{MEM_OPTION[inst.mempolicy]}={format_list(inst.mem_nodes)}")
            head = ["numactl", f"--physcpubind={format_list(inst.cpus)}", mem, "--"]
        else:
            head = ["taskset", "-c", format_list(inst.cpus)]
        words = head + ["env"] + [f"{k}={v}" for k, v in sorted(inst.env.items())] + list(inst.argv)
        line = " ".join(shlex.quote(w) for w in words)
        if inst.log:
            line += f" > {shlex.quote(inst.log)} 2>&1"
        if launch.spawn:
            line += " &"
        lines.append(line)
    if launch.spawn:
        lines.append("wait")
    return "\n".join(lines)


def _node_meminfo(node: int, root: str = "/") -> tuple[int, int] | None:
    """(MemTotal, MemFree) in kB of a node from sysfs, as numactl reads them."""
    total = free = None
    try:
        with open(os.path.join(root, f"sys/devices/system/node/node{node}/meminfo")) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 4 and parts[2] == "MemTotal:":
                    total = int(parts[3])
                elif len(parts) >= 4 and parts[2] == "MemFree:":
                    free = int(parts[3])
    except (OSError, ValueError):
        return None
    return (total, free) if total is not None and free is not None else None


def _node_distances(node: int, root: str = "/") -> list[int] | None:
    try:
        with open(os.path.join(root, f"sys/devices/system/node/node{node}/distance")) as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return None


def hardware_text(topology: Topology, root: str | None = "/") -> str:
    """``numactl --hardware`` for a topology.

    Parameters
    ----------
    topology : Topology
        The machine: its NUMA nodes and their CPUs.
    root : str or None
        Where sysfs is found (``"/"``) for node sizes, free memory and distances;
        None for another machine: the sizes the topology knows, no distances.

    Returns
    -------
    str
    """
    nodes = sorted(topology.numa_nodes, key=lambda n: n.os_index)
    ids = [n.os_index for n in nodes]
    lines = [f"available: {len(nodes)} nodes ({format_list(ids)})"]
    for n in nodes:
        lines.append(f"node {n.os_index} cpus:" + "".join(f" {c}" for c in sorted(n.cpuset)))
        info = _node_meminfo(n.os_index, root) if root is not None else None
        if info is not None:
            lines.append(f"node {n.os_index} size: {info[0] // 1024} MB")
            lines.append(f"node {n.os_index} free: {info[1] // 1024} MB")
        elif n.memory:
            lines.append(f"node {n.os_index} size: {n.memory // (1024 * 1024)} MB")
    dist = {i: _node_distances(i, root) for i in ids} if root is not None else {}
    if dist and all(d is not None and len(d) == len(ids) for d in dist.values()):
        lines.append("node distances:")
        lines.append("node " + "".join(f"{i:3d} " for i in ids))
        for i in ids:
            lines.append(f"{i:3d}: " + "".join(f"{d:3d} " for d in dist[i]))  # type: ignore[union-attr]
    return "\n".join(lines)


def show_text(topology: Topology, mask: frozenset[int], policy: str, pol_nodes: frozenset[int],
              mems_allowed: frozenset[int]) -> str:
    """``numactl --show`` for a mask and memory policy (what this process has now).

    Parameters
    ----------
    topology : Topology
        The machine (which nodes the mask's CPUs are on).
    mask : frozenset of int
        The CPU mask.
    policy : str
        The memory policy's name (``"default"``, ``"bind"``, ``"interleave"``, ...).
    pol_nodes : frozenset of int
        The policy's nodes.
    mems_allowed : frozenset of int
        ``Mems_allowed_list`` (shown as ``membind`` unless the policy binds).

    Returns
    -------
    str
    """
    cpu_nodes = sorted(n.os_index for n in topology.numa_nodes if n.cpuset & mask)
    lines = [f"policy: {policy}"]
    if policy == "interleave":
        first = min(pol_nodes) if pol_nodes else 0
        lines += [f"preferred node: {first} (interleave next)",
                  "interleavemask: " + "".join(f"{n} " for n in sorted(pol_nodes)),
                  f"interleavenode: {first}"]
    elif policy in ("bind", "preferred"):
        lines.append(f"preferred node: {min(pol_nodes)}")
    else:
        lines.append("preferred node: current")
    membind = pol_nodes if policy == "bind" else mems_allowed
    lines += ["physcpubind: " + "".join(f"{c} " for c in sorted(mask)),
              "cpubind: " + "".join(f"{n} " for n in cpu_nodes),
              "nodebind: " + "".join(f"{n} " for n in cpu_nodes),
              "membind: " + "".join(f"{n} " for n in sorted(membind)),
              "preferred: " + ("".join(f"{n} " for n in sorted(pol_nodes))
                               if policy in ("bind", "preferred", "interleave") else "")]
    return "\n".join(lines)
