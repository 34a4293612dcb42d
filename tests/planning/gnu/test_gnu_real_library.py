"""The gnu planner against the real libgomp builds on this machine, on machines
and settings the golden files do not hold.

The golden set's own harness (``tests/golden_gomp/replay``: a fake ``/sys`` tree,
faked CPU count, process mask, offline CPUs and cpuset) runs Debian's GCC 12
libgomp and PyTorch's bundled GCC 8.5 libgomp on nine machines: two recorded ones
(their fake trees as libgomp read them), last-level caches per half package,
NUMA nodes inside packages with sparse numbers, NUMA above packages, hybrid
cores, offline CPUs, a cpuset cgroup, non-uniform packages with a gap in the CPU
numbers -- with settings drawn at random (fixed seed): abstract names with
counts, explicit lists, policies and policy lists, thread counts,
``GOMP_CPU_AFFINITY`` lists, odd spellings, process masks.  Team size, every
mask, the place list, the initial thread's mask, the messages and aborts must
equal what the planner says.
"""

from __future__ import annotations

import json
import random

import pytest

from affinity.cpulist import format_list
from affinity.errors import PlanError
from affinity.machine.topology import Topology
from affinity.planning.gnu import plan_gomp
from gnu_golden import GOLDEN, topology
from gnu_realgomp import TORCH_LIB, RealGomp, gcc_libgomp_available, tree_files

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not gcc_libgomp_available(), reason="needs gcc -fopenmp (Debian's libgomp)")]


def _cpuinfo(tmp, rows) -> str:
    f = tmp / f"cpuinfo{len(rows)}_{abs(hash(tuple(rows))) % 10**6}"
    f.write_text("".join(f"processor : {p}\nphysical id : {s}\ncore id : {c}\n\n" for p, s, c in rows))
    return str(f)


