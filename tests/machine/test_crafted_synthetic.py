"""Synthetic descriptions read the way hwloc reads them (issue 24, item 4).

Before: the 8,192-PU cap read arities with ``str.isdigit`` while hwloc reads them
with ``strtoul(.., 0)``: ``pack:0x40 core:0x40 pu:0x4`` (16,384 PUs) passed,
``pack:0x100000 pu:0x1000`` ran for minutes, ``pu:010`` (8 PUs) counted as 10,
``indexes=4294967295`` took 4.6 GB, a NUL cut the description silently and a
5,000-digit arity was a raw ``ValueError``.  Each is now refused before hwloc is
called (asserted by counting calls, not by time).
"""

from __future__ import annotations

import pytest

from affinity.errors import AffinityError, TopologyError
from affinity.machine import _native
from affinity.machine.topology import MAX_PUS, Topology, _synthetic_pus


@pytest.fixture
def hwloc_calls(monkeypatch):
    calls = []
    real = _native.load_topology

    def spy(kind, arg):
        calls.append((kind, arg))
        return real(kind, arg)

    monkeypatch.setattr(_native, "load_topology", spy)
    return calls


@pytest.mark.parametrize("desc", [
    "pack:0x40 core:0x40 pu:0x4",          # 16,384 PUs in hex
    "pack:0x100000 pu:0x1000",
    "pack:020000 pu:2",                    # octal 8,192 packages x 2
    "pu:2(indexes=4294967295,0)",
    "pu:2(indexes=2147483647,0)",
    "pu:" + "9" * 5000,
    "pack:2\0 core:100000 pu:2",
    "pack:-1 pu:2",
    "pack:2 [numa(indexes=0,99999999)] pu:2",
    "(indexes=0,4294967295) pu:2",
])
def test_refused_before_hwloc(desc, hwloc_calls):
    with pytest.raises(TopologyError) as ei:
        Topology.from_synthetic(desc)
    assert isinstance(ei.value, AffinityError) and isinstance(ei.value, ValueError)
    msg = str(ei.value)
    assert "\n" not in msg and "\0" not in msg and len(msg) < 400
    assert hwloc_calls == []


@pytest.mark.parametrize("desc,pus", [
    ("pu:010", 8), ("pu:0x8", 8), ("pu:+4", 4), ("pack:2 core:28 pu:2(indexes=2*56:1*2)", 112),
    ("pack:2 [numa] core:2 pu:2", 8), ("2 2 2", 8), ("pack:2\ncore:2 pu:2", 8),
    (f"pack:2 pu:{MAX_PUS // 2}", MAX_PUS), ("pu:2(indexes=1,0)", 2),
])
def test_counted_as_hwloc_counts(desc, pus):
    assert _synthetic_pus(desc) == pus


@pytest.mark.parametrize("desc", ["pu:010", "pu:0x8", "pack:2\ncore:2 pu:2", "pu:+4"])
def test_hwloc_agrees_with_the_count(desc):
    assert len(Topology.from_synthetic(desc).cpuset) == _synthetic_pus(desc)
