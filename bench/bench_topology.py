"""Loading this machine's topology: hwloc fresh, affinity's per-process cache, and
what lscpu-based launchers do (``lscpu -p`` parsed in Python), side by side.

Group ``topology``: the cached ``Topology.from_system()`` is what every call of
``apply``/``plan``/``run`` pays after the first; a fresh hwloc load is what a
launcher that reloads each time pays (tens of ms on big machines, seconds on
large EPYCs).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from affinity.machine.topology import Topology


def _lscpu():
    out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True,
                         check=True).stdout
    return [tuple(line.split(",")) for line in out.splitlines() if not line.startswith("#")]


@pytest.mark.benchmark(group="topology")
@pytest.mark.parametrize("how", ["hwloc-fresh", "cached", "lscpu-parse"])
def test_topology_load(benchmark, how):
    if how == "hwloc-fresh":
        t = benchmark(Topology.from_system, refresh=True)
        assert t.pus
    elif how == "cached":
        Topology.from_system()
        t = benchmark(Topology.from_system)
        assert t.pus
    else:
        if shutil.which("lscpu") is None:
            pytest.skip("lscpu is not installed")
        rows = benchmark(_lscpu)
        assert rows
