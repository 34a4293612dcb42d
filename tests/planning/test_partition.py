"""``partition`` with ``cores_per_share`` (``affinity run --cores-per-instance C``)
on described machines, and shares on hybrid machines (cores of several kinds):
a pure function of the topology, checked on machines we do not have."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affinity.errors import PlanError
from affinity.launcher.build import Context, build_launch
from affinity.launcher.options import RunOptions
from affinity.machine.topology import Topology
from affinity.planning.launchers import LocalRank
from affinity.planning.partition import kinds_note, partition, rank_kinds_note
from affinity.record import replace
from affinity.tools.ranks_report import plan_ranks

XEON = "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"  # 2 x 28 x 2, siblings i and i+56
EPYC = "pack:2 group:4 [numa] l3:2 core:8 pu:2(indexes=2*128:1*2)"  # NPS4: 8 nodes x 16 cores, L3 per 8 cores
KNL = "pack:1 group:4 [numa] [numa] core:17 pu:4(indexes=4*68:1*4)"  # SNC-4 flat: DDR + MCDRAM per quadrant


def cpus(*ranges: tuple[int, int]) -> frozenset[int]:
    return frozenset(c for a, b in ranges for c in range(a, b + 1))


def packages(t: Topology, share) -> set[int]:
    return {t.pu(p).package for p in share.cpus}


def llcs(t: Topology, share) -> set[int]:
    return {c.logical_index for c in t.llcs if c.cpuset & share.cpus}


def check_exact(t: Topology, shares, count: int, c: int) -> None:
    """``count`` disjoint shares of exactly ``c`` whole cores."""
    assert len(shares) == count
    cores = [i for s in shares for i in s.cores]
    assert len(cores) == len(set(cores)) == count * c
    assert all(len(s.cores) == c for s in shares)
    for s in shares:
        assert s.cpus == frozenset().union(*(t.cores[i].cpuset for i in s.cores)) & t.allowed


# --------------------------------------------------------- --cores-per-instance

def test_xeon_a_share_spans_nodes_only_when_no_node_has_c_free_cores():
    # the audit's case: 3 x 18 on 2 x 28 gave 18-35 (10 cores of node 0, 8 of node 1) to instance 1
    t = Topology.from_synthetic(XEON)
    three = partition(t, 3, 18)
    check_exact(t, three, 3, 18)
    assert [s.cpus for s in three] == [cpus((0, 17), (56, 73)), cpus((28, 45), (84, 101)),
                                       cpus((18, 27), (74, 83), (46, 53), (102, 109))]
    assert [s.numa_nodes for s in three] == [{0}, {1}, {0, 1}]
    # C not dividing a node: 2 shares of 11 per node, the fifth from both nodes' 6 left
    five = partition(t, 5, 11)
    check_exact(t, five, 5, 11)
    assert [s.numa_nodes for s in five] == [{0}, {0}, {1}, {1}, {0, 1}]
    # C larger than a node: one share over both
    (big,) = partition(t, 1, 40)
    assert big.numa_nodes == {0, 1} and big.cpus >= cpus((0, 27))


def test_epyc_nps4_shares_stay_in_a_node_and_spanning_ones_in_a_package():
    # the audit's case: 10 x 12 gave 6 shares over two nodes, one across the packages
    t = Topology.from_synthetic(EPYC)
    ten = partition(t, 10, 12)
    check_exact(t, ten, 10, 12)
    assert [s.numa_nodes for s in ten[:8]] == [{n} for n in range(8)]
    assert [s.numa_nodes for s in ten[8:]] == [{0, 1, 2}, {4, 5, 6}]  # the 4 left in 3 nodes, one package each
    assert all(len(packages(t, s)) == 1 for s in ten)
    # each in-node share holds one whole L3 and 4 cores of the node's other one
    assert ten[0].cpus == cpus((0, 11), (128, 139)) and all(len(llcs(t, s)) == 2 for s in ten[:8])
    # C larger than a node: the shares span nodes, never the packages
    two = partition(t, 2, 20)
    assert [s.numa_nodes for s in two] == [{0, 1}, {4, 5}] and all(len(packages(t, s)) == 1 for s in two)


def test_epyc_shares_keep_to_one_l3_where_it_costs_nothing():
    t = Topology.from_synthetic(EPYC)
    sixteen = partition(t, 16, 4)
    # two shares a node, one per L3 (before: both in the node's first L3)
    assert all(len(llcs(t, s)) == 1 for s in sixteen)
    assert len({min(llcs(t, s)) for s in sixteen}) == 16
    assert [s.numa_nodes for s in sixteen] == [{n} for n in range(8) for _ in range(2)]
    # 3 shares of 5 a node: an L3 holds one, so one share per node straddles the two L3s
    shares = partition(t, 24, 5)
    check_exact(t, shares, 24, 5)
    assert all(len(s.numa_nodes) == 1 for s in shares)
    assert sum(len(llcs(t, s)) > 1 for s in shares) == 8


def test_knl_quadrants():
    t = Topology.from_synthetic(KNL)
    four = partition(t, 4, 17)  # K * C == every core: a quadrant each
    check_exact(t, four, 4, 17)
    assert len({min(s.numa_nodes) for s in four}) == 4 and all(len(s.numa_nodes) == 1 for s in four)
    assert all(len(s.cpus) == 68 for s in four)  # four siblings per core
    five = partition(t, 5, 13)  # one per quadrant, the fifth from the 4 cores each has left
    check_exact(t, five, 5, 13)
    assert [len(s.numa_nodes) for s in five] == [1, 1, 1, 1, 4]
    three = partition(t, 3, 20)  # larger than a quadrant: each spans two
    check_exact(t, three, 3, 20)
    assert [len(s.numa_nodes) for s in three] == [2, 2, 2]


@pytest.mark.parametrize("desc,count,c", [(XEON, 2, 28), (XEON, 8, 7), (XEON, 56, 1), (XEON, 7, 8),
                                          (EPYC, 8, 16), (EPYC, 2, 64), (KNL, 68, 1)])
def test_every_core_used(desc, count, c):
    t = Topology.from_synthetic(desc)
    shares = partition(t, count, c)
    check_exact(t, shares, count, c)
    assert frozenset().union(*(s.cpus for s in shares)) == t.cpuset
    nodes = [sum(1 for core in t.cores if t.pu(min(core.cpuset)).numa == n.logical_index) for n in t.numa_nodes]
    in_node = min(count, sum(n // c for n in nodes))
    assert sum(len(s.numa_nodes) == 1 for s in shares) == in_node
    assert partition(t, count, c) == shares  # deterministic


def test_too_many_cores_is_an_error():
    t = Topology.from_synthetic(EPYC)
    with pytest.raises(PlanError, match="11 shares of 12 cores need 132 cores, but only 128 are allowed"):
        partition(t, 11, 12)
    with pytest.raises(PlanError, match="cores per share must be >= 1, got 0"):
        partition(t, 2, 0)


SHAPES = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 2))


@settings(max_examples=80, deadline=None)
@given(shape=SHAPES, data=st.data())
def test_fixed_shares_properties(shape, data):
    """Exactly C cores each, disjoint; as many shares inside one node as the nodes
    hold; as many inside one package as the packages hold; shares inside a node first."""
    packs, nodes, l3s, cores, pus = shape
    t = Topology.from_synthetic(f"pack:{packs} group:{nodes} [numa] l3:{l3s} core:{cores} pu:{pus}")
    if data.draw(st.booleans()):
        t = t.with_allowed(data.draw(st.sets(st.sampled_from(sorted(t.cpuset)), min_size=1)))
    used = [c for c in t.cores if c.cpuset & t.allowed]
    c = data.draw(st.integers(1, len(used)))
    count = data.draw(st.integers(1, len(used) // c))
    shares = partition(t, count, c)
    check_exact(t, shares, count, c)
    per_node: dict[int, int] = {}
    per_pack: dict[int, int] = {}
    for core in used:
        pu = t.pu(min(core.cpuset & t.allowed))
        per_node[pu.numa] = per_node.get(pu.numa, 0) + 1
        per_pack[pu.package] = per_pack.get(pu.package, 0) + 1
    inside = [len(s.numa_nodes) == 1 for s in shares]
    assert sum(inside) == min(count, sum(n // c for n in per_node.values()))
    assert inside == sorted(inside, reverse=True)
    assert sum(len(packages(t, s)) == 1 for s in shares) == min(count, sum(n // c for n in per_pack.values()))


# ---------------------------------------------------------------- hybrid machines

def hybrid(p: int, e: int) -> Topology:
    """One package: ``p`` P-cores with 2 threads, then ``e`` E-cores with one
    (an Alder Lake-like machine, kinds as hwloc's cpukinds give them)."""
    t = Topology.from_synthetic(f"pack:1 [numa] core:{p + e} pu:2")
    cores = tuple(replace(c, kind="IntelCore" if c.logical_index < p else "IntelAtom",
                          efficiency=1 if c.logical_index < p else 0) for c in t.cores)
    allowed = frozenset(x for c in cores for x in (c.cpuset if c.efficiency else {min(c.cpuset)}))
    return replace(t, cores=cores, allowed=allowed, source=f"hybrid {p}P+{e}E")


def kinds(t: Topology, share) -> list[str]:
    return sorted({t.cores[i].kind for i in share.cores})


def test_hybrid_split_keeps_kinds_apart_when_equal_sizes_allow():
    t = hybrid(6, 8)
    four = partition(t, 4)  # 14 cores: two of 4 and two of 3, the 3s on the 6 P-cores
    assert [len(s.cores) for s in four] == [3, 3, 4, 4]
    assert [kinds(t, s) for s in four] == [["IntelCore"]] * 2 + [["IntelAtom"]] * 2
    assert kinds_note(t, four) == ("core kinds differ: the shares: shares 0-1: 3 IntelCore cores, "
                                   "shares 2-3: 4 IntelAtom cores: the shares do not run at the same speed")
    # the same machine without kinds keeps the plain order (larger shares first)
    plain = Topology.from_synthetic("pack:1 [numa] core:14 pu:2").with_allowed(t.allowed)
    assert [len(s.cores) for s in partition(plain, 4)] == [4, 4, 3, 3]
    assert kinds_note(plain, partition(plain, 4)) is None


def test_hybrid_split_that_must_mix_kinds_says_so():
    # the audit's machine: 8 P-cores x 2 + 16 E-cores, 2 ranks of 12 cores: one gets 8 P + 4 E
    t = hybrid(8, 16)
    a, b = partition(t, 2)
    assert len(a.cores) == len(b.cores) == 12 and kinds(t, a) == ["IntelAtom", "IntelCore"]
    note = kinds_note(t, (a, b), noun="instance")
    assert note == ("core kinds differ: the instances' shares: instance 0: 8 IntelCore + 4 IntelAtom cores, "
                    "instance 1: 12 IntelAtom cores: a team on cores of several kinds runs at the pace of its "
                    "slower ones and the instances do not run at the same speed; no split into 2 shares of "
                    "balanced size keeps the kinds apart here; 3 shares would")
    assert [kinds(t, s) for s in partition(t, 3)] == [["IntelCore"], ["IntelAtom"], ["IntelAtom"]]
    assert kinds_note(t, partition(t, 5)).endswith("; 3 or 6 shares would")
    # E-cores only (a mask): one kind, nothing to say
    e_only = t.with_allowed(frozenset(range(16, 32)))
    assert kinds_note(e_only, partition(e_only, 2)) is None


def test_hybrid_fixed_shares_fill_the_faster_kind_first_and_do_not_mix():
    t = hybrid(8, 16)
    shares = partition(t, 3, 6)
    check_exact(t, shares, 3, 6)
    assert [kinds(t, s) for s in shares] == [["IntelCore"], ["IntelAtom"], ["IntelAtom"]]
    assert [kinds(t, s) for s in partition(t, 4, 4)] == [["IntelCore"]] * 2 + [["IntelAtom"]] * 2
    mixed = partition(t, 2, 12)  # 12 cores: one share has to take E-cores with the 8 P-cores
    check_exact(t, mixed, 2, 12)
    assert "a team on cores of several kinds" in kinds_note(t, mixed, 12)
    assert "would" not in kinds_note(t, mixed, 12)  # no share count to offer for a fixed size


def test_hybrid_rank_note_is_the_ranks_own():
    t = hybrid(8, 16)
    shares = partition(t, 2)
    note = rank_kinds_note(t, LocalRank(1, 2, "Open MPI", "test"), shares[1])
    assert note.startswith("core kinds differ: this rank's share: 12 IntelAtom cores; the other ranks' shares: "
                           "rank 0: 8 IntelCore + 4 IntelAtom cores: ")
    # a share that is not this topology's cut (a launcher's own mask) is not commented
    assert rank_kinds_note(t, LocalRank(1, 2, "Open MPI", "test"), shares[0]) is None
    plain = Topology.from_synthetic(XEON)
    assert rank_kinds_note(plain, LocalRank(0, 2, "Open MPI", "test"), partition(plain, 2)[0]) is None


def test_hybrid_notes_reach_affinity_run_and_plan_ranks():
    t = hybrid(8, 16)
    launch = build_launch(RunOptions(command=("prog",), instances=2), t, Context())
    assert [n for n in launch.notices if n.startswith("core kinds differ: the instances' shares: instance 0: "
                                                      "8 IntelCore + 4 IntelAtom cores")]
    plans, _ = plan_ranks(t, "2")
    assert [p.instance.cpus for p in plans] == [s.cpus for s in partition(t, 2)]
    assert all(any(n.startswith("core kinds differ: this rank's share") for n in p.said) for p in plans)
    # nothing is said on a machine of one kind
    xeon = Topology.from_synthetic(XEON)
    assert not build_launch(RunOptions(command=("prog",), instances=2), xeon, Context()).notices
    assert all(not p.said for p in plan_ranks(xeon, "2")[0])
