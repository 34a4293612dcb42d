"""What ``affinity run``/``apply()`` export, re-planned under libgomp's rules.

For many Intel plans on many described machines (the golden machines, synthetic
ones with SNC and per-CCX caches, taskset masks, ``norespect``), the exported
environment (:func:`affinity.planning.envvars.plan_environment`) is planned with
:func:`~affinity.planning.gnu.plan_gomp` for both libgomp builds: the team size
and every thread's set must be the plan's, and the initial thread's mask at load
must be thread 0's set.
"""

from __future__ import annotations

import itertools

import pytest

from affinity.machine.topology import Topology
from affinity.planning.envvars import plan_environment
from affinity.planning.gnu import plan_gomp
from affinity.planning.envvars import gomp_exports
from affinity.planning.planner import plan
from helpers import golden_dir

SPECS = ["granularity=fine,compact", "granularity=fine,scatter", "granularity=core,compact",
         "granularity=core,scatter", "granularity=socket,compact", "granularity=fine,balanced",
         "compact,1", "scatter,0,1", "granularity=fine,explicit,proclist=[3,1,0,2]",
         "OMP_PLACES=cores OMP_PROC_BIND=spread", "OMP_PLACES=threads OMP_PROC_BIND=close",
         "OMP_PLACES=sockets OMP_PROC_BIND=spread", "granularity=fine,scatter,norespect",
         "granularity=core,compact,norespect"]


def _machines() -> list[Topology]:
    out = [Topology.from_xml(x) for x in sorted((golden_dir() / "hwloc").glob("*.xml"))]
    out.append(Topology.from_synthetic("pack:2 [numa] l3:2 core:4 pu:2"))
    out.append(Topology.from_synthetic("pack:1 l3:4 [numa] core:2 pu:2"))
    return out


def _cases():
    for t in _machines():
        n = len(t.cpuset)
        cpus = sorted(t.cpuset)
        masks = [None, frozenset(cpus[: max(1, n // 2)]), frozenset(cpus[1::2])]
        for spec, mask in itertools.product(SPECS, masks):
            for threads in sorted({1, 2, 3, max(1, n // 2), n, n + 1}):
                yield t, spec, threads, mask


def _plans():
    out = []
    for t, spec, threads, mask in _cases():
        try:
            out.append(plan(spec, threads, t, initial_mask=mask))
        except Exception:  # a spec the machine cannot take (Intel's rules refuse it): not an export case
            continue
    return out


PLANS = _plans()


def test_enough_plans():
    assert len(PLANS) > 1000


@pytest.mark.parametrize("build", ["gcc12", "torch"])
def test_exports_replan_to_the_same_threads_under_libgomp(build):
    bad, inexact = [], 0
    for p in PLANS:
        if not gomp_exports(p)[1]:
            inexact += 1  # a multi-CPU set outside the mask: libgomp cannot be told (see exports.py)
            continue
        env = plan_environment(p)
        g = plan_gomp(env, p.topology, p.initial_mask, build)
        if g.threads != p.threads or g.cpusets != p.cpusets or g.init_mask != p.cpusets[0] or g.warnings:
            bad.append((p.env, sorted(p.initial_mask), env, g.cpusets[:4], p.cpusets[:4], g.warnings))
    assert not bad, f"{len(bad)}/{len(PLANS)} differ, first: {bad[:3]}"
    assert inexact < len(PLANS) // 10


def test_norespect_one_cpu_per_thread_uses_gomp_cpu_affinity():
    t = Topology.from_synthetic("pack:1 core:4 pu:1")
    p = plan("granularity=fine,compact,norespect", 4, t, initial_mask={0})
    env, exact = gomp_exports(p)
    assert exact and "OMP_PLACES" not in env and env["GOMP_CPU_AFFINITY"] == "0 1 2 3"
    g = plan_gomp(plan_environment(p), t, {0})
    assert [sorted(s) for s in g.cpusets] == [[0], [1], [2], [3]]


def test_norespect_with_several_cpus_per_thread_is_not_exact():
    t = Topology.from_synthetic("pack:1 core:4 pu:2")
    p = plan("granularity=core,compact,norespect", 4, t, initial_mask={0, 1})
    env, exact = gomp_exports(p)
    assert not exact and "OMP_PLACES" in env


def test_inherited_variables_that_would_defeat_the_exports_are_refused():
    from affinity.errors import PlanError
    from affinity.planning.envvars import check_inherited

    multi = {"KMP_AFFINITY": "x", "OMP_PLACES": "{0,1},{0}", "OMP_PROC_BIND": "close"}
    with pytest.raises(PlanError, match="GOMP_CPU_AFFINITY='0-3 junk'.*never returns.*unset GOMP_CPU_AFFINITY"):
        check_inherited({"GOMP_CPU_AFFINITY": "0-3 junk"}, multi)
    check_inherited({"GOMP_CPU_AFFINITY": "0-3"}, multi)  # valid numbers: libgomp reads OMP_PLACES first
    check_inherited({"GOMP_CPU_AFFINITY": "0-3 junk"}, {**multi, "GOMP_CPU_AFFINITY": "0 1"})  # replaced
    outside = {"KMP_AFFINITY": "x", "GOMP_CPU_AFFINITY": "0 1", "OMP_PROC_BIND": "close"}
    with pytest.raises(PlanError, match="OMP_PLACES='cores'.*unset OMP_PLACES"):
        check_inherited({"OMP_PLACES": "cores"}, outside)


def test_exports_replan_to_the_same_threads_under_every_other_registered_runtime():
    """Intel's runtime (and any other registered one) reads the same exports to the same sets."""
    from affinity.planning.planner import RUNTIMES, plan_env

    others = [name for name in RUNTIMES if not name.startswith("gnu")]
    assert "intel" in others
    bad = []
    for p in PLANS[::7]:
        env = plan_environment(p)
        for name in others:
            q = plan_env(env, topology=p.topology, initial_mask=p.initial_mask, runtime=name)
            if q.threads != p.threads or q.cpusets != p.cpusets:
                bad.append((name, p.env, sorted(p.initial_mask)))
    assert not bad, f"{len(bad)} differ, first: {bad[:3]}"
