"""``runtime="llvm"`` against what LLVM's libomp 19 really did, case by case.

Every golden case records libomp 19's outcome beside libiomp5's
(``other_runtimes.libomp19``): where the two agree, libomp's team and masks are
libiomp5's; where they differ the shared golden files record libomp's masks, and
``tests/golden_extra`` records only that it differed -- its masks are in
``tests/planning/golden_llvm/`` (the same cases run through the real libomp 19 by
the oracle, ``oracle/runtime.py``: ``run_cases(..., ("libomp19",))``).  Where
libomp crashed (``rc`` not 0) the planner must raise :class:`PlanError`.

The test checks 100% of them: team size, every thread's mask, and the warnings
libomp printed (each distinct line once, as the harness records them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from affinity.cpulist import parse_list
from affinity.errors import PlanError
from affinity.machine.topology import Topology
from affinity.planning.intel import llvm
from affinity.planning.planner import RUNTIMES, plan, plan_env
from helpers import ROOT, golden_dir

EXTRA = ROOT / "tests" / "golden_extra"
LLVM_EXTRA = Path(__file__).parent / "golden_llvm"
PREFIX = re.compile(r"^OMP: (Warning|Error|Hint) #\d+: ")


def _json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def _files() -> list[tuple[Path, Path]]:
    return [(d, f) for d in (golden_dir(), EXTRA) if d.is_dir()
            for f in sorted(d.glob("*.json")) if f.name not in ("index.json", "doc_checks.json")]


FILES = _files()


def _decode(sets: Any) -> Any:
    if sets is None:
        return None
    return [sorted(parse_list(m)) if isinstance(m, str) else m for m in sets]


def _key(env: dict[str, str], mask: Any) -> str:
    return json.dumps(env, sort_keys=True) + " " + str(mask)


def expected(case: dict[str, Any], runs: dict[str, dict[str, Any]]) -> tuple[Any, ...]:
    """libomp 19's (rc, team size, masks, warnings) for a golden case."""
    other = case["other_runtimes"]["libomp19"]
    warnings = [PREFIX.sub("", w) for w in other["warnings"]]
    if other["rc"] != 0:
        return other["rc"], None, None, warnings
    if other["agree"] and case["rc"] == 0:
        return 0, case["nthreads"], _decode(case["masks"]), warnings
    if "masks" in other:
        return 0, other["nthreads"], _decode(other["masks"]), warnings
    run = runs[_key(case["env"], case.get("initial_mask"))]
    return 0, run["nthreads"], _decode(run["masks"]), [PREFIX.sub("", w) for w in run["warnings"]]


def _runs(name: str) -> dict[str, dict[str, Any]]:
    path = LLVM_EXTRA / name
    if not path.exists():
        return {}
    return {_key(c["env"], c.get("initial_mask")): c for c in _json(path)["cases"]}


def _topology(d: Path, f: Path, source: str) -> Topology | None:
    doc = _json(f)
    if "cpuinfo_file" not in doc:
        doc = _json(d / f.name.replace("_malformed", ""))
    if source == "xml":
        return Topology.from_xml(d / doc["hwloc_xml"]) if doc.get("hwloc_xml") else None
    return Topology.from_cpuinfo(d / doc["cpuinfo_file"], numa_nodes=d / doc["fake_sysfs_node_dir"])


def outcome(topo: Topology, case: dict[str, Any], runtime: str) -> tuple[Any, ...]:
    """The planner's (ran?, team size, masks, distinct warnings) for a case."""
    try:
        p = plan_env(case["env"], topology=topo, initial_mask=case.get("initial_mask"), runtime=runtime)
    except PlanError:
        return "crash", None, None, None
    return 0, p.threads, [sorted(s) for s in p.cpusets], list(dict.fromkeys(p.warnings))


def _has_xml(d: Path, f: Path) -> bool:
    doc = _json(f)
    if "cpuinfo_file" not in doc:
        doc = _json(d / f.name.replace("_malformed", ""))
    return bool(doc.get("hwloc_xml"))


def _params() -> list[Any]:
    return [pytest.param(d, f, source, id=f"{'extra/' if d == EXTRA else ''}{f.stem}-{source}")
            for d, f in FILES for source in ("cpuinfo", "xml") if source == "cpuinfo" or _has_xml(d, f)]


