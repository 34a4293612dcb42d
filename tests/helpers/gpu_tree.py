"""GPUs beside this machine's CPUs, as a copy of ``/sys`` holds them: what
``AFFINITY_GPU_SYSFS_ROOT`` names for a real run on a machine without GPUs.

:func:`write_gpus` writes ``ROOT/sys/bus/pci/devices/<bus id>/`` with the files the
kernel shows of a GPU (``class``, ``vendor``, ``device``, ``numa_node``,
``local_cpulist``) and, for an Intel data-centre GPU, its tiles as ``i915`` lists
them (``drm/cardN/gt/gtM``, what Aurora's driver shows).  The CPUs, caches and NUMA
nodes stay this machine's: hwloc reads them from ``/``.
"""

from __future__ import annotations

from pathlib import Path

from affinity.cpulist import format_list

#: (vendor, device, class as sysfs writes it)
H100 = (0x10DE, 0x2330, 0x030200)
PVC = (0x8086, 0x0BD5, 0x038000)  # Intel Data Center GPU Max 1550 (Aurora's)


def write_gpus(root: Path, gpus: list[tuple], cpus: frozenset[int], model: tuple[int, int, int] = H100,
               tiles: int = 0) -> Path:
    """``gpus``: (bus id, NUMA node) each, local to ``cpus`` -- or (bus id, NUMA node,
    its own local CPUs); ``tiles`` per Intel GPU (0: none listed)."""
    for card, (bus, node, *own) in enumerate(gpus):
        d = root / "sys" / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        for name, text in (("class", f"{model[2]:#08x}"), ("vendor", f"{model[0]:#06x}"),
                           ("device", f"{model[1]:#06x}"), ("numa_node", str(node)),
                           ("local_cpulist", format_list(own[0] if own else cpus))):
            (d / name).write_text(text + "\n")
        for t in range(tiles):
            (d / "drm" / f"card{card}" / "gt" / f"gt{t}").mkdir(parents=True)
    return root
