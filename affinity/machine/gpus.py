"""Where the GPUs of a machine are, without any GPU driver library.

A :class:`Gpu` is a PCI function of a GPU vendor (NVIDIA ``0x10de``, AMD
``0x1002``, Intel ``0x8086``) whose class is a display controller: VGA
(``0x0300``), 3D (``0x0302``, what NVIDIA's data-centre GPUs report) or "other"
(``0x0380``, what AMD Instinct and Intel Data Center GPU Max report).  Its
locality is what the kernel says of any PCI device: ``numa_node`` (``-1`` when
the firmware gives none, as on one-node machines) and ``local_cpulist``.

Sources, all without CUDA, NVML, ROCm SMI, Level Zero or ``torch.cuda``:

* :func:`read_pci_gpus` -- ``sys/bus/pci/devices`` under a file-system root: ``/``
  for this machine, or a directory that holds a described machine's ``sys/`` (as
  hwloc's ``HWLOC_FSROOT`` reads one);
* :func:`gpus_from_xml` -- the ``PCIDev`` objects of an hwloc XML export made with
  I/O discovery (``lstopo --whole-io file.xml``, or any export that kept them);
* :func:`gpus_from_dicts` -- the ``gpus`` list of ``affinity topology --json``.

What cannot be known this way, and is therefore left out (``None``) rather than
guessed: the driver's device order (CUDA's ``FASTEST_FIRST``, ROCr's, Level
Zero's), a GPU's UUID unless the NVIDIA kernel driver's procfs file, amdgpu's
``unique_id`` or the XML names it, MIG instances, and an Intel GPU's tile count
unless the kernel driver's sysfs lists its tiles (``xe``: ``tileN`` under the device; ``i915``:
``drm/cardN/gt/gtN`` of a ``0x0380`` device -- a media GT of an integrated GPU is
no tile, so ``i915``'s GTs are counted on data-centre parts only).  A GPU behind
a PCIe function other than ``.0`` is read as it is; its bus id says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..cpulist import format_list, parse_list
from ..errors import TopologyError
from ..record import record

__all__ = ["GPU_CLASSES", "GPU_VENDORS", "Gpu", "gpus_from_dicts", "gpus_from_xml", "gpus_to_dicts",
           "parse_bus_id", "read_pci_gpus"]

#: PCI vendor id -> the vendor's name
GPU_VENDORS: Mapping[int, str] = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel"}
#: PCI class (base class and subclass) of the functions read as GPUs -> its name
GPU_CLASSES: Mapping[int, str] = {0x0300: "VGA", 0x0302: "3D", 0x0380: "display"}

_BUS_ID = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])")


def parse_bus_id(text: str) -> tuple[int, int, int, int] | None:
    """``(domain, bus, device, function)`` of a PCI bus id such as ``0000:17:00.0``
    (the domain has 4 to 8 hex digits: VMD domains have 5), ``None`` for other text."""
    m = _BUS_ID.fullmatch(text.strip())
    if m is None:
        return None
    return int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 16)


@record(slots=True)
class Gpu:
    """One GPU as the kernel's PCI view shows it (see the module docstring)."""

    bus_id: str  #: ``0000:17:00.0``, lower case, as sysfs names it
    vendor: int  #: PCI vendor id (a key of :data:`GPU_VENDORS`)
    device: int  #: PCI device id (the model)
    pci_class: int  #: ``0x0300``, ``0x0302`` or ``0x0380``
    numa_node: int  #: the kernel's ``numa_node``; ``-1``: the firmware gave none
    local_cpus: frozenset[int]  #: the kernel's ``local_cpulist``; empty when not known
    logical_index: int  #: position among the machine's GPUs, in PCI bus order
    uuid: str | None = None  #: ``GPU-...`` where the driver's procfs or an XML says it
    tiles: int | None = None  #: Intel: tiles the kernel driver lists; ``None``: not said

    @property
    def vendor_name(self) -> str:
        return GPU_VENDORS.get(self.vendor, f"{self.vendor:#06x}")

    @property
    def order_key(self) -> tuple[int, int, int, int]:
        """The bus id as numbers: PCI bus order (nvidia-smi's, NVML's, Slurm's)."""
        key = parse_bus_id(self.bus_id)
        assert key is not None
        return key

    def describe(self) -> str:
        """``0000:17:00.0 NVIDIA 10de:2330 (3D), NUMA node 0``."""
        node = "no NUMA node given (numa_node -1)" if self.numa_node < 0 else f"NUMA node {self.numa_node}"
        extra = "".join([f", {self.tiles} tiles" if self.tiles else "", f", {self.uuid}" if self.uuid else ""])
        return (f"{self.bus_id} {self.vendor_name} {self.vendor:04x}:{self.device:04x} "
                f"({GPU_CLASSES.get(self.pci_class, f'{self.pci_class:#06x}')}), {node}{extra}")


