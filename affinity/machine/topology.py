"""The machine as an immutable value.

A :class:`Topology` lists packages, NUMA nodes, caches, dies/groups, cores and
PUs (hardware threads), each with **both** its OS index (what the kernel,
``taskset`` and ``KMP_AFFINITY`` proclists use) and its logical index (hwloc's
depth-first order).  Relations are logical indexes into the topology's tuples,
so values are cheap to copy, hash and compare.

Sources:

* :meth:`Topology.from_system` -- this machine, through hwloc (cached per process),
  restricted to the PUs this process may use (``allowed``) but knowing them all;
* :meth:`Topology.from_xml` -- an hwloc XML export (``lstopo foo.xml``);
* :meth:`Topology.from_json` -- a machine saved by ``affinity topology --json``
  (:meth:`Topology.to_dict`), read back anywhere;
* :meth:`Topology.from_synthetic` -- an hwloc synthetic description;
* :meth:`Topology.from_fsroot` -- a whole Linux ``/sys`` tree in a directory (a
  described machine, read by hwloc as ``HWLOC_FSROOT`` points it there);
* :meth:`Topology.from_cpuinfo` -- a ``/proc/cpuinfo``-format file, as Intel's
  OpenMP runtime reads through ``KMP_CPUINFO_FILE`` (pure Python, no hwloc).

The same machine given as XML, synthetic description and cpuinfo file (plus its
NUMA node lists) gives equal values.

The GPUs (:class:`~affinity.machine.gpus.Gpu`: PCI bus id, vendor, NUMA node,
local CPUs) come from sysfs for this system and an fsroot, from the ``PCIDev``
objects of an XML export made with I/O discovery, and from JSON; a synthetic
description or a cpuinfo file has none.  A cpuinfo file says nothing of caches:
its topology has ``caches_known=False`` (not compared), where every hwloc
source lists the caches the machine reports, none included.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence

from ..cpulist import MAX_CPUS, MAX_NODES, check_id, check_ids, format_list, parse_list
from ..errors import ArgumentTypeError, PlanError, TopologyError
from ..record import field, record
from . import _native
from .gpus import Gpu, gpus_from_dicts, gpus_from_xml, gpus_to_dicts, read_pci_gpus
from .userfiles import read_file
from typing import Any


__all__ = ["GPU_SYSFS_ROOT", "Cache", "Core", "Gpu", "Group", "NumaNode", "PU", "Package", "Topology"]

#: where this machine's GPUs are read from, when set: the root of a copy of ``/sys``
#: (its ``sys/bus/pci/devices``) -- a container that hides the host's PCI devices, or a
#: test that gives this machine's CPUs described GPUs; this machine's CPUs, caches and
#: NUMA nodes are still read from the system
GPU_SYSFS_ROOT = "AFFINITY_GPU_SYSFS_ROOT"


@record(slots=True)
class PU:
    """A hardware thread (hwloc ``PU``, the runtime's "OS proc")."""

    os_index: int
    logical_index: int
    core: int  #: logical index of its core in ``Topology.cores``
    package: int  #: logical index of its package in ``Topology.packages``
    numa: int | None  #: logical index of its NUMA node, ``None`` when unknown
    thread: int  #: rank among its core's PUs (0 = first sibling, by OS index)


@record(slots=True)
class Core:
    """A physical core.  ``os_index`` is the "core id": unique within a package only."""

    os_index: int
    logical_index: int
    package: int  #: logical index of its package
    cpuset: frozenset[int]
    kind: str | None = None  #: hybrid core type (hwloc ``CoreType``: ``IntelCore``, ``IntelAtom``)
    efficiency: int | None = None  #: hwloc cpukind efficiency rank (higher = faster)


@record(slots=True)
class Package:
    """A socket (the runtime's "physical id")."""

    os_index: int
    logical_index: int
    cpuset: frozenset[int]


@record(slots=True)
class NumaNode:
    """A NUMA node; ``cpuset`` may be empty (memory-only nodes such as KNL MCDRAM)."""

    os_index: int
    logical_index: int
    cpuset: frozenset[int]
    #: local memory in bytes, 0 when unknown; not part of equality (a cpuinfo
    #: file cannot say it, hwloc's synthetic backend invents 1 GiB).
    memory: int = field(default=0, compare=False)


@record(slots=True)
class Cache:
    """A CPU cache shared by ``cpuset`` (levels 1-5, data/unified caches only)."""

    level: int
    logical_index: int
    cpuset: frozenset[int]
    size: int = field(default=0, compare=False)  #: bytes, 0 when unknown


@record(slots=True)
class Group:
    """An intermediate level: a die, a tile/module group, or a ``node_N`` level of a
    cpuinfo file (``kind`` says which)."""

    kind: str
    os_index: int | None
    logical_index: int
    cpuset: frozenset[int]


def _count(n: int, word: str) -> str:
    """``1 PU``, ``2 PUs``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _fs(cpus: Iterable[int]) -> frozenset[int]:
    return cpus if isinstance(cpus, frozenset) else frozenset(cpus)


@record
class Topology:
    """An immutable description of a machine.  See the module docstring."""

    pus: tuple[PU, ...]
    cores: tuple[Core, ...]
    packages: tuple[Package, ...]
    numa_nodes: tuple[NumaNode, ...] = ()
    caches: tuple[Cache, ...] = ()
    groups: tuple[Group, ...] = ()
    #: OS indexes of the PUs this process may run on (cgroup cpuset and inherited
    #: mask); every PU for a topology read from a file.
    allowed: frozenset[int] = frozenset()
    #: where the value came from ("system", a path, "synthetic:...").
    source: str = field(default="", compare=False)
    #: True only for :meth:`from_system`: binding through any other topology is refused.
    is_this_system: bool = field(default=False, compare=False)
    #: whether ``caches`` is the machine's whole list of caches.  ``False`` for a
    #: source that cannot describe caches (a cpuinfo file): an empty ``caches`` then
    #: means "not known", not "none".  The hwloc sources (this system, an XML file,
    #: a synthetic description) list every cache the machine reports, so there an
    #: empty ``caches`` is a machine that reports none (Linux without
    #: ``cpu/cpuN/cache/``: some VMs, ARM boards without cache data).  Like
    #: ``source``, provenance: not compared.
    caches_known: bool = field(default=True, compare=False)
    #: CPUs the kernel has configured but not online (SMT switched off, hot-unplugged):
    #: what ``sysconf(_SC_NPROCESSORS_CONF)`` counts beyond the PUs.  Known from this
    #: system and from an hwloc XML (its ``complete_cpuset``); 0 where the source cannot
    #: say (a cpuinfo file lists online CPUs only, a synthetic description has none).
    offline_cpus: int = 0
    #: the GPUs, in PCI bus order (:mod:`affinity.machine.gpus`); ``()`` for a source
    #: that cannot say (synthetic, cpuinfo) or a machine without any.
    gpus: tuple[Gpu, ...] = ()

    # ------------------------------------------------------------------ lookups
    @functools.cached_property
    def _by_os(self) -> dict[int, PU]:
        return {pu.os_index: pu for pu in self.pus}

    @functools.cached_property
    def cpuset(self) -> frozenset[int]:
        """OS indexes of every PU of the machine."""
        return frozenset(self._by_os)

    def check_cpus(self, cpus: Iterable[int], what: str) -> frozenset[int]:
        """``cpus`` as a frozenset, each a PU of this machine: the one message for a CPU
        that is not (``affinity run --physcpubind 5``, ``threads.set_affinity({5})``).

        Parameters
        ----------
        cpus : iterable of int
            OS indexes, already read as ids (:func:`affinity.cpulist.check_ids`).
        what : str
            Names the input in the message (``--physcpubind 5``, ``set_affinity(cpus={5})``).

        Raises
        ------
        PlanError
            ``{what}: CPU 5 does not exist on this machine (CPUs 0-1)``.
        """
        chosen = frozenset(cpus)
        foreign = chosen - self.cpuset
        if foreign:
            raise PlanError(f"{what}: {'CPU' if len(foreign) == 1 else 'CPUs'} {format_list(foreign)} "
                            f"{'does' if len(foreign) == 1 else 'do'} not exist on this machine "
                            f"(CPUs {format_list(self.cpuset)})")
        return chosen

    def pu(self, os_index: int) -> PU:
        """The PU with this OS index (``KeyError`` if there is none)."""
        try:
            return self._by_os[os_index]
        except KeyError:
            raise KeyError(f"no PU with OS index {os_index} in {self.describe()}") from None

    def core_of(self, os_index: int) -> Core:
        return self.cores[self.pu(os_index).core]

    def package_of(self, os_index: int) -> Package:
        return self.packages[self.pu(os_index).package]

    def numa_of(self, os_index: int) -> NumaNode | None:
        n = self.pu(os_index).numa
        return None if n is None else self.numa_nodes[n]

    @property
    def llcs(self) -> tuple[Cache, ...]:
        """The last-level caches (highest cache level present), ``()`` when unknown."""
        if not self.caches:
            return ()
        top = max(c.level for c in self.caches)
        return tuple(c for c in self.caches if c.level == top)

    @property
    def dies(self) -> tuple[Group, ...]:
        return tuple(g for g in self.groups if g.kind == "die")

    @functools.cached_property
    def threads_per_core(self) -> int:
        """The largest number of PUs in one core."""
        return max((len(c.cpuset) for c in self.cores), default=0)

    @functools.cached_property
    def is_uniform(self) -> bool:
        """Every package has as many cores and every core as many PUs."""
        per_pkg = {sum(1 for c in self.cores if c.package == p.logical_index) for p in self.packages}
        per_core = {len(c.cpuset) for c in self.cores}
        return len(per_pkg) <= 1 and len(per_core) <= 1

    def describe(self) -> str:
        """One line: ``2 packages x 28 cores x 2 PUs (112 PUs, 2 NUMA nodes)``."""
        np_, nc, npu = len(self.packages), len(self.cores), len(self.pus)
        if self.is_uniform and np_:
            shape = (f"{_count(np_, 'package')} x {_count(nc // np_, 'core')} x "
                     f"{_count(self.threads_per_core, 'PU')}")
        else:
            shape = f"{_count(np_, 'package')}, {_count(nc, 'core')} (non-uniform)"
        extra = f"{_count(npu, 'PU')}, {_count(len(self.numa_nodes), 'NUMA node')}"
        if self.gpus:
            extra += f", {_count(len(self.gpus), 'GPU')}"
        if self.allowed != self.cpuset:
            extra += f", {len(self.allowed)} allowed"
        return f"{shape} ({extra})"

    def __repr__(self) -> str:
        return f"<Topology {self.describe()} from {self.source or '?'}>"

    # ------------------------------------------------------------- derivations
    def with_allowed(self, cpus: Iterable[int]) -> Topology:
        """The same machine seen by a process whose mask is ``cpus`` (intersected
        with the machine).  Raises :class:`TopologyError` if nothing is left."""
        mask = _fs(cpus) & self.cpuset
        if not mask:
            raise TopologyError(f"mask {format_list(cpus)} selects no PU of this machine", self.source)
        return Topology(pus=self.pus, cores=self.cores, packages=self.packages, numa_nodes=self.numa_nodes,
                        caches=self.caches, groups=self.groups, allowed=mask, source=self.source,
                        is_this_system=self.is_this_system, caches_known=self.caches_known,
                        offline_cpus=self.offline_cpus, gpus=self.gpus)

    # -------------------------------------------------------------- rendering
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description (OS and logical indexes, cpusets as lists)."""

        def cl(s: frozenset[int]) -> str:
            return format_list(s)

        return {
            "source": self.source,
            "summary": self.describe(),
            "allowed": cl(self.allowed),
            "offline_cpus": self.offline_cpus,
            "packages": [{"os_index": p.os_index, "logical_index": p.logical_index,
                          "cpuset": cl(p.cpuset)} for p in self.packages],
            "numa_nodes": [{"os_index": n.os_index, "logical_index": n.logical_index,
                            "cpuset": cl(n.cpuset), "memory": n.memory} for n in self.numa_nodes],
            "caches": [{"level": c.level, "logical_index": c.logical_index, "cpuset": cl(c.cpuset),
                        "size": c.size} for c in self.caches],
            "caches_known": self.caches_known,
            "groups": [{"kind": g.kind, "os_index": g.os_index, "logical_index": g.logical_index,
                        "cpuset": cl(g.cpuset)} for g in self.groups],
            "cores": [{"os_index": c.os_index, "logical_index": c.logical_index, "package": c.package,
                       "cpuset": cl(c.cpuset), "kind": c.kind, "efficiency": c.efficiency}
                      for c in self.cores],
            "pus": [{"os_index": u.os_index, "logical_index": u.logical_index, "core": u.core,
                     "package": u.package, "numa": u.numa, "thread": u.thread,
                     "allowed": u.os_index in self.allowed} for u in self.pus],
            "gpus": gpus_to_dicts(self.gpus),
        }

    def to_json(self, **kw: Any) -> str:
        import json  # lazy: only to_json prints JSON (affinity run starts without it)

        return json.dumps(self.to_dict(), **kw)

    def tree(self) -> str:
        """A readable tree: packages -> NUMA nodes -> cores -> PUs, with OS indexes
        (``P#``) and logical indexes (``L#``); PUs outside ``allowed`` are marked."""
        lines = [f"Machine: {self.describe()}"]
        shown: set[int] = set()  # the GPUs listed under their node

        def pu_text(os_index: int) -> str:
            p = self.pu(os_index)
            mark = "" if os_index in self.allowed else " (disallowed)"
            return f"PU P#{os_index} L#{p.logical_index}{mark}"

        def core_lines(cores: Sequence[Core], indent: str) -> list[str]:
            out = []
            for c in cores:
                kind = f" [{c.kind}]" if c.kind else ""
                pus = ", ".join(pu_text(o) for o in sorted(c.cpuset, key=lambda o: self.pu(o).thread))
                out.append(f"{indent}Core P#{c.os_index} L#{c.logical_index}{kind}: {pus}")
            return out

        for pkg in self.packages:
            lines.append(f"  Package P#{pkg.os_index} L#{pkg.logical_index} (cpus {format_list(pkg.cpuset)})")
            cores = [c for c in self.cores if c.package == pkg.logical_index]
            nodes = [n for n in self.numa_nodes if n.cpuset & pkg.cpuset]
            if not nodes:
                lines.extend(core_lines(cores, "    "))
                continue
            placed: set[int] = set()
            for n in nodes:
                span = "" if n.cpuset <= pkg.cpuset else f", spans cpus {format_list(n.cpuset)}"
                lines.append(f"    NUMANode P#{n.os_index} L#{n.logical_index} (cpus {format_list(n.cpuset & pkg.cpuset)}{span})")
                lines.extend(self._gpu_lines(n, "      ", shown))
                mine = [c for c in cores if c.logical_index not in placed
                        and self.pu(min(c.cpuset)).numa == n.logical_index]
                placed.update(c.logical_index for c in mine)
                lines.extend(core_lines(mine, "      "))
            rest = [c for c in cores if c.logical_index not in placed]
            lines.extend(core_lines(rest, "    "))
        memonly = [n for n in self.numa_nodes if not n.cpuset]
        for n in memonly:
            lines.append(f"  NUMANode P#{n.os_index} L#{n.logical_index} (memory only)")
            lines.extend(self._gpu_lines(n, "    ", shown))
        lines.extend(f"  GPU {g.describe()}, local cpus {format_list(g.local_cpus) or 'not known'}"
                     for g in self.gpus if g.logical_index not in shown)
        return "\n".join(lines)

    def _gpu_lines(self, node: NumaNode, indent: str, shown: set[int]) -> list[str]:
        """The tree's lines of the GPUs on ``node`` (once each: a node listed under
        two packages shows them under the first); ``shown`` collects them."""
        mine = [g for g in self.gpus if g.numa_node == node.os_index and g.logical_index not in shown]
        shown.update(g.logical_index for g in mine)
        return [f"{indent}GPU L#{g.logical_index} {g.describe()}" for g in mine]

    # ---------------------------------------------------------------- loaders
    @staticmethod
    def from_system(*, refresh: bool = False) -> Topology:
        """This machine, through hwloc.  Cached per process (``refresh=True`` reloads).

        ``allowed`` is the intersection of hwloc's allowed cpuset (cgroup cpuset)
        and this process's affinity mask as it is *now*, at first load.  The GPUs
        come from sysfs (no driver needed), or from the copy of ``/sys`` that
        ``AFFINITY_GPU_SYSFS_ROOT`` names (:data:`GPU_SYSFS_ROOT`).
        """
        return _system_topology(refresh)

    @staticmethod
    def from_xml(path: str | os.PathLike[str]) -> Topology:
        """An hwloc XML file (as written by ``lstopo file.xml``).  Its GPUs are the
        ``PCIDev`` objects it holds (an export made with I/O discovery, ``lstopo
        --whole-io``); an export without I/O objects describes no GPU."""
        import xml.etree.ElementTree as ET  # lazy: only an XML source parses XML in Python

        path = os.fspath(path)
        data = read_file(path)
        _check_size(_check_xml_syntax(path, data), path)
        t = _from_native(_native.load_topology("xml", path), source=path)
        configured = _xml_configured(data)
        offline = configured - len(t.pus) if configured is not None and configured > len(t.pus) else 0
        gpus = gpus_from_xml(ET.fromstring(data), path)
        if offline or gpus:
            t = Topology(pus=t.pus, cores=t.cores, packages=t.packages, numa_nodes=t.numa_nodes, caches=t.caches,
                         groups=t.groups, allowed=t.allowed, source=t.source, is_this_system=t.is_this_system,
                         caches_known=t.caches_known, offline_cpus=offline, gpus=gpus)
        return t

    @staticmethod
    def from_fsroot(root: str | os.PathLike[str]) -> Topology:
        """A described Linux machine: a directory holding its ``sys/`` tree (and, if
        wanted, ``proc/``), read by hwloc as ``HWLOC_FSROOT=root`` makes it read one
        (hwloc's own tests describe machines this way), and its GPUs from
        ``sys/bus/pci/devices`` (:func:`~affinity.machine.gpus.read_pci_gpus`).

        Every PU is allowed unless the tree's cgroup files say otherwise; the
        offline CPUs are the ``sys/devices/system/cpu/cpuN`` entries without a PU
        (what glibc's ``_SC_NPROCESSORS_CONF`` counts).  Binding through it is
        refused, as through any topology that is not this system.

        Raises
        ------
        TopologyError
            ``root`` is not a directory, has no ``sys/devices/system/cpu``, or hwloc
            finds no PU in it.
        """
        root = os.fspath(root)
        source = f"fsroot:{root}"
        cpu_dir = os.path.join(root, "sys", "devices", "system", "cpu")
        if not os.path.isdir(root):
            raise TopologyError("no such directory", source)
        if not os.path.isdir(cpu_dir):
            raise TopologyError("no sys/devices/system/cpu in it: not a described machine's file-system root "
                                "(give the directory that holds sys/, as HWLOC_FSROOT takes it)", source)
        t = _from_native(_native.load_topology("fsroot", os.path.abspath(root)), source=source)
        configured = sum(1 for n in os.listdir(cpu_dir) if re.fullmatch(r"cpu\d+", n))
        return Topology(pus=t.pus, cores=t.cores, packages=t.packages, numa_nodes=t.numa_nodes, caches=t.caches,
                        groups=t.groups, allowed=t.allowed, source=t.source, is_this_system=t.is_this_system,
                        caches_known=t.caches_known, offline_cpus=max(0, configured - len(t.pus)),
                        gpus=read_pci_gpus(root))

    @staticmethod
    def from_json(path: str | os.PathLike[str]) -> Topology:
        """A file written by ``affinity topology --json`` (:meth:`to_dict`): the machine
        saved on its node, read back anywhere.  Every PU is allowed, as with the other
        files; every index is checked against the objects it names."""
        import json  # lazy: only a JSON topology needs it (affinity run starts without it)

        path = os.fspath(path)
        try:
            d = json.loads(read_file(path))
        except (UnicodeDecodeError, ValueError) as e:
            raise TopologyError(f"not JSON: {e}", path) from None
        return _from_dict(d, path)

    @staticmethod
    def from_synthetic(description: str) -> Topology:
        """An hwloc synthetic description, e.g.
        ``"pack:2 core:28 pu:2(indexes=2*56:1*2)"`` (``[numa]`` attaches NUMA nodes)."""
        _check_size(_synthetic_pus(description), f"synthetic:{description}")
        return _from_native(_native.load_topology("synthetic", description),
                            source=f"synthetic:{description}")

    @staticmethod
    def from_cpuinfo(path: str | os.PathLike[str], numa_nodes: Any = None) -> Topology:
        """A file in ``/proc/cpuinfo`` format, read the way Intel's OpenMP runtime
        reads ``KMP_CPUINFO_FILE``.

        Parameters
        ----------
        path : str or path-like
            Records of ``processor``, ``physical id``, ``core id``, optional
            ``thread id`` and ``node_N id`` (levels above the package); other fields
            are ignored.
        numa_nodes : None, path, mapping or sequence
            The NUMA nodes the runtime would read from sysfs: ``None`` (none known),
            a path to a ``.../node`` directory holding ``nodeN/cpulist`` files, or
            ``{node_id: cpus}`` / ``[cpus_of_node0, ...]`` (cpus as an iterable or a
            cpulist string).

        Returns
        -------
        Topology

        Raises
        ------
        TopologyError
            An unreadable or malformed file, naming the file and the line.
        """
        path = os.fspath(path)
        text = read_file(path).decode("utf-8", errors="replace")
        return _from_cpuinfo_text(text, path, _numa_from_arg(numa_nodes, path))

    @staticmethod
    def load(src: str | os.PathLike[str] | Topology | None, numa_nodes: Any = None) -> Topology:
        """Interpret a topology source as the CLI does.

        Parameters
        ----------
        src : None, "system", str, path-like or Topology
            ``None``/``"system"`` for this machine, ``"synthetic:<description>"``,
            ``"fsroot:<directory>"`` (a described machine's ``sys/`` tree), an hwloc XML file, a JSON file of ``affinity topology --json``, or a
            cpuinfo file (recognised by its ``processor`` records); a Topology is
            returned as it is.
        numa_nodes : optional
            With a cpuinfo file, as in :meth:`from_cpuinfo`; refused with an XML or
            JSON file (their NUMA nodes are in the file).

        Returns
        -------
        Topology

        Raises
        ------
        TopologyError
            A source that does not exist or cannot be read, or ``numa_nodes`` with a
            source other than a cpuinfo file.
        """
        if isinstance(src, Topology):
            return src
        if src is not None and not isinstance(src, (str, os.PathLike)):
            raise ArgumentTypeError(f"topology: expected a Topology, None, 'system', 'synthetic:...' or a file's "
                                    f"path, not {type(src).__name__} ({src!r:.40})")
        kind = source_kind(src)
        if numa_nodes is not None and kind != "cpuinfo":  # ignored, it would plan on other nodes than the user gave
            raise TopologyError(f"Topology.load({src!r}, numa_nodes={numa_nodes!r}): numa_nodes goes with a "
                                f"cpuinfo file, not with {SOURCE_KINDS[kind]}, which says its own NUMA nodes")
        if kind == "system":
            return Topology.from_system()
        s = os.fspath(src)  # type: ignore[arg-type]
        if kind == "synthetic":
            return Topology.from_synthetic(s[len("synthetic:"):])
        if kind == "fsroot":
            return Topology.from_fsroot(s[len("fsroot:"):])
        if kind == "cpuinfo":
            return Topology.from_cpuinfo(s, numa_nodes)
        return Topology.from_xml(s) if kind == "xml" else Topology.from_json(s)


#: what each kind of topology source is, in words (:func:`source_kind`)
SOURCE_KINDS = {"system": "this machine", "synthetic": "an hwloc synthetic description",
                "fsroot": "a described machine's file-system root (its sys/ tree)",
                "xml": "an hwloc XML file", "json": "a JSON file of 'affinity topology --json'",
                "cpuinfo": "a cpuinfo file"}


def source_kind(src: str | os.PathLike[str] | None) -> str:
    """Which kind of source :meth:`Topology.load` reads ``src`` as: a key of
    :data:`SOURCE_KINDS` (a file by its first bytes; one that is neither XML nor
    JSON is read as a cpuinfo file).  Raises TopologyError for a file that cannot be read."""
    if src is None or src == "system":
        return "system"
    s = os.fspath(src)
    if s.startswith("synthetic:"):
        return "synthetic"
    if s.startswith("fsroot:"):
        return "fsroot"
    head = read_file(s, missing=" (expected an hwloc XML file, a JSON file, a cpuinfo file, "
                                "'synthetic:<description>', 'fsroot:<dir>' or 'system')")[:4096].lstrip()
    if head.startswith((b"<?xml", b"<topology")):
        return "xml"
    return "json" if head.startswith(b"{") else "cpuinfo"


# --------------------------------------------------------------------------
# Assembly shared by every source
# --------------------------------------------------------------------------

def _assemble(pu_rows: Sequence[tuple[int, int, int, int | None]],
              numa: Sequence[tuple[int, frozenset[int], int, int | None]],
              caches: Sequence[tuple[int, frozenset[int], int]],
              groups: Sequence[tuple[str, int | None, frozenset[int]]],
              core_info: Mapping[int, tuple[str | None, int | None]] | None,
              allowed: frozenset[int] | None,
              source: str, this_system: bool,
              position: Mapping[int, int] | None = None, caches_known: bool = True) -> Topology:
    """Build a Topology from flat rows.

    ``pu_rows``: ``(os_index, package_os, core_key, thread_key)`` per PU where
    ``core_key`` identifies the core within its package (its "core id") and
    ``thread_key`` ranks siblings (``None``: by OS index).
    ``numa``: ``(os_index, cpus, memory, hwloc_logical_index or None)``.
    ``caches_known``: ``False`` for a source that cannot describe caches (see
    :attr:`Topology.caches_known`).
    ``position``: each PU's depth-first position (hwloc's PU logical index).
    Every logical index derives from it, as in hwloc: objects of one type are
    numbered in the order of their first PU.  Without it (cpuinfo files) the
    position is what hwloc would compute: packages, then NUMA nodes inside a
    package, then cores, each ordered by their first CPU.
    """
    if not pu_rows:
        raise TopologyError("no processors found", source)
    pkg_cpus: dict[int, set[int]] = {}
    core_cpus: dict[tuple[int, int], set[int]] = {}
    tkey: dict[int, tuple[int, int]] = {}
    for os_i, pkg, core, th in pu_rows:
        pkg_cpus.setdefault(pkg, set()).add(os_i)
        core_cpus.setdefault((pkg, core), set()).add(os_i)
        tkey[os_i] = (th if th is not None else 0, os_i)
    if position is None:
        position = _hwloc_like_positions(pkg_cpus, core_cpus, numa)
    first = lambda cpus: min(position[c] for c in cpus) if cpus else 1 << 60  # noqa: E731
    pkg_order = sorted(pkg_cpus, key=lambda p: first(pkg_cpus[p]))
    packages = tuple(Package(p, i, frozenset(pkg_cpus[p])) for i, p in enumerate(pkg_order))
    pkg_logical = {p.os_index: p.logical_index for p in packages}
    core_order = sorted(core_cpus, key=lambda k: first(core_cpus[k]))
    cores_l: list[Core] = []
    rank_of: dict[int, tuple[int, int]] = {}  # os -> (core logical, rank in core)
    for ci, key in enumerate(core_order):
        cpus = frozenset(core_cpus[key])
        kind, eff = core_info.get(min(cpus), (None, None)) if core_info else (None, None)
        cores_l.append(Core(os_index=key[1], logical_index=ci, package=pkg_logical[key[0]], cpuset=cpus, kind=kind,
                            efficiency=eff))
        for rank, os_i in enumerate(sorted(cpus, key=lambda o: tkey[o])):
            rank_of[os_i] = (ci, rank)
    numa_nodes = tuple(NumaNode(os_i, li, cpus, mem) for li, (os_i, cpus, mem, _) in enumerate(
        sorted(numa, key=lambda n: (n[3] if n[3] is not None else -1, first(n[1]), n[0]))))
    # A PU's node is the most local one: the smallest node holding it (nodes can
    # nest, e.g. KNL MCDRAM beside DDR, or a package-wide node over SNC nodes).
    node_of: dict[int, int] = {}
    for n in sorted(numa_nodes, key=lambda n: (len(n.cpuset), n.logical_index)):
        for c in n.cpuset:
            node_of.setdefault(c, n.logical_index)
    pus = tuple(PU(os_index=os_i, logical_index=li, core=rank_of[os_i][0], package=cores_l[rank_of[os_i][0]].package,
                   numa=node_of.get(os_i), thread=rank_of[os_i][1])
                for li, os_i in enumerate(sorted(position, key=position.__getitem__)))
    cache_vals = []
    for level in sorted({c[0] for c in caches}):
        lv = sorted((c for c in caches if c[0] == level), key=lambda c: first(c[1]))
        cache_vals.extend(Cache(level, i, cpus, size) for i, (_, cpus, size) in enumerate(lv))
    group_vals = []
    for kind in sorted({g[0] for g in groups}):
        gv = sorted((g for g in groups if g[0] == kind), key=lambda g: first(g[2]))
        group_vals.extend(Group(kind, os_i, i, cpus) for i, (_, os_i, cpus) in enumerate(gv))
    every = frozenset(p.os_index for p in pus)
    allowed_set = every if allowed is None else (allowed & every)
    if not allowed_set:
        raise TopologyError("no PU of this machine is allowed to this process", source)
    return Topology(pus=pus, cores=tuple(cores_l), packages=packages, numa_nodes=numa_nodes, caches=tuple(cache_vals),
                    groups=tuple(group_vals), allowed=allowed_set, source=source, is_this_system=this_system,
                    caches_known=caches_known)


def _hwloc_like_positions(pkg_cpus: Mapping[int, set[int]],
                          core_cpus: Mapping[tuple[int, int], set[int]],
                          numa: Sequence[tuple[int, frozenset[int], int, int | None]]) -> dict[int, int]:
    """Depth-first PU positions as hwloc would number the same machine: packages by
    first CPU, inside a package the NUMA nodes it contains (SNC) by first CPU, then
    cores by first CPU, then PUs by OS index."""
    pkg_rank = {p: i for i, p in enumerate(sorted(pkg_cpus, key=lambda p: min(pkg_cpus[p])))}
    node_rank: dict[int, int] = {}
    for pkg, cpus in pkg_cpus.items():
        inside = sorted((n for n in numa if n[1] and n[1] <= cpus and n[1] != cpus),
                        key=lambda n: min(n[1]))
        for i, n in enumerate(inside):
            for c in n[1]:
                node_rank.setdefault(c, i)
    keys = {}
    for (pkg, _), cpus in core_cpus.items():
        cmin = min(cpus)
        for c in cpus:
            keys[c] = (pkg_rank[pkg], node_rank.get(cmin, 0), cmin, c)
    return {c: i for i, c in enumerate(sorted(keys, key=keys.__getitem__))}


# --------------------------------------------------------------------------
# cpuinfo files
# --------------------------------------------------------------------------

_FIELD_RE = re.compile(r"^([^:]*?)\s*:\s*(.*)$")
_NODE_RE = re.compile(r"^node_(\d+) id$")


def _from_cpuinfo_text(text: str, source: str,
                       numa: Sequence[tuple[int, frozenset[int], int, None]]) -> Topology:
    records: list[dict[str, tuple[int, int]]] = []  # field -> (value, line)
    cur: dict[str, tuple[int, int]] | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            cur = None
            continue
        m = _FIELD_RE.match(line)
        if not m:
            raise TopologyError(f"expected 'name : value', got {raw!r}", source, lineno)
        name, value = m.group(1).strip().lower(), m.group(2).strip()
        if name not in ("processor", "physical id", "core id", "thread id") and not _NODE_RE.match(name):
            continue  # model name, flags, ... : ignored, as the runtime does
        if name == "processor":
            cur = {}
            records.append(cur)
        elif cur is None:
            raise TopologyError(f"field {name!r} before any 'processor' line", source, lineno)
        if not (value.isascii() and value.isdigit()) or len(value) > 9:  # isdigit alone: '²', '٣'
            raise TopologyError(f"{name!r} must be a non-negative integer, got {value[:20]!r}", source, lineno)
        if name in cur:
            raise TopologyError(f"{name!r} given twice for one processor", source, lineno)
        cur[name] = (int(value), lineno)
    if not records:
        raise TopologyError("no 'processor' records (not a cpuinfo file?)", source)
    _check_size(len(records), source)
    seen: dict[int, int] = {}
    rows: list[tuple[int, int, int, int | None]] = []
    node_levels: dict[int, dict[int, set[int]]] = {}
    for rec in records:
        proc, line = rec["processor"]
        if proc in seen:
            raise TopologyError(f"processor {proc} listed twice (first at line {seen[proc]})", source, line)
        seen[proc] = line
        pkg = rec.get("physical id", (0, 0))[0]
        # Without a core id each processor is a core of its own (the runtime does the same).
        core = rec["core id"][0] if "core id" in rec else -1 - proc
        th = rec["thread id"][0] if "thread id" in rec else None
        rows.append((proc, pkg, core, th))
        for name, (val, _) in rec.items():
            m = _NODE_RE.match(name)
            if m:
                node_levels.setdefault(int(m.group(1)), {}).setdefault(val, set()).add(proc)
    if any(r[2] < 0 for r in rows):
        # cores numbered by appearance when the file has no core ids
        rows = [(p, pkg, c if c >= 0 else p, th) for p, pkg, c, th in rows]
    every = {r[0] for r in rows}
    for node_id, cpus, _, _ in numa:
        bad = set(cpus) - every
        if bad:
            raise TopologyError(f"NUMA node {node_id} lists cpus {format_list(bad)} that are not "
                                f"processors of the file", source)
    groups = [(f"node{lvl}", gid, frozenset(cpus))
              for lvl, ids in node_levels.items() for gid, cpus in ids.items()]
    return _assemble(rows, numa, (), groups, None, None, source, False, caches_known=False)


def _numa_from_arg(arg: Any, source: str) -> list[tuple[int, frozenset[int], int, None]]:
    if arg is None:
        return []
    if isinstance(arg, (str, os.PathLike)):
        d = os.fspath(arg)
        if not os.path.isdir(d):
            raise TopologyError("NUMA node directory does not exist", d)
        out = []
        for name in sorted(os.listdir(d)):
            m = re.fullmatch(r"node(\d+)", name)
            if not m:
                continue
            f = os.path.join(d, name, "cpulist")
            try:
                with open(f) as fh:
                    txt = fh.read().strip()
                out.append((int(m.group(1)), parse_list(txt), 0, None))
            except (OSError, ValueError) as e:
                raise TopologyError(f"unreadable cpulist: {e}", f) from e
        return out
    items = arg.items() if isinstance(arg, Mapping) else enumerate(arg)
    out = []
    for node_id, cpus in items:
        try:
            cs = parse_list(cpus) if isinstance(cpus, str) else check_ids(cpus, where=f"NUMA node {node_id}")
            nid = check_id(node_id, "node", where="numa_nodes")
        except ValueError as e:
            raise TopologyError(f"NUMA node {node_id}: {e}", source) from e
        out.append((nid, cs, 0, None))
    return out


# --------------------------------------------------------------------------
# hwloc-backed sources
# --------------------------------------------------------------------------

def _from_native(loaded: Any, source: str) -> Topology:
    """Build from ``_native.load_topology``'s result (see ``_native.NativeTopology``)."""
    objs = loaded.objects
    pkgs = [o for o in objs if o.type == "Package"]
    cores = [o for o in objs if o.type == "Core"]
    pus = [o for o in objs if o.type == "PU"]
    if not pus:
        raise TopologyError("hwloc found no PU", source)
    _check_objects(objs, pus, source)
    pkg_of: dict[int, int] = {}
    for p in pkgs:
        for c in p.cpuset:
            pkg_of[c] = p.os_index
    core_of: dict[int, int] = {}
    for c in cores:
        for cpu in c.cpuset:
            core_of[cpu] = c.os_index
    rows = []
    for pu in pus:
        o = pu.os_index
        rows.append((o, pkg_of.get(o, 0), core_of.get(o, o), None))
    numa = [(n.os_index, n.cpuset, n.size, n.logical_index) for n in objs if n.type == "NUMANode"]
    caches = [(o.cache_level, o.cpuset, o.size) for o in objs if o.type == "Cache"]
    redundant = {frozenset(n.cpuset) for n in objs if n.type in ("NUMANode", "Package", "Machine")}
    groups = []
    for o in objs:
        if o.type == "Die":
            groups.append(("die", o.os_index, o.cpuset))
        elif o.type == "Group" and o.cpuset not in redundant:
            groups.append(((o.subtype or "group").lower(), o.os_index, o.cpuset))
    core_info = {}
    for kind_cpus, kind_name, eff in loaded.cpukinds:
        for c in cores:
            if min(c.cpuset) in kind_cpus:
                core_info[min(c.cpuset)] = (kind_name, eff)
    position = {pu.os_index: pu.logical_index for pu in pus}
    return _assemble(rows, numa, caches, groups, core_info or None,
                     loaded.allowed, source, loaded.this_system, position)


def _check_objects(objs: Sequence[Any], pus: Sequence[Any], source: str) -> None:
    """What hwloc accepts from a crafted XML file but no machine has: a PU whose
    index is out of range (``os_index="-1"`` reads as 4294967295) or whose cpuset is
    not its own bit, twice the same PU, an object whose cpuset names CPUs that are
    no PU (a garbage ``cpuset=``)."""
    seen: set[int] = set()
    for pu in pus:
        o = pu.os_index
        if o is None or not 0 <= o < MAX_PUS:
            raise TopologyError(f"a PU {'without an OS index' if o is None else f'with os_index {o}'} (out of "
                                f"range: PUs are 0 to {MAX_PUS - 1})", source)
        if o in seen or frozenset(pu.cpuset) != {o}:
            raise TopologyError(f"PU {o}: cpuset {{{format_list(pu.cpuset)}}} is not its own CPU "
                                f"(or the PU is listed twice)", source)
        seen.add(o)
    for obj in objs:
        stray = frozenset(obj.cpuset) - seen
        if stray:
            shown = format_list(sorted(stray)[:8]) + ("..." if len(stray) > 8 else "")
            raise TopologyError(f"{obj.type} {obj.os_index}: cpuset names CPUs that are no PU ({shown})", source)


def _check_xml_syntax(path: str, data: bytes) -> int:
    """hwloc reports a broken XML file without a position: find it ourselves in
    ``data`` (the file's bytes).  Returns the number of PUs the file describes."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        line = e.position[0] if getattr(e, "position", None) else None
        raise TopologyError(f"not well-formed XML: {e}", path, line) from None
    if root.tag != "topology":
        raise TopologyError(f"root element is <{root.tag}>, not an hwloc <topology>", path, 1)
    pus = sum(1 for o in root.iter("object") if o.get("type") == "PU")
    _check_size(pus, path)  # (the count first: it says more than the first index out of range)
    _check_xml_indexes(path, data)
    return pus


#: the objects whose ``os_index`` hwloc sets as a bit of a bitmap, and the bound of each
_XML_INDEXED = {"PU": MAX_CPUS, "NUMANode": MAX_NODES}


def _check_xml_indexes(path: str, data: bytes) -> None:
    """Every PU's and NUMA node's ``os_index`` in range (below :data:`MAX_PUS`,
    :data:`~affinity.cpulist.MAX_NODES`), checked before hwloc reads the file: it
    sets bit ``os_index`` of a cpuset or nodeset, allocating the bitmap up to it
    (``os_index="4294967294"``: half a gigabyte per bitmap).  hwloc reads the value
    with ``strtoul(.., 10)``: a sign, leading blanks, a ``-1`` that is 4294967295."""
    from xml.parsers import expat  # lazy: only an XML file needs it

    parser = expat.ParserCreate()

    def start(name: str, attrs: dict[str, str]) -> None:
        kind = attrs.get("type") if name == "object" else None
        bound = _XML_INDEXED.get(kind or "")
        value = attrs.get("os_index")
        if bound is None or value is None:
            return
        text = value.lstrip(_C_SPACE)
        digits = text[1:] if text[:1] in "+-" else text
        digits = digits[:len(digits) - len(digits.lstrip("0123456789"))]
        if text[:1] == "-" and digits.strip("0") or len(digits) > 12 or int(digits or 0) >= bound:
            raise TopologyError(f'a {kind} with os_index="{value[:24]}": out of range ({kind} indexes are 0 to '
                                f"{bound - 1}; hwloc would allocate a bitmap up to it)", path,
                                parser.CurrentLineNumber)

    parser.StartElementHandler = start
    parser.Parse(data, True)


def _xml_configured(data: bytes) -> int | None:
    """How many CPUs the machine of an hwloc XML has configured, online or not: the
    bits of its root object's ``complete_cpuset`` (``0xffffffff,0x000000ff``: 32-bit
    words, the highest first); ``None`` when the file does not say or says "all"."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(data).find("object")
    text = root.get("complete_cpuset") if root is not None else None
    if not text:
        return None
    value = 0
    for word in text.split(","):
        word = word.strip().lower().removeprefix("0x")
        if not re.fullmatch(r"[0-9a-f]{1,8}", word):
            return None
        value = (value << 32) | int(word, 16)
    return bin(value).count("1")


