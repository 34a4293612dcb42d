"""Replaying the libgomp golden cases (shared by the tests and the match-rate report)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from affinity.cpulist import format_list, parse_list
from affinity.errors import PlanError
from affinity.machine.topology import Topology
from affinity.planning.gnu import plan_gomp

GOLDEN = Path(__file__).resolve().parents[2] / "golden_gomp"
MACHINES = ("2s4c2t_linux", "doc_2s4c2t_interleaved", "skx8180_2s28c2t")
#: machines whose sysfs and hwloc's objects differ (recorded by ``python -m oracle.gomp_record``):
#: AMD compute units, clusters whose core ids restart, dies whose core ids restart
KINDS = ("amd_cu_2s4u2c", "cluster_2s2k4c", "die_2s2d4c2t")
BUILD_KEYS = {"gcc12": "gomp12", "torch": "gomp_torch"}


@lru_cache(maxsize=None)
def doc(machine: str) -> dict[str, Any]:
    with open(GOLDEN / f"{machine}.json") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def topology(machine: str) -> Topology:
    return Topology.from_xml(GOLDEN / "hwloc" / f"{machine}.xml")


@lru_cache(maxsize=None)
def cpuinfo_topology(machine: str) -> Topology:
    """The same machine from the Intel golden set's cpuinfo file and NUMA lists
    (no caches: the planner takes one per package)."""
    from helpers import golden_dir

    d = golden_dir()
    with open(d / f"{machine}.json") as f:
        meta = json.load(f)
    return Topology.from_cpuinfo(d / meta["cpuinfo_file"], numa_nodes=d / meta["fake_sysfs_node_dir"])


def expected(case: dict[str, Any], build: str) -> dict[str, Any]:
    """The recorded result of ``build`` for ``case``."""
    key = BUILD_KEYS[build]
    return case.get("by_runtime", {}).get(key, case) if key != "gomp12" else case


def _partition(off: int, n: int) -> str:
    return format_list(range(off, off + n))


def replay(machine: str, case: dict[str, Any], build: str, topo: Topology | None = None) -> dict[str, Any]:
    """The planner's result in the golden file's terms (``rc`` 'refused' on PlanError);
    the machine from its XML unless ``topo`` is given."""
    mask = case.get("initial_mask")
    try:
        p = plan_gomp(case["env"], topo or topology(machine), None if mask is None else parse_list(mask), build)
    except PlanError as e:
        return {"rc": "refused", "error": str(e)}
    return {
        "rc": 0, "nthreads": p.threads, "masks": [format_list(s) for s in p.cpusets],
        "places": [format_list(s) for s in p.places] if p.places else [],
        "num_places": len(p.places) if p.places else 0,
        "init_mask": format_list(p.init_mask), "proc_bind": p.proc_bind_value,
        "place_nums": list(p.place_nums), "num_procs": p.num_procs, "max_threads": p.max_threads,
        "partitions": [_partition(*pt) if n >= 0 else None for pt, n in zip(p.partitions, p.place_nums)],
        "warnings": ["libgomp: " + w for w in p.warnings],
    }


FIELDS = ("nthreads", "masks", "places", "init_mask", "proc_bind", "place_nums", "num_procs", "max_threads",
          "warnings", "partitions")


def differences(machine: str, case: dict[str, Any], build: str,
                topo: Topology | None = None) -> dict[str, tuple[Any, Any]]:
    """Field -> (recorded, planned) for every field that differs."""
    want = expected(case, build)
    got = replay(machine, case, build, topo)
    if want["rc"] != 0:
        return {} if got["rc"] == "refused" else {"rc": (want["rc"], got["rc"])}
    if got["rc"] != 0:
        return {"rc": (0, got.get("error"))}
    out = {}
    for f in FIELDS:
        w = want.get(f)
        if f == "places" and w is None:
            w = []
        if f == "partitions" and w is not None:
            w = [x if n >= 0 else None for x, n in zip(w, want["place_nums"])]
        if w != got[f]:
            out[f] = (w, got[f])
    return out
