"""Where DataLoader workers go beside a plan's compute threads: a pure function of
the plan, checked on synthetic machines (and through ``affinity plan
--dataloader-workers``)."""

from __future__ import annotations

import json

import pytest

import affinity
from affinity.errors import PlanError
from affinity.machine.topology import Topology
from affinity.planning.workers import worker_layout
from affinity.tools.cli import main

SMT = Topology.from_synthetic("pack:1 core:4 pu:2")  # PUs 0-7, siblings (0,1) (2,3) ...
FLAT = Topology.from_synthetic("pack:1 core:8 pu:1")


def sets(layout):
    return [sorted(s) for s in layout.cpusets]


def test_free_cores_first_one_whole_core_each():
    p = affinity.plan("granularity=fine,compact,1,0", threads=2, topology=SMT)  # PUs 0 and 2
    lay = worker_layout(p, 2)
    assert lay.kind == "free-cores" and sets(lay) == [[4, 5], [6, 7]] and lay.sharing == (None, None)


def test_smt_siblings_when_there_are_not_enough_free_cores():
    p = affinity.plan("granularity=fine,compact,1,0", threads=4, topology=SMT)  # 0 2 4 6: every core
    lay = worker_layout(p, 4)
    assert lay.kind == "free-pus" and sets(lay) == [[1], [3], [5], [7]]


def test_shared_free_cpus_first_then_compute_slots_from_the_last():
    p = affinity.plan("granularity=fine,compact", threads=7, topology=FLAT)  # 0-6 used, 7 free
    lay = worker_layout(p, 3)
    assert lay.kind == "shared" and sets(lay) == [[7], [6], [5]] and lay.sharing == (None, 6, 5)
    p = affinity.plan("granularity=fine,compact", threads=2, topology=Topology.from_synthetic("pack:1 core:2 pu:1"))
    lay = worker_layout(p, 3)
    assert sets(lay) == [[1], [0], [1]] and lay.sharing == (1, 0, 1)  # more workers than CPUs: cycle


def test_allowed_cpus_only_and_the_environment_form():
    p = affinity.plan("granularity=fine,compact", threads=2, topology=FLAT.with_allowed({0, 1, 2, 5}))
    lay = worker_layout(p, 2)
    assert sets(lay) == [[2], [5]]
    assert lay.to_env_value() == "2;5"
    assert lay.describe().splitlines()[1:] == ["  worker 0 -> {2}", "  worker 1 -> {5}"]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_a_bad_count_names_the_call(bad):
    p = affinity.plan("compact", threads=1, topology=FLAT)
    with pytest.raises(PlanError, match=r"worker_layout\(workers="):
        worker_layout(p, bad)


def test_affinity_plan_dataloader_workers(capsys):
    assert main(["plan", "granularity=fine,compact,1,0", "-t", "2", "--topology", "synthetic:pack:1 core:4 pu:2",
                 "--dataloader-workers", "2"]) == 0
    text = capsys.readouterr().out
    assert "2 DataLoader workers, each on a core the compute threads do not use" in text
    assert "  worker 0 -> {4-5}" in text and "  worker 1 -> {6-7}" in text
    assert main(["plan", "granularity=fine,compact,1,0", "-t", "2", "--topology", "synthetic:pack:1 core:4 pu:2",
                 "--dataloader-workers", "2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["dataloader_workers"] == {"kind": "free-cores", "cpusets": [[4, 5], [6, 7]], "sharing": [None, None]}
