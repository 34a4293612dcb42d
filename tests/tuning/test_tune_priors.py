"""What the machine says before anything is measured: the seeds' rules snapped to the
space, the prior's preferences, and which configurations launch the same thing."""

from __future__ import annotations

import pytest

from affinity.machine.topology import Topology
from affinity.tuning.priors import COMPONENTS, INFEASIBLE, Priors, affinity_spec
from affinity.tuning.space import Space

XEON = "package:2 [numa] core:28 pu:2"
FLAT16 = "package:1 [numa] core:16 pu:1"


def priors(space, desc):
    return Priors(Space.of(space), Topology.from_synthetic(desc))


def test_the_tensorflow_rules_on_a_two_socket_xeon():
    """intra = physical cores, inter = packages, OMP = intra, KMP_BLOCKTIME 1, and the
    affinity that gives each thread its own core (compact would fill hyper-threads)."""
    p = priors({"intra": [7, 14, 28, 56, 112], "inter": [1, 2, 4], "omp": [14, 28, 56, 112],
                "blocktime": [0, 1, 200], "affinity": ["compact", "scatter"]}, XEON)
    assert p.seeds() == [{"intra": 56, "inter": 2, "omp": 56, "blocktime": 1, "affinity": "scatter"}]
    cfg = p.seeds()[0]
    assert p.score({**cfg, "affinity": "compact"}) < p.score(cfg) - 0.3  # doubled on cores, half idle


def test_seeds_snap_to_the_space():
    p = priors({"intra": [10, 20, 40], "inter": [3], "omp": [12, 24], "blocktime": [30, 200]}, XEON)
    assert p.seeds() == [{"intra": 40, "inter": 3, "omp": 24, "blocktime": 30}]


def test_instances_times_threads_equals_the_cores():
    p = priors({"instances": [1, 2, 4, 8, 16], "threads": [1, 2, 4, 8, 16], "membind": ["none", "local"]}, FLAT16)
    (seed,) = p.seeds()
    assert seed["instances"] * seed["threads"] == 16
    assert seed["membind"] == "local"
    ridge = [{"instances": k, "threads": 16 // k, "membind": "local"} for k in (1, 2, 4, 8, 16)]
    off = [{"instances": 2, "threads": 16, "membind": "local"}, {"instances": 1, "threads": 4, "membind": "local"}]
    assert min(p.score(c) for c in ridge) > max(p.score(c) for c in off)


def test_oversubscription_is_rarely_best():
    p = priors({"instances": [1, 2, 4], "threads": [8, 16, 32, 64]}, FLAT16)
    fits = p.score({"instances": 1, "threads": 16})
    assert p.score({"instances": 2, "threads": 16}) < fits - 1.0
    assert p.score({"instances": 1, "threads": 64}) < p.score({"instances": 1, "threads": 32}) < fits


def test_counts_that_do_not_divide_the_cores_rarely_win():
    p = priors({"threads": [12, 14, 16]}, "package:1 [numa] core:28 pu:1")
    assert p.score({"threads": 14}) > p.score({"threads": 12})


def test_components_and_infeasible_layouts():
    p = priors({"instances": [1, 32]}, FLAT16)
    assert len(p.components({"instances": 1})) == len(COMPONENTS)
    assert p.components({"instances": 32})[0] == INFEASIBLE  # 32 disjoint shares of 16 PUs


def test_twins_launch_the_same_thing():
    """On one package without SMT, compact and scatter place a full team alike, and
    every memory policy is local with one NUMA node; with SMT they differ."""
    space = {"affinity": ["compact", "scatter"], "granularity": ["fine", "core"], "threads": [16],
             "membind": ["none", "local", "interleave"]}
    flat = priors(space, FLAT16)
    twins = {flat.twin(c) for c in flat.space.configs()}
    assert len(twins) == 1
    smt = priors({"affinity": ["compact", "scatter"], "threads": [4]}, "package:1 [numa] core:4 pu:2")
    assert smt.twin({"affinity": "compact", "threads": 4}) != smt.twin({"affinity": "scatter", "threads": 4})
    other = priors({"affinity": ["compact", "scatter"], "batch": [1, 2]}, FLAT16)
    assert other.twin({"affinity": "compact", "batch": 1}) != other.twin({"affinity": "compact", "batch": 2})


@pytest.mark.parametrize("cfg, spec", [
    ({"affinity": "compact"}, "compact"),
    ({"affinity": "scatter", "granularity": "fine"}, "granularity=fine,scatter"),
    ({"affinity": "none", "granularity": "fine"}, "none"),
    ({"affinity": "granularity=core,balanced", "granularity": "fine"}, "granularity=core,balanced"),
    ({"granularity": "core"}, "granularity=core,compact,1,0"),
    ({"threads": 4}, None),
])
def test_affinity_spec(cfg, spec):
    assert affinity_spec(cfg) == spec
