"""The planner's two caches against the uncached computation (hypothesis).

* the read memo (``planner._read``): how a runtime read an environment, per
  ``(runtime, variables, strict)``;
* the topology cache (``planner._memo``): per Topology value, what a runtime's
  rules computed (tables per full mask, initializations, teams).

Whatever order plans are made in, on whichever topologies, a cached plan equals
the plan computed afresh (``_run(..., cached=False)``: a fresh read and a memo
that keeps nothing), warnings, places and settings included; and both caches
stay within their bounds.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affinity.errors import PlanError, SpecError
from affinity.machine.topology import Topology
from affinity.planning import planner

SHAPES = ["package:1 core:4 pu:1", "package:2 core:4 pu:2", "package:2 [numa] core:3 pu:2",
          "package:1 numa:2 core:2 pu:4", "package:4 core:2 pu:1"]
_TOPOS: dict[str, Topology] = {}


def topology(shape: str) -> Topology:
    if shape not in _TOPOS:
        _TOPOS[shape] = Topology.from_synthetic(shape)
    return _TOPOS[shape]


KMP = st.builds(lambda gran, typ, nums: ",".join(x for x in (gran, typ, nums) if x),
                st.sampled_from(["", "granularity=fine", "granularity=core", "granularity=socket",
                                 "granularity=numa_domain", "norespect"]),
                st.sampled_from(["compact", "scatter", "balanced", "logical", "physical", "none", "disabled",
                                 "explicit,proclist=[0,3,{1,2}]", "compakt"]),
                st.sampled_from(["", "1", "0,2", "2,1", "99999999999"]))
ENV = st.fixed_dictionaries({}, optional={
    "KMP_AFFINITY": KMP,
    "OMP_NUM_THREADS": st.sampled_from(["1", "2", "3", "5", "8", "17", "4,2", "abc"]),
    "OMP_PLACES": st.sampled_from(["threads", "cores", "sockets", "numa_domains", "cores(2)", "{0:2},{4:2}",
                                   "{0}:3:2", "!{0}", "{0,1"]),
    "OMP_PROC_BIND": st.sampled_from(["close", "spread", "primary", "true", "false", "spread,close"]),
    "KMP_HW_SUBSET": st.sampled_from(["1s", "2c,1t", "1s,1c", "1n", "2c@1"]),
})
PLANS = st.lists(st.tuples(st.sampled_from(SHAPES), ENV, st.sampled_from(sorted(planner.RUNTIMES)),
                           st.booleans(), st.sampled_from([None, "0-3", "1,2", "0"])), min_size=1, max_size=6)


def _outcome(cached: bool, shape: str, env: dict[str, str], runtime: str, strict: bool, mask: Any) -> Any:
    rules = planner.RUNTIMES[runtime]
    try:
        p = planner._run(planner._env_items(env, rules.VARIABLES), topology(shape), mask, strict, rules,
                         cached=cached)
    except (PlanError, SpecError) as e:
        return type(e).__name__, str(e)
    return p, p.warnings, p.places, p.settings, p.explain()


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(PLANS)
def test_cached_plans_equal_the_uncached_computation(plans: list[tuple[Any, ...]]) -> None:
    for shape, env, runtime, strict, mask in plans:
        fresh = _outcome(False, shape, env, runtime, strict, mask)
        assert _outcome(True, shape, env, runtime, strict, mask) == fresh
        assert _outcome(True, shape, env, runtime, strict, mask) == fresh  # a hit now


@settings(max_examples=100, deadline=None, derandomize=True)
@given(ENV, st.sampled_from(sorted(planner.RUNTIMES)), st.booleans())
def test_the_read_memo_equals_a_fresh_read(env: dict[str, str], runtime: str, strict: bool) -> None:
    rules = planner.RUNTIMES[runtime]
    items = planner._env_items(env, rules.VARIABLES)
    try:
        fresh = rules.read(items, strict=strict)
    except (PlanError, SpecError) as e:
        with pytest.raises(type(e)):
            planner._read(runtime, items, strict)
        return
    assert planner._read(runtime, items, strict) == fresh
    assert planner._read(runtime, items, strict) == fresh


def test_the_caches_are_bounded() -> None:
    assert planner._read.cache_info().maxsize == planner._MAX_READS
    topo = topology("package:2 core:4 pu:2")
    for n in range(1, 40):
        for mask in ("0-7", "0-15", "1-14", "2,3"):
            planner.plan("granularity=fine,compact", n, topo, initial_mask=mask)
            planner.plan("granularity=fine,balanced", n, topo, initial_mask=mask)
    entry = planner._BASES[id(topo)]
    assert 0 < len(entry[1]) <= planner._MAX_ENTRIES
    many = [Topology.from_synthetic("package:1 core:2 pu:1") for _ in range(planner._MAX_TOPOLOGIES + 5)]
    for t in many:
        planner.plan("compact", 1, t)
    assert len(planner._BASES) <= planner._MAX_TOPOLOGIES
    del many  # the weak references drop the entries of collected topologies
    import gc

    gc.collect()
    assert all(ref() is not None for ref, _store in planner._BASES.values())


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.integers(min_value=0, max_value=40000), min_size=1, max_size=20))
def test_interned_singletons_are_the_singletons(procs: list[int]) -> None:
    """The masks of thread granularity are interned ``{o}`` (bounded: ids past
    the bound are made anew), equal to the sets made afresh."""
    from affinity.planning.intel import runtime as intel

    for o in procs:
        assert intel._singleton(o) == frozenset({o})
        if o < intel._SINGLETONS_MAX:
            assert intel._singleton(o) is intel._singleton(o)
    assert len(intel._SINGLETONS) <= intel._SINGLETONS_MAX
