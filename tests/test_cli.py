"""The command line, run as users run it (``python -m affinity ...``)."""

from __future__ import annotations

import json
import subprocess
import sys

from affinity.cli import main
from affinity.topology import Topology

from conftest import golden_dir

GOLDEN = golden_dir()


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "affinity", *args], capture_output=True, text=True,
                          timeout=120)


def test_topology_tree_of_an_xml_file():
    r = run("topology", "--topology", str(GOLDEN / "hwloc" / "skx8180_2s28c2t.xml"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "Machine: 2 packages x 28 cores x 2 PUs (112 PUs, 2 NUMA nodes)"
    assert "    NUMANode P#1 L#1 (cpus 28-55,84-111)" in r.stdout
    assert "      Core P#27 L#55: PU P#55 L#110, PU P#111 L#111" in r.stdout


def test_topology_json_matches_the_value(capsys):
    src = str(GOLDEN / "cpuinfo" / "doc_2s4c2t_interleaved.cpuinfo")
    node_dir = str(GOLDEN / "fakesys" / "doc_2s4c2t_interleaved" / "node")
    assert main(["topology", "--topology", src, "--numa-nodes", node_dir, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == Topology.from_cpuinfo(src, node_dir).to_dict()
    assert [c["os_index"] for c in out["cores"][:4]] == [0, 2, 1, 3]


def test_topology_synthetic_and_system():
    r = run("topology", "--topology", "synthetic:pack:2 [numa] core:2 pu:2", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)["pus"]) == 8
    r = run("topology")
    assert r.returncode == 0 and r.stdout.startswith("Machine: ")


def test_errors_exit_1_with_a_message():
    r = run("topology", "--topology", "/no/such/file.xml")
    assert r.returncode == 1
    assert r.stderr.strip() == ("affinity topology: error: /no/such/file.xml: no such file (expected an "
                                "hwloc XML file, a cpuinfo file, 'synthetic:<description>' or 'system')")
    r = run("topology", "--topology", "synthetic:nonsense")
    assert r.returncode == 1 and "hwloc_topology_set_synthetic" in r.stderr
    assert run("no-such-command").returncode == 2


def test_console_script_and_version():
    import shutil
    from pathlib import Path

    script = Path(sys.executable).with_name("affinity")
    exe = str(script) if script.exists() else shutil.which("affinity")
    assert exe, "the 'affinity' console script is not installed"
    r = subprocess.run([exe, "version", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["header_api"].split(".")[0] == v["runtime_api"].split(".")[0] == "2"
