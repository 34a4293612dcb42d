"""Random GPU servers written as Linux ``/sys`` trees.

A :class:`Server` is a machine described by a few numbers -- packages, NUMA nodes
per package (SNC/NPS), cores per node, SMT, how CPUs are numbered, the last-level
cache's scope (per package, per node, per core complex, none, no cache files at
all), offline CPUs, memory-only nodes, nodes the kernel lists as possible but
absent, and GPUs with their PCI bus id, vendor, class and ``numa_node`` -- and
:func:`write_tree` writes what the kernel would show of it under ``ROOT/sys``:
what hwloc reads through ``HWLOC_FSROOT`` (``cpuN/topology``, ``cpuN/cache``,
``node/nodeN``, the CPU masks) and what ``torch/numa/binding.py`` reads
(``nodeN/cpulist``, ``node/possible``, ``thread_siblings_list``,
``physical_package_id``, ``cache/index*/{type,level,shared_cpu_list}``,
``bus/pci/devices/*/numa_node``).  Non-GPU PCI functions (a NIC, a BMC's VGA, an
NVSwitch, a GPU's audio function) are written beside the GPUs, so that a reader
must tell them apart.

:func:`random_server` draws one from a seeded ``random.Random``; the trees are
small (at most 4 x 2 x 6 cores x 2 threads) so that hundreds are written in
seconds.  The kernel's rules followed: an offline CPU keeps its ``cpuN`` folder
with ``online`` = 0 and loses ``topology/`` and ``cache/``; CPU and cache lists
hold online CPUs only; a GPU on a node the firmware does not name reads
``numa_node`` -1 and ``local_cpulist`` = every online CPU; a GPU on a node without
CPUs has an empty ``local_cpulist``.
"""

from __future__ import annotations

import os
import random

from affinity.cpulist import format_list
from affinity.record import record

__all__ = ["GpuSpec", "Server", "random_server", "server_from_dict", "server_to_dict", "write_tree"]

#: vendor -> (device id, PCI class written to sysfs)
_MODELS = {0x10DE: (0x2330, 0x030200), 0x1002: (0x74A1, 0x038000), 0x8086: (0x0BD5, 0x038000)}


@record
class GpuSpec:
    bus_id: str
    vendor: int
    device: int
    pci_class: int  #: as sysfs writes it: 24 bits (0x030200)
    numa_node: int
    tiles: int = 0  #: Intel: tiles the xe driver lists (0: none listed)


