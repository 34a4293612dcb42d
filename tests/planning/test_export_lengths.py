"""What a plan exports must be read back as the plan by every runtime, whatever the
machine's size (found by a fuzz of the exports against the real runtimes).

libiomp5 reads no ``NAME=VALUE`` longer than 4096 bytes: an explicit proclist that
writes out every CPU of every thread (``granularity=socket`` on 2 x 28 cores: 4,572
characters; ``KMP_AFFINITY=none`` on 2 x 16 x 2: 5,924) was ignored (Warning #65,
hidden by the exported ``KMP_WARNINGS=0``), and with ``OMP_PLACES`` too long as well
the runtime bound one CPU per thread; past 128 KiB (``none`` on 384 PUs: 274,212
characters) ``execve`` failed and ``affinity run`` exited 126.  Measured with the
real libiomp5 2026.2, libomp 19 and both libgomp builds on the audit's machines: the
exports below bind as planned.  Here the planner (exact on the golden data) reads
them back."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from affinity.machine.topology import Topology
from affinity.planning.envvars import export
from affinity.planning.intel.limits import fits_env
from affinity.planning.envvars import _compact_places
from affinity.planning.planner import plan_env

READ = ("KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "OMP_NUM_THREADS")
CASES = [  # (machine, settings, process mask): each exported once too long for libiomp5
    ("pack:2 core:28 pu:1", {"KMP_AFFINITY": "granularity=socket,scatter", "OMP_NUM_THREADS": "56"}, None),
    ("pack:2 core:32 pu:2", {"OMP_PROC_BIND": "false", "OMP_NUM_THREADS": "64"}, "0-63:2"),
    ("pack:2 core:16 pu:2", {"KMP_AFFINITY": "none"}, None),
    ("pack:2 core:96 pu:2", {"KMP_AFFINITY": "disabled"}, None),
    ("pack:2 core:32 pu:1(indexes=64:2*32)", {"KMP_AFFINITY": "granularity=socket,scatter", "OMP_NUM_THREADS": "64"},
     None),
    ("pack:8 core:256 pu:1", {"KMP_AFFINITY": "granularity=fine,compact", "OMP_NUM_THREADS": "2048"}, None),
    ("pack:2 core:64 pu:2", {"KMP_AFFINITY": "granularity=fine,scatter", "OMP_NUM_THREADS": "256"}, None),
]


@pytest.mark.parametrize("machine,settings,mask", CASES)
def test_every_runtime_reads_the_export_back_as_the_plan(machine, settings, mask):
    topo = Topology.from_synthetic(machine)
    p = plan_env(settings, topology=topo, initial_mask=mask)
    naive = len(p.to_kmp_affinity())
    env, problems = export(p)
    assert problems == []
    assert fits_env("KMP_AFFINITY", env["KMP_AFFINITY"]) and fits_env("OMP_PLACES", env["OMP_PLACES"])
    assert all(len(v) < 131072 for v in env.values())  # one environment string: the kernel's limit
    for runtime in ("intel", "llvm", "gnu", "gnu-torch"):
        back = plan_env({k: v for k, v in env.items() if k in READ}, topology=topo, initial_mask=mask,
                        runtime=runtime)
        assert back.cpusets == p.cpusets, (runtime, env["KMP_AFFINITY"][:80], env["OMP_PLACES"][:80])
    if not fits_env("KMP_AFFINITY", "x" * naive):  # the explicit proclist was too long: a short form
        single = all(len(s) == 1 for s in p.cpusets)  # one CPU each: ranges; else OMP_PLACES decides
        assert env["KMP_AFFINITY"] == ("granularity=fine,proclist=[0-2047],explicit" if single
                                       else "granularity=fine"), env["KMP_AFFINITY"][:80]


def test_short_exports_stay_as_they_were():
    topo = Topology.from_synthetic("pack:2 core:4 pu:2")
    p = plan_env({"KMP_AFFINITY": "granularity=core,compact", "OMP_NUM_THREADS": "4"}, topology=topo)
    env, problems = export(p)
    assert env["KMP_AFFINITY"] == p.to_kmp_affinity() == \
        "granularity=fine,proclist=[{0,1},{0,1},{2,3},{2,3}],explicit"
    assert env["OMP_PLACES"] == p.to_omp_places() == "{0:2},{0:2},{2:2},{2:2}" and problems == []


def test_compact_places_say_the_same_places():
    rng = random.Random(7)
    topo = Topology.from_synthetic("pack:1 core:64 pu:1")
    for _ in range(200):
        sets = []
        for _ in range(rng.randint(1, 12)):
            kind = rng.random()
            if kind < 0.3 and sets:  # a repeat or a shifted copy of the one before
                shift = rng.choice([0, 1, 2, 4])
                sets.append(frozenset(c + shift for c in sets[-1] if c + shift < 64) or sets[-1])
            elif kind < 0.6:
                a, step = rng.randrange(32), rng.choice([1, 2, 3])
                sets.append(frozenset(range(a, min(64, a + step * rng.randint(1, 8)), step)))
            else:
                sets.append(frozenset(rng.sample(range(64), rng.randint(1, 5))))
        text = _compact_places(sets)
        back = plan_env({"OMP_PLACES": text, "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": str(len(sets))},
                        topology=topo, runtime="gnu")
        assert back.cpusets == tuple(sets), text


def test_what_no_runtime_can_be_told_is_said():
    # libgomp cuts each place to the process mask: a norespect plan's two-CPU set on a one-CPU mask
    topo = Topology.from_synthetic("pack:1 core:2 pu:2")
    p = plan_env({"KMP_AFFINITY": "norespect,granularity=core,compact", "OMP_NUM_THREADS": "2"}, topology=topo,
                 initial_mask={0})
    env, problems = export(p)
    assert problems == ["libgomp cuts every place to the process mask (0): a thread whose set lies partly outside "
                        "it (the plan binds outside the mask: norespect) gets only the part inside; Intel's and "
                        "LLVM's runtimes follow the plan"]
    # sets no short form says: random pairs of CPUs, read from an OMP_PLACES of libgomp's
    big = Topology.from_synthetic("pack:1 core:2048 pu:1")
    rng = random.Random(3)
    places = ",".join("{%d,%d}" % tuple(rng.sample(range(2048), 2)) for _ in range(600))
    p = plan_env({"OMP_PLACES": places, "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": "600"}, topology=big,
                 runtime="gnu")
    env, problems = export(p)
    assert len(problems) == 1 and problems[0].startswith(
        f"the plan needs a KMP_AFFINITY of {len(env['KMP_AFFINITY'])} characters, longer than Intel's runtime reads")


def test_affinity_run_warns_where_libgomp_cannot_be_told():
    r = subprocess.run([sys.executable, "-m", "affinity", "run", "-C", "0", "norespect,granularity=core,compact",
                        "-t", "2", "--dry-run", "--topology", "synthetic:pack:1 core:2 pu:2", "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "affinity run: warning: libgomp cuts every place to the process mask (0)" in r.stderr


def test_gomp_translation_of_single_cpus_outside_the_mask():
    """``translation_env("gomp")`` refused every plan outside the process mask, though
    libgomp binds GOMP_CPU_AFFINITY's CPUs as they are (the fuzz: 1,122 runs of both
    builds, all as planned) -- up to the CPU sets it sizes for the mask."""
    t = Topology.from_synthetic("pack:1 core:4 pu:2")
    p = plan_env({"KMP_AFFINITY": "norespect,granularity=fine,proclist=[1,5],explicit", "OMP_NUM_THREADS": "2"},
                 topology=t, initial_mask={0})
    env = p.translation_env("gomp")
    assert env == {"GOMP_CPU_AFFINITY": "1 5", "OMP_NUM_THREADS": "2"}
    for runtime in ("gnu", "gnu-torch"):
        assert plan_env(env, topology=t, initial_mask={0}, runtime=runtime).cpusets == p.cpusets
    far = plan_env({"KMP_AFFINITY": "norespect,granularity=fine,proclist=[100],explicit", "OMP_NUM_THREADS": "1"},
                   topology=Topology.from_synthetic("pack:1 core:128 pu:1"), initial_mask={0})
    from affinity.errors import PlanError

    with pytest.raises(PlanError, match="cannot name CPU 100: libgomp sizes its CPU sets for the process mask's "
                                        "highest CPU and drops CPUs from 64 on"):
        far.translation_env("gomp")


def test_kmp_affinity_alone_says_the_plan_or_refuses():
    """``translation_env("kmp_affinity")`` handed out a KMP_AFFINITY libiomp5 ignores
    (Warning #65: every thread on every CPU) once its proclist passed 4096 bytes."""
    from affinity.errors import PlanError

    one = plan_env({"KMP_AFFINITY": "granularity=fine,compact", "OMP_NUM_THREADS": "2048"},
                   topology=Topology.from_synthetic("pack:8 core:256 pu:1"))
    assert one.to_kmp_affinity() == "granularity=fine,proclist=[0-2047],explicit"  # one CPU a thread: ranges
    env = one.translation_env("kmp_affinity")
    assert plan_env(env, topology=one.topology).cpusets == one.cpusets
    wide = plan_env({"KMP_AFFINITY": "granularity=socket,scatter", "OMP_NUM_THREADS": "56"},
                    topology=Topology.from_synthetic("pack:2 core:28 pu:1"))
    with pytest.raises(PlanError, match=r"KMP_AFFINITY alone cannot say this plan: its proclist takes 45\d\d "
                                        r"characters, and libiomp5 reads no variable longer than 4096 bytes; use "
                                        r"translation_env\('omp_places'\)"):
        wide.translation_env("kmp_affinity")
    back = plan_env(wide.translation_env("omp_places"), topology=wide.topology)
    assert back.cpusets == wide.cpusets