#: The most PUs a described machine may have: Linux itself runs on at most 8192
#: CPUs (``NR_CPUS`` with ``CONFIG_MAXSMP``), and loading a description beyond that
#: costs hwloc minutes and gigabytes for a machine that cannot exist.
MAX_PUS = 8192


def _from_dict(d: Any, source: str) -> Topology:
    """:meth:`Topology.to_dict`'s value back, or :class:`TopologyError` naming the
    first entry that is missing, of the wrong type, or names an object that is not there."""
    where = "the file"
    try:
        where = "pus"
        _check_size(len(d["pus"]), source)
        pus = tuple(PU(os_index=_int(u["os_index"]), logical_index=_int(u["logical_index"]), core=_int(u["core"]),
                       package=_int(u["package"]), numa=None if u["numa"] is None else _int(u["numa"]),
                       thread=_int(u["thread"])) for u in d["pus"])
        where = "cores"
        cores = tuple(Core(os_index=_int(c["os_index"]), logical_index=_int(c["logical_index"]),
                           package=_int(c["package"]), cpuset=_cpus(c["cpuset"]), kind=c.get("kind"),
                           efficiency=c.get("efficiency")) for c in d["cores"])
        where = "packages"
        packages = tuple(Package(_int(p["os_index"]), _int(p["logical_index"]), _cpus(p["cpuset"]))
                         for p in d["packages"])
        where = "numa_nodes"
        nodes = tuple(NumaNode(_int(n["os_index"]), _int(n["logical_index"]), _cpus(n["cpuset"]),
                               _int(n.get("memory", 0))) for n in d.get("numa_nodes", ()))
        where = "caches"
        caches = tuple(Cache(_int(c["level"]), _int(c["logical_index"]), _cpus(c["cpuset"]), _int(c.get("size", 0)))
                       for c in d.get("caches", ()))
        where = "caches_known"
        known = d.get("caches_known", bool(caches))  # a file written before the key: an empty list is unknown
        if not isinstance(known, bool):
            raise TypeError(f"{known!r} is not true or false")
        where = "groups"
        groups = tuple(Group(str(g["kind"]), None if g["os_index"] is None else _int(g["os_index"]),
                             _int(g["logical_index"]), _cpus(g["cpuset"])) for g in d.get("groups", ()))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise TopologyError(f"{where}: not as 'affinity topology --json' writes it ({type(e).__name__}: {e})",
                            source) from None
    _check_links(pus, cores, packages, nodes, source)
    offline = d.get("offline_cpus", 0)
    if type(offline) is not int or offline < 0:
        raise TopologyError(f"offline_cpus: {offline!r} is not a count of CPUs", source)
    return Topology(pus=pus, cores=cores, packages=packages, numa_nodes=nodes, caches=caches, groups=groups,
                    allowed=frozenset(u.os_index for u in pus), source=source, caches_known=known,
                    offline_cpus=offline, gpus=gpus_from_dicts(d.get("gpus", []), source))


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{v!r} is no index or count")
    return v


