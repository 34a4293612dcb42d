"""Where ``affinity run --instances K`` and PyTorch's ``run_cpu --ninstances K``
put K instances, computed (not timed) on any machine description.

``run_cpu`` (``torch/backends/xeon/run_cpu.py``, PyTorch 2.x) reads
``lscpu --parse=CPU,Core,Socket,Node``, takes the sorted **Core** column (a
core number) as its list of "cores", gives instance ``i`` the slice
``cores[i*n:(i+1)*n]`` and starts it as ``numactl -C <that slice> -m <nodes>``
with ``OMP_NUM_THREADS=n``: the core numbers are handed to numactl as **CPU**
numbers (and looked up as CPU numbers to find the memory nodes).  On machines
whose hardware threads are numbered ``i, i+N`` (most Linux x86 servers) core k
and CPU k coincide; where the siblings of a core are adjacent (CPU 2k and 2k+1,
e.g. IBM POWER, some hypervisors' guests, and hwloc's synthetic machines)
they do not: the instances land on half the cores, two threads per
core, and the second package stays idle.

:func:`run_cpu_instances` follows that code for ``--ninstances K`` (no
``--core-list``, no ``--use-logical-core``); on a machine with PyTorch,
:func:`check_against_torch` compares its core lists with run_cpu's own
``_CPUinfo`` on the same ``lscpu`` text.  :func:`affinity_instances` is
``affinity run --instances K --dry-run`` on the same machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from affinity.cpulist import format_list
from affinity.launcher.build import Context, build_launch
from affinity.launcher.options import RunOptions
from affinity.machine.topology import Topology


@dataclass(frozen=True)
class Placed:
    """One instance: its process mask, memory nodes and thread count, and what that means."""

    cpus: frozenset[int]
    nodes: frozenset[int]
    threads: int
    cores: int  #: physical cores under the mask
    packages: frozenset[int]  #: packages (OS index) under the mask


def lscpu_rows(topology: Topology) -> list[tuple[int, int, int, int]]:
    """``lscpu --parse=CPU,Core,Socket,Node`` of the machine: (CPU, core number,
    socket, node), cores numbered from 0 in the order of their first CPU as
    lscpu numbers them."""
    core_no: dict[int, int] = {}
    rows = []
    for cpu in sorted(topology.cpuset):
        pu = topology.pu(cpu)
        core_no.setdefault(pu.core, len(core_no))
        node = topology.numa_nodes[pu.numa].os_index if pu.numa is not None else 0
        rows.append((cpu, core_no[pu.core], topology.packages[pu.package].os_index, node))
    return rows


def lscpu_text(topology: Topology) -> str:
    return "# CPU,Core,Socket,Node\n" + "\n".join(",".join(map(str, r)) for r in lscpu_rows(topology)) + "\n"


def run_cpu_instances(topology: Topology, k: int) -> list[Placed]:
    """``run_cpu --ninstances K``: the physical "cores" (the Core column, node by
    node), ``n = len(cores) // K`` per instance, instance i's slice of the sorted
    numbers given to ``numactl -C`` as CPUs, ``-m`` the nodes of those CPUs."""
    rows = lscpu_rows(topology)
    nodes = sorted({r[3] for r in rows})
    cores: list[int] = []
    node_of_cpu = {r[0]: r[3] for r in rows}
    for node in nodes:  # _CPUinfo.get_all_physical_cores: per node, each core number once
        for r in rows:
            if r[3] == node and r[1] not in cores:
                cores.append(r[1])
    n = len(cores) // k
    cores = sorted(cores)
    out = []
    for i in range(k):
        as_cpus = frozenset(cores[i * n:(i + 1) * n])
        out.append(_placed(topology, as_cpus, frozenset(node_of_cpu[c] for c in as_cpus), n))
    return out


def affinity_instances(topology: Topology, k: int) -> list[Placed]:
    """``affinity run --instances K --dry-run`` on the machine."""
    launch = build_launch(RunOptions(command=("true",), instances=k), topology, Context({}))
    return [_placed(topology, i.cpus, i.mem_nodes, i.threads) for i in launch.instances]


def _placed(topology: Topology, cpus: frozenset[int], nodes: frozenset[int], threads: int) -> Placed:
    cores = {topology.pu(c).core for c in cpus if c in topology.cpuset}
    pkgs = frozenset(topology.packages[topology.pu(c).package].os_index for c in cpus if c in topology.cpuset)
    return Placed(cpus, nodes, threads, len(cores), pkgs)


def check_against_torch(topology: Topology) -> bool | None:
    """run_cpu's own ``_CPUinfo`` on this machine's ``lscpu`` text agrees with
    :func:`lscpu_rows`' core lists (None without PyTorch)."""
    try:
        from torch.backends.xeon.run_cpu import _CPUinfo
    except ImportError:
        return None
    info = _CPUinfo(test_input=lscpu_text(topology))
    ours = {}
    for cpu, core, _s, node in lscpu_rows(topology):
        ours.setdefault(node, [])
        if core not in ours[node]:
            ours[node].append(core)
    return [info.get_node_physical_cores(n) for n in sorted(ours)] == [ours[n] for n in sorted(ours)]


MACHINES = ("pack:2 [numa] core:28 pu:2", "pack:2 [numa] core:8 pu:2",
            "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)")


def table(description: str, ks: tuple[int, ...] = (2, 4)) -> list[dict[str, Any]]:
    """Rows comparing both tools on ``synthetic:<description>``."""
    t = Topology.from_synthetic(description)
    out = []
    for k in ks:
        for tool, placed in (("run_cpu", run_cpu_instances(t, k)), ("affinity", affinity_instances(t, k))):
            for i, p in enumerate(placed):
                out.append({"machine": description, "k": k, "tool": tool, "instance": i,
                            "cpus": format_list(p.cpus), "threads": p.threads, "cores": p.cores,
                            "packages": format_list(p.packages), "memory": format_list(p.nodes)})
    return out


def markdown() -> str:
    """The comparison as the Markdown section ``bench/report.py`` writes."""
    lines = []
    for d in MACHINES:
        t = Topology.from_synthetic(d)
        sib = sorted(t.cores[0].cpuset)
        lines += [f"**`{d}`** ({t.describe()}; core 0 = CPUs {format_list(sib)})", "",
                  "| K | tool | instance | CPUs (process mask) | threads | cores under the mask | packages | memory |",
                  "|---:|---|---:|---|---:|---:|---|---|"]
        for r in table(d):
            lines.append(f"| {r['k']} | {r['tool']} | {r['instance']} | {r['cpus']} | {r['threads']} | "
                         f"{r['cores']} | {r['packages']} | {r['memory']} |")
        lines.append("")
    return "\n".join(lines)