def _machines(tmp):
    """name -> (topology, online CPUs or None, cpuset or None, sysfs files or None = from the topology)."""
    out = {}
    for m in ("doc_2s4c2t_interleaved", "skx8180_2s28c2t"):  # the recorded trees, as libgomp read them
        with open(GOLDEN / "fakesys" / f"{m}.json") as f:
            out[m] = (topology(m), None, None, json.load(f)["files"])
    out["ccx"] = (Topology.from_synthetic("pack:2 [numa] l3:2 core:4 pu:2"), None, None)
    out["numa_above"] = (Topology.from_synthetic("[numa] pack:2 l3:1 core:3 pu:2"), None, None)
    snc = [(p, p // 8, p % 8) for p in range(16)]
    out["snc_sparse"] = (Topology.from_cpuinfo(_cpuinfo(tmp, snc),
                                               numa_nodes={0: "0-3", 2: "4-7", 5: "8-11", 7: "12-15"}), None, None)
    hyb = [(0, 0, 0), (1, 0, 0), (2, 0, 1), (3, 0, 1), (4, 0, 2), (5, 0, 3), (6, 0, 4), (7, 0, 5)]
    out["hybrid"] = (Topology.from_cpuinfo(_cpuinfo(tmp, hyb), numa_nodes={0: "0-7"}), None, None)
    off = [(p, p // 6, (p % 6) // 2) for p in range(12) if p not in (3, 8)]
    out["offline"] = (Topology.from_cpuinfo(_cpuinfo(tmp, off), numa_nodes={0: "0-2,4,5", 1: "6,7,9-11"}),
                      frozenset(p for p, _, _ in off), None)
    ccx = Topology.from_synthetic("pack:2 [numa] l3:2 core:4 pu:2")
    out["cgroup"] = (ccx.with_allowed(range(4, 20)), None, frozenset(range(4, 20)))
    # packages of 3, 4 and 4 cores, CPU numbers with a gap (6 and 7 do not exist), NUMA ids 1 and 3
    rows = [(p, 0, p // 2) for p in range(6)] + [(p, 1, p - 8) for p in range(8, 12)] + \
        [(p, 2, (p - 12) // 2) for p in range(12, 20)]
    out["nonuniform_sparse"] = (Topology.from_cpuinfo(_cpuinfo(tmp, rows), numa_nodes={1: "0-5", 3: "8-19"}),
                                frozenset(p for p, _, _ in rows), None)
    return {k: v if len(v) == 4 else (*v, None) for k, v in out.items()}


def _explicit(rng, cpus):
    items = []
    for _ in range(rng.randint(1, 4)):
        a = rng.choice(cpus)
        kind = rng.random()
        if kind < 0.3:
            items.append(f"{{{a}:{rng.randint(1, 4)}}}")
        elif kind < 0.5:
            items.append(f"{{{a}:{rng.randint(1, 3)}:{rng.choice([1, 2, -1])}}}:{rng.randint(1, 4)}:{rng.choice([2, 4, -2])}")
        elif kind < 0.6:
            items.append(f"{{{a},{rng.choice(cpus)},!{a}}}")
        elif kind < 0.7 and items:
            items.append("!" + items[-1])
        else:
            items.append(f"{{{a},{rng.choice(cpus)}}}")
    return ",".join(items)


def _env(rng, cpus, n):
    env = {}
    r = rng.random()
    if r < 0.45:
        name = rng.choice(["threads", "cores", "sockets", "ll_caches", "numa_domains"])
        env["OMP_PLACES"] = name + (f"({rng.randint(0, 6)})" if rng.random() < 0.4 else "")
    elif r < 0.7:
        env["OMP_PLACES"] = _explicit(rng, cpus)
    if rng.random() < 0.6:
        env["OMP_PROC_BIND"] = rng.choice(["true", "false", "close", "spread", "primary", "master",
                                           "spread,close", "close,spread", "TRUE", "Spread"])
    if rng.random() < 0.25:
        picks = [str(rng.choice(cpus)) for _ in range(rng.randint(1, 4))]
        if rng.random() < 0.3:
            picks.append(f"{rng.choice(cpus)}-{max(cpus)}:{rng.randint(1, 3)}")
        env["GOMP_CPU_AFFINITY"] = " ".join(picks)
    if rng.random() < 0.8:
        env["OMP_NUM_THREADS"] = str(rng.randint(1, 2 * n + 1))
    if rng.random() < 0.15:  # odd spellings, read by libgomp's own rules
        var, odd = rng.choice([
            ("OMP_NUM_THREADS", " 4 "), ("OMP_NUM_THREADS", "3,2"), ("OMP_NUM_THREADS", "0"),
            ("OMP_NUM_THREADS", "2,"), ("OMP_THREAD_LIMIT", "2"), ("OMP_THREAD_LIMIT", "0"),
            ("OMP_PROC_BIND", "spread,"), ("OMP_PROC_BIND", " close "), ("OMP_PROC_BIND", "true,close"),
            ("OMP_PLACES", "{ 0 : 2 }, { 2 : 2 }"), ("OMP_PLACES", "threads (2)"), ("OMP_PLACES", "cores()"),
            ("OMP_PLACES", "{0:2}:3"), ("OMP_PLACES", "{1},{0}:2:-1"), ("OMP_PLACES", "0,2:2:3"),
            ("OMP_PLACES", "{0:2},!{0:2}"), ("OMP_PLACES", "{}"), ("OMP_PLACES", "{0:-1}"),
            ("GOMP_CPU_AFFINITY", "0 0x1 010"), ("GOMP_CPU_AFFINITY", "0 1-3:2"), ("GOMP_CPU_AFFINITY", "0,,1"),
            ("GOMP_CPU_AFFINITY", "0 -0"), ("GOMP_CPU_AFFINITY", "0 99"), ("GOMP_CPU_AFFINITY", "0 2-1")])
        env[var] = odd
    return env


@pytest.fixture(scope="module", params=["gcc12", "torch"])
def real(request):
    lib = None if request.param == "gcc12" else TORCH_LIB
    r = RealGomp(lib)
    yield request.param, r
    r.close()


def _planned(env, topo, mask, build):
    try:
        p = plan_gomp(env, topo, mask, build)
    except PlanError:
        return {"rc": "refused"}
    warnings = []
    for w in p.warnings:
        if "libgomp: " + w not in warnings:
            warnings.append("libgomp: " + w)
    return {"rc": 0, "nthreads": p.threads, "masks": [format_list(s) for s in p.cpusets],
            "places": [format_list(s) for s in p.places or ()], "init_mask": format_list(p.init_mask),
            "warnings": warnings}


def test_random_settings_on_described_machines(real, tmp_path):
    build, gomp = real
    rng = random.Random(25)
    bad, total = [], 0
    for name, (topo, online, cpuset, files) in _machines(tmp_path).items():
        tree = gomp.tree(name, files or tree_files(topo, online))
        ncpus = max(topo.cpuset) + 1
        usable = sorted(topo.allowed)
        for _ in range(30):
            env = _env(rng, usable, len(usable))
            mask = frozenset(usable) if rng.random() < 0.6 else frozenset(
                rng.sample(usable, rng.randint(1, len(usable))))
            if "GOMP_CPU_AFFINITY" in env:  # the harness cannot refuse the initial thread's own set
                env["GOMP_CPU_AFFINITY"] = f"{min(mask)} " + env["GOMP_CPU_AFFINITY"]
            got = gomp.run(tree, ncpus, env, format_list(mask), format_list(online) if online else None,
                           format_list(cpuset) if cpuset else None)
            want = _planned(env, topo, mask, build)
            total += 1
            if got["rc"] != 0:
                same = want["rc"] == "refused"
            else:
                same = all(got.get(k) == want.get(k) for k in ("nthreads", "masks", "places", "init_mask", "warnings"))
            if not same:
                bad.append((name, env, format_list(mask), {k: got.get(k) for k in want}, want))
    assert total == 270
    assert not bad, f"{len(bad)}/{total} differ; first: " + "\n".join(map(str, bad[:3]))