def _cpus(text: Any) -> frozenset[int]:
    if not isinstance(text, str):
        raise TypeError(f"a cpuset is a CPU list string, not {type(text).__name__}")
    return frozenset(parse_list(text))


def _check_links(pus: tuple[PU, ...], cores: tuple[Core, ...], packages: tuple[Package, ...],
                 nodes: tuple[NumaNode, ...], source: str) -> None:
    """Each object at its logical index; each PU in the core, package and node it names."""
    for name, objs in (("pus", pus), ("cores", cores), ("packages", packages), ("numa_nodes", nodes)):
        for i, o in enumerate(objs):
            if o.logical_index != i:
                raise TopologyError(f"{name}[{i}] has logical_index {o.logical_index}", source)
    if not pus or len({u.os_index for u in pus}) != len(pus):
        raise TopologyError("pus: none, or an OS index twice", source)
    for u in pus:
        ok = (u.core < len(cores) and u.os_index in cores[u.core].cpuset and u.package < len(packages)
              and u.os_index in packages[u.package].cpuset and cores[u.core].package == u.package
              and (u.numa is None or (u.numa < len(nodes) and u.os_index in nodes[u.numa].cpuset)))
        if not ok:
            raise TopologyError(f"PU {u.os_index} names core {u.core}, package {u.package}, NUMA node "
                                f"{u.numa}, which do not hold it", source)