def _numbered(found: Iterable[Gpu]) -> tuple[Gpu, ...]:
    """The GPUs in PCI bus order, each with its position as ``logical_index``."""
    ordered = sorted(found, key=lambda g: g.order_key)
    return tuple(Gpu(bus_id=g.bus_id, vendor=g.vendor, device=g.device, pci_class=g.pci_class, numa_node=g.numa_node,
                     local_cpus=g.local_cpus, logical_index=i, uuid=g.uuid, tiles=g.tiles)
                 for i, g in enumerate(ordered))


# ------------------------------------------------------------------ sysfs

def _read(path: str) -> str | None:
    """A sysfs attribute's text (its first 4 KiB), ``None`` when the file is not
    there.  One ``open``/``read``/``close``: no buffered file object (a sysfs read
    is the whole cost of looking for GPUs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        raise TopologyError(f"cannot read: {e.strerror or e}", path) from None
    try:
        return os.read(fd, 4096).decode("ascii", errors="replace")
    except OSError as e:
        raise TopologyError(f"cannot read: {e.strerror or e}", path) from None
    finally:
        os.close(fd)


def _hex(path: str, text: str) -> int:
    try:
        return int(text.strip(), 16)
    except ValueError:
        raise TopologyError(f"expected a hexadecimal number, got {text.strip()[:40]!r}", path) from None


def read_pci_gpus(root: str = "/") -> tuple[Gpu, ...]:
    """The GPUs under ``root``'s ``sys/bus/pci/devices``, in PCI bus order.

    Reads each device's ``class`` first and the rest only for a display
    controller of a GPU vendor, so the cost is one small read per PCI function
    (about 5 us each) plus a few per GPU.  ``numa_node`` missing (a kernel built
    without NUMA) reads as ``-1``; ``local_cpulist`` missing as unknown (empty).

    Raises
    ------
    TopologyError
        A GPU's attribute that is there but malformed, naming the file.
    """
    base = os.path.join(root, "sys", "bus", "pci", "devices")
    try:
        names = os.listdir(base)
    except (FileNotFoundError, NotADirectoryError):
        return ()
    except OSError as e:
        raise TopologyError(f"cannot list: {e.strerror or e}", base) from None
    found = []
    for name in names:
        dev = f"{base}/{name}"
        text = _read(f"{dev}/class")
        if text is None or _hex(f"{dev}/class", text) >> 8 not in GPU_CLASSES or parse_bus_id(name) is None:
            continue
        vendor_text = _read(os.path.join(dev, "vendor"))
        vendor = _hex(os.path.join(dev, "vendor"), vendor_text) if vendor_text is not None else -1
        if vendor not in GPU_VENDORS:
            continue
        found.append(_sysfs_gpu(root, dev, name.lower(), vendor, _hex(os.path.join(dev, "class"), text) >> 8))
    return _numbered(found)


def _sysfs_gpu(root: str, dev: str, bus_id: str, vendor: int, pci_class: int) -> Gpu:
    device_text = _read(os.path.join(dev, "device"))
    device = _hex(os.path.join(dev, "device"), device_text) if device_text is not None else 0
    node_text = _read(os.path.join(dev, "numa_node"))
    node = -1
    if node_text is not None:
        try:
            node = int(node_text.strip())
        except ValueError:
            raise TopologyError(f"numa_node: expected a node number or -1, got {node_text.strip()[:40]!r}",
                                os.path.join(dev, "numa_node")) from None
        node = max(node, -1)
    cpus_text = _read(os.path.join(dev, "local_cpulist"))
    try:
        cpus = frozenset(parse_list(cpus_text.strip())) if cpus_text and cpus_text.strip() else frozenset()
    except ValueError as e:
        raise TopologyError(f"local_cpulist: {e}", os.path.join(dev, "local_cpulist")) from None
    uuid = _nvidia_uuid(root, bus_id) if vendor == 0x10DE else _amd_uuid(dev) if vendor == 0x1002 else None
    tiles = _intel_tiles(dev, pci_class) if vendor == 0x8086 else None
    return Gpu(bus_id=bus_id, vendor=vendor, device=device, pci_class=pci_class, numa_node=node, local_cpus=cpus,
               logical_index=0, uuid=uuid, tiles=tiles)


def _nvidia_uuid(root: str, bus_id: str) -> str | None:
    """``GPU UUID`` of the NVIDIA kernel driver's ``/proc/driver/nvidia/gpus/<bus
    id>/information`` (present when the driver is loaded; not NVML)."""
    text = _read(os.path.join(root, "proc", "driver", "nvidia", "gpus", bus_id, "information"))
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "GPU UUID" and value.strip().startswith("GPU-"):
            return value.strip()
    return None


def _amd_uuid(dev: str) -> str | None:
    """``GPU-<unique_id>``: amdgpu's ``unique_id`` (Vega 20 and later), the digits
    ROCr shows as the device's UUID (what ``ROCR_VISIBLE_DEVICES=GPU-...`` names)."""
    text = (_read(f"{dev}/unique_id") or "").strip().lower().removeprefix("0x")
    return f"GPU-{text}" if re.fullmatch(r"[0-9a-f]{1,32}", text) else None


