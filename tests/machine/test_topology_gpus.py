"""GPUs as part of the machine: read from sysfs (a described ``/sys`` tree), from an
hwloc XML's PCI objects and from JSON, without any driver library."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from affinity.errors import TopologyError
from affinity.machine.gpus import Gpu, gpus_from_dicts, parse_bus_id, read_pci_gpus
from affinity.machine.topology import Topology, source_kind
from affinity.record import replace
from helpers.sysfs_tree import GpuSpec, Server, write_tree

NV = (0x10DE, 0x2330, 0x030200)


def two_socket(gpus: tuple[GpuSpec, ...], **kw) -> Server:
    """2 packages x 1 node x 4 cores x 2 threads (CPUs 0-7 and 8-15 by package, siblings +8... split)."""
    base = dict(packages=2, nodes_per_package=1, cores_per_node=4, smt=2, numbering="split", l3="package",
                ccx_cores=4, offline=frozenset(), cpuless_nodes=0, extra_possible=0, gpus=gpus)
    base.update(kw)
    return Server(**base)


def nv(bus: str, node: int) -> GpuSpec:
    return GpuSpec(bus, NV[0], NV[1], NV[2], node)


def test_bus_ids_are_read_as_numbers():
    assert parse_bus_id("0000:17:00.0") == (0, 0x17, 0, 0)
    assert parse_bus_id("10000:e1:1f.7") == (0x10000, 0xE1, 0x1F, 7)
    assert parse_bus_id("17:00.0") is None and parse_bus_id("0000:17:00.8") is None


def test_sysfs_gpus_in_bus_order_and_nothing_else(ram_path):
    """A BMC's VGA (ASPEED), a NIC, an NVSwitch and a GPU's audio function sit beside
    the GPUs: only the display controllers of GPU vendors are GPUs."""
    s = two_socket((nv("0000:b1:00.0", 1), nv("0000:17:00.0", 0), nv("0001:05:00.0", 1), nv("0000:2a:00.0", 0)))
    write_tree(s, str(ram_path))
    gpus = read_pci_gpus(str(ram_path))
    assert [g.bus_id for g in gpus] == ["0000:17:00.0", "0000:2a:00.0", "0000:b1:00.0", "0001:05:00.0"]
    assert [g.logical_index for g in gpus] == [0, 1, 2, 3]
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    g = gpus[0]
    assert (g.vendor, g.device, g.pci_class, g.vendor_name) == (0x10DE, 0x2330, 0x0302, "NVIDIA")
    assert g.local_cpus == s.node_cpus()[0] == frozenset(range(4)) | frozenset(range(8, 12))
    assert g.uuid is None and g.tiles is None  # no driver procfs in the tree: not guessed


def test_a_gpu_the_firmware_places_nowhere(ram_path):
    """numa_node -1 (one-node machines, silent firmware): the kernel's local CPUs are
    every online CPU; a GPU on a node without CPUs has none."""
    s = two_socket((nv("0000:17:00.0", -1), nv("0000:2a:00.0", 2)), cpuless_nodes=1)
    write_tree(s, str(ram_path))
    a, b = read_pci_gpus(str(ram_path))
    assert (a.numa_node, a.local_cpus) == (-1, s.online)
    assert (b.numa_node, b.local_cpus) == (2, frozenset())


def test_amd_and_intel_classes_uuids_and_tiles(ram_path):
    """AMD Instinct and Intel Data Center GPU Max report class 0x0380; xe lists tiles
    under the device, i915 GTs under drm/cardN/gt (counted on a 0x0380 part only);
    amdgpu's unique_id and the NVIDIA driver's procfs give UUIDs."""
    gpus = (GpuSpec("0000:10:00.0", 0x1002, 0x74A1, 0x038000, 0), GpuSpec("0000:20:00.0", 0x8086, 0x0BD5, 0x038000, 0, 2),
            GpuSpec("0000:30:00.0", 0x8086, 0x0BD5, 0x038000, 1), GpuSpec("0000:40:00.0", 0x8086, 0x56A0, 0x030000, 1),
            nv("0000:50:00.0", 1))
    root = str(ram_path)
    write_tree(two_socket(gpus), root, others=False)
    dev = Path(root, "sys/bus/pci/devices")
    (dev / "0000:10:00.0/unique_id").write_text("0x1b5ab4e2c6b85b40\n")
    for bus in ("0000:30:00.0", "0000:40:00.0"):  # i915: two GTs each
        for gt in ("gt0", "gt1"):
            (dev / bus / "drm/card1/gt" / gt).mkdir(parents=True)
    info = Path(root, "proc/driver/nvidia/gpus/0000:50:00.0")
    info.mkdir(parents=True)
    (info / "information").write_text("Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-8932f937-d72c-4106-c12f-20bd9faed9f6\n")
    amd, xe, i915, igpu, nvd = read_pci_gpus(root)
    assert (amd.vendor_name, amd.pci_class, amd.uuid) == ("AMD", 0x0380, "GPU-1b5ab4e2c6b85b40")
    assert (xe.tiles, i915.tiles, igpu.tiles) == (2, 2, None)
    assert nvd.uuid == "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"


def test_a_malformed_attribute_names_its_file(ram_path):
    write_tree(two_socket((nv("0000:17:00.0", 0),)), str(ram_path))
    Path(ram_path, "sys/bus/pci/devices/0000:17:00.0/numa_node").write_text("zero\n")
    with pytest.raises(TopologyError, match=r"0000:17:00.0/numa_node: numa_node: expected a node number or -1, got .zero."):
        read_pci_gpus(str(ram_path))


def test_no_pci_folder_is_no_gpu(ram_path):
    assert read_pci_gpus(str(ram_path)) == ()


def test_a_described_machine_from_its_sys_tree(ram_path):
    """hwloc reads the tree (HWLOC_FSROOT, set around the load and put back), the
    offline CPUs are the cpuN folders without a PU, the GPUs come with it."""
    s = two_socket((nv("0000:17:00.0", 0), nv("0000:b1:00.0", 1)), offline=frozenset({13}))
    write_tree(s, str(ram_path))
    os.environ["HWLOC_FSROOT"] = "/nonexistent-before"
    try:
        t = Topology.from_fsroot(ram_path)
        assert os.environ["HWLOC_FSROOT"] == "/nonexistent-before"
    finally:
        del os.environ["HWLOC_FSROOT"]
    assert t.cpuset == s.online and t.allowed == s.online and t.offline_cpus == 1
    assert (len(t.packages), len(t.cores), len(t.numa_nodes)) == (2, 8, 2)
    assert [n.cpuset for n in t.numa_nodes] == [s.node_cpus()[0], s.node_cpus()[1]]
    assert t.gpus == read_pci_gpus(str(ram_path)) and not t.is_this_system
    assert t.describe() == "2 packages, 8 cores (non-uniform) (15 PUs, 2 NUMA nodes, 2 GPUs)"
    assert Topology.load(f"fsroot:{ram_path}") == t and source_kind(f"fsroot:{ram_path}") == "fsroot"


def test_a_folder_that_is_no_machine_is_refused(ram_path):
    with pytest.raises(TopologyError, match="no sys/devices/system/cpu"):
        Topology.from_fsroot(ram_path)
    with pytest.raises(TopologyError, match="no such directory"):
        Topology.load(f"fsroot:{ram_path}/missing")


XML = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <object type="Machine" os_index="0" cpuset="0x0000000f" complete_cpuset="0x0000000f" nodeset="0x00000003" complete_nodeset="0x00000003" gp_index="1">
    <object type="Package" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="2">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="3" local_memory="1073741824"/>
      <object type="Core" os_index="0" cpuset="0x00000003" complete_cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="4">
        <object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="5"/>
        <object type="PU" os_index="1" cpuset="0x00000002" complete_cpuset="0x00000002" nodeset="0x00000001" complete_nodeset="0x00000001" gp_index="6"/>
      </object>
      <object type="Bridge" gp_index="20" bridge_type="0-1" depth="0" bridge_pci="0000:[17-18]">
        <object type="PCIDev" gp_index="21" pci_busid="0000:17:00.0" pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="0.000000">
          <object type="OSDev" gp_index="22" name="nvml0" osdev_type="12">
            <info name="Backend" value="NVML"/>
            <info name="NVIDIAUUID" value="GPU-d3977428-7a30-086b-2e20-5c1eeed647c6"/>
          </object>
        </object>
        <object type="PCIDev" gp_index="23" pci_busid="0000:18:00.0" pci_type="0207 [15b3:1021] [15b3:0041] 00" pci_link_speed="0.000000"/>
      </object>
    </object>
    <object type="Package" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="7">
      <object type="NUMANode" os_index="1" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="8" local_memory="1073741824"/>
      <object type="Core" os_index="0" cpuset="0x0000000c" complete_cpuset="0x0000000c" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="9">
        <object type="PU" os_index="2" cpuset="0x00000004" complete_cpuset="0x00000004" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="10"/>
        <object type="PU" os_index="3" cpuset="0x00000008" complete_cpuset="0x00000008" nodeset="0x00000002" complete_nodeset="0x00000002" gp_index="11"/>
      </object>
      <object type="Bridge" gp_index="30" bridge_type="0-1" depth="0" bridge_pci="0000:[9a-9a]">
        <object type="PCIDev" gp_index="31" pci_busid="0000:9a:00.0" pci_type="0380 [8086:0bd5] [8086:0000] 2f" pci_link_speed="0.000000">
          <object type="OSDev" gp_index="32" name="ze0" osdev_type="12" subtype="LevelZero">
            <info name="LevelZeroSubdevices" value="2"/>
          </object>
        </object>
      </object>
    </object>
    <object type="Bridge" gp_index="40" bridge_type="0-1" depth="0" bridge_pci="0000:[c0-c1]">
      <object type="PCIDev" gp_index="41" pci_busid="0000:c1:00.0" pci_type="0300 [1002:74a1] [1002:0000] 00" pci_link_speed="0.000000"/>
      <object type="PCIDev" gp_index="42" pci_busid="0000:c0:00.0" pci_type="0300 [1a03:2000] [1a03:2000] 41" pci_link_speed="0.000000"/>
    </object>
  </object>
</topology>
"""


