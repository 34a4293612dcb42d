"""The command line, run as users run it (``python -m affinity ...``)."""

from __future__ import annotations

import json
import subprocess
import sys

from affinity.tools.cli import main
from affinity.machine.topology import Topology

from helpers import golden_dir

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
                                "hwloc XML file, a JSON file, a cpuinfo file, 'synthetic:<description>', 'fsroot:<dir>' or "
                                "'system')")
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


# ----------------------------------------------------------------- plan


def test_plan_explain_lines_match_the_planner():
    from affinity import plan

    xml = str(GOLDEN / "hwloc" / "2s4c2t_linux.xml")
    r = run("plan", "granularity=fine,scatter", "--threads", "5", "--topology", xml, "--translate", "-v")
    assert r.returncode == 0, r.stderr
    p = plan("granularity=fine,scatter", threads=5, topology=Topology.from_xml(xml))
    bound = [line for line in r.stdout.splitlines() if " bound to OS proc set " in line]
    assert bound == [f"KMP_AFFINITY: thread {i} bound to OS proc set {{{','.join(map(str, sorted(s)))}}}"
                     for i, s in enumerate(p.cpusets)]
    assert "KMP_AFFINITY: OS proc 8 maps to socket 0 core 0 thread 1" in r.stdout
    assert "  OMP_PLACES: {0},{4},{1},{5},{2}" in r.stdout


def test_plan_json_env_mask_and_lenient():
    xml = str(GOLDEN / "hwloc" / "2s4c2t_linux.xml")
    r = run("plan", "--env", "OMP_PLACES=cores", "--env", "OMP_PROC_BIND=spread", "--threads", "3",
            "--topology", xml, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["threads"] == 3 and d["cpusets"] == [[0, 8], [3, 11], [6, 14]]
    assert len(d["places"]) == 8 and d["warnings"] == []
    assert d["translations"]["OMP_PLACES"] == "{0,8},{3,11},{6,14}"
    r = run("plan", "granularity=fine,compact", "--mask", "0-3,8-11", "--topology", xml, "--json")
    assert json.loads(r.stdout)["cpusets"] == [[0], [8], [1], [9], [2], [10], [3], [11]]
    # strict by default: a caret under the bad token, exit 1
    r = run("plan", "granularity=fine,compakt", "--topology", xml)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-2:] == ["    granularity=fine,compakt", "                     ^"]
    # lenient: as the runtime, warn and fall back
    r = run("plan", "granularity=fine,compakt", "--topology", xml, "--lenient", "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout)["warnings"] == ['KMP_AFFINITY: parameter invalid, ignoring "compakt".']
    assert run("plan", "--env", "NOEQUALS", "--topology", xml).returncode != 0


def test_plan_picture_is_drawn_from_the_plan(tmp_path):
    import xml.etree.ElementTree as ET

    from affinity import plan

    topo = Topology.from_synthetic("pack:2 [numa] core:4 pu:2")
    for spec in ("granularity=fine,compact", "granularity=fine,scatter", "compact,1"):
        out = tmp_path / "p.svg"
        assert main(["plan", spec, "--topology", "synthetic:pack:2 [numa] core:4 pu:2",
                     "--picture", str(out)]) == 0
        p = plan(spec, topology=topo)
        drawn = {}
        for el in ET.parse(out).iter():
            if el.get("data-threads") is not None and el.get("data-os-index") and \
                    el.get("data-thread-names") is not None:
                ts = el.get("data-threads")
                drawn[int(el.get("data-os-index"))] = {int(t) for t in ts.split(",")} if ts else set()
        want = {pu.os_index: {i for i, s in enumerate(p.cpusets) if pu.os_index in s} for pu in topo.pus}
        assert drawn == want, spec


def test_show_json_and_picture(tmp_path):
    out = tmp_path / "live.png"
    r = run("show", "--json", "--picture", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["threads"][0]["role"] == "main" and d["mismatches"] == []
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run("show", "999999999").returncode == 1
