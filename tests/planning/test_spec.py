"""Spec values: parsing, canonical strings, strict errors, lenient fallbacks."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affinity.errors import SpecError
from affinity.planning.kmp import kmp_affinity_has_type_name
from affinity.planning.spec import (HwSubsetItem, KmpAffinity, KmpHwSubset, NumThreads, OmpPlaces, OmpProcBind, Place,
                                    ProcList, ProcRange, Settings, SubPlace, parse_gomp_cpu_affinity,
                                    parse_kmp_affinity, parse_kmp_hw_subset, parse_lenient, parse_num_threads,
                                    parse_omp_places, parse_omp_proc_bind)

# ---------------------------------------------------------------- KMP_AFFINITY


def test_kmp_affinity_fields() -> None:
    a = parse_kmp_affinity("granularity=fine,compact,1,0")
    assert a == KmpAffinity(type="compact", granularity="thread", permute=1, offset=0)
    assert str(a) == "granularity=fine,compact,1,0"
    b = parse_kmp_affinity("verbose,nowarnings,norespect,noreset,nodups,granularity=core,scatter,2")
    assert (b.verbose, b.warnings, b.respect, b.reset, b.dups) == (True, False, False, False, False)
    assert b.type == "scatter" and b.permute == 2 and b.offset is None
    assert str(b) == "verbose,nowarnings,norespect,noreset,nodups,granularity=core,scatter,2"


@pytest.mark.parametrize(("text", "gran"), [
    ("granularity=fine", "thread"), ("granularity=thread", "thread"), ("gran=core", "core"),
    ("granularity=package", "socket"), ("granularity=socket", "socket"), ("granularity=node", "numa_domain"),
    ("granularity=numa_domain", "numa_domain"), ("granularity=tile", "tile"), ("granularity=die", "die"),
    ("granularity=l2_cache", "l2_cache"), ("granularity=ll_cache", "ll_cache"),
    ("granularity=core_type", "core_type"), ("granularity=core_eff", "core_efficiency"),
    ("GRANULARITY = FINE", "thread"),
])
def test_kmp_affinity_granularity_names(text: str, gran: str) -> None:
    assert parse_kmp_affinity(text).granularity == gran


def test_kmp_affinity_numeric_granularity() -> None:
    a = parse_kmp_affinity("granularity=2,compact")
    assert a.granularity is None and a.granularity_levels == 2
    assert str(a) == "granularity=2,compact"


def test_kmp_affinity_proclist() -> None:
    a = parse_kmp_affinity("explicit,proclist=[0,3,5-7,0-7:2,{1,2},9-1:-4]")
    assert a.proclist == ProcList((0, 3, ProcRange(5, 7), ProcRange(0, 7, 2), (1, 2), ProcRange(9, 1, -4)))
    assert a.proclist.places() == [(0,), (3,), (5,), (6,), (7,), (0,), (2,), (4,), (6,), (1, 2), (9,), (5,), (1,)]
    assert str(a) == "proclist=[0,3,5-7,0-7:2,{1,2},9-1:-4],explicit"
    # the same list written after the type, with spaces
    assert parse_kmp_affinity("proclist=[ 3 , 0 ,{1, 2},{0,3}],explicit").proclist.places() == \
        [(3,), (0,), (1, 2), (0, 3)]


@pytest.mark.parametrize("text", ["logical", "physical,2", "balanced", "none", "disabled", "compact,0,3",
                                  "dups,scatter", "granularity=fine,explicit,proclist=[1]", ""])
def test_kmp_affinity_roundtrip_examples(text: str) -> None:
    a = parse_kmp_affinity(text)
    assert parse_kmp_affinity(str(a)) == a


@pytest.mark.parametrize(("text", "bad", "message"), [
    ("compakt", "compakt", 'unknown word "compakt" (did you mean "compact"?)'),
    ("granularity=fine,compakt", "compakt", 'unknown word "compakt" (did you mean "compact"?)'),
    ("compact,scatter", "scatter", '"scatter": a type was specified already'),
    ("granularity=fin,compact", "granularity=fin", 'invalid parameter "granularity=fin"'),
    ("granulatiry=fine,compact", "granulatiry=fine", '(did you mean "granularity=fine"?)'),
    ("compact,nowarning", "nowarning", '(did you mean "nowarnings"?)'),
    ("compact,1,2,3", "3", "too many integer parameters"),
    ("granularity=fine,compact,-1", "-1", 'unknown word "-1"'),
    ("explicit", None, 'proclist not specified with explicit affinity type'),
    ("proclist=[0,1]", None, 'proclist given without the "explicit" type'),
    ("explicit,proclist=[3-1]", "3-1", "range error (3 > 1)"),
    ("explicit,proclist=[a]", "a]", "syntax error"),
    ("explicit,proclist=[0-7:0]", "0-7:0", "zero stride"),
    ("explicit,proclist=[0,1", None, "invalid parameter"),
    ("compactx", "x", 'extra trailing characters "x"'),
    ("none,1", None, "the 'none' type does not take integer parameters"),
    ("1,0", None, "integer parameters need an affinity type"),
])
def test_kmp_affinity_strict_errors(text: str, bad: str | None, message: str) -> None:
    with pytest.raises(SpecError) as ei:
        parse_kmp_affinity(text)
    err = ei.value
    assert isinstance(err, ValueError)
    assert message in str(err)
    assert err.text == text
    rendered = str(err).splitlines()
    assert rendered[-2].strip() == text.strip() or rendered[-2] == "    " + text
    caret = rendered[-1].index("^") - 4
    if bad is not None:
        assert text[caret:].startswith(bad), (text, caret)


def test_a_mistyped_type_is_an_error_without_ignoring_and_a_hint_beside_the_runtimes_words():
    """Issue #40, point 5: strict parsing said 'ignoring "compcat"' inside an error, with no
    did-you-mean; apply()'s lenient warnings keep the runtime's words, each with its hint
    (the second one, "'default' type", said why the type is 'default')."""
    with pytest.raises(SpecError) as ei:
        parse_kmp_affinity("compcat")
    assert str(ei.value).splitlines()[0] == 'KMP_AFFINITY: unknown word "compcat" (did you mean "compact"?)'
    assert "ignoring" not in str(ei.value)
    from affinity.planning.planner import hinted, plan
    from affinity.machine.topology import Topology

    p = plan("compakt,1,0", topology=Topology.from_synthetic("pack:1 core:2 pu:1"), strict=False)
    assert hinted("compakt,1,0", p.warnings) == [
        'KMP_AFFINITY: parameter invalid, ignoring "compakt". (did you mean "compact"?)',
        "KMP_AFFINITY: 'default' type does not take any integer parameters, ignoring them. "
        "(the type is 'default' because \"compakt\" was ignored)"]
    assert hinted("compact,xyzzy", ("KMP_AFFINITY: parameter invalid, ignoring \"xyzzy\".",)) == [
        'KMP_AFFINITY: parameter invalid, ignoring "xyzzy".']  # nothing close: no hint


def test_caret_under_bad_token() -> None:
    with pytest.raises(SpecError) as ei:
        parse_kmp_affinity("granularity=fine,compakt,1")
    lines = str(ei.value).splitlines()
    assert lines[0] == 'KMP_AFFINITY: unknown word "compakt" (did you mean "compact"?)'
    assert lines[1] == "    granularity=fine,compakt,1"
    assert lines[2] == "    " + " " * len("granularity=fine,") + "^"


@pytest.mark.parametrize(("text", "expected", "warnings"), [
    ("compakt", KmpAffinity(), ['KMP_AFFINITY: parameter invalid, ignoring "compakt".']),
    ("foo,compact", KmpAffinity(type="compact"), ['KMP_AFFINITY: parameter invalid, ignoring "foo".']),
    ("compact,scatter", KmpAffinity(type="compact"),
     ['KMP_AFFINITY: parameter has been specified already, ignoring "scatter".']),
    ("granularity=fine,granularity=core,compact", KmpAffinity(type="compact", granularity="thread"),
     ['KMP_AFFINITY: extra trailing characters ignored: "core".']),
    ("granularity=fine,compact,1,2,3,verbose", KmpAffinity(type="compact", granularity="thread", permute=1,
                                                           offset=2, verbose=True),
     ['KMP_AFFINITY: too many integer parameters specified, ignoring "3,verbose".']),
    ("explicit", KmpAffinity(type="none"),
     ['KMP_AFFINITY: proclist not specified with explicit affinity type, using "none".']),
    ("proclist=[0,1]", KmpAffinity(type="explicit", proclist=ProcList((0, 1))),
     ['KMP_AFFINITY: proclist specified, setting affinity type to "explicit".']),
    ("compact,none", KmpAffinity(type="none"),
     ['KMP_AFFINITY: parameter has been specified already, ignoring "none".']),
    ("balanced", KmpAffinity(type="balanced"), ["KMP_AFFINITY: granularity=core will be used."]),
    ("nowarnings,balanced", KmpAffinity(type="balanced", warnings=False), []),
    ("compact,99999999999", KmpAffinity(type="compact", permute=2**31 - 1), []),
    ("compact,1k", KmpAffinity(type="compact", permute=1024),
     ['KMP_AFFINITY: extra trailing characters ignored: "k".']),
    ("1k,compact", KmpAffinity(type="compact", permute=0), ['KMP_AFFINITY: extra trailing characters ignored: "k".']),
    ("foo, compact", KmpAffinity(), ['KMP_AFFINITY: parameter invalid, ignoring "foo".',
                                     'KMP_AFFINITY: parameter invalid, ignoring " compact".']),
])
def test_kmp_affinity_lenient(text: str, expected: KmpAffinity, warnings: list[str]) -> None:
    value, diags = parse_lenient("KMP_AFFINITY", text)
    assert value == expected
    assert [d.text for d in diags] == warnings
    assert parse_kmp_affinity(text, strict=False) == expected


def test_balanced_notice_is_not_an_error() -> None:
    # strict parsing accepts it (the runtime only informs)
    assert parse_kmp_affinity("balanced").type == "balanced"


def test_type_name_search() -> None:
    assert kmp_affinity_has_type_name("granularity=fine,compact")
    assert not kmp_affinity_has_type_name("granularity=fine,verbose")
    assert not kmp_affinity_has_type_name("compakt")
    assert kmp_affinity_has_type_name("nonexistent")  # the runtime searches substrings


# ---------------------------------------------------------------- OMP_PLACES


@pytest.mark.parametrize(("text", "expected"), [
    ("threads", OmpPlaces(kind="threads")),
    ("cores(4)", OmpPlaces(kind="cores", count=4)),
    ("sockets", OmpPlaces(kind="sockets")),
    ("numa_domains", OmpPlaces(kind="numa_domains")),
    ("ll_caches(2)", OmpPlaces(kind="ll_caches", count=2)),
    ("l2_caches", OmpPlaces(kind="l2_caches")),
    ("tiles", OmpPlaces(kind="tiles")),
    ("cores:intel_atom(2)", OmpPlaces(kind="cores", attribute="intel_atom", count=2)),
    ("cores:eff1", OmpPlaces(kind="cores", attribute="eff1")),
    ("core_types", OmpPlaces(kind="core_types")),
    ("Cores", OmpPlaces(kind="cores")),
    ("cores(0)", OmpPlaces(kind="cores")),
])
def test_omp_places_abstract(text: str, expected: OmpPlaces) -> None:
    assert parse_omp_places(text) == expected


def test_omp_places_explicit() -> None:
    p = parse_omp_places("{0:4:2},{1,3}:2:4,!{0},5,{7:3:-1}")
    assert p.places == (
        Place(members=(SubPlace(0, 4, 2),)),
        Place(members=(SubPlace(1), SubPlace(3)), count=2, stride=4),
        Place(exclude=Place(members=(SubPlace(0),))),
        Place(proc=5),
        Place(members=(SubPlace(7, 3, -1),)),
    )
    assert str(p) == "{0:4:2},{1,3}:2:4,!{0},5,{7:3:-1}"
    assert parse_omp_places("{0:4}:4:4").places == (Place(members=(SubPlace(0, 4),), count=4, stride=4),)
    # signs may repeat in strides
    assert parse_omp_places("{0}:3:--2").places[0].stride == 2


@pytest.mark.parametrize(("text", "warning"), [
    ("invalid", "OMP_PLACES: syntax error, using threads."),
    ("", "OMP_PLACES: syntax error, using threads."),
    ("{0-3}", "OMP_PLACES: syntax error, using threads."),
    (" cores ", "OMP_PLACES: syntax error, using threads."),
    ("sockets(", "OMP_PLACES: syntax error, using sockets."),
    ("cores(-1)", "OMP_PLACES: syntax error, using cores."),
    ("numa_domains(x)", "OMP_PLACES: syntax error, using NUMA domains."),
    ("threads(4)abc", 'OMP_PLACES: extra trailing characters ignored: "abc".'),
])
def test_omp_places_lenient(text: str, warning: str) -> None:
    _, diags = parse_lenient("OMP_PLACES", text)
    assert [d.text for d in diags] == [warning]
    with pytest.raises(SpecError):
        parse_omp_places(text)


def test_omp_places_fallback_value() -> None:
    assert parse_omp_places("{0,1", strict=False) == OmpPlaces(kind="threads")
    assert parse_omp_places("sockets(", strict=False) == OmpPlaces(kind="sockets")


# ---------------------------------------------------------------- OMP_PROC_BIND


@pytest.mark.parametrize(("text", "policies"), [
    ("spread", ("spread",)), ("close,primary", ("close", "primary")), ("master", ("primary",)),
    ("TRUE", ("true",)), ("false", ("false",)), ("spread , close", ("spread", "close")),
    ("disabled", ("disabled",)),
])
def test_omp_proc_bind(text: str, policies: tuple[str, ...]) -> None:
    v = parse_omp_proc_bind(text)
    assert v.policies == policies
    assert parse_omp_proc_bind(str(v)) == v


@pytest.mark.parametrize(("text", "warnings", "first"), [
    ("closer", ['OMP_PROC_BIND: extra trailing characters ignored: "r".'], "close"),
    ("spread,bogus", ['OMP_PROC_BIND: "spread,bogus" is an invalid value; ignored.'], "false"),
    ("false,spread", ['OMP_PROC_BIND: extra trailing characters ignored: ",spread".'], "false"),
    ("", ['OMP_PROC_BIND: "" is an invalid value; ignored.'], "false"),
    ("3", ['OMP_PROC_BIND: "3" is an invalid value; ignored.'], "false"),
    ("closer, master", ['OMP_PROC_BIND: extra trailing characters ignored: "r, master".'], "close"),
])
def test_omp_proc_bind_lenient(text: str, warnings: list[str], first: str) -> None:
    v, diags = parse_lenient("OMP_PROC_BIND", text)
    assert [d.text for d in diags] == warnings
    assert v.first == first


# ---------------------------------------------------------------- KMP_HW_SUBSET


def test_hw_subset_items() -> None:
    s = parse_kmp_hw_subset("2s,4c@2,1t")
    assert s == KmpHwSubset((HwSubsetItem("socket", 2), HwSubsetItem("core", 4, 2), HwSubsetItem("thread", 1)))
    assert str(s) == "2s,4c@2,1t"
    assert parse_kmp_hw_subset("1s@1,2c@1,1t@1").items[0] == HwSubsetItem("socket", 1, 1)
    assert parse_kmp_hw_subset("5C@1,3T").items == (HwSubsetItem("core", 5, 1), HwSubsetItem("thread", 3))
    assert parse_kmp_hw_subset("2sx4co2x2t") == parse_kmp_hw_subset("2s,4c@2,2t")  # legacy spellings
    assert parse_kmp_hw_subset("1n,2l2,*c,1t").items[:2] == (HwSubsetItem("numa_domain", 1),
                                                             HwSubsetItem("l2_cache", 2))
    a = parse_kmp_hw_subset(":2c:intel_atom&3c:intel_core,1t")
    assert a.absolute and a.items[:2] == (HwSubsetItem("core", 2, attr="intel_atom"),
                                         HwSubsetItem("core", 3, attr="intel_core"))
    assert parse_kmp_hw_subset("1tile,1d,1module,1ll").items == (
        HwSubsetItem("tile", 1), HwSubsetItem("die", 1), HwSubsetItem("module", 1), HwSubsetItem("ll_cache", 1))


@pytest.mark.parametrize("text", ["1x", "2s,", "0c", "1s,1s", "", "2s:intel_atom", "1l", "4c:foo", "4c:eff"])
def test_hw_subset_invalid(text: str) -> None:
    v, diags = parse_lenient("KMP_HW_SUBSET", text)
    assert v is None
    assert [d.text for d in diags] == [
        f'KMP_HW_SUBSET: invalid value "{text}", valid format is "N<item>[@N][,...][,Nt] (<item> can be S, N, '
        'L2, C, T  for Socket, NUMA Node, L2 Cache, Core, Thread)".']
    with pytest.raises(SpecError):
        parse_kmp_hw_subset(text)


def test_hw_subset_quirks() -> None:
    # the runtime reads these without complaint
    assert parse_kmp_hw_subset("@2c").items == (HwSubsetItem("socket", None, 2),)
    assert parse_kmp_hw_subset("c").items == (HwSubsetItem("core"),)
    assert parse_kmp_hw_subset("-1c").items == (HwSubsetItem("socket"),)
    assert parse_kmp_hw_subset("1o").items == (HwSubsetItem("socket", 1),)
    assert parse_kmp_hw_subset("99999999999c").items == (HwSubsetItem("core", 1215752191),)


# ---------------------------------------------------------------- OMP_NUM_THREADS / GOMP


@pytest.mark.parametrize(("text", "values"), [
    ("4", (4,)), ("4,2", (4, 2)), (" 4 ", (4,)), ("04", (4,)), (",4", (None, 4)), ("1,,2", (1, 1, 2)),
    ("4,", (4,)), (",", (None,)), (",,", (None, None)), (",,3", (None, None, 3)),
])
def test_num_threads(text: str, values: tuple[int | None, ...]) -> None:
    assert parse_num_threads(text).values == values


def test_num_threads_lenient() -> None:
    assert parse_num_threads("all").all
    v, d = parse_lenient("OMP_NUM_THREADS", "0")
    assert v == NumThreads((1,)) and [x.text for x in d] == ['OMP_NUM_THREADS="0": value too small.']
    for bad in ("-1", "abc", "3x", "+4", "4 5", "4,x"):
        v, d = parse_lenient("OMP_NUM_THREADS", bad)
        assert v is None and [x.text for x in d] == [f'OMP_NUM_THREADS: "{bad}" is an invalid value; ignored.']
    assert parse_lenient("OMP_NUM_THREADS", "") == (None, [])


def test_gomp_cpu_affinity() -> None:
    assert parse_gomp_cpu_affinity("0 3 1-2 4-10:2").places() == [(0,), (3,), (1,), (2,), (4,), (6,), (8,), (10,)]
    v, d = parse_lenient("GOMP_CPU_AFFINITY", "1 2 x")
    assert v is None and [x.text for x in d] == ["GOMP_CPU_AFFINITY: syntax error, not using affinity."]


def test_settings_roundtrip() -> None:
    s = Settings.from_env({"KMP_AFFINITY": "granularity=fine,compact", "OMP_NUM_THREADS": "8",
                           "OMP_PLACES": "cores(4)", "OMP_PROC_BIND": "spread,close", "KMP_HW_SUBSET": "1s,2c",
                           "PATH": "/bin"})
    assert Settings.parse(str(s)) == s
    assert str(s) == ("KMP_AFFINITY=granularity=fine,compact KMP_HW_SUBSET=1s,2c OMP_NUM_THREADS=8 "
                      "OMP_PLACES=cores(4) OMP_PROC_BIND=spread,close")
    with pytest.raises(SpecError):
        Settings.parse("FOO=1")


def test_a_value_in_a_string_of_assignments_runs_to_the_next_name_equals() -> None:
    """libgomp's GOMP_CPU_AFFINITY is a blank-separated list: in one string of assignments
    (a spec, Settings.parse) a value goes on until the next word of the form NAME= (it
    stopped at the first blank: 'GOMP_CPU_AFFINITY=0 2 4 6' failed with got '2')."""
    from affinity.planning.spec import parse_assignments

    assert parse_assignments("GOMP_CPU_AFFINITY=0 2 4 6") == {"GOMP_CPU_AFFINITY": "0 2 4 6"}
    assert parse_assignments(" GOMP_CPU_AFFINITY=3  1-2:1 OMP_PROC_BIND=true ") == {
        "GOMP_CPU_AFFINITY": "3  1-2:1", "OMP_PROC_BIND": "true"}
    assert parse_assignments("OMP_PLACES=cores OMP_PROC_BIND=spread") == {"OMP_PLACES": "cores",
                                                                         "OMP_PROC_BIND": "spread"}
    assert Settings.parse("GOMP_CPU_AFFINITY=0 2 4 OMP_PROC_BIND=true") == Settings.from_env(
        {"GOMP_CPU_AFFINITY": "0,2,4", "OMP_PROC_BIND": "true"})
    with pytest.raises(SpecError, match=r"got 'OMP_PLACE=cores': did you mean OMP_PLACES\?\n"
                                        r"    GOMP_CPU_AFFINITY=0 2 OMP_PLACE=cores\n {26}\^"):
        parse_assignments("GOMP_CPU_AFFINITY=0 2 OMP_PLACE=cores")  # a mistyped name is no value
    with pytest.raises(SpecError, match=r"got '0'"):
        parse_assignments("0 GOMP_CPU_AFFINITY=2")  # nothing to go on from


def test_values_are_frozen_and_hashable() -> None:
    a = parse_kmp_affinity("granularity=fine,compact")
    with pytest.raises(AttributeError):
        a.type = "scatter"  # type: ignore[misc]
    assert hash(a) == hash(parse_kmp_affinity("compact,granularity=fine"))
    p, q = parse_omp_places("{0:4}:4:4"), parse_omp_places("{0:4}:4:4")
    assert p == q and hash(p) == hash(q) and len({p, q, parse_omp_places("{0:4}:4:2")}) == 2
    assert {a: "x"}[parse_kmp_affinity("granularity=fine,compact")] == "x"  # usable as a key


def test_non_string_input() -> None:
    with pytest.raises(TypeError):
        parse_kmp_affinity(3)  # type: ignore[arg-type]


# ---------------------------------------------------------------- properties

_gran = st.sampled_from(["thread", "core", "socket", "numa_domain", "die", "tile", "l2_cache", "ll_cache",
                         "core_type", "core_efficiency", None])
_small = st.integers(min_value=0, max_value=200)
_item = st.one_of(_small, st.builds(lambda a, n, s: ProcRange(a, a + n * s, s), _small, st.integers(0, 9),
                                    st.integers(1, 4)),
                  st.builds(lambda xs: tuple(sorted(set(xs))), st.lists(_small, min_size=2, max_size=4)).filter(
                      lambda t: len(t) > 1))
_proclist = st.builds(lambda xs: ProcList(tuple(xs)), st.lists(_item, min_size=1, max_size=5))


@st.composite
def kmp_affinities(draw: st.DrawFn) -> KmpAffinity:
    typ = draw(st.sampled_from([None, "none", "compact", "scatter", "balanced", "explicit", "disabled", "logical",
                                "physical"]))
    kw: dict = {"type": typ}
    if draw(st.booleans()):
        kw["granularity"] = draw(_gran)
    elif draw(st.booleans()):
        kw["granularity_levels"] = draw(st.integers(0, 5))
    for flag in ("verbose", "warnings", "respect", "reset", "dups"):
        kw[flag] = draw(st.sampled_from([None, True, False]))
    if typ == "explicit":
        kw["proclist"] = draw(_proclist)
    if typ in ("compact", "scatter", "balanced"):
        p = draw(st.one_of(st.none(), _small))
        o = draw(st.one_of(st.none(), _small)) if p is not None else None
        kw["permute"], kw["offset"] = p, o
    if typ in ("logical", "physical"):
        kw["offset"] = draw(st.one_of(st.none(), _small))
    return KmpAffinity(**kw)


@given(kmp_affinities())
def test_kmp_affinity_str_roundtrips(a: KmpAffinity) -> None:
    assert parse_kmp_affinity(str(a)) == a


_sub = st.builds(SubPlace, _small, st.one_of(st.none(), st.integers(0, 8)), st.none()) | st.builds(
    SubPlace, _small, st.integers(0, 8), st.integers(-3, 3))
_place = st.recursive(
    st.builds(lambda m: Place(members=tuple(m)), st.lists(_sub, min_size=1, max_size=3)) | st.builds(
        lambda p: Place(proc=p), _small),
    lambda inner: st.builds(lambda p: Place(exclude=p), inner), max_leaves=3)


@st.composite
def omp_places(draw: st.DrawFn) -> OmpPlaces:
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["threads", "cores", "sockets", "numa_domains", "ll_caches", "l2_caches",
                                     "tiles", "dice", "modules", "core_types", "core_effs"]))
        attr = draw(st.sampled_from([None, "intel_atom", "intel_core", "eff0", "eff2"])) if kind == "cores" else None
        count = None if kind in ("core_types", "core_effs") else draw(st.one_of(st.none(), st.integers(1, 64)))
        return OmpPlaces(kind=kind, attribute=attr, count=count)
    places = []
    for p in draw(st.lists(_place, min_size=1, max_size=4)):
        if draw(st.booleans()):
            p = Place(p.members, p.proc, p.exclude, draw(st.integers(0, 5)),
                      draw(st.one_of(st.none(), st.integers(-4, 4))))
        places.append(p)
    return OmpPlaces(places=tuple(places))


@given(omp_places())
def test_omp_places_str_roundtrips(p: OmpPlaces) -> None:
    assert parse_omp_places(str(p)) == p


@given(st.lists(st.sampled_from(["primary", "close", "spread"]), min_size=1, max_size=4) | st.sampled_from(
    [["true"], ["false"], ["disabled"]]))
def test_omp_proc_bind_str_roundtrips(pols: list[str]) -> None:
    v = OmpProcBind(tuple(pols))
    assert parse_omp_proc_bind(str(v)) == v


_layers = ["socket", "core", "thread", "numa_domain", "die", "tile", "module", "l1_cache", "l2_cache", "l3_cache",
           "ll_cache"]


@st.composite
def hw_subsets(draw: st.DrawFn) -> KmpHwSubset:
    layers = draw(st.lists(st.sampled_from(_layers), min_size=1, max_size=5, unique=True))
    items = []
    for layer in layers:
        attr = draw(st.sampled_from([None, "intel_atom", "eff1"])) if layer == "core" else None
        items.append(HwSubsetItem(layer, draw(st.one_of(st.none(), st.integers(1, 99))), draw(st.integers(0, 9)),
                                  attr))
    return KmpHwSubset(tuple(items), draw(st.booleans()))


@given(hw_subsets())
def test_hw_subset_str_roundtrips(s: KmpHwSubset) -> None:
    assert parse_kmp_hw_subset(str(s)) == s


def _leading_nones_only(v: list[int | None]) -> bool:
    """Parsed lists leave only leading levels empty (",,4")."""
    k = 0
    while k < len(v) and v[k] is None:
        k += 1
    return all(x is not None for x in v[k:])


@given(st.lists(st.one_of(st.none(), st.integers(1, 10**6)), min_size=1, max_size=4).filter(_leading_nones_only))
def test_num_threads_str_roundtrips(values: list[int | None]) -> None:
    v = NumThreads(tuple(values))
    assert parse_num_threads(str(v)) == v


_ALPHABET = st.sampled_from(list("0123456789,:;=[]{}()!-+@*&x kKmMoOtsScCnNlL_") +
                            ["compact", "scatter", "granularity", "fine", "core", "proclist", "explicit", "threads",
                             "cores", "sockets", "spread", "close", "master", "intel_atom", "eff", "\t", "é", "²"])
_fuzz = st.lists(_ALPHABET, max_size=12).map("".join) | st.text(max_size=30)
_PARSERS = {"KMP_AFFINITY": parse_kmp_affinity, "OMP_PLACES": parse_omp_places,
            "OMP_PROC_BIND": parse_omp_proc_bind, "KMP_HW_SUBSET": parse_kmp_hw_subset,
            "OMP_NUM_THREADS": parse_num_threads, "GOMP_CPU_AFFINITY": parse_gomp_cpu_affinity}


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(_PARSERS)), _fuzz)
def test_random_strings_strict_raise_only_spec_error(var: str, text: str) -> None:
    try:
        v = _PARSERS[var](text)
    except SpecError as e:
        assert e.text == text and 0 <= (e.pos or 0) <= len(text)
    else:
        if v is not None:  # a valid string: its canonical form reads back the same
            assert _PARSERS[var](str(v)) == v


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(_PARSERS)), _fuzz)
def test_random_strings_lenient_never_raise(var: str, text: str) -> None:
    value, diags = parse_lenient(var, text)
    assert all(isinstance(d.text, str) and d.text for d in diags)
    try:
        strict_value = _PARSERS[var](text)
    except SpecError:
        assert any(d.error for d in diags)
    else:
        assert strict_value == value


# ---------------------------------------------------------------- the one table of variables


def test_every_variable_is_defined_once_in_the_table() -> None:
    """Variable, value type, parser, Settings attribute and export: one row each,
    and everything else (the names, Settings, the parsers by name, Intel's rules)
    follows the table."""
    from affinity.record import fields

    from affinity.planning import spec
    from affinity.planning.intel import runtime as intel

    names = [v.name for v in spec.VARIABLES]
    assert tuple(names) == spec.SETTINGS_VARIABLES == tuple(sorted(names))
    assert {v.attribute for v in spec.VARIABLES if v.exported} == {f.name for f in fields(Settings)}
    assert set(intel._APPLY) == set(names) and set(intel._RIVALS) <= set(names)
    full = Settings.parse("GOMP_CPU_AFFINITY=0-3 KMP_AFFINITY=compact KMP_HW_SUBSET=1s OMP_NUM_THREADS=2 "
                          "OMP_PLACES=cores OMP_PROC_BIND=close")
    for var in spec.VARIABLES:
        if var.exported:
            value = getattr(full, var.attribute)
            assert isinstance(value, var.type) and full.to_env()[var.name] == str(value)
            assert parse_lenient(var.name, str(value))[0] == value
    assert Settings.of({v.name: getattr(full, v.attribute) for v in spec.VARIABLES if v.exported}) == full
    assert Settings.from_env({"KMP_PLACE_THREADS": "1s"}) == Settings()  # read, never exported


def test_a_strict_plan_parses_each_variable_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from affinity.machine.topology import Topology
    from affinity.planning import planner, spec
    from affinity.planning.planner import plan

    calls: list[str] = []
    real = spec.run_parser

    def counting(fn, value, strict, what, *rest):  # type: ignore[no-untyped-def]
        calls.append(what)
        return real(fn, value, strict, what, *rest)

    monkeypatch.setattr(spec, "run_parser", counting)
    planner._read.cache_clear()
    env = {"KMP_AFFINITY": "granularity=fine,compact", "OMP_NUM_THREADS": "3", "KMP_HW_SUBSET": "1s"}
    topo = Topology.from_synthetic("package:2 core:2 pu:2")
    p = plan(env, topology=topo)
    assert sorted(calls) == sorted(env)
    assert plan(env, topology=topo) == p and sorted(calls) == sorted(env)  # the read is memoized
    assert p.settings == Settings.of({k: real(spec._parser(k), v, True, k)[0] for k, v in env.items()})