def test_gpus_from_an_hwloc_xml_with_pci_objects(tmp_path):
    """Locality is the first non-I/O ancestor: one node in its nodeset is the GPU's
    node; attached to the machine (two nodes) is -1.  UUIDs and Level Zero tiles
    come from the OS devices; a NIC and a BMC's VGA are no GPUs."""
    path = tmp_path / "gpus.xml"
    path.write_text(XML)
    t = Topology.from_xml(path)
    nvd, pvc, mi = t.gpus
    assert (nvd.bus_id, nvd.numa_node, nvd.local_cpus, nvd.uuid) == (
        "0000:17:00.0", 0, frozenset({0, 1}), "GPU-d3977428-7a30-086b-2e20-5c1eeed647c6")
    assert (pvc.vendor_name, pvc.pci_class, pvc.numa_node, pvc.local_cpus, pvc.tiles) == (
        "Intel", 0x0380, 1, frozenset({2, 3}), 2)
    assert (mi.vendor_name, mi.numa_node, mi.local_cpus) == ("AMD", -1, frozenset(range(4)))
    assert "GPU L#0 0000:17:00.0 NVIDIA 10de:2330 (3D), NUMA node 0" in t.tree()
    assert "  GPU 0000:c1:00.0 AMD 1002:74a1 (VGA), no NUMA node given (numa_node -1), local cpus 0-3" in t.tree()


