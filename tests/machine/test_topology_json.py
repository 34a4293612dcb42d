"""``affinity topology --json`` saves a node; ``--topology FILE`` (``Topology.load``,
``Topology.from_json``) reads it back anywhere: docs/recipes.md offers it, and the
file used to be read as a cpuinfo file ("expected 'name : value', got '{'")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import affinity
from affinity import Topology
from affinity.errors import TopologyError
from affinity.machine.topology import Core

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "hwloc"


def _hybrid() -> Topology:
    x = Topology.from_synthetic("pack:1 [numa] core:4 pu:2")
    cores = tuple(Core(c.os_index, c.logical_index, c.package, c.cpuset, "IntelAtom" if i >= 2 else "IntelCore",
                       0 if i >= 2 else 1) for i, c in enumerate(x.cores))
    return Topology(x.pus, cores, x.packages, x.numa_nodes, x.caches, x.groups, x.allowed, "hybrid")


MACHINES = {
    "xeon": lambda: Topology.from_synthetic("pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"),
    "knl": lambda: Topology.from_synthetic("pack:1 [numa(memory=1GB)] l2:34 core:2 pu:4"),
    "skx-xml": lambda: Topology.from_xml(GOLDEN / "skx8180_2s28c2t.xml"),
    "hybrid": _hybrid,
    "this": lambda: Topology.from_system(),
}


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_a_saved_machine_comes_back_the_same(name, tmp_path):
    x = MACHINES[name]()
    f = tmp_path / "node.json"
    f.write_text(x.to_json(indent=2))
    y = Topology.load(f)
    assert y == x.with_allowed(x.cpuset) and y.source == str(f)
    assert [(c.kind, c.efficiency) for c in y.cores] == [(c.kind, c.efficiency) for c in x.cores]
    for spec in ("granularity=fine,scatter", "compact,1,0", "OMP_PLACES=cores OMP_PROC_BIND=spread"):
        for runtime in ("intel", "gnu"):
            assert (affinity.plan(spec, topology=y, runtime=runtime).cpusets
                    == affinity.plan(spec, topology=x.with_allowed(x.cpuset), runtime=runtime).cpusets)


def test_the_recipe_from_the_command_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    saved = subprocess.run([sys.executable, "-m", "affinity", "topology", "--json"], capture_output=True,
                           text=True, env=env, check=True).stdout
    (tmp_path / "node.json").write_text(saved)
    r = subprocess.run([sys.executable, "-m", "affinity", "plan", "compact", "--topology",
                        str(tmp_path / "node.json")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"plan: compact on {Topology.from_system().describe()}")


def _broken(d: dict, how: str) -> dict:
    d = json.loads(json.dumps(d))
    if how == "no pus":
        del d["pus"]
    elif how == "core out of range":
        d["pus"][0]["core"] = 99
    elif how == "pu not in its core":
        d["pus"][0]["core"], d["pus"][2]["core"] = d["pus"][2]["core"], d["pus"][0]["core"]
    elif how == "bool index":
        d["pus"][0]["thread"] = True
    elif how == "cpuset not a string":
        d["cores"][0]["cpuset"] = [0, 1]
    elif how == "logical index":
        d["packages"][0]["logical_index"] = 1
    elif how == "twice":
        d["pus"][1]["os_index"] = d["pus"][0]["os_index"]
    return d


@pytest.mark.parametrize("how,says", [("no pus", "pus: not as 'affinity topology --json' writes it"),
                                      ("core out of range", "PU 0 names core 99"),
                                      ("pu not in its core", "which do not hold it"),
                                      ("bool index", "True is no index"),
                                      ("cpuset not a string", "a cpuset is a CPU list string"),
                                      ("logical index", "packages[0] has logical_index 1"),
                                      ("twice", "an OS index twice")])
def test_a_broken_file_is_refused_naming_what(tmp_path, how, says):
    x = Topology.from_synthetic("pack:2 [numa] core:2 pu:2")
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(_broken(x.to_dict(), how)))
    with pytest.raises(TopologyError, match=str(f)) as e:
        Topology.load(f)
    assert says in str(e.value)


def test_not_json(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("{ nope")
    with pytest.raises(TopologyError, match="not JSON"):
        Topology.load(f)
