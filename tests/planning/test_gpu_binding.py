"""Which GPU is a rank's, and which CPUs and memory go with it: the pure functions of
``affinity.planning.gpus`` on described machines (the equality with torchrun's own
binding on random servers is ``test_gpu_torch_binding.py``)."""

from __future__ import annotations

import pytest

from affinity.errors import PlanError
from affinity.machine.gpus import Gpu
from affinity.machine.topology import NumaNode, Topology
from affinity.planning.gpus import (GpuDevice, gpu_binding, gpu_bindings, mode_cpus, rank_gpu, visible_devices)
from affinity.record import replace

UUIDS = [f"GPU-d{i}{i}00000-aaaa-bbbb-cccc-{i:012x}" for i in range(8)]


def gpu(i: int, bus: int, node: int, vendor: int = 0x10DE, device: int = 0x2330, uuid: str | None = None,
        tiles: int | None = None, cls: int = 0x0302) -> Gpu:
    return Gpu(f"0000:{bus:02x}:00.0", vendor, device, cls, node, frozenset(), i, uuid, tiles)


def machine(desc: str = "pack:2 [numa] l3:2 core:3 pu:2", gpus: tuple[Gpu, ...] | None = None,
            uuids: bool = False) -> Topology:
    """2 sockets x 6 cores x 2 (CPUs 0-11 node 0, 12-23 node 1, an L3 per 3 cores);
    8 NVIDIA GPUs, four on each node, in PCI bus order."""
    t = Topology.from_synthetic(desc)
    if gpus is None:
        buses = [0x17, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB]
        gpus = tuple(gpu(i, b, i // 4, uuid=UUIDS[i] if uuids else None) for i, b in enumerate(buses))
    return replace(t, gpus=gpus)


def names(vis) -> list[str]:
    return [d.name for d in vis.devices]


BUS = ["0000:17:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
       "0000:ba:00.0", "0000:db:00.0"]


# ------------------------------------------------------------------ CUDA_VISIBLE_DEVICES

def test_every_gpu_in_pci_order_and_the_order_assumed_is_said():
    vis = visible_devices(machine(), {})
    assert names(vis) == BUS and vis.variables == () and vis.vendor == "NVIDIA"
    assert any("fastest first, which only the driver can tell; PCI bus order assumed (the GPUs are of one model"
               in n for n in vis.notes)
    assert not visible_devices(machine(), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).notes
    mixed = machine(gpus=(gpu(0, 0x17, 0), gpu(1, 0x2A, 0, device=0x20B0)))
    assert any("set CUDA_DEVICE_ORDER=PCI_BUS_ID" in n for n in visible_devices(mixed, {}).notes)


@pytest.mark.parametrize("value, chosen", [
    ("3,1", [3, 1]),
    (" 2 , 0", [2, 0]),
    ("0,2,-1,1", [0, 2]),  # NVIDIA's own example: -1 ends the list
    ("-1", []),
    ("", []),
    ("GPU-d3", [3]),
    ("GPU-d5500000-aaaa-bbbb-cccc-000000000005,GPU-d1", [5, 1]),
    ("MIG-GPU-d6600000-aaaa-bbbb-cccc-000000000006/1/0", [6]),
])
def test_cuda_visible_devices_as_nvidia_documents_it(value, chosen):
    vis = visible_devices(machine(uuids=True), {"CUDA_VISIBLE_DEVICES": value})
    assert names(vis) == [BUS[i] for i in chosen]
    assert vis.variables[0] == f"CUDA_VISIBLE_DEVICES={value}"


@pytest.mark.parametrize("value, message", [
    ("9", r"CUDA_VISIBLE_DEVICES=9: no GPU 9 here \(8 to choose from"),
    ("1,1", r"GPU 0000:2a:00.0 is listed twice \(1\); CUDA then sees no GPU at all"),
    ("0,GPU-d3", r"mixes indices and UUIDs"),
    ("GPU-d", r"GPU-d is ambiguous"),
    ("GPU-ff", r"GPU-ff matches no GPU"),
    ("MIG-4d3c2b1a-0000-1111-2222-333344445555", r"MIG instance named by its own UUID: which GPU holds it"),
    ("0000:17:00.0", r"'0000:17:00.0' is not a device index, a GPU-<uuid> or a MIG"),
])
def test_a_gpu_that_is_not_there_is_one_line_naming_the_input(value, message):
    with pytest.raises(PlanError, match=message):
        visible_devices(machine(uuids=True), {"CUDA_VISIBLE_DEVICES": value})


def test_uuids_without_the_driver_are_not_guessed():
    with pytest.raises(PlanError, match=r"names a GPU by UUID, which this topology does not know \(the NVIDIA "
                                        r"kernel driver's /proc/driver/nvidia"):
        visible_devices(machine(), {"CUDA_VISIBLE_DEVICES": "GPU-d3"})


# ------------------------------------------------------------------ Slurm

def test_slurm_indices_count_from_the_step_or_the_node_whichever_names_its_gpus():
    """ConstrainDevices=yes makes CUDA_VISIBLE_DEVICES count from the step's first GPU:
    0,1 under SLURM_STEP_GPUS=2,3 can only be read so; 2,3 only from the node's."""
    t = machine()
    step = {"SLURM_STEP_GPUS": "2,3"}
    confined = visible_devices(t, {**step, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert names(confined) == BUS[2:4] and [d.name for d in confined.step] == BUS[2:4]
    assert any("read from the step's first GPU" in n for n in confined.notes)
    assert names(visible_devices(t, {**step, "CUDA_VISIBLE_DEVICES": "2,3"})) == BUS[2:4]
    with pytest.raises(PlanError, match=r"CUDA_VISIBLE_DEVICES=1 under SLURM_STEP_GPUS=1,2: GPU 0000:3a:00.0 if "
                                        r"Slurm confines the step's devices .* GPU 0000:2a:00.0 if not"):
        visible_devices(t, {"SLURM_STEP_GPUS": "1,2", "CUDA_VISIBLE_DEVICES": "1"})
    assert names(visible_devices(t, {"SLURM_STEP_GPUS": "1,2", "CUDA_VISIBLE_DEVICES": "1"},
                                 devices_constrained=True)) == [BUS[2]]
    outside = r"CUDA_VISIBLE_DEVICES=5 and SLURM_STEP_GPUS=2,3 contradict each other: CUDA_VISIBLE_DEVICES names GPU"
    with pytest.raises(PlanError, match=outside + r" 0000:ab:00.0, outside the GPUs Slurm gave this step"):
        visible_devices(t, {**step, "CUDA_VISIBLE_DEVICES": "5"}, devices_constrained=False)
    # not known whether confined: the contradiction is said, not the reading that finds no GPU 5 in the step
    with pytest.raises(PlanError, match=outside):
        visible_devices(t, {**step, "CUDA_VISIBLE_DEVICES": "5"})
    with pytest.raises(PlanError, match=r"SLURM_JOB_GPUS=8: no GPU 8 on this machine"):
        visible_devices(t, {"SLURM_JOB_GPUS": "8"})


#: what srun --gpus-per-task=1 sets in task 2 of 4 inside a batch script of 4 GPUs (Slurm 22.05.8, measured
#: on the tests' one-node Slurm with 2 GPUs: tests/engines/test_gpu_recipes.py): SLURM_STEP_GPUS names the
#: task's own GPU only; the job's GPUs pass on from the batch script
PER_TASK = {"SLURM_STEP_GPUS": "2", "CUDA_VISIBLE_DEVICES": "2", "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4",
            "SLURMD_TRES_BIND": "gpu:per_task:1", "SLURM_GPUS_PER_TASK": "1", "SLURM_LOCALID": "2",
            "SLURM_STEP_TASKS_PER_NODE": "4"}


def test_srun_per_task_binding_the_step_is_the_jobs_gpus_when_slurm_counts_them_all():
    t = machine()
    b = gpu_binding(t, "exclusive", environ=PER_TASK, local_rank=2, local_size=4)
    assert b.device.name == BUS[2] and b.ordinal == 0
    assert b.cpus == frozenset({8, 9})  # node 0's 6 cores divided between the step's 4 GPUs: 2, 2, 1, 1
    assert any("SLURM_STEP_GPUS=2 names this task's own GPU (Slurm binds each task to its GPUs (gpu:per_task:1)); "
               "the step's 4 on this node are SLURM_JOB_GPUS=0,1,2,3" in n for n in b.notes), b.notes
    # srun outside a batch script: no SLURM_JOB_GPUS, the other tasks' GPUs are not known: the whole node, as torch
    alone = {k: v for k, v in PER_TASK.items() if k not in ("SLURM_JOB_GPUS", "SLURM_GPUS_PER_TASK")}
    b = gpu_binding(t, "exclusive", environ=alone, local_rank=2, local_size=4)
    assert b.device.name == BUS[2] and b.cpus == frozenset(range(12)) and b.differs_from_torch is None
    assert any("the other ranks' GPUs are not known here" in n for n in b.notes)
    # a step of some of the job's GPUs (SLURM_GPUS_ON_NODE counts the step's): the job's are not its peers
    some = {**PER_TASK, "SLURM_GPUS_ON_NODE": "2"}
    assert gpu_binding(t, "exclusive", environ=some, local_rank=2, local_size=4).cpus == frozenset(range(12))


def test_srun_gpus_per_task_gives_each_rank_its_own_and_divides_the_step():
    """srun --gpus-per-task=1: the task sees its GPU; exclusive divides the node between
    the step's GPUs on it (torchrun, seeing one device, would not: said)."""
    t = machine()
    env = {"SLURM_STEP_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "2", "SLURM_LOCALID": "2"}
    b = gpu_binding(t, "exclusive", environ=env, local_rank=2, local_size=4, devices_constrained=False)
    assert b.device.name == BUS[2] and b.ordinal == 0
    assert b.cpus == frozenset({8, 9})  # node 0's 6 cores in 4: 2, 2, 1, 1 -> the third GPU gets the fifth core
    assert "torchrun, seeing one device, would not divide the node between the 4 GPUs" in b.differs_from_torch


# ------------------------------------------------------------------ AMD and Intel

def amd(n: int = 4) -> Topology:
    return machine(gpus=tuple(gpu(i, 0x10 * (i + 1), i // 2, vendor=0x1002, device=0x74A1, cls=0x0380)
                              for i in range(n)))


def test_rocr_then_hip_as_torch_composes_them():
    t = amd()
    assert names(visible_devices(t, {"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "0,2"})) == [
        "0000:20:00.0", "0000:40:00.0"]
    assert names(visible_devices(t, {"CUDA_VISIBLE_DEVICES": "3"})) == ["0000:40:00.0"]  # HIP reads it when alone
    vis = visible_devices(t, {"ROCR_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert names(vis) == ["0000:20:00.0"] and any("CUDA_VISIBLE_DEVICES is not read" in n for n in vis.notes)
    with pytest.raises(PlanError, match=r"HIP_VISIBLE_DEVICES=2 and ROCR_VISIBLE_DEVICES=0,1 contradict each "
                                        r"other: HIP counts within the 2 GPU\(s\) ROCr leaves"):
        visible_devices(t, {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "2"})


def pvc(tiles: int | None = 2) -> Topology:
    """Aurora-style: 6 Intel GPUs of 2 tiles, three on each socket."""
    return machine(gpus=tuple(gpu(i, 0x18 + 0x10 * i, i // 3, vendor=0x8086, device=0x0BD5, cls=0x0380,
                                  tiles=tiles) for i in range(6)))


def test_ze_affinity_mask_in_flat_and_composite_hierarchies():
    t = pvc()
    flat = visible_devices(t, {})
    assert len(flat.devices) == 12 and flat.devices[5] == GpuDevice(t.gpus[2], 1)
    assert visible_devices(t, {"ZE_AFFINITY_MASK": "5"}).devices == (GpuDevice(t.gpus[2], 1),)
    comp = {"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}
    assert visible_devices(t, {**comp, "ZE_AFFINITY_MASK": "2.1"}).devices == (GpuDevice(t.gpus[2], 1),)
    assert visible_devices(t, {**comp, "ZE_AFFINITY_MASK": "2.0,2.1"}).devices == (GpuDevice(t.gpus[2]),)
    masked = visible_devices(t, {**comp, "ZE_AFFINITY_MASK": "4,1"})
    assert masked.devices == (GpuDevice(t.gpus[1]), GpuDevice(t.gpus[4]))
    assert any("selects devices; Level Zero keeps its own order" in n for n in masked.notes)
    with pytest.raises(PlanError, match=r"ZE_AFFINITY_MASK=2.1: 2.1 names a tile of a device, but with "
                                        r"ZE_FLAT_DEVICE_HIERARCHY=FLAT each tile is a device of its own \(0 to 11\)"):
        visible_devices(t, {"ZE_AFFINITY_MASK": "2.1"})
    unknown = visible_devices(pvc(tiles=None), {})
    assert len(unknown.devices) == 6 and any("are not known (the kernel driver lists none)" in n
                                             for n in unknown.notes)


def test_aurora_style_tiles_each_rank_on_its_socket():
    """12 ranks, one tile each (ZE_AFFINITY_MASK per rank in FLAT mode): ranks of the
    first three GPUs on socket 0, the rest on socket 1."""
    t = pvc()
    for rank in range(12):
        b = gpu_binding(t, "socket", environ={"ZE_AFFINITY_MASK": str(rank)}, local_rank=rank, local_size=12)
        assert (b.device.gpu.logical_index, b.device.tile) == (rank // 2, rank % 2)
        assert b.cpus == (frozenset(range(12)) if rank < 6 else frozenset(range(12, 24)))


def test_the_vendor_of_mixed_gpus():
    t = machine(gpus=(gpu(0, 0x02, 0, vendor=0x8086, device=0x56A0, cls=0x0300), gpu(1, 0x17, 0), gpu(2, 0x2A, 1)))
    vis = visible_devices(t, {})
    assert vis.vendor == "NVIDIA" and any("NVIDIA's, the most (pass vendor= to choose)" in n for n in vis.notes)
    assert visible_devices(t, {"ZE_AFFINITY_MASK": "0"}).vendor == "Intel"
    assert visible_devices(t, {}, vendor="intel").vendor == "Intel"
    with pytest.raises(PlanError, match=r"vendor='amd': this machine's GPUs are"):
        visible_devices(t, {}, vendor="amd")
    with pytest.raises(PlanError, match=r"no GPU on this machine"):
        visible_devices(Topology.from_synthetic("pack:1 core:2 pu:1"), {})


# ------------------------------------------------------------------ the rank's device

def test_local_rank_n_is_device_n_as_torchrun_binds_it():
    vis = visible_devices(machine(), {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    c = rank_gpu(vis, 2, local_size=4)
    assert (c.device.name, c.ordinal, c.peer_index, c.per_rank) == (BUS[6], 2, 2, False)
    with pytest.raises(PlanError, match=r"5 ranks on this node but 4 NVIDIA GPUs visible \(CUDA_VISIBLE_DEVICES="
                                        r"4,5,6,7\): more ranks than GPUs"):
        rank_gpu(vis, 0, local_size=5)
    with pytest.raises(PlanError, match=r"local rank 4: 4 NVIDIA GPUs visible"):
        rank_gpu(vis, 4)


def test_one_visible_gpu_is_the_ranks_own_except_under_torchrun():
    vis = visible_devices(machine(), {"CUDA_VISIBLE_DEVICES": "5"})
    c = rank_gpu(vis, 3, local_size=8)
    assert (c.device.name, c.ordinal, c.per_rank) == (BUS[5], 0, True)
    assert any("the other ranks' GPUs are not known here" in n for n in c.notes)
    with pytest.raises(PlanError, match="more ranks than GPUs"):
        rank_gpu(vis, 3, local_size=8, environ={"LOCAL_WORLD_SIZE": "8"})


@pytest.mark.parametrize("given, ordinal", [(2, 2), ("2", 2), ("0000:3a:00.0", 2), ("3a:00.0", 2), ("GPU-d2", 2)])
def test_an_explicit_gpu(given, ordinal):
    c = rank_gpu(visible_devices(machine(uuids=True), {}), 7, gpu=given)
    assert (c.ordinal, c.device.name) == (ordinal, BUS[2])


@pytest.mark.parametrize("given, message", [
    (8, r"gpu=8: this process sees 8 devices \(every NVIDIA GPU of the machine\): 0 to 7"),
    ("0000:18:00.0", r"gpu='0000:18:00.0' is none of the GPUs this process sees"),
    ("GPU-d", r"gpu='GPU-d' is ambiguous"),
    ("gpu0", r"expected a device ordinal, a PCI bus id"),
    (True, r"expected a device ordinal"),
])
def test_an_explicit_gpu_that_is_not_there(given, message):
    with pytest.raises(PlanError, match=message):
        rank_gpu(visible_devices(machine(uuids=True), {}), 0, gpu=given)


def test_an_explicit_gpu_the_process_does_not_see():
    vis = visible_devices(machine(), {"CUDA_VISIBLE_DEVICES": "0,1"})
    with pytest.raises(PlanError, match=r"gpu='0000:9a:00.0' is none of the GPUs this process sees "
                                        r"\(CUDA_VISIBLE_DEVICES=0,1"):
        rank_gpu(vis, 0, gpu="0000:9a:00.0")


# ------------------------------------------------------------------ the modes

def test_node_and_socket():
    t = machine("pack:2 group:2 [numa] l3:1 core:3 pu:2",
                gpus=(gpu(0, 0x17, 1), gpu(1, 0x9A, 2)))  # SNC: nodes 0,1 on socket 0, 2,3 on socket 1
    assert mode_cpus(t, t.gpus, 0, "node").cpus == frozenset(range(6, 12))
    assert mode_cpus(t, t.gpus, 0, "socket").cpus == frozenset(range(12))
    assert mode_cpus(t, t.gpus, 1, "socket").cpus == frozenset(range(12, 24))
    cut = t.with_allowed(frozenset(range(24)) - {6, 7})
    assert mode_cpus(cut, cut.gpus, 0, "node").cpus == frozenset(range(8, 12))


def test_exclusive_divides_whole_cores_lowest_devices_first():
    """Node 0: 6 cores for 4 GPUs -> 2, 2, 1, 1 cores (siblings stay together)."""
    t = machine()
    got = [mode_cpus(t, t.gpus, i, "exclusive").cpus for i in range(4)]
    assert got == [frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7}), frozenset({8, 9}), frozenset({10, 11})]
    two = [t.gpus[i] for i in (5, 1)]  # CUDA_VISIBLE_DEVICES=5,1: one GPU per node
    assert mode_cpus(t, two, 0, "exclusive").cpus == frozenset(range(12, 24))
    with pytest.raises(PlanError, match=r"gpu_bind='exclusive': NUMA node 0 has 1 allowed core for its 4 GPUs"):
        mode_cpus(t, t.gpus, 0, "exclusive", allowed=frozenset({0, 1, 12}))


def test_core_complex_one_l3_each_largest_first():
    t = machine()  # node 0: L3 {0-5} and {6-11}
    assert [mode_cpus(t, t.gpus, i, "core-complex").cpus for i in range(4)] == [
        frozenset(range(6)), frozenset(range(6, 12))] * 2
    cut = t.with_allowed(frozenset(range(24)) - {0, 1})  # the first L3 now has fewer allowed CPUs
    assert mode_cpus(cut, cut.gpus, 0, "core-complex").cpus == frozenset(range(6, 12))
    bare = machine("pack:2 [numa] core:6 pu:2")
    with pytest.raises(PlanError, match=r"report no cache, so no core complex is known \(torchrun fails here too\)"):
        mode_cpus(bare, bare.gpus, 0, "core-complex")


def test_a_gpu_without_numa_information_is_node_0_as_torch_takes_it():
    t = machine(gpus=(gpu(0, 0x17, -1), gpu(1, 0x9A, -1)))
    m = mode_cpus(t, t.gpus, 1, "node")
    assert (m.node, m.cpus, m.differs_from_torch) == (0, frozenset(range(12)), None)
    assert "numa_node -1 (the firmware gave none): NUMA node 0 assumed, as torchrun does" in m.notes[0]


def test_a_gpu_on_a_node_without_cpus_gets_the_cpus_next_to_it():
    """A memory-only node hwloc places on socket 1 (its cpuset is its locality):
    torch finds no CPU there and fails; here the allowed CPUs next to it, said."""
    t = machine(gpus=(gpu(0, 0x17, 2),))
    t = replace(t, numa_nodes=t.numa_nodes + (NumaNode(2, 2, frozenset(range(12, 24))),))
    m = mode_cpus(t, t.gpus, 0, "node")
    assert (m.node, m.cpus) == (2, frozenset(range(12, 24)))
    assert m.differs_from_torch == "NUMA node 2 of GPU 0000:17:00.0 has no CPUs (torch finds none to bind to)"
    assert mode_cpus(t, t.gpus, 0, "socket").differs_from_torch is not None


def test_a_gpu_whose_node_is_outside_the_allowed_cpus():
    t = machine()
    with pytest.raises(PlanError, match=r"GPU 0000:9a:00.0 is on NUMA node 1, whose CPUs 12-23 are all outside the "
                                        r"allowed CPUs 0-11"):
        mode_cpus(t, t.gpus, 4, "node", allowed=frozenset(range(12)))
    with pytest.raises(PlanError, match=r"gpu_bind='nodes': expected one of node, socket, exclusive, core-complex"):
        mode_cpus(t, t.gpus, 0, "nodes")


# ------------------------------------------------------------------ what torchrun lacks

def test_memory_on_the_node_of_the_cpus_within_the_allowed_mems():
    t = machine()
    b = gpu_binding(t, "node", local_rank=5, local_size=8)
    assert (b.device.name, b.node, b.mem_nodes, b.mempolicy, b.threads) == (BUS[5], 1, frozenset({1}), "bind", 6)
    assert gpu_binding(t, "node", local_rank=5, memory="preferred").mempolicy == "preferred"
    none = gpu_binding(t, "node", local_rank=5, memory="none")
    assert (none.mempolicy, none.mem_nodes) == (None, frozenset())
    cut = gpu_binding(t, "socket", local_rank=5, mems_allowed=frozenset({0}))
    assert cut.mempolicy is None and any("outside the allowed memory nodes 0: memory is not bound" in n
                                         for n in cut.notes)
    with pytest.raises(PlanError, match=r"memory='interleave': expected one of bind, preferred, none"):
        gpu_binding(t, "node", memory="interleave")


def test_cores_set_aside_for_data_loading():
    t = machine()
    b = gpu_binding(t, "exclusive", local_rank=0, local_size=8, reserve_cores=1)
    assert (b.cpus, b.compute_cpus, b.loader_cpus, b.threads) == (
        frozenset({0, 1, 2, 3}), frozenset({0, 1}), frozenset({2, 3}), 1)
    with pytest.raises(PlanError, match=r"reserve_cores=2: GPU 0000:17:00.0's CPUs 0-3 are 2 cores: none would be "
                                        r"left for compute"):
        gpu_binding(t, "exclusive", local_rank=0, local_size=8, reserve_cores=2)


def test_every_rank_of_a_node_each_on_its_gpus_share():
    t = machine()
    plan = gpu_bindings(t, "exclusive", 8)
    assert [b.device.name for b in plan] == BUS
    cpus = [b.cpus for b in plan]
    assert frozenset().union(*cpus) == t.cpuset and sum(map(len, cpus)) == len(t.cpuset)
    assert plan[4].describe() == ("rank 4: GPU 0000:9a:00.0 (device 4), NUMA node 1, cpus 12-15, 2 threads, "
                                  "memory bind 1")
    assert plan[4].to_dict()["cpus"] == "12-15" and plan[4].to_dict()["gpu"] == BUS[4]
    with pytest.raises(PlanError, match="9 ranks on this node but 8 NVIDIA GPUs visible"):
        gpu_bindings(t, "node", 9)


def test_a_step_narrowed_for_the_whole_node_is_not_a_tasks_own():
    """SLURM_STEP_GPUS holds 8, the node's ranks see 4 (narrowed by hand for all):
    rank r is device r; with --gpus-per-task=2 each task's first device is its own."""
    t = machine()
    env = {"SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    narrowed = rank_gpu(visible_devices(t, env, devices_constrained=False), 1, local_size=4, environ=env)
    assert (narrowed.device.name, narrowed.per_rank) == (BUS[5], False)
    per_task = {**env, "CUDA_VISIBLE_DEVICES": "2,3", "SLURM_GPUS_PER_TASK": "2"}
    own = rank_gpu(visible_devices(t, per_task, devices_constrained=False), 1, local_size=4, environ=per_task)
    assert (own.device.name, own.ordinal, own.per_rank, len(own.peers)) == (BUS[2], 0, True, 8)
