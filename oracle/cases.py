"""The test matrix run on every invented machine.

Sections follow the shared golden data (``kmp_affinity``,
``kmp_affinity_extra``, ``kmp_hw_subset``, ``omp_places``,
``initial_mask``) plus ``numa`` (granularities and places by layer),
``balanced`` (non-uniform and oversubscribed teams) and ``malformed`` (the
malformed settings of the shared golden data, replayed).
"""

from __future__ import annotations

import json
import os
from typing import Any

from .runtime import Machine

BASE_SPECS = ["compact", "scatter", "compact,1", "compact,1,0", "compact,2", "scatter,1", "compact,0,3",
              "compact,1,4", "scatter,0,2", "balanced", "explicit,proclist=[0,3,5-7]",
              "explicit,proclist=[{0,1},{2,3}]", "none", "disabled", "logical,1", "physical,1"]
GRANULARITIES = [None, "fine", "core"]
EXTRA_SPECS = ["granularity=socket,compact", "granularity=socket,scatter", "granularity=tile,compact",
               "granularity=core,nodups,compact", "granularity=core,nodups,scatter",
               "granularity=fine,compact,3", "granularity=fine,scatter,0,100", "granularity=fine,compact,0,1",
               "granularity=numa_domain,compact", "granularity=numa_domain,scatter",
               "granularity=ll_cache,compact", "granularity=l2_cache,scatter", "granularity=die,compact",
               "granularity=2,compact", "granularity=1,scatter", "norespect,granularity=fine,compact",
               "granularity=fine,explicit,proclist=[0-7:2]", "granularity=fine,explicit,proclist=[7-0:-3,{1,2,3}]",
               "granularity=fine,physical", "granularity=fine,logical,2"]
HW_SUBSETS = ["1s,4c,1t", "1T", "2c,1t", "1s", "2s,2c,2t", "4c@2,1t", "1s@1,2c@1,1t@1", "5C@1,3T",
              "1n", "2n,1c", "1n@1,2c", "*s,2c@1", "1c,*t", ":2c", ":1s,3c", ":1t", "3c:intel_atom",
              "1l2", "1ll,2c", "1d", "2c&1c:intel_core", "1s,1n"]
HW_SUBSET_AFFINITY = [None, "granularity=fine,compact", "granularity=fine,scatter", "granularity=core,compact"]
PLACES = ["threads", "cores", "sockets", "cores(3)", "numa_domains", "ll_caches", "{0,1},{2,3},{4,5},{6,7}",
          "{0:2}:4:2", "!{0}", None]
PROC_BINDS = ["close", "spread", "primary", "true", None]
INITIAL_MASK_SPECS = [None, "granularity=fine,compact", "granularity=fine,scatter", "granularity=core,compact",
                      "granularity=core,scatter", "norespect,granularity=fine,compact", "granularity=fine,balanced",
                      "none", "disabled", "OMP:cores:spread", "OMP:threads:close", "HW:1s,2c"]


def thread_counts(m: Machine) -> list[int]:
    P = len(m.hw_threads)
    C = len({(h[1], h[2]) for h in m.hw_threads})
    return sorted({1, 3, 5, C, P, P + 3})


def _places_count(m: Machine, pl: str | None) -> int:
    P = len(m.hw_threads)
    C = len({(h[1], h[2]) for h in m.hw_threads})
    S = len({h[1] for h in m.hw_threads})
    if pl is None or pl.startswith("threads"):
        return P
    if pl.startswith("cores"):
        return min(C, 3) if "(" in pl else C
    if pl.startswith("sockets"):
        return S
    if pl.startswith("{"):
        return max(pl.count("{"), 4)
    return max(len(m.numa_nodes), 1)