def _intel_tiles(dev: str, pci_class: int) -> int | None:
    """The tiles the Intel kernel driver lists: ``xe``'s ``tileN`` directories under
    the device, else ``i915``'s ``drm/cardN/gt/gtN`` of a data-centre part
    (class ``0x0380``; an integrated GPU's media GT is no tile)."""
    def count(path: str, prefix: str) -> int:
        try:
            return sum(1 for n in os.listdir(path) if n.startswith(prefix) and n[len(prefix):].isdigit())
        except OSError:
            return 0

    xe = count(dev, "tile")
    if xe:
        return xe
    if pci_class != 0x0380:
        return None
    drm = os.path.join(dev, "drm")
    try:
        cards = [n for n in os.listdir(drm) if n.startswith("card") and n[4:].isdigit()]
    except OSError:
        return None
    gts = max((count(os.path.join(drm, c, "gt"), "gt") for c in cards), default=0)
    return gts or None


# ------------------------------------------------------------------ hwloc XML

#: hwloc's I/O object types (a PCI device's locality is its first ancestor of another type)
_IO_TYPES = frozenset({"Bridge", "PCIDev", "OSDev", "Misc"})
#: the OS-device infos that name a GPU's UUID, by backend (NVML, RSMI, Level Zero)
_UUID_INFOS = ("NVIDIAUUID", "AMDUUID", "LevelZeroUUID")


def _bitmap(text: str | None) -> frozenset[int]:
    """An hwloc bitmap string (``0xffffffff,0x000000ff``: 32-bit words, the highest
    first) as a set of bits."""
    if not text:
        return frozenset()
    value = 0
    for word in text.split(","):
        word = word.strip().lower().removeprefix("0x") or "0"
        value = (value << 32) | int(word, 16)
    out, bit = [], 0
    while value:
        if value & 1:
            out.append(bit)
        value >>= 1
        bit += 1
    return frozenset(out)


def gpus_from_xml(root: Any, source: str) -> tuple[Gpu, ...]:
    """The GPUs among the ``PCIDev`` objects of a parsed hwloc XML (``root``: its
    ``<topology>`` element), in PCI bus order.

    ``pci_type`` gives the class, vendor and device; the locality is the first
    ancestor that is no I/O object: its ``cpuset`` is the GPU's local CPUs and its
    ``nodeset`` the GPU's node when it holds exactly one (else ``-1``: hwloc
    attached the device above one node, e.g. to a package of two SNC nodes or to
    the machine when the kernel gave no node).  UUIDs and Level Zero tile counts
    come from the device's OS devices (NVML, RSMI, Level Zero backends) when the
    export has them.

    Raises
    ------
    TopologyError
        A ``PCIDev`` whose ``pci_busid`` or ``pci_type`` is malformed, or a bitmap
        that is not hexadecimal.
    """
    found: list[Gpu] = []

    def walk(elem: Any, ancestors: list[Any]) -> None:
        for child in elem:
            if child.tag != "object":
                continue
            if child.get("type") == "PCIDev":
                gpu = _xml_gpu(child, ancestors, source)
                if gpu is not None:
                    found.append(gpu)
            walk(child, ancestors + [child])

    walk(root, [])
    return _numbered(found)


