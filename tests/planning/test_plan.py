"""The planner's API and the runtime rules it reproduces, on small machines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import affinity
from affinity.machine import topology as topo_mod
from affinity.errors import PlanError, SpecError
from affinity.planning import planner
from affinity.planning.planner import Plan, kmp_mask_str, plan, plan_env
from affinity.planning.spec import KmpAffinity, OmpPlaces, OmpProcBind, Settings, parse_kmp_affinity, parse_kmp_hw_subset
from affinity.machine.topology import Topology
from helpers import golden_dir

GOLDEN = golden_dir()


def _golden(name: str) -> Topology:
    return Topology.from_cpuinfo(GOLDEN / "cpuinfo" / f"{name}.cpuinfo",
                                 numa_nodes=GOLDEN / "fakesys" / name / "node")


def machine(S: int, C: int, T: int, numa: dict[int, list[int]] | None = None, tmp: Path | None = None,
            core_ids: list[int] | None = None) -> Topology:
    """S sockets x C cores x T threads, Linux numbering (siblings p, p+S*C)."""
    rows = []
    cids = core_ids or list(range(C))
    for t in range(T):
        for s in range(S):
            for c in range(C):
                rows.append((t * S * C + s * C + c, s, cids[c]))
    text = "\n".join(f"processor\t: {p}\nphysical id\t: {s}\ncore id\t\t: {c}\n" for p, s, c in sorted(rows)) + "\n"
    path = (tmp or Path(os.environ.get("TMPDIR", "/tmp"))) / f"m{S}x{C}x{T}-{abs(hash(str(numa)))}.cpuinfo"
    path.write_text(text)
    if numa is None:
        numa = {s: [p for p, s2, _c in rows if s2 == s] for s in range(S)}
    return Topology.from_cpuinfo(path, numa_nodes=numa)


@pytest.fixture(scope="module")
def t2s() -> Topology:
    return _golden("2s4c2t_linux")


def sets(p: Plan) -> list[list[int]]:
    return [sorted(s) for s in p.cpusets]


# ---------------------------------------------------------------- API


def test_exports(t2s: Topology) -> None:
    # affinity.plan is the function (the module is affinity.planning.planner)
    from affinity.binding import here

    assert isinstance(affinity.plan("compact", 2, t2s), Plan)
    assert affinity.plan_env is here.plan_env and affinity.plan is here.plan and affinity.Plan is Plan
    assert affinity.KmpAffinity is KmpAffinity


def test_runtime_is_named_and_checked(t2s: Topology) -> None:
    p = plan("compact", 2, t2s)
    assert p.runtime == "intel" and p.to_dict()["runtime"] == "intel"
    assert plan("compact", 2, t2s, runtime="intel") == p
    assert plan_env({"KMP_AFFINITY": "compact"}, topology=t2s, runtime="intel").runtime == "intel"
    for bad in ("intell", "", "INTEL"):
        with pytest.raises(PlanError) as e:
            plan("compact", 2, t2s, runtime=bad)
        assert repr(bad) in str(e.value) and all(name in str(e.value) for name in planner.RUNTIMES)
        with pytest.raises(PlanError):
            plan_env({}, topology=t2s, runtime=bad)
    with pytest.raises(TypeError):
        plan("compact", 2, t2s, runtime=None)  # type: ignore[arg-type]


def test_every_registered_runtime_follows_the_rules_interface(t2s: Topology) -> None:
    """Each registry entry names itself, reads a sorted set of variables and
    plans: a plan made by its rules says so."""
    assert "intel" in planner.RUNTIMES
    for name, rules in planner.RUNTIMES.items():
        assert rules.NAME == name
        assert list(rules.VARIABLES) == sorted(set(rules.VARIABLES))
        p = plan_env({"OMP_NUM_THREADS": "2", "OMP_PROC_BIND": "close"}, topology=t2s, runtime=name)
        assert p.runtime == name and p.threads == 2 and len(p.cpusets) == 2
        assert "bound to OS proc set" in p.explain()


def test_plan_forms_agree(t2s: Topology) -> None:
    a = plan("granularity=fine,scatter", 5, t2s)
    b = plan(parse_kmp_affinity("granularity=fine,scatter"), 5, t2s)
    c = plan({"KMP_AFFINITY": "granularity=fine,scatter"}, 5, t2s)
    d = plan_env({"KMP_AFFINITY": "granularity=fine,scatter", "OMP_NUM_THREADS": "5"}, topology=t2s)
    e = plan("KMP_AFFINITY=granularity=fine,scatter OMP_NUM_THREADS=5", topology=t2s)
    assert sets(a) == sets(b) == sets(c) == sets(d) == sets(e) == [[0], [4], [1], [5], [2]]
    assert a == b
    assert hash(a) == hash(b)


def test_plan_spec_values(t2s: Topology) -> None:
    p = plan(OmpPlaces(kind="cores"), 4, t2s, env={"OMP_PROC_BIND": "close"})
    assert sets(p) == [[0, 8], [1, 9], [2, 10], [3, 11]] and p.proc_bind == "close"
    p = plan(OmpProcBind(("spread",)), 2, t2s)
    assert sets(p) == [[0, 8], [4, 12]]
    p = plan(parse_kmp_hw_subset("1s,2c,1t"), None, t2s)
    assert p.threads == 2 and sets(p) == [[0, 1], [0, 1]]
    s = Settings.from_env({"OMP_PLACES": "sockets", "OMP_NUM_THREADS": "4"})
    assert sets(plan(s, topology=t2s)) == [[0, 1, 2, 3, 8, 9, 10, 11]] * 2 + [[4, 5, 6, 7, 12, 13, 14, 15]] * 2


def test_strict_raises_with_caret(t2s: Topology) -> None:
    with pytest.raises(SpecError) as ei:
        plan("granularity=fine,compakt", 4, t2s)
    assert str(ei.value).splitlines()[-1].index("^") == 4 + len("granularity=fine,")
    with pytest.raises(SpecError):
        plan("KMP_AFFINITY=compact OMP_PLACES=cores", topology=t2s)  # conflicting settings
    lenient = plan("granularity=fine,compakt", 4, t2s, strict=False)
    assert lenient == plan_env({"KMP_AFFINITY": "granularity=fine,compakt", "OMP_NUM_THREADS": "4"}, topology=t2s)
    assert lenient.warnings == ('KMP_AFFINITY: parameter invalid, ignoring "compakt".',)
    assert lenient.affinity_type == "none"


def test_a_mistyped_variable_name_is_refused_naming_it_strict_or_not(t2s: Topology) -> None:
    # "OMP_PLACE=cores" alone was read as a KMP_AFFINITY string: "KMP_AFFINITY: parameter invalid",
    # and with strict=False (apply()'s default) a plan that binds nothing
    for spec in ("OMP_PLACE=cores", "  OMP_PLACE=cores OMP_PROC_BIND=spread", "KMP_AFINITY=compact"):
        for strict in (True, False):
            with pytest.raises(SpecError, match=r"^spec: expected KEY=VALUE with KEY one of .*, got '(OMP_PLACE|KMP_AFINITY)="):
                plan(spec, 2, t2s, strict=strict)
    # a variable name in lower or mixed case was read as a KMP_AFFINITY string: under libgomp's
    # rules (which never read KMP_AFFINITY) a plan that binds nothing, without a word
    for spec, says in [("omp_places=cores", "variable names are upper case, OMP_PLACES "),
                       ("Omp_Proc_Bind=spread OMP_PLACES=cores", "variable names are upper case, OMP_PROC_BIND "),
                       ("OMP_PROCBIND=spread", "did you mean OMP_PROC_BIND\\?")]:
        for runtime in ("intel", "gnu"):
            with pytest.raises(SpecError, match=r"^spec: expected KEY=VALUE .*, got '[^']*': " + says):
                plan(spec, 2, t2s, strict=False, runtime=runtime)
    # KMP_AFFINITY is read case-insensitively: its own NAME= words (granularity, gran, proclist) stay its own
    from affinity.planning.kmp import _AFF_ASSIGNMENTS
    assert not any(planner._ENV_FORM.match(k.upper() + "=x") for k, *_ in _AFF_ASSIGNMENTS)
    for spec in ("GRANULARITY=FINE,COMPACT", "Granularity=core,scatter", "PROCLIST=[0,1],EXPLICIT", "GRAN=FINE,COMPACT"):
        p, q = plan(spec, 2, t2s), plan("KMP_AFFINITY=" + spec.lower(), 2, t2s)
        assert p.env == (("KMP_AFFINITY", spec), ("OMP_NUM_THREADS", "2")), spec
        assert (p.cpusets, p.affinity_type, p.warnings) == (q.cpusets, q.affinity_type, q.warnings), spec


def test_a_variable_given_twice_is_an_error_when_strict(t2s: Topology) -> None:
    # the last one was kept silently
    with pytest.raises(SpecError, match=r"^spec: KMP_AFFINITY is given twice\b.*\n.*\n {25}\^$"):
        plan("KMP_AFFINITY=compact KMP_AFFINITY=scatter", 2, t2s)
    lenient = plan("KMP_AFFINITY=compact KMP_AFFINITY=scatter", 2, t2s, strict=False)  # as `env A=1 A=2`
    assert lenient.affinity_type == "scatter"


def test_strict_is_about_reading_placement_warnings_stay_warnings() -> None:
    # docs/semantics.md: a well-formed spec that names CPUs this machine lacks binds nothing,
    # with the runtime's warnings, strict or not (it binds on a machine that has them)
    two = Topology.from_synthetic("pack:1 core:2 pu:1")
    for strict in (True, False):
        p = plan("explicit,proclist=[5]", topology=two, strict=strict)
        assert p.warnings == ("Ignoring invalid OS proc ID 5.", "No valid OS proc IDs specified - not using affinity.")
        assert p.affinity_type == "none"


def test_notices_survive_strict(t2s: Topology) -> None:
    p = plan("balanced", 3, t2s)
    assert p.warnings == ("KMP_AFFINITY: granularity=core will be used.",)


def test_bad_arguments(t2s: Topology) -> None:
    with pytest.raises(PlanError):
        plan("compact", 0, t2s)
    with pytest.raises(TypeError):
        plan("compact", True, t2s)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        plan("compact", 2, topology="x")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="selects no processor"):
        plan_env({}, topology=t2s, initial_mask=[100])
    with pytest.raises(TypeError):
        plan_env({"KMP_AFFINITY": 3}, topology=t2s)  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        plan(3.5, topology=t2s)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["2147483648", "999999", "99999999999"])
def test_team_the_runtime_cannot_create(t2s: Topology, value: str) -> None:
    with pytest.raises(PlanError, match="cannot be created"):
        plan_env({"OMP_NUM_THREADS": value}, topology=t2s)


def test_other_variables_ignored(t2s: Topology) -> None:
    assert plan_env({"PATH": "/bin", "OMP_NUM_THREADS": "2", "KMP_BLOCKTIME": "0"}, topology=t2s).threads == 2


def test_from_system_only_when_no_topology(monkeypatch: pytest.MonkeyPatch, t2s: Topology) -> None:
    calls = []

    def fake(refresh: bool = False) -> Topology:
        calls.append(1)
        return t2s

    monkeypatch.setattr(Topology, "from_system", staticmethod(fake))
    affinity.plan("compact", 2, t2s)
    affinity.plan_env({}, topology=t2s)
    with pytest.raises(TypeError, match="pure"):
        plan("compact", 2)  # the planning layer never reads the machine
    with pytest.raises(TypeError, match="pure"):
        plan_env({})
    assert calls == []
    p = affinity.plan("compact", 2)
    q = affinity.plan_env({"KMP_AFFINITY": "compact", "OMP_NUM_THREADS": "2"}, runtime="llvm")
    assert calls == [1, 1] and p.topology is t2s and q.runtime == "llvm" and q.cpusets == p.cpusets


def test_plan_is_pure_value(t2s: Topology) -> None:
    before = hash(t2s)
    p = plan("granularity=fine,compact", 4, t2s)
    assert hash(t2s) == before and t2s == _golden("2s4c2t_linux")
    with pytest.raises(AttributeError):
        p.threads = 3  # type: ignore[misc]
    assert isinstance(p.cpusets, tuple) and all(isinstance(s, frozenset) for s in p.cpusets)
    assert isinstance(p.warnings, tuple)
    assert plan("granularity=fine,compact", 4, t2s) == p


# ---------------------------------------------------------------- team size


def test_default_team_sizes(t2s: Topology) -> None:
    assert plan("compact", None, t2s).threads == 16
    assert plan_env({}, topology=t2s, initial_mask="0-5").threads == 6
    assert plan_env({"KMP_HW_SUBSET": "1s,2c"}, topology=t2s).threads == 4
    assert plan_env({"OMP_PLACES": "cores(3)"}, topology=t2s).threads == 6
    assert plan_env({"OMP_NUM_THREADS": "3,2"}, topology=t2s).threads == 3
    assert plan_env({"OMP_NUM_THREADS": ",2"}, topology=t2s).threads == 16
    assert plan_env({"OMP_NUM_THREADS": "all"}, topology=t2s, initial_mask="0-3").threads == 16
    # disabled: the runtime counts every processor of the machine
    assert plan_env({"KMP_AFFINITY": "disabled"}, topology=t2s, initial_mask="0-3").threads == 16


def test_oversubscription_wraps(t2s: Topology) -> None:
    p = plan("granularity=fine,compact", 19, t2s)
    assert sets(p)[16:] == [[0], [8], [1]]
    q = plan("OMP_PLACES=threads OMP_PROC_BIND=close", 19, t2s)
    assert list(q.place_nums) == [0, 0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 10, 11, 12, 13, 14, 15]


# ---------------------------------------------------------------- runtime rules


def test_compact_scatter_permute_offset(t2s: Topology) -> None:
    assert sets(plan("granularity=fine,compact,1", 4, t2s)) == [[0], [1], [2], [3]]
    assert sets(plan("granularity=fine,compact,2", 4, t2s)) == sets(plan("granularity=fine,scatter", 4, t2s))
    assert sets(plan("granularity=fine,compact,5", 4, t2s)) == sets(plan("granularity=fine,scatter", 4, t2s))
    assert sets(plan("granularity=fine,scatter,0,100", 2, t2s)) == [[2], [6]]
    assert sets(plan("granularity=core,compact", 3, t2s)) == [[0, 8], [0, 8], [1, 9]]
    assert sets(plan("granularity=core,nodups,compact", 3, t2s)) == [[0, 8], [1, 9], [2, 10]]
    assert sets(plan("granularity=socket,compact", 1, t2s)) == [[0, 1, 2, 3, 8, 9, 10, 11]]
    assert sets(plan("granularity=fine,logical,1", 2, t2s)) == [[1], [9]]
    assert sets(plan("granularity=fine,physical,1", 2, t2s)) == [[2], [3]]


def test_granularity_missing_layer(t2s: Topology) -> None:
    p = plan("granularity=tile,compact", 2, t2s)
    assert p.warnings == ("KMP_AFFINITY: granularity setting: tile does not exist in topology.  "
                          "Using granularity=core instead.",)
    assert p.granularity == "core"
    assert plan("nowarnings,granularity=tile,compact", 2, t2s).warnings == ()


def test_explicit_invalid_ids(t2s: Topology) -> None:
    p = plan_env({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[0,200,{1,300}]", "OMP_NUM_THREADS": "3"},
                 topology=t2s)
    assert sets(p) == [[0], [1], [0]]
    assert p.warnings == ("Ignoring invalid OS proc ID 200.", "Ignoring invalid OS proc ID 300.")
    q = plan_env({"KMP_AFFINITY": "explicit,proclist=[500]"}, topology=t2s)
    assert q.affinity_type == "none" and q.warnings[-1] == "No valid OS proc IDs specified - not using affinity."


def test_respect_and_norespect(t2s: Topology) -> None:
    p = plan_env({"KMP_AFFINITY": "granularity=fine,compact", "OMP_NUM_THREADS": "4"}, topology=t2s,
                 initial_mask="1,3,5,7,9,11,13,15")
    assert sets(p) == [[1], [9], [3], [11]]
    q = plan_env({"KMP_AFFINITY": "norespect,granularity=fine,compact", "OMP_NUM_THREADS": "4"}, topology=t2s,
                 initial_mask="1,3,5,7,9,11,13,15")
    assert sets(q) == [[0], [8], [1], [9]]
    assert plan_env({"KMP_AFFINITY": "none"}, topology=t2s, initial_mask="0-3").cpusets[0] == frozenset(range(4))
    assert plan_env({"KMP_AFFINITY": "disabled"}, topology=t2s, initial_mask="0-3").places is None


def test_precedence(t2s: Topology) -> None:
    p = plan_env({"KMP_AFFINITY": "granularity=fine,compact", "OMP_PLACES": "cores", "OMP_NUM_THREADS": "2"},
                 topology=t2s)
    assert p.warnings == ("OMP_PLACES: ignored because KMP_AFFINITY has been defined",)
    # KMP_AFFINITY without a type does not override OMP_PLACES/OMP_PROC_BIND
    q = plan_env({"KMP_AFFINITY": "granularity=fine", "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": "3"},
                 topology=t2s)
    assert sets(q) == [[0], [8], [1]] and q.warnings == ()
    # a later 'none' switches binding off
    assert plan_env({"KMP_AFFINITY": "compact,none"}, topology=t2s).affinity_type == "none"


def test_balanced(t2s: Topology) -> None:
    assert sets(plan("granularity=fine,balanced", 19, t2s)) == [[0], [8], [0], [1], [9], [1], [2], [10], [2], [3],
                                                                  [11], [4], [12], [5], [13], [6], [14], [7], [15]]
    nonuniform = plan_env({"KMP_AFFINITY": "granularity=fine,balanced", "OMP_NUM_THREADS": "3"}, topology=t2s,
                          initial_mask="0-5")
    assert sets(nonuniform) == [[0], [1], [4]]


def test_spread_partition(t2s: Topology) -> None:
    p = plan("OMP_PLACES=cores OMP_PROC_BIND=spread", 5, t2s)
    assert list(p.place_nums) == [0, 1, 3, 5, 7]
    assert sets(plan("OMP_PLACES=cores OMP_PROC_BIND=primary", 3, t2s)) == [[0, 8]] * 3


def test_hw_subset_rules(t2s: Topology) -> None:
    assert sets(plan_env({"KMP_HW_SUBSET": "4c@2,1t", "KMP_AFFINITY": "granularity=fine,compact"},
                         topology=t2s)) == [[2], [3], [6], [7]]
    p = plan_env({"KMP_HW_SUBSET": "2s@2", "KMP_AFFINITY": "granularity=fine,compact", "OMP_NUM_THREADS": "1"},
                 topology=t2s)
    assert p.warnings == ("KMP_HW_SUBSET ignored: all hardware resources would be filtered, please reduce the "
                          "filter.",)
    # the same subset without KMP_AFFINITY: the warning is not printed (affinity type none)
    assert plan_env({"KMP_HW_SUBSET": "2s@2"}, topology=t2s).warnings == ()
    # core attributes on a machine without core types: ignored, with a warning when affinity is on
    q = plan_env({"KMP_HW_SUBSET": "2c:intel_atom", "KMP_AFFINITY": "granularity=fine,compact"}, topology=t2s)
    assert q.threads == 8 and q.warnings == ("KMP_HW_SUBSET: ignoring core_type attribute. This machine is not a "
                                             "hybrid architecutre.",)


# ---------------------------------------------------------------- NUMA layer (libiomp5)


def test_snc_changes_scatter(tmp_path: Path) -> None:
    t = machine(2, 8, 2, numa={n: [p for p in range(32) if (p % 16) // 8 == n // 2 and (p % 8) // 4 == n % 2]
                               for n in range(4)}, tmp=tmp_path)
    assert sets(plan("granularity=fine,scatter", 4, t)) == [[0], [8], [4], [12]]
    assert sets(plan("granularity=fine,compact", 4, t)) == [[0], [16], [1], [17]]
    assert len(plan("OMP_PLACES=numa_domains", 1, t).places) == 4


def test_numa_node_list_stops_at_first_gap(tmp_path: Path) -> None:
    # nodes 0 and 2: libiomp5 reads node0, finds no node1 and stops; every other
    # processor counts as node 0 -> one NUMA domain over both packages
    t = machine(2, 4, 2, numa={0: [0, 1, 2, 3, 8, 9, 10, 11], 2: [4, 5, 6, 7, 12, 13, 14, 15]}, tmp=tmp_path)
    assert len(plan("OMP_PLACES=numa_domains", 1, t).places) == 1
    # no node0 at all: no NUMA layer
    u = machine(2, 4, 2, numa={1: list(range(16))}, tmp=tmp_path)
    p = plan_env({"OMP_PLACES": "numa_domains", "OMP_NUM_THREADS": "1"}, topology=u)
    assert p.warnings[0].startswith("OMP_PLACES: granularity setting: NUMA domain does not exist")


def test_numa_above_packages(tmp_path: Path) -> None:
    t = machine(2, 4, 2, numa={0: list(range(16))}, tmp=tmp_path)
    assert sets(plan("granularity=fine,compact,2", 4, t)) == [[0], [4], [1], [5]]
    assert plan("OMP_PLACES=numa_domains", 1, t).places == (frozenset(range(16)),)


# ---------------------------------------------------------------- richer topologies


def _assembled(rows, numa=(), caches=(), groups=(), core_info=None) -> Topology:
    return topo_mod._assemble(rows, numa, caches, groups, core_info, None, "test", False)


def test_dies_and_caches() -> None:
    # 1 package, 2 dies x 4 cores x 2 threads; L3 per die, L2 per core
    rows = [(d * 4 + c + 8 * t, 0, d * 4 + c, None) for d in range(2) for c in range(4) for t in range(2)]
    die = [("die", d, frozenset(p for p, _s, c, _t in rows if c // 4 == d)) for d in range(2)]
    l3 = [(3, frozenset(p for p, _s, c, _t in rows if c // 4 == d), 0) for d in range(2)]
    l2 = [(2, frozenset(p for p, _s, c2, _t in rows if c2 == c), 0) for c in range(8)]
    t = _assembled(rows, caches=l3 + l2, groups=die)
    p = plan_env({"KMP_AFFINITY": "granularity=die,compact", "OMP_NUM_THREADS": "2"}, topology=t)
    assert sets(p) == [[0, 1, 2, 3, 8, 9, 10, 11]] * 2 and p.warnings == ()
    q = plan_env({"OMP_PLACES": "ll_caches", "OMP_NUM_THREADS": "2"}, topology=t)
    assert sets(q) == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    r = plan_env({"KMP_AFFINITY": "granularity=fine,scatter", "OMP_NUM_THREADS": "4"}, topology=t)
    assert sets(r) == [[0], [4], [1], [5]]  # alternates dies
    s = plan_env({"KMP_HW_SUBSET": "1d,2c,1t", "OMP_NUM_THREADS": "2"}, topology=t)
    assert s.cpusets[0] == frozenset({0, 1})
    assert plan_env({"OMP_PLACES": "l2_caches", "OMP_NUM_THREADS": "1"}, topology=t).places[0] == frozenset({0, 8})


def test_hybrid_core_types() -> None:
    # 4 performance cores (2 threads) then 4 efficient cores (1 thread)
    rows = [(c * 2 + t, 0, c, None) for c in range(4) for t in range(2)] + [(8 + c, 0, 4 + c, None) for c in range(4)]
    info = {c * 2: ("IntelCore", 1) for c in range(4)}
    info.update({8 + c: ("IntelAtom", 0) for c in range(4)})
    t = _assembled(rows, core_info=info)
    p = plan_env({"KMP_HW_SUBSET": "2c:intel_atom", "KMP_AFFINITY": "granularity=fine,compact"}, topology=t)
    assert p.warnings == () and sets(p) == [[8], [9]]
    q = plan_env({"OMP_PLACES": "cores:intel_atom", "OMP_NUM_THREADS": "4"}, topology=t)
    assert q.warnings == () and set(map(frozenset, sets(q))) <= {frozenset({x}) for x in range(8, 12)}
    r = plan_env({"KMP_AFFINITY": "granularity=core_type,compact", "OMP_NUM_THREADS": "2"}, topology=t)
    assert sets(r)[0] == list(range(8)) and r.warnings == ()


# ---------------------------------------------------------------- reports and derived counts


def test_explain(t2s: Topology) -> None:
    text = plan("granularity=fine,compact", 3, t2s).explain()
    assert "KMP_AFFINITY: OS proc 8 maps to socket 0 core 0 thread 1" in text
    assert "KMP_AFFINITY: 2 sockets x 4 cores/socket x 2 threads/core (8 total cores)" in text
    assert text.splitlines()[-3:] == ["KMP_AFFINITY: thread 0 bound to OS proc set {0}",
                                      "KMP_AFFINITY: thread 1 bound to OS proc set {8}",
                                      "KMP_AFFINITY: thread 2 bound to OS proc set {1}"]
    assert "bound to OS proc set {0-3,8-11}" in plan("OMP_PLACES=sockets", 1, t2s).explain()
    d = plan_env({"KMP_AFFINITY": "disabled", "OMP_NUM_THREADS": "1"}, topology=t2s).explain()
    assert "affinity disabled" in d and "thread 0 bound to OS proc set {0-15}" in d
    w = plan_env({"KMP_AFFINITY": "compakt", "OMP_NUM_THREADS": "1"}, topology=t2s).explain()
    assert w.splitlines()[0] == 'OMP: Warning: KMP_AFFINITY: parameter invalid, ignoring "compakt".'


def test_kmp_mask_str() -> None:
    assert kmp_mask_str({0, 1}) == "0,1"
    assert kmp_mask_str({0, 1, 2, 8, 10, 11}) == "0-2,8,10,11"
    assert kmp_mask_str(set()) == "{<empty>}"


def test_to_dict(t2s: Topology) -> None:
    d = plan("granularity=core,scatter", 3, t2s).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["threads"] == 3 and d["cpusets"] == [[0, 8], [4, 12], [1, 9]]
    assert d["warnings"] == [] and len(d["places"]) == 16 and d["granularity"] == "core"
    assert d["packages"] == [0, 1] and d["inter_op_threads"] == 2 and d["intra_op_threads"] == 3


def test_derived_counts(t2s: Topology) -> None:
    fine = plan("granularity=fine,compact", 4, t2s)
    assert fine.intra_op_threads == 4 and fine.inter_op_threads == 1 and fine.omp_threads == 4
    core = plan("granularity=core,scatter", 4, t2s)
    assert core.intra_op_threads == 4 and core.inter_op_threads == 2
    assert [c.os_index for c in core.cores] == [0, 1, 0, 1]
    assert [p.os_index for p in core.packages] == [0, 1]
    assert [n.os_index for n in core.numa_nodes] == [0, 1]
    none = plan("none", 4, t2s)  # every thread floats over the 8 cores; the pool never outgrows the team
    assert none.intra_op_threads == 4 and none.inter_op_threads == 2
    assert plan("none", 1, t2s).intra_op_threads == 1  # issue 23: -t 1 is one TensorFlow worker
    assert plan("none", 16, t2s).intra_op_threads == 8


def test_empty_place(t2s: Topology) -> None:
    # OMP_PLACES=!{0:16} excludes every proc: one empty place.  libiomp5
    # ignores the primary thread's failed binding (it keeps the process mask)
    # but aborts when a worker must be bound to the empty place.
    env = {"OMP_PLACES": "!{0:16},{1},{2}", "OMP_PROC_BIND": "close"}
    p = plan_env(dict(env, OMP_NUM_THREADS="3"), topology=t2s, initial_mask="0-3")
    assert sets(p) == [[0, 1, 2, 3], [1], [2]]
    assert [sorted(x) for x in p.places] == [[], [1], [2]]
    p = plan_env(dict(env, OMP_NUM_THREADS="2", OMP_PROC_BIND="true", KMP_AFFINITY="norespect"),
                 topology=t2s, initial_mask="0-3")
    assert sets(p) == [[0, 1, 2, 3], [2]]
    with pytest.raises(PlanError, match="empty place"):
        plan_env(dict(env, OMP_NUM_THREADS="3", OMP_PROC_BIND="primary"), topology=t2s, initial_mask="0-3")
    with pytest.raises(PlanError, match="thread 2 would be bound to an empty place"):
        plan_env({"OMP_PLACES": "{1},!{0:16}", "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": "3"}, topology=t2s)