def _check_size(pus: int | None, source: str) -> None:
    if pus is not None and pus > MAX_PUS:
        raise TopologyError(f"describes {pus} PUs; at most {MAX_PUS} are accepted (Linux runs on at "
                            f"most {MAX_PUS} CPUs: NR_CPUS with CONFIG_MAXSMP)", source)


def _synthetic_pus(description: str) -> int | None:
    """The PUs an hwloc synthetic description asks for, read the way hwloc's own
    parser reads it (``topology-synthetic.c``), so that nothing it would build is
    missed: levels apart by spaces or newlines, ``type:`` optional, the arity read
    by ``strtoul(.., 0)`` (``0x40`` hex, ``010`` octal, a leading ``+``), ``(...)``
    attributes after it, ``[numa...]`` attached objects.  ``None`` where the text is
    not in that form (hwloc then refuses it itself).

    Raises
    ------
    TopologyError
        A NUL (C would cut the description there), an arity or an explicit
        ``indexes=`` value too large to be a machine, or more than :data:`MAX_PUS`.
    """
    source = "synthetic:" + description[:80].replace("\0", "\\0")
    if "\0" in description:
        raise TopologyError("a NUL character in a synthetic description (hwloc would silently read "
                            "only the text before it)", source)
    pos, total, n = 0, 1, len(description)
    if description.startswith("("):
        pos = _synthetic_attrs(description, 1, source)
    while True:
        while pos < n and description[pos] in " \n":
            pos += 1
        if pos >= n:
            return total
        if description[pos] == "[":  # attached NUMA nodes: indexes only
            end = description.find("]", pos)
            if end < 0:
                return None
            attr = description.find("(", pos, end)
            if attr >= 0:
                _synthetic_attrs(description, attr + 1, source)
            pos = end + 1
            continue
        if not "0" <= description[pos] <= "9":  # "type:" first
            colon = description.find(":", pos)
            if colon < 0:
                return None
            pos = colon + 1
        arity, pos = _strtoul(description, pos, source)
        if arity is None:
            return None
        total *= arity  # at most 128 levels of 12 digits: a small product to compute
        if pos < n and description[pos] == "(":
            pos = _synthetic_attrs(description, pos + 1, source)


