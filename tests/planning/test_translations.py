"""Translations of a plan to other affinity interfaces, checked by planning
them again.

What each target can express:

* ``KMP_AFFINITY`` (explicit proclist, ``granularity=fine``, plus
  ``norespect`` when a set leaves the process mask) and ``OMP_PLACES`` (one
  place per thread, ``OMP_PROC_BIND=close``): any plan -- every thread's set,
  in order, with ``OMP_NUM_THREADS`` fixing the team size;
* ``GOMP_CPU_AFFINITY``: only plans where every thread has a single CPU
  (libgomp binds thread ``i`` to the ``i``-th CPU of the list);
* ``taskset -c`` / ``numactl --physcpubind``: one mask for the whole process,
  the union of the threads' sets; the plan round-trips only when every thread
  already has that same set (``none``, ``disabled``, or one place).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from affinity.cpulist import parse_list
from affinity.errors import PlanError
from affinity.planning.planner import Plan, plan, plan_env
from affinity.machine.topology import Topology
from helpers import golden_dir

GOLDEN = golden_dir()


def _topology(name: str) -> Topology:
    return Topology.from_cpuinfo(GOLDEN / "cpuinfo" / f"{name}.cpuinfo",
                                 numa_nodes=GOLDEN / "fakesys" / name / "node")


def _golden_plans(name: str, limit: int | None = None) -> list[Plan]:
    topo = _topology(name)
    with open(GOLDEN / f"{name}.json") as f:
        cases = json.load(f)["cases"]
    out = []
    for c in cases[:limit]:
        try:
            out.append(plan_env(c["env"], topology=topo, initial_mask=c.get("initial_mask")))
        except PlanError:
            continue
    return out


PLANS = _golden_plans("2s4c2t_linux") + _golden_plans("doc_2s4c2t_interleaved", 400)


def _replan(p: Plan, env: dict[str, str]) -> Plan:
    return plan_env(env, topology=p.topology, initial_mask=p.initial_mask)


@pytest.mark.parametrize("target", ["kmp_affinity", "omp_places"])
def test_round_trip_every_plan(target: str) -> None:
    assert len(PLANS) > 1000
    for p in PLANS:
        env = p.translation_env(target)
        q = _replan(p, env)
        assert q.cpusets == p.cpusets, (p.env, p.initial_mask, env)
        assert q.warnings == (), (p.env, env, q.warnings)


def test_kmp_affinity_form() -> None:
    t = _topology("2s4c2t_linux")
    p = plan("granularity=core,scatter", 3, t)
    assert p.to_kmp_affinity() == "granularity=fine,proclist=[{0,8},{4,12},{1,9}],explicit"
    assert p.translation_env("kmp_affinity") == {"KMP_AFFINITY": p.to_kmp_affinity(), "OMP_NUM_THREADS": "3"}
    # sets outside the process mask need norespect
    q = plan_env({"KMP_AFFINITY": "norespect,granularity=fine,compact", "OMP_NUM_THREADS": "2"}, topology=t,
                 initial_mask="4-7")
    assert q.to_kmp_affinity().startswith("norespect,")
    assert _replan(q, q.translation_env("kmp_affinity")).cpusets == q.cpusets


def test_omp_places_form() -> None:
    t = _topology("2s4c2t_linux")
    p = plan("OMP_PLACES=sockets", 2, t)
    assert p.to_omp_places() == "{0:4,8:4},{4:4,12:4}"
    assert p.translation_env("omp_places") == {"OMP_PLACES": "{0:4,8:4},{4:4,12:4}", "OMP_PROC_BIND": "close",
                                               "OMP_NUM_THREADS": "2"}


def test_gomp_cpu_affinity() -> None:
    t = _topology("2s4c2t_linux")
    p = plan("granularity=fine,scatter", 6, t)
    assert p.to_gomp_cpu_affinity() == "0 4 1 5 2 6"
    q = _replan(p, p.translation_env("gomp"))
    assert q.cpusets == p.cpusets
    outside = 0
    for r in PLANS:
        if all(len(s) == 1 for s in r.cpusets) and r.union <= r.initial_mask:
            assert _replan(r, r.translation_env("gomp")).cpusets == r.cpusets
        elif all(len(s) == 1 for s in r.cpusets):  # libgomp binds GOMP_CPU_AFFINITY's CPUs outside the mask too
            env = r.translation_env("gomp")
            for runtime in ("gnu", "gnu-torch"):
                assert plan_env(env, topology=r.topology, initial_mask=r.initial_mask,
                                runtime=runtime).cpusets == r.cpusets
            outside += 1
        else:
            with pytest.raises(PlanError):
                r.translation_env("gomp")
    assert outside > 0


def test_taskset_numactl_give_the_union() -> None:
    t = _topology("2s4c2t_linux")
    p = plan("granularity=fine,compact", 4, t)
    assert p.to_taskset() == "0-1,8-9"
    assert p.to_numactl() == "--physcpubind=0-1,8-9"
    # as a process mask the union is all a thread gets: only shared-set plans survive
    q = plan_env({"KMP_AFFINITY": "none", "OMP_NUM_THREADS": "4"}, topology=t,
                 initial_mask=parse_list(p.to_taskset()))
    assert q.cpusets != p.cpusets and set(q.cpusets) == {p.union}
    for r in PLANS:
        if len(set(r.cpusets)) == 1:
            back = plan_env({"KMP_AFFINITY": "disabled", "OMP_NUM_THREADS": str(r.threads)}, topology=r.topology,
                            initial_mask=parse_list(r.to_taskset()))
            assert back.cpusets == r.cpusets


def test_unknown_target() -> None:
    p = plan("compact", 2, _topology("1s4c1t"))
    with pytest.raises(ValueError):
        p.translation_env("likwid")


def _all_translations(p: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {"kmp_affinity": p.to_kmp_affinity(), "omp_places": p.to_omp_places(),
                           "taskset": p.to_taskset(), "numactl": p.to_numactl()}
    try:
        out["gomp"] = p.to_gomp_cpu_affinity()
    except PlanError:
        out["gomp"] = None
    return out


def test_translations_are_strings() -> None:
    for p in PLANS[:50]:
        for k, v in _all_translations(p).items():
            assert v is None or (isinstance(v, str) and v), k