@pytest.mark.parametrize(("gdir", "path", "source"), _params())
def test_llvm_reproduces_libomp19(gdir: Path, path: Path, source: str) -> None:
    topo = _topology(gdir, path, source)
    assert topo is not None
    runs = _runs(path.name)
    failures = []
    for case in _json(path)["cases"]:
        rc, nthreads, masks, warnings = expected(case, runs)
        got = outcome(topo, case, "llvm")
        if rc != 0:
            ok = got[0] == "crash"
        else:
            ok = got == (0, nthreads, masks, warnings)
        if not ok:
            failures.append(f"env={case['env']} mask={case.get('initial_mask')}: planned {str(got)[:200]}, "
                            f"libomp 19 {str((rc, nthreads, masks, warnings))[:200]}")
    assert not failures, f"{len(failures)} cases differ from libomp 19:\n" + "\n".join(failures[:20])


def test_the_golden_data_tells_the_runtimes_apart() -> None:
    """The cases where libomp 19 differs from libiomp5 are many, every one has
    libomp's answer on record, and Intel's rules get them wrong: the test above
    can fail."""
    differ = 0
    for d, f in FILES:
        topo = _topology(d, f, "cpuinfo")
        runs = _runs(f.name)
        for case in _json(f)["cases"]:
            other = case["other_runtimes"]["libomp19"]
            if other["agree"] and other["rc"] == case["rc"]:
                continue
            rc, nthreads, masks, _w = expected(case, runs)  # KeyError: a libomp answer missing
            intel = outcome(topo, case, "intel")
            assert (intel[0] == "crash") != (rc != 0) or intel[1:3] != (nthreads, masks), case["env"]
            differ += 1
    assert differ >= 2000, differ


def test_llvm_dialect_differences(tmp_path: Path) -> None:
    """The rules one by one, on 2 packages x 4 cores with two NUMA nodes per package."""
    text = "".join(f"processor\t: {p}\nphysical id\t: {p // 4}\ncore id\t\t: {p % 4}\n\n" for p in range(8))
    (tmp_path / "m.cpuinfo").write_text(text)
    topo = Topology.from_cpuinfo(tmp_path / "m.cpuinfo", numa_nodes={0: [0, 1], 1: [2, 3], 2: [4, 5], 3: [6, 7]})

    def both(**env: str) -> tuple[Any, Any]:
        return tuple(plan_env(env, topology=topo, runtime=r) for r in ("intel", "llvm"))  # type: ignore[return-value]

    intel, lib = both(OMP_PLACES="numa_domains", OMP_PROC_BIND="close", OMP_NUM_THREADS="2")
    assert [sorted(s) for s in intel.cpusets] == [[0, 1], [2, 3]] and not intel.warnings
    assert [sorted(s) for s in lib.cpusets] == [[0], [1]]  # no NUMA layer: cores instead, with a warning
    assert "NUMA domain does not exist in topology" in lib.warnings[0] and lib.runtime == "llvm"
    intel, lib = both(KMP_AFFINITY="granularity=fine,compact,0,99999999999", OMP_NUM_THREADS="1")
    assert sorted(intel.cpusets[0]) == [2147483647 % 8] and sorted(lib.cpusets[0]) == [1215752191 % 8]
    intel, lib = both(OMP_PLACES="{0", OMP_NUM_THREADS="2")
    assert intel.warnings == ("OMP_PLACES: syntax error, using threads.",)
    assert lib.warnings == ("OMP_PLACES: syntax error, using cores.",)
    for env in ({"OMP_NUM_THREADS": "abc"}, {"OMP_NUM_THREADS": ""}, {"OMP_PLACES": "!{0}"},
                {"KMP_AFFINITY": "granularity=fine,compact,proclist=[0,1]"}):
        assert plan_env(env, topology=topo, runtime="intel").threads >= 1
        with pytest.raises(PlanError, match="libomp 19"):
            plan_env(env, topology=topo, runtime="llvm")
    assert plan_env({"OMP_NUM_THREADS": "2147483648"}, topology=topo, runtime="llvm").threads == 1
    with pytest.raises(PlanError):
        plan_env({"OMP_NUM_THREADS": "2147483648"}, topology=topo, runtime="intel")


def test_llvm_is_registered_and_strict_plans_work(tmp_path: Path) -> None:
    assert RUNTIMES["llvm"] is llvm and llvm.LLVM.name == "llvm"
    topo = Topology.from_synthetic("package:2 core:4 pu:2")
    p = plan("granularity=fine,scatter", 4, topo, runtime="llvm")
    assert p.runtime == "llvm" and p.to_dict()["runtime"] == "llvm" and "by llvm rules" in repr(p)
    assert p.cpusets == plan("granularity=fine,scatter", 4, topo).cpusets