#: characters C's isspace() skips before a number
_C_SPACE = " \t\n\v\f\r"


def _strtoul(text: str, pos: int, source: str) -> tuple[int | None, int]:
    """C's ``strtoul(text + pos, &end, 0)`` for the values a machine can have:
    (value, end), value ``None`` where no number starts there or it is 0 (hwloc
    refuses those itself); too many digits is a :class:`TopologyError` at once."""
    n = len(text)
    while pos < n and text[pos] in _C_SPACE:
        pos += 1
    if pos < n and text[pos] in "+-":
        if text[pos] == "-":  # strtoul negates into a huge unsigned value
            raise TopologyError(f"negative count at {text[pos:pos + 20]!r}", source)
        pos += 1
    if text.startswith(("0x", "0X"), pos) and pos + 2 < n and text[pos + 2] in "0123456789abcdefABCDEF":
        base, start = 16, pos + 2
        digits = "0123456789abcdefABCDEF"
    elif text.startswith("0", pos):
        base, start, digits = 8, pos, "01234567"
    else:
        base, start, digits = 10, pos, "0123456789"
    end = start
    while end < n and text[end] in digits:
        end += 1
    if end == start:
        return None, pos
    if end - start > 12:
        raise TopologyError(f"a count of {end - start} digits at {text[start:start + 20]!r}...: no machine "
                            f"has that many (at most {MAX_PUS} PUs)", source)
    value = int(text[start:end], base)
    return (value or None), end


