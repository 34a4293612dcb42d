"""The planner against the real Intel OpenMP runtime, case by case.

Every case of every golden file is planned with :func:`affinity.plan_env`
and must match what libiomp5 did: team size, every thread's OS-proc set,
the warnings (texts, without the ``OMP: Warning #NNN:`` prefix), the place
list where the case records it; where the runtime crashed the planner must
raise :class:`~affinity.errors.PlanError`.

Golden files: the project's shared golden data (``golden_dir()``, the six
visible machines and their malformed settings) and ``tests/golden_extra``
(machines invented for this test and run through the real runtime by
``oracle/golden_check.py``).  Each machine is loaded twice: from its cpuinfo
file plus NUMA node lists, and from its hwloc XML export.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from affinity.cpulist import format_list, parse_list
from affinity.errors import PlanError
from affinity.planning.planner import plan_env
from affinity.machine.topology import Topology
from helpers import ROOT, golden_dir

EXTRA = ROOT / "tests" / "golden_extra"
PREFIX = re.compile(r"^OMP: (Warning|Error|Hint) #\d+: ")


def _files() -> list[tuple[Path, Path]]:
    out = []
    for d in (golden_dir(), EXTRA):
        if d.is_dir():
            for f in sorted(d.glob("*.json")):
                if f.name in ("index.json", "doc_checks.json"):
                    continue
                out.append((d, f))
    return out


FILES = _files()
_DOCS: dict[Path, dict[str, Any]] = {}


def _doc(path: Path) -> dict[str, Any]:
    if path not in _DOCS:
        with open(path) as f:
            _DOCS[path] = json.load(f)
    return _DOCS[path]


def _base_doc(d: Path, f: Path) -> dict[str, Any]:
    """The machine description: a ``*_malformed.json`` file describes the
    same machine as its base file."""
    doc = _doc(f)
    if "cpuinfo_file" in doc:
        return doc
    base = d / f.name.replace("_malformed", "")
    return _doc(base)


_TOPOS: dict[tuple[Path, str], Topology] = {}


def _topology(d: Path, f: Path, source: str) -> Topology:
    doc = _base_doc(d, f)
    key = (d / doc["cpuinfo_file"], source)
    if key not in _TOPOS:
        if source == "cpuinfo":
            _TOPOS[key] = Topology.from_cpuinfo(d / doc["cpuinfo_file"], numa_nodes=d / doc["fake_sysfs_node_dir"])
        else:
            _TOPOS[key] = Topology.from_xml(d / doc["hwloc_xml"])
    return _TOPOS[key]


def _dedup(ws: Any) -> list[str]:
    out: list[str] = []
    for w in ws:
        if w not in out:
            out.append(w)
    return out


def _fmt(masks: Any) -> str:
    if masks is None:
        return "None"
    s = " ".join("{" + format_list(m) + "}" for m in masks)
    return s if len(s) < 240 else s[:240] + "..."


def _decode(sets: Any) -> Any:
    """Lists of ids (shared golden data) or cpulist strings (golden_extra)."""
    if sets is None:
        return None
    return [sorted(parse_list(m)) if isinstance(m, str) else m for m in sets]


def check_case(topo: Topology, case: dict[str, Any]) -> str | None:
    """None when the plan reproduces the runtime's result, else why not."""
    case = dict(case, masks=_decode(case.get("masks")), places=_decode(case.get("places")))
    expected_warnings = [PREFIX.sub("", w) for w in case["warnings"]]
    try:
        p = plan_env(case["env"], topology=topo, initial_mask=case.get("initial_mask"))
    except PlanError as e:
        if case["rc"] != 0:
            return None
        return f"PlanError: {e}"
    if case["rc"] != 0:
        return f"the runtime failed (rc={case['rc']}) but a plan of {p.threads} threads was made"
    problems = []
    if p.threads != case["nthreads"]:
        problems.append(f"team size {p.threads}, runtime {case['nthreads']}")
    got = [sorted(s) for s in p.cpusets]
    if got != case["masks"]:
        problems.append(f"sets {_fmt(got)}, runtime {_fmt(case['masks'])}")
    warnings = _dedup(p.warnings)  # the harness records each distinct line once
    if bool(warnings) != bool(expected_warnings):
        problems.append(f"warns={bool(warnings)}, runtime warns={bool(expected_warnings)}")
    if warnings != expected_warnings:
        problems.append(f"warnings {warnings}, runtime {expected_warnings}")
    if case.get("places") is not None:
        places = [sorted(s) for s in p.places] if p.places else []
        if places != case["places"]:
            problems.append(f"places {_fmt(places)}, runtime {_fmt(case['places'])}")
    return "; ".join(problems) or None