@record
class Server:
    packages: int
    nodes_per_package: int
    cores_per_node: int
    smt: int
    numbering: str  #: "split" (sibling of CPU i is i + cores) or "adjacent" (siblings next to each other)
    l3: str  #: "package", "node", "ccx", "none" (L2 is the last level) or "nocache" (no cache files)
    ccx_cores: int
    offline: frozenset[int]
    cpuless_nodes: int  #: memory-only nodes, numbered after the CPU nodes
    extra_possible: int  #: nodes /sys/devices/system/node/possible lists beyond those present
    gpus: tuple[GpuSpec, ...]

    # ---------------------------------------------------------------- derived
    @property
    def total_cores(self) -> int:
        return self.packages * self.nodes_per_package * self.cores_per_node

    @property
    def cpu_nodes(self) -> int:
        return self.packages * self.nodes_per_package

    @property
    def nodes(self) -> int:
        return self.cpu_nodes + self.cpuless_nodes

    def cpu(self, core: int, thread: int) -> int:
        """The CPU id of thread ``thread`` of global core ``core``."""
        return thread * self.total_cores + core if self.numbering == "split" else core * self.smt + thread

    def place(self, cpu: int) -> tuple[int, int, int]:
        """(package, node, global core) of ``cpu``."""
        core = cpu % self.total_cores if self.numbering == "split" else cpu // self.smt
        node = core // self.cores_per_node
        return node // self.nodes_per_package, node, core

    @property
    def cpus(self) -> list[int]:
        return list(range(self.total_cores * self.smt))

    @property
    def online(self) -> frozenset[int]:
        return frozenset(self.cpus) - self.offline

    def node_cpus(self) -> dict[int, frozenset[int]]:
        out: dict[int, set[int]] = {n: set() for n in range(self.nodes)}
        for c in self.online:
            out[self.place(c)[1]].add(c)
        return {n: frozenset(s) for n, s in out.items()}

    def siblings(self, cpu: int) -> frozenset[int]:
        core = self.place(cpu)[2]
        return frozenset(self.cpu(core, t) for t in range(self.smt)) & self.online

    def package_cpus(self, package: int) -> frozenset[int]:
        return frozenset(c for c in self.online if self.place(c)[0] == package)

    def l3_cpus(self, cpu: int) -> frozenset[int] | None:
        pkg, node, core = self.place(cpu)
        if self.l3 == "package":
            return self.package_cpus(pkg)
        if self.l3 == "node":
            return self.node_cpus()[node]
        if self.l3 == "ccx":
            group = (core % self.cores_per_node) // self.ccx_cores
            return frozenset(c for c in self.online if self.place(c)[1] == node
                             and (self.place(c)[2] % self.cores_per_node) // self.ccx_cores == group)
        return None

    def distance(self, a: int, b: int) -> int:
        if a == b:
            return 10
        home = lambda n: n // self.nodes_per_package if n < self.cpu_nodes else (n - self.cpu_nodes) % self.packages  # noqa: E731
        if a >= self.cpu_nodes or b >= self.cpu_nodes:
            return 17 if home(a) == home(b) else 28
        return 12 if home(a) == home(b) else 21


def random_server(rng: random.Random) -> Server:
    """One GPU server: 1-4 packages, 1/2/4 nodes each (at most 8 CPU nodes), SMT 1/2,
    per-CCX L3 or others, a few offline CPUs, memory-only nodes, 1-8 GPUs."""
    packages = rng.choice([1, 1, 2, 2, 2, 4])
    nodes_per_package = rng.choice([1, 1, 2] + ([4] if packages <= 2 else []))
    cores = rng.choice([2, 3, 4, 6]) if packages * nodes_per_package <= 4 else rng.choice([2, 3])
    smt = rng.choice([1, 2, 2])
    l3 = rng.choice(["package", "package", "node", "ccx", "ccx", "none", "nocache"])
    ccx = rng.choice([c for c in (1, 2, 3) if cores % c == 0])
    draft = Server(packages, nodes_per_package, cores, smt, rng.choice(["split", "split", "adjacent"]), l3, ccx,
                   frozenset(), rng.choice([0, 0, 0, 1, 2]), rng.choice([0] * 9 + [2]), ())
    offline: set[int] = set()
    if rng.random() < 0.25:  # a few CPUs offline, never CPU 0, every node keeps one
        for c in rng.sample(draft.cpus[1:], k=min(len(draft.cpus) - 1, rng.randint(1, 3))):
            node = draft.place(c)[1]
            left = [x for x in draft.cpus if draft.place(x)[1] == node and x not in offline and x != c]
            if left:
                offline.add(c)
    vendor = rng.choice([0x10DE] * 6 + [0x1002] * 2 + [0x8086])
    return Server(packages, nodes_per_package, cores, smt, draft.numbering, l3, ccx, frozenset(offline),
                  draft.cpuless_nodes, draft.extra_possible, _random_gpus(rng, draft, vendor))


def _random_gpus(rng: random.Random, s: Server, vendor: int) -> tuple[GpuSpec, ...]:
    count = rng.randint(1, 8)
    buses = sorted(rng.sample(range(0x05, 0xF0), count))
    firmware_silent = rng.random() < 0.12  # every numa_node -1
    spread = rng.random() < 0.7  # GPUs spread over the nodes in bus order, else anywhere
    device, pci_class = _MODELS[vendor]
    tiles = rng.choice([0, 2]) if vendor == 0x8086 else 0
    out = []
    for i, bus in enumerate(buses):
        if firmware_silent:
            node = -1
        elif s.cpuless_nodes and rng.random() < 0.15:
            node = s.cpu_nodes + rng.randrange(s.cpuless_nodes)
        else:
            node = i * s.cpu_nodes // count if spread else rng.randrange(s.cpu_nodes)
        domain = 0 if rng.random() < 0.9 else rng.choice([1, 2, 0x10])
        out.append(GpuSpec(f"{domain:04x}:{bus:02x}:00.0", vendor, device, pci_class, node, tiles))
    return tuple(out)


# ------------------------------------------------------------------ writing

def _mask(cpus: frozenset[int], width: int) -> str:
    """The kernel's ``%*pb``: 32-bit hex groups, the highest first, ``width`` bits."""
    value = sum(1 << c for c in cpus)
    groups = max(1, (width + 31) // 32)
    words = [(value >> (32 * i)) & 0xFFFFFFFF for i in reversed(range(groups))]
    first = (width - 32 * (groups - 1) + 3) // 4
    return ",".join([f"{words[0]:0{first}x}"] + [f"{w:08x}" for w in words[1:]])


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def write_tree(s: Server, root: str, *, others: bool = True) -> None:
    """Write ``s`` under ``root/sys`` (``root`` is what ``HWLOC_FSROOT`` and
    ``Topology.from_fsroot`` take)."""
    cpu_dir = os.path.join(root, "sys", "devices", "system", "cpu")
    os.makedirs(cpu_dir)
    width = len(s.cpus)
    every = format_list(s.cpus)
    for name, text in (("online", format_list(s.online)), ("possible", every), ("present", every)):
        _write(os.path.join(cpu_dir, name), text + "\n")
    for c in s.cpus:
        _write_cpu(s, cpu_dir, c, width)
    _write_nodes(s, root, width)
    _write_pci(s, root, width, others)


def _write_cpu(s: Server, cpu_dir: str, c: int, width: int) -> None:
    d = os.path.join(cpu_dir, f"cpu{c}")
    os.mkdir(d)
    if c:
        _write(os.path.join(d, "online"), "0\n" if c in s.offline else "1\n")
    if c in s.offline:
        return
    pkg, _, core = s.place(c)
    t = os.path.join(d, "topology")
    os.mkdir(t)
    sib = s.siblings(c)
    for name, text in (("physical_package_id", str(pkg)), ("core_id", str(core % (s.total_cores // s.packages))),
                       ("thread_siblings", _mask(sib, width)), ("thread_siblings_list", format_list(sib)),
                       ("core_siblings", _mask(s.package_cpus(pkg), width))):
        _write(os.path.join(t, name), text + "\n")
    cache = os.path.join(d, "cache")
    os.mkdir(cache)
    if s.l3 == "nocache":
        return
    levels = [(2, "Unified", sib, "1024K"), (1, "Instruction", sib, "32K")]
    l3 = s.l3_cpus(c)
    if l3 is not None:
        levels.append((3, "Unified", l3, "32768K"))
    for i, (level, kind, cpus, size) in enumerate(levels):
        ix = os.path.join(cache, f"index{i}")
        os.mkdir(ix)
        for name, text in (("level", str(level)), ("type", kind), ("size", size),
                           ("shared_cpu_map", _mask(cpus, width)), ("shared_cpu_list", format_list(cpus))):
            _write(os.path.join(ix, name), text + "\n")


def _write_nodes(s: Server, root: str, width: int) -> None:
    base = os.path.join(root, "sys", "devices", "system", "node")
    os.makedirs(base)
    present = format_list(range(s.nodes))
    cpu_nodes = s.node_cpus()
    for name, text in (("online", present), ("possible", format_list(range(s.nodes + s.extra_possible))),
                       ("has_cpu", format_list(n for n, c in cpu_nodes.items() if c)),
                       ("has_memory", present), ("has_normal_memory", present)):
        _write(os.path.join(base, name), text + "\n")
    for n in range(s.nodes):
        d = os.path.join(base, f"node{n}")
        os.mkdir(d)
        cpus = cpu_nodes[n]
        _write(os.path.join(d, "cpumap"), _mask(cpus, width) + "\n")
        _write(os.path.join(d, "cpulist"), format_list(cpus) + "\n")
        _write(os.path.join(d, "meminfo"), f"Node {n} MemTotal:       16777216 kB\nNode {n} MemFree:        "
                                           f"8388608 kB\n")
        _write(os.path.join(d, "distance"), " ".join(str(s.distance(n, m)) for m in range(s.nodes)) + "\n")


def _write_pci(s: Server, root: str, width: int, others: bool) -> None:
    base = os.path.join(root, "sys", "bus", "pci", "devices")
    os.makedirs(base)
    node_cpus = s.node_cpus()
    functions = [(g.bus_id, g.vendor, g.device, g.pci_class, g.numa_node, g.tiles) for g in s.gpus]
    if others:
        first = s.gpus[0].bus_id
        functions += [("0000:02:00.0", 0x1A03, 0x2000, 0x030000, -1 if s.gpus[0].numa_node < 0 else 0, 0),  # BMC VGA
                      ("0000:f1:00.0", 0x15B3, 0x1021, 0x020700, 0, 0),  # InfiniBand NIC
                      (first[:-1] + "1", s.gpus[0].vendor, 0x22E8, 0x040300, s.gpus[0].numa_node, 0)]  # GPU audio
        if s.gpus[0].vendor == 0x10DE:
            functions.append(("0000:f5:00.0", 0x10DE, 0x22A3, 0x068000, 0, 0))  # NVSwitch
    for bus, vendor, device, cls, node, tiles in functions:
        d = os.path.join(base, bus)
        os.mkdir(d)
        local = s.online if node < 0 else node_cpus.get(node, frozenset())
        for name, text in (("class", f"{cls:#08x}"), ("vendor", f"{vendor:#06x}"), ("device", f"{device:#06x}"),
                           ("numa_node", str(node)), ("local_cpulist", format_list(local)),
                           ("local_cpus", _mask(local, width))):
            _write(os.path.join(d, name), text + "\n")
        for t in range(tiles):
            os.mkdir(os.path.join(d, f"tile{t}"))


def server_to_dict(s: Server) -> dict[str, object]:
    """``s`` as JSON-ready values (what the checked-in dumps keep beside their XML)."""
    return {"packages": s.packages, "nodes_per_package": s.nodes_per_package, "cores_per_node": s.cores_per_node,
            "smt": s.smt, "numbering": s.numbering, "l3": s.l3, "ccx_cores": s.ccx_cores,
            "offline": sorted(s.offline), "cpuless_nodes": s.cpuless_nodes, "extra_possible": s.extra_possible,
            "gpus": [{"bus_id": g.bus_id, "vendor": g.vendor, "device": g.device, "pci_class": g.pci_class,
                      "numa_node": g.numa_node, "tiles": g.tiles} for g in s.gpus]}


def server_from_dict(d: dict) -> Server:
    return Server(d["packages"], d["nodes_per_package"], d["cores_per_node"], d["smt"], d["numbering"], d["l3"],
                  d["ccx_cores"], frozenset(d["offline"]), d["cpuless_nodes"], d["extra_possible"],
                  tuple(GpuSpec(**g) for g in d["gpus"]))
