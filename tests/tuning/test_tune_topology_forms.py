"""``plan()``, ``apply()`` and ``tune()`` take the same ``topology=`` forms: a Topology,
``"system"``/None, ``"synthetic:..."``, an hwloc XML or cpuinfo file (``Topology.load``)."""

from __future__ import annotations

import os

import pytest

import affinity
from affinity.machine.topology import Topology
from helpers import ROOT

XML = ROOT / "tests" / "golden" / "hwloc" / "doc_2s2c2t.xml"
SYN = "synthetic:package:2 core:2 pu:2"


@pytest.mark.parametrize("form", [SYN, str(XML), XML, Topology.from_synthetic("package:2 core:2 pu:2")])
def test_plan_and_tune_take_every_form(form):
    p = affinity.plan("granularity=fine,compact", threads=2, topology=form)
    assert len(p.topology.allowed) == 8
    res = affinity.tune(lambda c: float(c["threads"]), {"threads": [1, 2]}, budget=2, seed=0, topology=form)
    assert res.best == {"threads": 2} and len(res.topology.allowed) == 8


def test_apply_takes_system_as_plan_and_tune_do():
    here = len(os.sched_getaffinity(0))
    assert len(affinity.plan("granularity=fine,compact", threads=1, topology="system").topology.allowed) >= 1
    with affinity.apply("granularity=fine,compact", threads=1, topology="system", tensorflow=False) as b:
        assert b.active
    assert len(os.sched_getaffinity(0)) == here


@pytest.mark.parametrize("call", [
    lambda t: affinity.plan("compact", threads=1, topology=t),
    lambda t: affinity.tune(lambda c: 1.0, {"threads": [1]}, budget=1, topology=t),
])
def test_a_missing_file_is_the_same_error_everywhere(call, tmp_path):
    with pytest.raises(affinity.TopologyError, match="no such file"):
        call(str(tmp_path / "nothing.xml"))
