"""``mode_cpus`` against PyTorch 2.13's own ``torch/numa/binding.py``, driven over the
same described ``/sys`` trees: 200 random GPU servers (1-8 GPUs, 1-4 packages,
SNC/NPS nodes, SMT 1/2, per-CCX L3, no cache files, offline CPUs, memory-only
nodes with GPUs on them, ``numa_node`` -1, nodes listed as possible but absent,
random visible-device lists and allowed-CPU masks), and hwloc's own XML dumps
(``lstopo --whole-io``) of four servers.

For every mode and every visible device: where torch gives a CPU set, ours is
that set and says no difference; where torch raises, ours raises too or says why
it differs (``differs_from_torch``) -- except the one case the topology cannot
know, a node the kernel lists as possible but that is absent (torch's ``socket``
mode reads every possible node), which the test knows from the server.  Torch runs
once, in a subprocess (``tests/helpers/torch_numa.py``), for all servers.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

from affinity.errors import PlanError
from affinity.machine.topology import Topology
from affinity.planning.gpus import GPU_BIND_MODES, GpuDevice, mode_cpus
from helpers.sysfs_tree import random_server, server_from_dict, write_tree

HERE = Path(__file__).resolve().parent
DRIVER = HERE.parent / "helpers" / "torch_numa.py"
DUMPS = HERE.parent / "data" / "gpu" / "dumps"
SERVERS = 200
SEED = 37


def run_torch(cases: list[dict]) -> list[dict]:
    p = subprocess.run([sys.executable, str(DRIVER)], input=json.dumps(cases), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["torch"].startswith("2.13.0"), out["torch"]
    return out["results"]


def bus_order(bus: str) -> tuple[int, ...]:
    domain, b, rest = bus.split(":")
    return int(domain, 16), int(b, 16), int(rest.split(".")[0], 16)


def draw_case(rng: random.Random, s, root: str) -> dict:
    """The devices the process sees (all, a subset, a shuffled subset) and its allowed
    CPUs (all online, a node cut out, a random 70%, one package)."""
    buses = sorted((g.bus_id for g in s.gpus), key=bus_order)
    r = rng.random()
    visible = (buses if r < 0.6 else [b for b in buses if rng.random() < 0.7] or buses[:1] if r < 0.8
               else rng.sample(buses, rng.randint(1, len(buses))))
    online, r = sorted(s.online), rng.random()
    if r < 0.6:
        allowed = online
    elif r < 0.75 and s.cpu_nodes > 1:
        cut = s.node_cpus()[rng.randrange(s.cpu_nodes)]
        allowed = [c for c in online if c not in cut]
    elif r < 0.9:
        allowed = sorted(rng.sample(online, max(1, len(online) * 7 // 10)))
    else:
        allowed = sorted(s.package_cpus(rng.randrange(s.packages)))
    return {"root": root, "allowed": allowed, "visible": visible, "modes": list(GPU_BIND_MODES)}


def compare(topology: Topology, case: dict, torch_result: dict, possible_absent: bool, tally: Counter) -> list[str]:
    """Every mode, every device: ours against torch's; the disagreements, in words."""
    by_bus = {g.bus_id: g for g in topology.gpus}
    devices = [GpuDevice(by_bus[b]) for b in case["visible"]]
    bad = []
    for mode in GPU_BIND_MODES:
        for i, theirs in enumerate(torch_result[mode]):
            try:
                ours: object = mode_cpus(topology, devices, i, mode)
            except PlanError as e:
                ours = e
            if not isinstance(theirs, dict):  # torch gives a set: ours is it, and says no difference
                ok = not isinstance(ours, PlanError) and sorted(ours.cpus) == theirs and not ours.differs_from_torch
                kind = "same"
            elif isinstance(ours, PlanError):
                ok, kind = True, "both refuse"
            elif ours.differs_from_torch:
                ok, kind = True, "torch fails, said"
            else:
                ok, kind = mode == "socket" and possible_absent, "torch fails on a possible node absent"
            tally[mode, kind] += 1
            if not ok:
                bad.append(f"{case['root']} {mode} device {i} ({case['visible'][i]}), allowed "
                           f"{case['allowed']}: torch {theirs}, ours {ours}")
    return bad


def test_every_mode_equals_torchs_own_binding_on_200_random_servers(ram_path):
    rng = random.Random(SEED)
    servers, cases = [], []
    for i in range(SERVERS):
        s = random_server(rng)
        root = ram_path / str(i)
        root.mkdir()
        write_tree(s, str(root))
        servers.append(s)
        cases.append(draw_case(rng, s, str(root)))
    results = run_torch(cases)
    tally: Counter = Counter()
    bad = []
    for s, case, theirs in zip(servers, cases, results):
        topology = Topology.from_fsroot(case["root"]).with_allowed(case["allowed"])
        bad += compare(topology, case, theirs, s.extra_possible > 0, tally)
    assert not bad, f"{len(bad)} disagreements, first: " + "\n".join(bad[:5])
    for mode in GPU_BIND_MODES:  # each mode compared on many devices where torch answers
        assert tally[mode, "same"] >= 200, tally
    assert tally["node", "torch fails, said"] and tally["exclusive", "both refuse"], tally
    # what the servers held: every feature the docstring promises was drawn
    assert {s.l3 for s in servers} == {"package", "node", "ccx", "none", "nocache"}
    assert any(s.offline for s in servers) and any(s.smt == 1 for s in servers) and any(s.packages == 4 for s in servers)
    assert any(g.numa_node < 0 for s in servers for g in s.gpus)
    assert any(g.numa_node >= s.cpu_nodes for s in servers for g in s.gpus)  # a GPU on a memory-only node
    assert any(s.nodes_per_package > 1 for s in servers) and any(len(s.gpus) == 8 for s in servers)


def test_hwloc_pci_dumps_equal_torch_over_the_trees_they_were_made_from(ram_path):
    """Ours reads each XML (the GPUs' locality from hwloc's PCI objects); torch reads
    the tree the dump was made of (SNC nodes, numa_node -1, AMD and Intel class
    0x0380, an offline CPU, no L3)."""
    names = sorted(p.stem for p in DUMPS.glob("*.xml"))
    assert len(names) >= 4
    servers, topologies, cases = [], [], []
    for name in names:
        server = server_from_dict(json.loads((DUMPS / f"{name}.json").read_text())["server"])
        root = ram_path / name
        root.mkdir()
        write_tree(server, str(root))
        topology = Topology.from_xml(DUMPS / f"{name}.xml")
        assert [g.bus_id for g in topology.gpus] == sorted((g.bus_id for g in server.gpus), key=bus_order), name
        servers.append(server)
        topologies.append(topology)
        cases.append({"root": str(root), "allowed": sorted(server.online),
                      "visible": [g.bus_id for g in topology.gpus], "modes": list(GPU_BIND_MODES)})
    tally: Counter = Counter()
    bad = []
    for topology, case, theirs in zip(topologies, cases, run_torch(cases)):
        bad += compare(topology, case, theirs, False, tally)
    assert not bad, bad
    assert tally["node", "same"] == sum(len(s.gpus) for s in servers)