def malformed_envs() -> list[dict[str, str]]:
    """The malformed settings of the shared golden data (one env per entry,
    without OMP_NUM_THREADS)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "..", "shared", "golden", "1s4c1t_malformed.json"),
                 os.path.join(here, "..", "tests", "golden", "1s4c1t_malformed.json")):
        if os.path.exists(cand):
            with open(cand) as f:
                d = json.load(f)
            out, seen = [], set()
            for c in d["cases"]:
                env = {k: v for k, v in c["env"].items() if k != "OMP_NUM_THREADS"}
                if "OMP_NUM_THREADS" in c["env"] and not env:
                    env = dict(c["env"])
                key = json.dumps(env, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    out.append(env)
            return out
    return []


def build_cases(m: Machine, *, sections: set[str] | None = None) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    P = len(m.hw_threads)
    C = len({(h[1], h[2]) for h in m.hw_threads})

    def add(section: str, env: dict[str, str], threads: int | None, initial_mask: str | None = None) -> None:
        if sections and section not in sections:
            return
        e = dict(env)
        if threads is not None:
            e["OMP_NUM_THREADS"] = str(threads)
        c: dict[str, Any] = {"section": section, "spec": env.get("KMP_AFFINITY"), "env": e, "threads": threads}
        if initial_mask:
            c["initial_mask"] = initial_mask
        cases.append(c)

    counts = thread_counts(m)
    for base in BASE_SPECS:
        for g in GRANULARITIES:
            spec = ("granularity=%s," % g if g else "") + base
            for n in counts:
                add("kmp_affinity", {"KMP_AFFINITY": spec}, n)
    for spec in EXTRA_SPECS:
        for n in sorted({1, 3, C, P + 3}):
            add("kmp_affinity_extra", {"KMP_AFFINITY": spec}, n)
    for sub in HW_SUBSETS:
        for aff in HW_SUBSET_AFFINITY:
            env = {"KMP_HW_SUBSET": sub}
            if aff:
                env["KMP_AFFINITY"] = aff
            for n in (None, 3):
                add("kmp_hw_subset", env, n)
    for pl in PLACES:
        for pb in PROC_BINDS:
            if pl is None and pb is None:
                continue
            env = {}
            if pl is not None:
                env["OMP_PLACES"] = pl
            if pb is not None:
                env["OMP_PROC_BIND"] = pb
            npl = _places_count(m, pl)
            for n in sorted({1, 3, npl, npl + 1, P + 3}) + [None]:
                add("omp_places", env, n)
    for spec in ["granularity=fine,balanced", "granularity=core,balanced", "balanced",
                 "granularity=socket,balanced"]:
        for n in sorted({2, 3, C - 1, C + 1, P - 1, P + 3, 2 * P + 1}):
            if n >= 1:
                add("balanced", {"KMP_AFFINITY": spec}, n)
    for im in m.initial_masks:
        for spec in INITIAL_MASK_SPECS:
            env = {}
            if spec and spec.startswith("OMP:"):
                _, pl, pb = spec.split(":")
                env["OMP_PLACES"], env["OMP_PROC_BIND"] = pl, pb
            elif spec and spec.startswith("HW:"):
                env["KMP_HW_SUBSET"] = spec[3:]
                env["KMP_AFFINITY"] = "granularity=fine,compact"
            elif spec:
                env["KMP_AFFINITY"] = spec
            for n in (None, 1, 3, 8):
                add("initial_mask", env, n, im)
    for env in malformed_envs():
        add("malformed", env, None)
        if "OMP_NUM_THREADS" not in env:
            add("malformed", env, 3)
    if m.sparse:
        # norespect / disabled over offline CPUs depend on the host's
        # /sys/devices/system/cpu/offline, which the shim does not fake.
        def real(c: dict[str, Any]) -> bool:
            a = c["env"].get("KMP_AFFINITY", "").lower()
            return "norespect" not in a and "disabled" not in a and \
                c["env"].get("OMP_PROC_BIND", "").lower() != "disabled" and \
                c["env"].get("OMP_NUM_THREADS", "").lower() != "all"
        cases = [c for c in cases if real(c)]
    return cases
