"""``affinity plan --ranks N --gpu-bind MODE``: each rank's GPU, CPUs and memory node
before a job runs, on the example 8-GPU two-socket server (tests/data/gpu/server-2s8g),
and ``affinity topology`` listing the GPUs."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from affinity.cpulist import parse_list
from affinity.machine.topology import Topology
from affinity.tools.cli import main

SERVER = Path(__file__).resolve().parents[1] / "data" / "gpu" / "server-2s8g"
TOPO = f"fsroot:{SERVER}"
BUS = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0", "0000:9d:00.0", "0000:c3:00.0",
       "0000:d1:00.0", "0000:df:00.0"]


@pytest.fixture(autouse=True)
def _no_gpu_variables(monkeypatch):
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                 "ZE_AFFINITY_MASK", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(name, raising=False)


def test_eight_ranks_exclusive_json_names_each_gpu_its_cpus_and_memory(capsys):
    """Socket 0 (CPUs 0-5,12-17) has 6 cores for 4 GPUs: 2, 2, 1, 1 cores, siblings together."""
    assert main(["plan", "--ranks", "8", "--gpu-bind", "exclusive", "--topology", TOPO, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ranks = out["ranks"]
    assert (out["source"], out["gpu_bind"]) == ("--ranks 8", "exclusive")
    assert [r["gpu"] for r in ranks] == BUS and [r["ordinal"] for r in ranks] == list(range(8))
    assert [r["cpus"] for r in ranks] == ["0-1,12-13", "2-3,14-15", "4,16", "5,17",
                                          "6-7,18-19", "8-9,20-21", "10,22", "11,23"]
    assert [(r["mempolicy"], r["mem_nodes"]) for r in ranks] == [("bind", "0")] * 4 + [("bind", "1")] * 4
    assert [r["threads"] for r in ranks] == [2, 2, 1, 1] * 2
    assert all(r["differs_from_torch"] is None for r in ranks)


def test_the_table_with_visible_devices_and_reserved_cores(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert main(["plan", "--ranks", "2", "--gpu-bind", "node", "--reserve-cores", "1", "--topology", TOPO]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("(--ranks 2), each next to its GPU as torchrun --numa-binding=node binds it:")
    assert lines[2].split() == ["0", BUS[4], "0", "1", "6-11,18-23", "11,23", "5", "bind", "1"]
    assert lines[3].split() == ["1", BUS[5], "1", "1", "6-11,18-23", "11,23", "5", "bind", "1"]
    assert len(lines) == 4  # PCI_BUS_ID: no order assumed, nothing to note


def _rect(group) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of an SVG group's own box (its first rect)."""
    r = group.find("{http://www.w3.org/2000/svg}rect")
    x, y, w, h = (float(r.get(k)) for k in ("x", "y", "width", "height"))
    return x, y, x + w, y + h


def test_the_picture_draws_each_gpu_in_its_node_with_its_ranks(tmp_path, capsys):
    """What the picture is for: rank r's number on exactly its CPUs, and the box of its
    GPU, labelled with r, drawn inside the same NUMA node, beside the cores (inside the
    node's box, overlapping no core)."""
    path = tmp_path / "ranks.svg"
    assert main(["plan", "--ranks", "8", "--gpu-bind", "exclusive", "--topology", TOPO, "--picture", str(path),
                 "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    svg = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    groups = {g.get("id"): g for g in svg.iter(f"{ns}g")}
    cpus_of = {r["rank"]: parse_list(r["cpus"]) for r in ranks}
    for node_id in (0, 1):
        node = groups[f"numa-{node_id}"]
        inside = {g.get("id") for g in node.iter(f"{ns}g")}
        nx0, ny0, nx1, ny1 = _rect(node)
        cores = [_rect(g) for g in node.iter(f"{ns}g") if g.get("class") == "core"]
        for i, bus in enumerate(BUS):
            if i // 4 != node_id:
                continue
            box = groups[f"gpu-{i}"]
            assert box.get("data-bus-id") == bus and f"gpu-{i}" in inside, f"GPU {bus} is not drawn in its node"
            assert any(t.text == f"rank {i}" for t in box.iter(f"{ns}text"))
            x0, y0, x1, y1 = _rect(box)
            assert nx0 <= x0 < x1 <= nx1 and ny0 <= y0 < y1 <= ny1
            assert all(x1 <= cx0 or cx1 <= x0 or y1 <= cy0 or cy1 <= y0 for cx0, cy0, cx1, cy1 in cores)
            # the rank's number on the PUs of its CPUs, and these PUs in the GPU's node
            on = {int(g.get("data-os-index")) for g in svg.iter(f"{ns}g")
                  if g.get("class") == "pu" and g.get("data-threads") == str(i)}
            assert on == cpus_of[i] and {f"pu-{c}" for c in on} <= inside


@pytest.mark.parametrize("argv, message", [
    (["--ranks", "9", "--gpu-bind", "node"], "9 ranks on this node but 8 NVIDIA GPUs visible"),
    (["--gpu-bind", "node"], "--gpu-bind and --reserve-cores go with --ranks N|auto"),
    (["--ranks", "2", "--reserve-cores", "1"], "--reserve-cores goes with --gpu-bind"),
    (["--ranks", "2", "--gpu-bind", "node", "--reserve-cores", "6"], "reserve_cores=6: GPU 0000:1b:00.0's CPUs"),
])
def test_bad_input_is_one_line(argv, message, capsys):
    assert main(["plan", *argv, "--topology", TOPO]) in (1, 2)
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) <= 2, err


def test_a_machine_without_gpus_says_so(capsys):
    assert main(["plan", "--ranks", "2", "--gpu-bind", "node", "--topology", "synthetic:pack:2 core:2 pu:1"]) == 1
    assert "no GPU on this machine" in capsys.readouterr().err


def test_topology_lists_the_gpus(capsys):
    assert main(["topology", "--topology", TOPO]) == 0
    tree = capsys.readouterr().out
    assert tree.splitlines()[0] == "Machine: 2 packages x 6 cores x 2 PUs (24 PUs, 2 NUMA nodes, 8 GPUs)"
    assert "      GPU L#4 0000:9d:00.0 NVIDIA 10de:2330 (3D), NUMA node 1" in tree
    assert main(["topology", "--topology", TOPO, "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)["gpus"]
    assert [g["bus_id"] for g in gpus] == BUS and {g["numa_node"] for g in gpus[4:]} == {1}
    assert Topology.from_fsroot(SERVER).gpus[7].local_cpus == frozenset(range(6, 12)) | frozenset(range(18, 24))
