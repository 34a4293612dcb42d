"""The space: what the tuner accepts, what it refuses (naming the problem), the default
space of a machine, ``--param`` parsing."""

from __future__ import annotations

import pytest

from affinity.machine.topology import Topology
from affinity.errors import SpaceError, TuneUsageError
from affinity.tuning.space import Space, default_space, parse_param


def test_a_space_keeps_its_order_and_drops_duplicates():
    sp = Space.of({"intra": [28, 56, 28], "blocktime": [0, "infinite", "INFINITE"], "batch": [1, 1.0, "1"]})
    assert sp.names == ("intra", "blocktime", "batch")
    assert sp.choices("intra") == (28, 56)
    assert sp.choices("blocktime") == (0, "infinite")
    assert sp.choices("batch") == (1, 1.0, "1")  # different types are different choices
    assert sp.size == 2 * 2 * 3
    cfg = {"intra": 56, "blocktime": "infinite", "batch": "1"}
    assert sp.contains(cfg) and sp.config(sp.key(cfg)) == cfg
    assert not sp.contains({**cfg, "batch": 2}) and not sp.contains({"intra": 56})
    assert len(list(sp.configs())) == sp.size


@pytest.mark.parametrize("space, words", [
    ({}, "empty"),
    ([("intra", [1])], "mapping"),
    ({"intra": []}, "no choices"),
    ({"intra": "1,2"}, "list of choices"),
    ({"intra": 4}, "list of choices"),
    ({"intra": [0, 1]}, "positive integers"),
    ({"instances": [2.5]}, "positive integers"),
    ({"threads": [True]}, "positive integers"),
    ({"blocktime": [-1]}, "'infinite'"),
    ({"blocktime": ["forever"]}, "'infinite'"),
    ({"membind": ["remote"]}, "none, local, interleave"),
    ({"affinity": ["granularity=fine,compactt"]}, "not a KMP_AFFINITY"),
    ({"granularity": ["atom"]}, "granularity"),
    ({"batch": [[1, 2]]}, "cannot be tuned"),
    ({"batch": [object()]}, "cannot be tuned"),
    ({"batch": [float("nan")]}, "cannot be tuned"),
    ({3: [1]}, "names are non-empty strings"),
])
def test_bad_spaces_are_refused_naming_the_problem(space, words):
    with pytest.raises(SpaceError, match=words) as e:
        Space.of(space)
    assert isinstance(e.value, TuneUsageError) and isinstance(e.value, ValueError)


def test_known_names_accept_what_the_launcher_takes():
    sp = Space.of({"affinity": ["none", "compact", "granularity=fine,compact,1,0"], "granularity": ["fine", "core"],
                   "membind": ["none", "local", "interleave"], "blocktime": [0, 1, 200, "infinite"]})
    assert sp.size == 3 * 2 * 3 * 4


@pytest.mark.parametrize("desc, threads, inter, instances, membind", [
    ("package:2 [numa] core:28 pu:2", [7, 8, 14, 28, 56, 112], [1, 2, 4], [1, 2, 4, 7, 8, 14, 28, 56], True),
    ("package:1 [numa] core:16 pu:1", [2, 4, 8, 16], [1, 2], [1, 2, 4, 8, 16], False),
    ("package:1 [numa] core:2 pu:1", [1, 2], [1, 2], [1, 2], False),
])
def test_the_default_space_is_made_of_counts_that_divide_the_machine(desc, threads, inter, instances, membind):
    sp = default_space(Topology.from_synthetic(desc), instances=True)
    assert sp.choices("threads") == tuple(threads)
    assert sp.choices("inter") == tuple(inter)
    assert sp.choices("instances") == tuple(instances)
    assert sp.choices("blocktime") == (0, 1, 200)
    assert ("membind" in sp.names) is membind


def test_param_words():
    assert parse_param("intra=14,28,56") == ("intra", [14, 28, 56])
    assert parse_param("blocktime=0,1,infinite") == ("blocktime", [0, 1, "infinite"])
    assert parse_param("affinity=none,compact,scatter") == ("affinity", ["none", "compact", "scatter"])
    assert parse_param("affinity=granularity=fine,compact,1,0") == ("affinity", ["granularity=fine,compact,1,0"])
    assert parse_param("affinity=granularity=fine,compact,1,0;scatter") == \
        ("affinity", ["granularity=fine,compact,1,0", "scatter"])
    assert parse_param("lr=0.1,1e-3") == ("lr", [0.1, 0.001])
    for bad in ("intra", "=1,2", "intra=1,,2", "intra="):
        with pytest.raises(SpaceError, match="--param"):
            parse_param(bad)


def test_copies_keep_instances_out_of_the_default_space_but_not_the_memory_policy():
    sp = default_space(Topology.from_synthetic("package:2 [numa] core:28 pu:2"))
    assert "instances" not in sp.names and sp.choices("membind") == ("none", "local", "interleave")
    assert "instances" in default_space(Topology.from_synthetic("package:2 [numa] core:28 pu:2"), instances=True).names
