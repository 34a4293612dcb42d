"""The exported environment says what the plan says, thread for thread.

``plan_environment(p)`` is what ``apply()`` and ``affinity run`` give runtimes that
start later.  Read back by the planner (the runtime's rules), each of its languages
-- ``KMP_AFFINITY``, ``OMP_PLACES``+``OMP_PROC_BIND``, ``GOMP_CPU_AFFINITY`` -- must
bind thread ``i`` of a team of ``p.threads`` to ``p.cpusets[i]``.  The real libiomp5
agrees that a ``KMP_AFFINITY`` type keeps one place per hardware thread
(duplicates included), so a translation that drops duplicates (or the team size)
changes the binding; the first test is the case that caught it.
"""

from __future__ import annotations

import pytest

from affinity.machine.topology import Topology
from affinity.planning.envvars import plan_environment, worker_slots
from affinity.planning.planner import plan, plan_env

SMT = Topology.from_synthetic("pack:2 core:2 pu:2")
MACHINES = {
    "smt": SMT,
    "xeon": Topology.from_synthetic("pack:2 [numa] core:4 pu:2(indexes=2*8:1*2)"),
    "knl-ish": Topology.from_synthetic("pack:1 numa:2 core:3 pu:4"),
}
SPECS = ["compact", "scatter", "balanced", "granularity=fine,compact,1,0", "granularity=core,scatter,1",
         "granularity=socket,compact", "explicit,proclist=[{0,1},3,2]", "none", "logical,1",
         "OMP_PLACES=cores OMP_PROC_BIND=spread", "OMP_PLACES=threads(3) OMP_PROC_BIND=close"]


def _languages(env: dict[str, str]) -> dict[str, dict[str, str]]:
    n = {"OMP_NUM_THREADS": env["OMP_NUM_THREADS"]}
    out = {"KMP_AFFINITY": {**n, "KMP_AFFINITY": env["KMP_AFFINITY"]},
           "OMP_PLACES": {**n, "OMP_PLACES": env["OMP_PLACES"], "OMP_PROC_BIND": env["OMP_PROC_BIND"]}}
    if "GOMP_CPU_AFFINITY" in env:
        out["GOMP_CPU_AFFINITY"] = {**n, "GOMP_CPU_AFFINITY": env["GOMP_CPU_AFFINITY"]}
    return out


def test_compact_at_core_granularity_keeps_one_place_per_thread():
    p = plan("compact", topology=SMT)  # granularity=core, 8 threads on 4 cores
    env = plan_environment(p)
    assert env["OMP_NUM_THREADS"] == "8"
    assert env["OMP_PLACES"] == "{0:2},{0:2},{2:2},{2:2},{4:2},{4:2},{6:2},{6:2}"
    assert plan_env(env, topology=SMT).cpusets == p.cpusets
    s = plan("scatter", topology=SMT)  # deduplicated places would put threads 0 and 1 on one core
    assert plan_env(_languages(plan_environment(s))["OMP_PLACES"], topology=SMT).cpusets == s.cpusets


@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("threads", [None, 1, 3, 5])
def test_every_language_reproduces_the_plan(machine, spec, threads):
    topo = MACHINES[machine]
    p = plan(spec, threads=threads, topology=topo)
    env = plan_environment(p)
    assert env["OMP_NUM_THREADS"] == str(p.threads)
    for language, sub in _languages(env).items():
        back = plan_env(sub, topology=topo)
        assert back.threads == p.threads, language
        assert back.cpusets == p.cpusets, (language, sub)
        assert not back.warnings, (language, back.warnings)


def test_a_restricted_mask_is_kept_or_said():
    p = plan("compact", threads=2, topology=SMT, initial_mask={2, 3, 4, 5})
    env = plan_environment(p)
    assert plan_env(env, topology=SMT, initial_mask={2, 3, 4, 5}).cpusets == p.cpusets


def test_tensorflow_pools_are_sized_from_the_plan():
    p = plan("compact", topology=SMT)
    env = plan_environment(p, blocktime=None)
    assert env["TF_NUM_INTRAOP_THREADS"] == str(len(worker_slots(p))) == "4"
    assert env["TF_NUM_INTEROP_THREADS"] == "2"
    assert "KMP_BLOCKTIME" not in env
    assert plan_environment(p, blocktime="0")["KMP_BLOCKTIME"] == "0"
