"""What libgomp reads of the machine, derived from a :class:`Topology`.

libgomp never asks hwloc: it opens sysfs files (``strace`` of the real library
confirms it, see ``tests/golden_gomp/README.md``):

==========================================  ==========================================
``cpu/cpuN/topology/thread_siblings_list``  the PUs of N's core (:func:`thread_siblings`)
``cpu/cpuN/topology/core_siblings_list``    the PUs of N's package
``cpu/cpuN/cache/indexK/{level,shared_cpu_list}``  N's caches (the last level is used)
``node/online``, ``node/nodeK/cpulist``     the NUMA nodes, by node number
==========================================  ==========================================

:func:`sysfs_view` is the one place that turns a :class:`Topology` into those
facts; :func:`view_from_files` reads the same facts from the files' text (the
test checks the two agree on the machines the real library was run on).
Offline CPUs have no files, so they appear in no list.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...cpulist import parse_list
from ...machine.topology import Topology
from ...record import record

__all__ = ["SysfsView", "sysfs_view", "thread_siblings", "view_from_files"]


@record
class SysfsView:
    """The machine as libgomp sees it.  Every set holds OS CPU numbers."""

    #: CPU -> its ``thread_siblings_list``
    thread_siblings: Mapping[int, frozenset[int]]
    #: CPU -> its ``core_siblings_list``
    core_siblings: Mapping[int, frozenset[int]]
    #: CPU -> ``shared_cpu_list`` of its highest-level cache (absent: no cache files)
    last_cache: Mapping[int, frozenset[int]]
    #: ``(node number, cpulist)`` for each node of ``node/online``, ascending
    numa_nodes: tuple[tuple[int, frozenset[int]], ...]
    #: CPUs the kernel accepts in an affinity mask (online and in the cpuset)
    usable: frozenset[int]


def sysfs_view(topology: Topology) -> SysfsView:
    """The sysfs facts libgomp would read on ``topology``'s machine.

    Thread siblings are the PU's core, core siblings its package (Linux's
    ``core_siblings`` is the package), the last-level cache is the
    highest-level cache holding the PU, NUMA nodes come in node-number order
    with their full CPU lists (memory-only nodes list none).  ``usable`` is
    ``topology.allowed``: the CPUs a thread of this process may be bound to.

    Caches: a PU no cache holds has no cache files.  A topology that lists no
    cache is a machine whose sysfs has no ``cpu/cpuN/cache/`` (an hwloc source:
    hwloc reads those files, so an XML, synthetic description or this system
    without caches is such a machine; libgomp's ``ll_caches`` then finds none),
    unless its source could not say (``topology.caches_known`` false: a cpuinfo
    file), where one cache per package is taken, the common case.
    """
    threads = thread_siblings(topology)
    cores: dict[int, frozenset[int]] = {}
    for pu in topology.pus:
        cores[pu.os_index] = topology.packages[pu.package].cpuset
    cache: dict[int, tuple[int, frozenset[int]]] = {}
    for c in topology.caches:
        for cpu in c.cpuset:
            if cpu not in cache or c.level >= cache[cpu][0]:
                cache[cpu] = (c.level, c.cpuset)
    if not topology.caches and not topology.caches_known:  # a cpuinfo file: one per package, the common case
        cache = {cpu: (0, cores[cpu]) for cpu in cores}
    nodes = tuple(sorted((n.os_index, n.cpuset) for n in topology.numa_nodes))
    return SysfsView(threads, cores, {k: v[1] for k, v in cache.items()}, nodes,
                     topology.allowed or topology.cpuset)


def thread_siblings(topology: Topology) -> dict[int, frozenset[int]]:
    """Each CPU's ``thread_siblings_list`` as Linux writes it: the hardware threads
    of its core -- which is not always ``topology.cores``:

    * a :class:`Topology` core is a package's CPUs of one core id (what Intel's
      runtime reads), and the kernel numbers cores from 0 again in every die of
      a multi-die package and, on arm64 device trees, in every cluster: such a
      "core" spans dies or clusters.  Linux's siblings share a die, a cluster and
      the last-level cache (``match_smt`` in ``arch/x86/kernel/smpboot.c``): the
      core is cut by every group holding the CPU and by its caches above level 1
      (a cluster that hwloc merged into the L2 cache it shares, the same CPUs, is
      found as that L2) -- the threads of a real core share all of them, so
      nothing else is cut (not level 1: a compute unit's cores, Linux's siblings,
      each have their own L1d);
    * an AMD compute unit (family 15h: hwloc's ``Group`` of subtype
      ``ComputeUnit``, its cores one thread each) is one set of siblings to Linux
      (same ``cu_id``): the whole unit.

    An XML where hwloc merged a compute unit into its L2 cache (the same CPUs, no
    group left) says nothing of the unit: its cores are taken as cores.
    """
    out = {pu.os_index: topology.cores[pu.core].cpuset for pu in topology.pus}
    units: dict[int, frozenset[int]] = {}
    for g in topology.groups:
        for cpu in g.cpuset & out.keys():
            if g.kind == "computeunit":
                units[cpu] = g.cpuset
            else:
                out[cpu] &= g.cpuset
    for c in topology.caches:
        if c.level < 2:
            continue
        for cpu in c.cpuset & out.keys():
            out[cpu] &= c.cpuset
    out.update((cpu, unit & topology.cpuset) for cpu, unit in units.items())
    return out


def view_from_files(files: Mapping[str, str], usable: frozenset[int] | None = None) -> SysfsView:
    """The same facts read from sysfs text, keyed by paths relative to
    ``/sys/devices/system`` (``"cpu/cpu0/topology/thread_siblings_list"``).

    ``usable`` defaults to ``cpu/online``."""
    threads: dict[int, frozenset[int]] = {}
    cores: dict[int, frozenset[int]] = {}
    levels: dict[int, dict[int, int]] = {}
    shared: dict[tuple[int, int], frozenset[int]] = {}
    for path, text in files.items():
        parts = path.split("/")
        if len(parts) < 4 or parts[0] != "cpu" or not parts[1].startswith("cpu") or not parts[1][3:].isdigit():
            continue
        cpu = int(parts[1][3:])
        if parts[2] == "topology" and parts[3] == "thread_siblings_list":
            threads[cpu] = parse_list(text.strip())
        elif parts[2] == "topology" and parts[3] == "core_siblings_list":
            cores[cpu] = parse_list(text.strip())
        elif parts[2] == "cache" and len(parts) == 5 and parts[3].startswith("index"):
            k = int(parts[3][5:])
            if parts[4] == "level":
                levels.setdefault(cpu, {})[k] = int(text.strip())
            elif parts[4] == "shared_cpu_list":
                shared[(cpu, k)] = parse_list(text.strip())
    last: dict[int, frozenset[int]] = {}
    for cpu, by_index in levels.items():
        # libgomp: the highest level wins, among equals the highest index
        best = max(by_index, key=lambda k: (by_index[k], k))
        if (cpu, best) in shared:
            last[cpu] = shared[(cpu, best)]
    nodes = []
    for node in sorted(parse_list(files.get("node/online", "").strip())):
        text = files.get(f"node/node{node}/cpulist")
        if text is not None:
            nodes.append((node, parse_list(text.strip())))
    if usable is None:
        usable = parse_list(files.get("cpu/online", "").strip())
    return SysfsView(threads, cores, last, tuple(nodes), usable)