def test_an_export_without_io_objects_has_no_gpu():
    xml = Path(__file__).parents[1] / "planning" / "data" / "nosmt_4c_4offline.xml"
    assert Topology.from_xml(xml).gpus == ()


def test_json_keeps_the_gpus_and_equality_sees_them(ram_path, tmp_path):
    s = two_socket((nv("0000:17:00.0", 0), nv("0000:b1:00.0", -1)))
    write_tree(s, str(ram_path))
    t = Topology.from_fsroot(ram_path)
    saved = tmp_path / "t.json"
    saved.write_text(t.to_json())
    back = Topology.from_json(saved)
    assert back == t and hash(back) == hash(t) and back.gpus == t.gpus
    bare = replace(t, gpus=())
    assert bare != t and back != bare
    assert t.with_allowed({0, 1}).gpus == t.gpus
    moved = replace(t, gpus=(replace(t.gpus[0], numa_node=1), t.gpus[1]))
    assert moved != t


@pytest.mark.parametrize("entry, message", [
    ({"bus_id": "17:00.0"}, "bus_id '17:00.0' is no PCI bus id"),
    ({"numa_node": -2}, "numa_node -2 is no node number"),
    ({"vendor": "nvidia"}, "ValueError"),
    ({"tiles": 0}, "tiles 0 is not a count"),
])
def test_json_gpus_that_are_not_as_written_are_refused(entry, message):
    good = {"bus_id": "0000:17:00.0", "vendor": "0x10de", "device": "0x2330", "class": "0x0302", "numa_node": 0,
            "local_cpus": "0-3", "uuid": None, "tiles": None}
    assert gpus_from_dicts([good], "x")[0] == Gpu("0000:17:00.0", 0x10DE, 0x2330, 0x0302, 0, frozenset(range(4)), 0)
    with pytest.raises(TopologyError, match=rf"gpus\[0\]: .*{message}"):
        gpus_from_dicts([{**good, **entry}], "x")


def test_this_system_lists_its_pci_gpus():
    """This machine's GPUs are what its sysfs lists (none on a CPU-only builder)."""
    t = Topology.from_system()
    assert t.gpus == read_pci_gpus("/")
    assert [g["bus_id"] for g in json.loads(t.to_json())["gpus"]] == [g.bus_id for g in t.gpus]
