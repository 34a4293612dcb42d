"""``affinity run --instances K`` against PyTorch's ``run_cpu --ninstances K`` on
2-socket SMT machines, placement computed (``bench/placement.py``), not timed.

run_cpu hands lscpu's core numbers to ``numactl -C`` as CPU numbers.  Where a
core's hardware threads are adjacent CPUs (2k, 2k+1) that puts every instance on
the first package, two threads per core, and leaves the second package idle;
affinity's shares are whole cores spread over the packages, one thread per
core, memory bound to each share's own node.  Where siblings are numbered
``i, i+N`` both tools agree."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from affinity.machine.topology import Topology
from helpers import ROOT


def _placement():
    spec = importlib.util.spec_from_file_location("bench_placement", ROOT / "bench" / "placement.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_placement", mod)
    spec.loader.exec_module(mod)
    return mod


P = _placement()
ADJACENT = "pack:2 [numa] core:28 pu:2"  # hwloc's default numbering: core k = CPUs 2k, 2k+1
LINUX = "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"  # core k = CPUs k, k+56


def test_lscpu_numbers_cores_in_order_of_their_first_cpu() -> None:
    rows = P.lscpu_rows(Topology.from_synthetic(ADJACENT))
    assert rows[:4] == [(0, 0, 0, 0), (1, 0, 0, 0), (2, 1, 0, 0), (3, 1, 0, 0)]
    assert rows[56] == (56, 28, 1, 1)
    rows = P.lscpu_rows(Topology.from_synthetic(LINUX))
    assert rows[1] == (1, 1, 0, 0) and rows[56] == (56, 0, 0, 0) and rows[28] == (28, 28, 1, 1)


@pytest.mark.parametrize("k", [2, 4])
def test_adjacent_siblings_run_cpu_crowds_one_package(k: int) -> None:
    t = Topology.from_synthetic(ADJACENT)
    theirs = P.run_cpu_instances(t, k)
    ours = P.affinity_instances(t, k)
    per = 56 // k
    # run_cpu: CPUs 0 .. 55 = the first package's 28 cores, two threads on each
    assert [sorted(p.cpus) for p in theirs] == [list(range(i * per, (i + 1) * per)) for i in range(k)]
    assert all(p.packages == {0} and p.nodes == {0} for p in theirs)
    assert all(p.threads == per and p.cores == per // 2 for p in theirs)
    # affinity: whole cores, one thread per core, both packages, each share's own node
    assert all(p.threads == p.cores == per for p in ours)
    assert [set(p.packages) for p in ours] == [{i * 2 // k} for i in range(k)]
    assert [set(p.nodes) for p in ours] == [set(p.packages) for p in ours]
    assert frozenset().union(*(p.cpus for p in ours)) == t.cpuset
    assert sum(len(p.cpus) for p in ours) == len(t.cpuset)
    for p in ours:  # every core under a mask is there whole
        assert all(c.cpuset <= p.cpus for c in t.cores if c.cpuset & p.cpus)


@pytest.mark.parametrize("k", [2, 4])
def test_linux_numbering_both_tools_agree_on_cores_and_packages(k: int) -> None:
    t = Topology.from_synthetic(LINUX)
    theirs = P.run_cpu_instances(t, k)
    ours = P.affinity_instances(t, k)
    assert [(p.packages, p.nodes, p.cores, p.threads) for p in theirs] == \
        [(p.packages, p.nodes, p.cores, p.threads) for p in ours]
    # run_cpu masks only the first hardware thread of each core; affinity masks whole cores
    assert all(len(p.cpus) == p.cores for p in theirs) and all(len(p.cpus) == 2 * p.cores for p in ours)


def test_the_markdown_section() -> None:
    text = P.markdown()
    assert f"**`{ADJACENT}`**" in text and "| 2 | run_cpu | 1 | 28-55 | 28 | 14 | 0 | 0 |" in text
    assert "| 2 | affinity | 1 | 56-111 | 28 | 28 | 1 | 1 |" in text
    # run_cpu's own parser agrees with the lscpu rows: in a subprocess (torch stays out of
    # the test process; make installs it, so the check runs and can fail)
    code = (f"import importlib.util, sys; spec = importlib.util.spec_from_file_location('p', {str(ROOT / 'bench' / 'placement.py')!r}); "
            "m = importlib.util.module_from_spec(spec); sys.modules['p'] = m; spec.loader.exec_module(m); "
            "from affinity.machine.topology import Topology; "
            f"print(m.check_against_torch(Topology.from_synthetic({ADJACENT!r})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]