def _synthetic_attrs(text: str, pos: int, source: str) -> int:
    """Check the ``(...)`` attributes starting at ``pos`` (after the parenthesis):
    an explicit ``indexes=`` list may not name an index a machine cannot have
    (hwloc allocates a bitmap up to the largest).  Returns the position after ``)``."""
    end = text.find(")", pos)
    if end < 0:
        return len(text)  # hwloc refuses an unclosed attribute list itself
    at = text.find("indexes=", pos, end)
    while at >= 0:
        _check_explicit_indexes(text, at + len("indexes="), source)
        at = text.find("indexes=", at + 1, end)
    return end + 1


def _check_explicit_indexes(text: str, pos: int, source: str) -> None:
    """The indexes hwloc reads from the ``indexes=`` value at ``pos`` when it takes it
    for an explicit list: its value (up to a blank or ``)``) holds only digits and
    commas -- an empty one too -- and each index is ``strtoul(.., 10)``, which skips
    leading blanks (so ``indexes= 4294967295,0`` names 4294967295) and takes a sign
    (``-1`` is 4294967295).  Any of them :data:`MAX_PUS` or more is refused."""
    n = len(text)
    stop = pos
    while stop < n and text[stop] not in " )":
        stop += 1
    if not all(c in "0123456789," for c in text[pos:stop]):
        return  # an interleaving (x*y:z*t, or object types): hwloc checks its range itself
    while True:
        while pos < n and text[pos] in _C_SPACE:
            pos += 1
        negative = pos < n and text[pos] == "-"
        pos += 1 if pos < n and text[pos] in "+-" else 0
        start = pos
        while pos < n and text[pos] in "0123456789":
            pos += 1
        if pos == start:
            return
        if negative or pos - start > 12 or int(text[start:pos]) >= MAX_PUS:
            item = ("-" if negative else "") + text[start:min(pos, start + 20)]
            raise TopologyError(f"index {item} in indexes= is out of range: at most {MAX_PUS} "
                                f"PUs (hwloc would allocate a bitmap up to it)", source)
        if pos >= n or text[pos] != ",":
            return
        pos += 1


_system_lock = threading.Lock()
_system_cache: Topology | None = None


def _system_topology(refresh: bool) -> Topology:
    global _system_cache
    with _system_lock:
        if _system_cache is None or refresh:
            t = _from_native(_native.system(refresh=refresh), source="system")
            conf = os.sysconf("SC_NPROCESSORS_CONF") if hasattr(os, "sysconf") else -1
            # configured CPUs that are offline (the runtimes count them); the GPUs from sysfs
            t = Topology(pus=t.pus, cores=t.cores, packages=t.packages, numa_nodes=t.numa_nodes, caches=t.caches,
                         groups=t.groups, allowed=t.allowed, source=t.source, is_this_system=t.is_this_system,
                         caches_known=t.caches_known, offline_cpus=max(0, conf - len(t.pus)),
                         gpus=read_pci_gpus(os.environ.get(GPU_SYSFS_ROOT) or "/"))
            _system_cache = t
        return _system_cache