_PCI_TYPE = re.compile(r"([0-9a-fA-F]{4}) \[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")


def _xml_gpu(obj: Any, ancestors: list[Any], source: str) -> Gpu | None:
    busid, ptype = obj.get("pci_busid", ""), obj.get("pci_type", "")
    m = _PCI_TYPE.match(ptype)
    if parse_bus_id(busid) is None or m is None:
        raise TopologyError(f"a PCIDev with pci_busid={busid!r} pci_type={ptype!r} (expected '0000:17:00.0' "
                            f"and '0302 [10de:2330] ...')", source)
    pci_class, vendor, device = (int(g, 16) for g in m.groups())
    if pci_class not in GPU_CLASSES or vendor not in GPU_VENDORS:
        return None
    place = next((a for a in reversed(ancestors) if a.get("type") not in _IO_TYPES), None)
    try:
        cpus = _bitmap(place.get("cpuset")) if place is not None else frozenset()
        nodes = _bitmap(place.get("nodeset")) if place is not None else frozenset()
    except ValueError:
        raise TopologyError(f"PCIDev {busid}: its parent's cpuset or nodeset is not an hwloc bitmap", source) from None
    infos = {i.get("name"): i.get("value") for o in obj.iter("object") if o.get("type") == "OSDev"
             for i in o.iter("info")}
    uuid = next((infos[k] for k in _UUID_INFOS if infos.get(k)), None)
    tiles_text = infos.get("LevelZeroSubdevices") if vendor == 0x8086 else None
    tiles = int(tiles_text) if tiles_text and tiles_text.isdigit() and int(tiles_text) > 0 else None
    node = next(iter(nodes)) if len(nodes) == 1 else -1
    return Gpu(bus_id=busid.lower(), vendor=vendor, device=device, pci_class=pci_class, numa_node=node,
               local_cpus=cpus, logical_index=0, uuid=uuid, tiles=tiles)


# ------------------------------------------------------------------ JSON

def gpus_to_dicts(gpus: Sequence[Gpu]) -> list[dict[str, Any]]:
    """The GPUs as ``affinity topology --json`` writes them (ids in hex, CPUs as a list)."""
    return [{"bus_id": g.bus_id, "vendor": f"{g.vendor:#06x}", "vendor_name": g.vendor_name,
             "device": f"{g.device:#06x}", "class": f"{g.pci_class:#06x}", "numa_node": g.numa_node,
             "local_cpus": format_list(g.local_cpus), "uuid": g.uuid, "tiles": g.tiles} for g in gpus]


def gpus_from_dicts(items: Any, source: str) -> tuple[Gpu, ...]:
    """:func:`gpus_to_dicts`'s list back, or :class:`TopologyError` naming the entry."""
    if not isinstance(items, list):
        raise TopologyError("gpus: not a list", source)
    out = []
    for i, d in enumerate(items):
        try:
            bus = str(d["bus_id"]).lower()
            if parse_bus_id(bus) is None:
                raise ValueError(f"bus_id {bus!r} is no PCI bus id")
            vendor, device, pci_class = (int(str(d[k]), 16) for k in ("vendor", "device", "class"))
            node = d["numa_node"]
            if type(node) is not int or node < -1:
                raise ValueError(f"numa_node {node!r} is no node number or -1")
            cpus = frozenset(parse_list(d["local_cpus"])) if d["local_cpus"] else frozenset()
            uuid, tiles = d.get("uuid"), d.get("tiles")
            if uuid is not None and not isinstance(uuid, str):
                raise ValueError(f"uuid {uuid!r} is not a string")
            if tiles is not None and (type(tiles) is not int or tiles < 1):
                raise ValueError(f"tiles {tiles!r} is not a count")
        except (KeyError, TypeError, ValueError) as e:
            raise TopologyError(f"gpus[{i}]: not as 'affinity topology --json' writes it "
                                f"({type(e).__name__}: {e})", source) from None
        out.append(Gpu(bus_id=bus, vendor=vendor, device=device, pci_class=pci_class, numa_node=node, local_cpus=cpus,
                       logical_index=0, uuid=uuid, tiles=tiles))
    return _numbered(out)
