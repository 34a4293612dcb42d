"""Response-surface models for the tuner's benchmark (``bench/bench_tune.py``).

Every surface is a table: one throughput per configuration of a space over the
tuner's named parameters.  The tables here are **models**, not recordings: a
throughput formula with the interactions the seeds describe, evaluated on the
machine each surface is about (described to :mod:`affinity` as a synthetic
hwloc topology, so thread placements are the planner's own):

* a team of OpenMP threads runs at the speed of its slowest thread (static
  schedule, barriers): two threads on one core (hyper-threads) each get ~0.6 of
  it; more threads than PUs time-slice, and spin-waiting (``KMP_BLOCKTIME``)
  makes that far worse;
* Amdahl: a serial fraction (larger for small batches) limits big teams, which is
  why several instances with few threads each can beat one instance with all of
  them;
* TensorFlow's intra-op (Eigen) pool and inter-op concurrency, the OpenMP workers'
  spinning that steals cores from the Eigen pool (why KMP_BLOCKTIME 0/1 is
  recommended), wake-up costs of blocktime 0;
* a team spanning packages pays for remote memory (less with interleaving); an
  instance allocating on one node of several is bandwidth-bound there;
* memory bandwidth per NUMA node caps what instances together can do;
* a small deterministic "measurement noise" (1 %, a hash of the configuration).

``bench16_*`` surfaces are a model **calibrated** on the measurements of
``../shared/bench16/README.md`` (PyTorch on a 16-core, one-socket, no-SMT
machine): they reproduce those numbers at the measured points and interpolate
the rest with the same formula.  They are labelled ``"model calibrated on
measurements"``; they are not recordings.

``python bench/surfaces/models.py`` rewrites the JSON files next to it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from affinity.machine.topology import Topology  # noqa: E402
from affinity.planning.planner import plan  # noqa: E402
from affinity.planning.partition import partition  # noqa: E402


@dataclass(frozen=True)
class Workload:
    """What the modelled program is like."""

    batch: float = 64.0  #: images per step (per instance)
    rate1: float = 4.0  #: images/sec of one instance on one thread, no overheads
    serial: float = 0.03  #: Amdahl serial fraction of the oneDNN/OpenMP part
    eigen: float = 0.12  #: fraction of the work on TensorFlow's intra-op (Eigen) pool
    overlap: float = 0.25  #: fraction of the graph that can run as concurrent ops (inter-op)
    ht_gain: float = 0.2  #: extra throughput of a core running 2+ hyper-threads
    spin: dict = field(default_factory=lambda: {0: 0.4, 1: 0.6, 10: 1.5, 30: 2.5, 200: 6.0,
                                                "infinite": 9.0, None: 6.0})
    wake: dict = field(default_factory=lambda: {0: 0.05, 1: 0.015})
    node_cap: float = 1e9  #: images/sec one NUMA node's memory bandwidth can feed
    remote: float = 0.12  #: slowdown per extra package a team spans
    sync: float = 0.0  #: barrier cost per doubling of the team, as a fraction of one thread's step
    noise: float = 0.01


# ----------------------------------------------------------------- placement

def _spec(cfg: dict) -> str | None:
    aff = cfg.get("affinity", "compact")
    if aff in ("none", "disabled"):
        return None
    if "=" in str(aff) or "," in str(aff):
        return str(aff)
    gran = cfg.get("granularity")
    return f"granularity={gran},{aff}" if gran else str(aff)


@lru_cache(maxsize=None)
def _plan_sets(topo: Topology, spec: str | None, n: int) -> tuple[frozenset[int], ...] | None:
    if spec is None:
        return None
    return plan(spec, n, topo, strict=True).cpusets


def team_speed(topo: Topology, spec: str | None, n: int, wl: Workload, blocktime: Any,
               extra_load: float = 1.0) -> tuple[float, int]:
    """(speed of a team of ``n`` threads in units of one free core, packages it spans).

    ``extra_load`` multiplies every thread's load (inter-op concurrency)."""
    pus = sorted(topo.allowed)
    cores = {p: topo.pu(p).core for p in pus}
    ncores = len(set(cores.values()))
    tpc = max(1, len(pus) // ncores)
    spin = wl.spin.get(blocktime, 6.0)
    sets = _plan_sets(topo, spec, n)
    if sets is None:  # unbound: the OS spreads the threads, with migrations
        load_core = n * extra_load / ncores
        load_pu = n * extra_load / len(pus)
        speed = _thread_speed(load_core, load_pu, tpc, wl, spin) * 0.93
        pkgs = len({topo.pu(p).package for p in pus}) if n > 1 else 1
        return n * speed, pkgs
    pu_w: dict[int, float] = {}
    for s in sets:
        for p in s:
            pu_w[p] = pu_w.get(p, 0.0) + extra_load / len(s)
    core_w: dict[int, float] = {}
    for p, w in pu_w.items():
        core_w[cores[p]] = core_w.get(cores[p], 0.0) + w
    slowest = min(_thread_speed(sum(core_w[c] for c in {cores[p] for p in s}) / len({cores[p] for p in s}),
                                sum(pu_w[p] for p in s) / len(s), tpc, wl, spin) for s in set(sets))
    pkgs = len({topo.pu(p).package for s in sets for p in s})
    return n * slowest, pkgs


def _thread_speed(load_core: float, load_pu: float, tpc: int, wl: Workload, spin: float) -> float:
    """One thread's speed given the threads per core and per PU around it."""
    if load_core <= 1.0:
        return 1.0
    # hyper-threads add less and less: 2 of 4 give 57 % of the gain of all 4
    core = 1.0 + wl.ht_gain * (1 - 0.5 ** (min(load_core, tpc) - 1)) / (1 - 0.5 ** (tpc - 1)) if tpc > 1 else 1.0
    speed = core / load_core
    if load_pu > 1.0:  # time-slicing: barrier waits burn the slices
        speed /= 1.0 + (load_pu - 1.0) * spin
    return speed


# ------------------------------------------------------------------- models

def tf_throughput(topo: Topology, cfg: dict, wl: Workload) -> float:
    """Images/sec summed over instances (see the module docstring)."""
    k = int(cfg.get("instances", 1))
    shares = [topo] if k == 1 else [topo.with_allowed(s.cpus) for s in partition(topo, k)]
    total = 0.0
    per_node: dict[int, float] = {}
    for share in shares:
        rate = _instance_rate(share, cfg, wl, k)
        nodes = [n.os_index for n in share.numa_nodes if n.cpuset & share.allowed] or [0]
        total += rate
        for n in nodes:
            per_node[n] = per_node.get(n, 0.0) + rate / len(nodes)
    if wl.node_cap < 1e9:  # memory bandwidth of each node caps what its instances do
        capped = sum(x / (1 + (x / wl.node_cap) ** 4) ** 0.25 for x in per_node.values())
        total = capped
    return total


def _instance_rate(share: Topology, cfg: dict, wl: Workload, k: int) -> float:
    threads = cfg.get("threads")
    omp = int(cfg.get("omp", threads or cfg.get("intra", len(share.cores))))
    intra = int(cfg.get("intra", threads or omp))
    inter = int(cfg.get("inter", 1))
    bt = cfg.get("blocktime", 1)
    spec = _spec(cfg)
    npus, ncores = len(share.allowed), len({share.pu(p).core for p in share.allowed})
    spin = wl.spin.get(bt, 6.0)
    team, pkgs = team_speed(share, spec, omp, wl, bt)
    remote = 1 + wl.remote * (pkgs - 1) * (0.5 if cfg.get("membind") == "interleave" else 1.0)
    mkl = (1 - wl.eigen) * (wl.serial + (1 - wl.serial) / team + wl.sync * math.log2(omp + 1)) * remote
    mkl *= 1 + wl.wake.get(bt, 0.0)
    eig_speed = min(intra, ncores) + wl.ht_gain * min(max(intra - ncores, 0), npus - ncores)
    if intra > npus:
        eig_speed /= 1 + 0.15 * (intra / npus - 1)
    steal = 1 + 0.35 * min(spin / 6, 1.5) if (spin >= 2.5 and omp >= 0.75 * ncores) else 1.0
    eig = wl.eigen * (0.05 + 0.95 / max(eig_speed, 1e-9)) * steal
    t = mkl + eig
    conc = min(inter, 2)
    if conc >= 2:  # concurrent ops, each with its own team on the same places
        team2, _ = team_speed(share, spec, omp, wl, bt, extra_load=2.0)
        t_conc = (1 - wl.eigen) * (wl.serial + (1 - wl.serial) / max(team2, 1e-9)) * remote
        t += wl.overlap * (t_conc / 2 - mkl)
    t *= 1 + 0.004 * max(0, inter - 2 * max(1, len(share.packages)))
    mem = _membind_factor(share, cfg, k)
    return wl.rate1 * mem / t


def _membind_factor(share: Topology, cfg: dict, k: int) -> float:
    nodes = [n for n in share.numa_nodes if n.cpuset & share.allowed]
    mb = cfg.get("membind", "none")
    if len(nodes) <= 1:  # one node: local; interleaving over every node of the machine costs
        if mb == "interleave" and k > 1:
            return 0.88
        return 1.0
    if mb == "interleave":
        return 0.97
    return 1.0 / (1 + 0.08 * (len(nodes) - 1))  # first touch on one node, shared by all


def noisy(value: float, cfg: dict, wl: Workload, name: str) -> float:
    """``value`` with a deterministic pseudo-noise of ``wl.noise`` (a hash of the config)."""
    h = hashlib.sha256((name + json.dumps(cfg, sort_keys=True)).encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2 ** 64
    return value * (1 + wl.noise * (2 * u - 1))


# ---------------------------------------------------------------- surfaces

SURFACES: dict[str, dict[str, Any]] = {
    "xeon2s_tf": {
        "title": "2-socket Xeon (2 x 28 cores, HT), TensorFlow ResNet-50 training",
        "topology": "package:2 [numa] core:28 pu:2",
        "space": {"intra": [4, 7, 14, 28, 42, 56, 112], "inter": [1, 2, 3, 4],
                  "omp": [14, 28, 42, 56], "blocktime": [0, 1, 200],
                  "affinity": ["compact", "scatter"]},
        "fixed": {"granularity": "fine"},
        "workload": Workload(batch=128, rate1=1.6, serial=0.02, eigen=0.15, overlap=0.3),
    },
    "xeonphi_tf": {
        "title": "Xeon Phi 7250 (68 cores x 4 hyper-threads), TensorFlow training",
        "topology": "package:1 [numa] core:68 pu:4",
        "space": {"intra": [17, 34, 68, 136, 272], "inter": [1, 2, 4], "omp": [34, 68, 136, 272],
                  "blocktime": [0, 1, 30, "infinite"], "affinity": ["compact", "scatter", "balanced"],
                  "granularity": ["fine", "core"]},
        "workload": Workload(batch=64, rate1=0.5, serial=0.012, eigen=0.1, overlap=0.2, ht_gain=0.4,
                             sync=0.0012),
    },
    "epyc_serving": {
        "title": "2 x EPYC (2 x 64 cores, SMT2, NPS4: 8 NUMA nodes), inference serving with instances",
        "topology": "package:2 numa:4 core:16 pu:2",
        "space": {"instances": [1, 2, 4, 8, 16, 32, 64], "threads": [1, 2, 4, 8, 16, 32, 64, 128],
                  "membind": ["none", "local", "interleave"], "blocktime": [0, 1, 200]},
        "fixed": {"affinity": "granularity=fine,compact,1,0", "inter": 1},
        "workload": Workload(batch=8, rate1=30.0, serial=0.08, eigen=0.05, overlap=0.0,
                             node_cap=1500.0),
    },
    "xeon2s_serving": {
        "title": "2-socket Xeon (2 x 28 cores, HT), TensorFlow inference: instances x threads x intra/inter",
        "topology": "package:2 [numa] core:28 pu:2",
        "space": {"instances": [1, 2, 4, 7, 14, 28], "threads": [1, 2, 4, 7, 14, 28, 56],
                  "inter": [1, 2], "membind": ["none", "interleave"], "affinity": ["none", "compact"]},
        "fixed": {"granularity": "fine", "blocktime": 1},
        "workload": Workload(batch=16, rate1=12.0, serial=0.05, eigen=0.1, overlap=0.2,
                             node_cap=900.0),
    },
    "bench16_resnet18": {
        "title": "16-core one-socket no-SMT VM, PyTorch ResNet-18 batch 8 (model calibrated on "
                 "../shared/bench16/README.md: 1x16 = 167, 16x1 = 330, 2x16 oversubscribed = 15)",
        "kind": "model calibrated on measurements",
        "topology": "package:1 [numa] core:16 pu:1",
        "space": {"instances": [1, 2, 4, 8, 16], "threads": [1, 2, 4, 8, 16],
                  "affinity": ["none", "compact"], "membind": ["none", "local"]},
        "fixed": {"inter": 1, "blocktime": None},
        "workload": Workload(batch=8, rate1=20.6, serial=0.065, eigen=0.0, overlap=0.0,
                             spin={None: 22.0}, wake={}),
        "calibration": [({"instances": 1, "threads": 16, "affinity": "compact"}, 167.0),
                        ({"instances": 16, "threads": 1, "affinity": "compact"}, 330.0),
                        ({"instances": 2, "threads": 16, "affinity": "none"}, 15.0)],
    },
    "bench16_resnet50": {
        "title": "16-core one-socket no-SMT VM, PyTorch ResNet-50 batch 16 (model calibrated on "
                 "../shared/bench16/README.md: 1x16 = 46-52, 4x4 = 68-71)",
        "kind": "model calibrated on measurements",
        "topology": "package:1 [numa] core:16 pu:1",
        "space": {"instances": [1, 2, 4, 8, 16], "threads": [1, 2, 4, 8, 16],
                  "affinity": ["none", "compact"], "membind": ["none", "local"]},
        "fixed": {"inter": 1, "blocktime": None},
        "workload": Workload(batch=16, rate1=4.92, serial=0.04, eigen=0.0, overlap=0.0,
                             spin={None: 22.0}, wake={}, node_cap=120.0),
        "calibration": [({"instances": 1, "threads": 16, "affinity": "compact"}, 49.0),
                        ({"instances": 4, "threads": 4, "affinity": "compact"}, 70.0)],
    },
}


# ----------------------------------------------------------- stress surfaces
# Written the way someone else might model a machine: products of independent
# factors, optima that the seeds' rules miss, parameters the tuner does not know,
# and one surface with no structure at all.  They show what the priors cost when
# they are wrong.

def _bump(x: float, at: float, width: float) -> float:
    return math.exp(-0.5 * (math.log2(x / at) / width) ** 2)


def _stress_rules_hold(c: dict) -> float:
    f = _bump(c["intra"], 28, 0.8) * _bump(c["omp"], c["intra"], 0.7)
    f *= {1: 0.8, 2: 1.0, 3: 0.93, 4: 0.9}[c["inter"]] * {0: 0.97, 1: 1.0, 10: 0.9, 200: 0.75}[c["blocktime"]]
    f *= 0.6 if c["omp"] * min(c["inter"], 2) > 56 else 1.0
    return 100 * f * {"compact": 0.85, "scatter": 1.0, "none": 0.8}[c["affinity"]]


def _stress_omp_not_intra(c: dict) -> float:
    f = _bump(c["omp"], 136, 0.9) * _bump(c["intra"], 68, 1.2) * {1: 0.9, 2: 1.0, 4: 0.95}[c["inter"]]
    f *= {0: 0.9, 1: 0.97, 30: 1.0, "infinite": 0.96}[c["blocktime"]]
    return 20 * f * {("balanced", "fine"): 1.0, ("balanced", "core"): 0.96, ("scatter", "fine"): 0.97,
                     ("scatter", "core"): 0.95, ("compact", "fine"): 0.7,
                     ("compact", "core"): 0.9}[(c["affinity"], c["granularity"])]


def _stress_anti_prior(c: dict) -> float:
    f = _bump(c["omp"], 112, 1.0) * _bump(c["intra"], 28, 1.0) * {1: 1.0, 2: 0.95, 4: 0.9}[c["inter"]]
    f *= {0: 0.85, 1: 0.9, 30: 0.95, 200: 1.0}[c["blocktime"]]
    return 50 * f * {"none": 1.0, "compact": 0.9, "scatter": 0.93}[c["affinity"]]


def _stress_unknown_param(c: dict) -> float:
    k, t = c["instances"], c["threads"]
    tot = k * t
    f = k / (0.05 + 0.95 / t) * (min(1, 64 / tot) ** 3 if tot > 64 else 1) * (0.2 if tot > 128 else 1)
    f *= {1: 0.6, 4: 0.9, 16: 1.0, 64: 0.95}[c["batch"]]
    f *= {"none": 0.95, "local": 1.0, "interleave": 0.85}[c["membind"]] * (1.2 if k < 4 and c["membind"] == "interleave" else 1)
    return 10 * f


def _stress_plain(c: dict) -> float:
    f = {"a1": 1, "a2": 1.3, "a3": 0.8, "a4": 1.1}[c["alpha"]] * math.exp(-0.5 * ((c["beta"] - 6) / 3) ** 2)
    f *= {"x": 1.0, "y": 0.7, "z": 0.9}[c["gamma"]] * (1.25 if c["delta"] and c["gamma"] == "z" else 1.0)
    return f * {0.1: 0.8, 0.2: 1.0, 0.5: 0.95, 1.0: 0.7}[c["eps"]]


def _stress_no_structure(c: dict) -> float:
    h = hashlib.sha256(json.dumps(c, sort_keys=True).encode()).digest()
    z = sum(int.from_bytes(h[i:i + 2], "big") / 65536 for i in range(0, 12, 2)) - 3  # ~ N(0, 0.7)
    return math.exp(0.4 * z)


STRESS: dict[str, dict[str, Any]] = {
    "stress_rules_hold": {
        "title": "naive model, 2 x 14 cores (HT): best at the seeds' rules (intra 28, inter 2, OMP = intra)",
        "topology": "package:2 [numa] core:14 pu:2", "model": _stress_rules_hold,
        "space": {"intra": [7, 14, 21, 28, 42, 56], "inter": [1, 2, 3, 4], "omp": [7, 14, 28, 56],
                  "blocktime": [0, 1, 10, 200], "affinity": ["none", "compact", "scatter"]}},
    "stress_omp_not_intra": {
        "title": "naive model, Xeon Phi: best with OMP = 2 x intra (the rule OMP = intra is wrong)",
        "topology": "package:1 [numa] core:68 pu:4", "model": _stress_omp_not_intra,
        "space": {"intra": [17, 34, 68, 136, 272], "inter": [1, 2, 4], "omp": [34, 68, 136, 272],
                  "blocktime": [0, 1, 30, "infinite"], "affinity": ["compact", "scatter", "balanced"],
                  "granularity": ["fine", "core"]}},
    "stress_anti_prior": {
        "title": "naive model, 2 x 28 cores (HT): best uses every PU, OMP = 4 x intra, blocktime 200, unbound",
        "topology": "package:2 [numa] core:28 pu:2", "model": _stress_anti_prior,
        "space": {"intra": [7, 14, 28, 56, 112], "inter": [1, 2, 4], "omp": [14, 28, 56, 112, 224],
                  "blocktime": [0, 1, 30, 200], "affinity": ["none", "compact", "scatter"]}},
    "stress_unknown_param": {
        "title": "naive model, 64 cores (SMT2, 4 NUMA nodes): instances x threads and a 'batch' the tuner "
                 "does not know",
        "topology": "package:1 numa:4 core:16 pu:2", "model": _stress_unknown_param,
        "space": {"instances": [1, 2, 4, 8, 16, 32, 64], "threads": [1, 2, 4, 8, 16, 32, 64],
                  "batch": [1, 4, 16, 64], "membind": ["none", "local", "interleave"]}},
    "stress_plain": {
        "title": "no known parameter: five plain choices, additive with one interaction",
        "topology": "package:1 [numa] core:4 pu:1", "model": _stress_plain,
        "space": {"alpha": ["a1", "a2", "a3", "a4"], "beta": [1, 2, 4, 6, 8, 12], "gamma": ["x", "y", "z"],
                  "delta": [True, False], "eps": [0.1, 0.2, 0.5, 1.0]}},
    "stress_no_structure": {
        "title": "no structure: a hash of the configuration (priors and models cannot help)",
        "topology": "package:1 [numa] core:8 pu:2", "model": _stress_no_structure,
        "space": {"intra": [1, 2, 4, 8, 16], "omp": [1, 2, 4, 8, 16], "blocktime": [0, 1, 200],
                  "affinity": ["compact", "scatter", "none"]}},
}


def build_stress(name: str) -> dict[str, Any]:
    """A stress surface as JSON-ready data (2 % pseudo-noise)."""
    s = STRESS[name]
    names = list(s["space"])
    wl = Workload(noise=0.02)
    rows = []
    for values in itertools.product(*(s["space"][n] for n in names)):
        cfg = dict(zip(names, values))
        rows.append([*values, round(noisy(s["model"](cfg), cfg, wl, name), 4)])
    return {"name": name, "title": s["title"], "kind": "stress model", "topology": s["topology"],
            "direction": "maximize", "params": names, "space": s["space"], "fixed": {}, "rows": rows}


def build(name: str) -> dict[str, Any]:
    """The surface ``name`` as JSON-ready data: space, topology and one row per configuration."""
    s = SURFACES[name]
    topo = Topology.from_synthetic(s["topology"])
    names = list(s["space"])
    rows = []
    for values in itertools.product(*(s["space"][n] for n in names)):
        cfg = {**s.get("fixed", {}), **dict(zip(names, values))}
        v = noisy(tf_throughput(topo, cfg, s["workload"]), dict(zip(names, values)), s["workload"], name)
        rows.append([*values, round(v, 3)])
    out = {"name": name, "title": s["title"], "kind": s.get("kind", "model"),
           "topology": s["topology"], "direction": "maximize", "params": names,
           "space": s["space"], "fixed": s.get("fixed", {}), "rows": rows}
    if "calibration" in s:
        out["calibration"] = [{"config": c, "measured": m,
                               "model": round(tf_throughput(topo, {**s.get("fixed", {}), **c},
                                                            s["workload"]), 1)}
                              for c, m in s["calibration"]]
    return out


def main() -> int:
    for name in [*SURFACES, *STRESS]:
        data = build(name) if name in SURFACES else build_stress(name)
        vals = [r[-1] for r in data["rows"]]
        best = max(vals)
        near = sum(v >= 0.97 * best for v in vals)
        (HERE / f"{name}.json").write_text(json.dumps(data, separators=(",", ":")) + "\n")
        print(f"{name}: {len(vals)} configurations, best {best:.1f}, {near} within 3 %, "
              f"worst {min(vals):.1f}; calibration {data.get('calibration', '-')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