def _params() -> list[Any]:
    out = []
    for d, f in FILES:
        sections = sorted({c["section"] for c in _doc(f)["cases"]})
        has_xml = bool(_base_doc(d, f).get("hwloc_xml"))
        tag = "extra/" if d == EXTRA else ""
        for section in sections:
            out.append(pytest.param(d, f, section, "cpuinfo", id=f"{tag}{f.stem}-{section}-cpuinfo"))
            if has_xml:
                out.append(pytest.param(d, f, section, "xml", id=f"{tag}{f.stem}-{section}-xml"))
    return out


def test_golden_files_present() -> None:
    names = {f.name for _d, f in FILES}
    assert len([n for n in names if not n.endswith("_malformed.json")]) >= 6, names
    assert any(n.endswith("_malformed.json") for n in names)
    total = sum(len(_doc(f)["cases"]) for _d, f in FILES)
    assert total >= 5000


@pytest.mark.parametrize(("gdir", "path", "section", "source"), _params())
def test_golden(gdir: Path, path: Path, section: str, source: str) -> None:
    topo = _topology(gdir, path, source)
    cases = [c for c in _doc(path)["cases"] if c["section"] == section]
    assert cases
    failures = []
    for c in cases:
        why = check_case(topo, c)
        if why:
            failures.append(f"env={c['env']} initial_mask={c.get('initial_mask')}: {why}")
    assert not failures, f"{len(failures)}/{len(cases)} cases differ from the runtime:\n" + "\n".join(failures[:25])


# ---------------------------------------------------------------------------
# Live differential test: the real runtime on machines made up on the spot
# ---------------------------------------------------------------------------

def _runtimes() -> Any:
    """The real runtimes built by ``oracle/setup.sh``, which ``make test`` runs before
    pytest (``make oracle``): no test downloads anything.  Missing, the test fails
    and says how to prepare them."""
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from oracle.runtime import find_runtimes

    rts = find_runtimes()
    if rts is None:
        pytest.fail("the real OpenMP runtimes are not prepared: run `make oracle` (oracle/setup.sh, "
                    "which `make test` runs first; it needs gcc and PyPI/Debian access)")
    return rts


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 23, 37])
def test_live_runtime_random_machine(seed: int, tmp_path: Path) -> None:
    """Intel's libiomp5, run under the oracle's fake-kernel shim on a random
    machine (sparse ids, unequal packages, SMT-1..4, shuffled numbering, SNC
    or spanning NUMA nodes), against the planner: a sample of the oracle's
    case matrix must match exactly."""
    import random

    rts = _runtimes()
    from oracle.cases import build_cases
    from oracle.golden_check import case_record, compare_case
    from oracle.machines import random_machine
    from oracle.runtime import run_cases

    m = random_machine(seed)
    cases = build_cases(m)
    cases = random.Random(seed).sample(cases, min(200, len(cases)))
    results = run_cases(rts, m, cases, ("libiomp5",), root=str(tmp_path))
    topo = Topology.from_cpuinfo(tmp_path / "cpuinfo" / (m.name + ".cpuinfo"),
                                 numa_nodes=tmp_path / "fakesys" / m.name / "node")
    failures = []
    for r in results:
        rec = case_record(r)
        why = compare_case(topo, rec)
        if why:
            failures.append(f"env={rec['env']} initial_mask={rec.get('initial_mask')}: {why}")
    assert not failures, f"{m.description}: {len(failures)}/{len(results)} differ:\n" + "\n".join(failures[:20])
