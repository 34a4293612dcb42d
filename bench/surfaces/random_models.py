"""Surfaces drawn at random, to check that the tuner's edge is not a fit to the fixed ones.

The surfaces in ``hardware.py`` and ``models.py`` were written by the same hands as the
tuner's priors, and the sampler was tuned while looking at them.  The two families
here are drawn from a seed instead, with every constant random, so nobody chose them:

* ``machine`` -- a machine model: one of five topologies (2-socket Xeon, Xeon Phi,
  4 sub-NUMA nodes, a 16-core VM, a hybrid client CPU), a workload with a random serial
  share, barrier and wake-up costs, SMT yield (below 1: SMT hurts), a cost of unbound
  threads, a cost of spinning while time-sliced, a memory bandwidth cap, a memory size
  beyond which copies fail (``None``; the surface's ``out_of_memory``, so ``affinity.tune``
  is told a MemoryError, as a command killed for memory tells ``affinity tune``), and on
  several NUMA nodes a random cost of remote pages.  Space: instances x threads x affinity x blocktime (x membind).
* ``naive`` -- a product of independent factors, as the stress models: a bump in OMP
  threads and one in intra-op threads at random places and widths, and a random factor
  for every value of the other parameters, so that only one value of each is best.

``generate(family, k)`` is a pure function of ``(family, k)``: the same draw every time,
on any machine.  ``python bench/bench_tune.py --random 12`` compares the searchers on
the first 12 of each family.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import harness  # noqa: E402
from hardware import HYBRID, Core, _sets, _shares, _spec, team_rate, thread_speeds, topology_of  # noqa: E402

__all__ = ["FAMILIES", "generate"]

FAMILIES = ("machine", "naive")

#: (hwloc synthetic description or hybrid, GB of memory) of the machine family
_MACHINES = (("package:2 [numa] core:16 pu:2", 96.0), ("package:1 [numa] core:68 pu:4", 96.0),
             ("package:2 numa:2 core:8 pu:2", 128.0), ("package:1 [numa] core:16 pu:1", 64.0),
             (HYBRID, 32.0))

#: the naive family's spaces (as the stress models: a Xeon and a Xeon Phi)
_NAIVE = (("package:2 [numa] core:28 pu:2",
           {"intra": [7, 14, 28, 56, 112], "inter": [1, 2, 4], "omp": [14, 28, 56, 112, 224],
            "blocktime": [0, 1, 30, 200], "affinity": ["none", "compact", "scatter"]}),
          ("package:1 [numa] core:68 pu:4",
           {"intra": [17, 34, 68, 136, 272], "inter": [1, 2, 4], "omp": [34, 68, 136, 272],
            "blocktime": [0, 1, 30, "infinite"], "affinity": ["compact", "scatter", "balanced"],
            "granularity": ["fine", "core"]}))


def _powers(top: int) -> list[int]:
    out, p = [], 1
    while p <= top:
        out.append(p)
        p *= 2
    return out


def _machine(rng: np.random.Generator, k: int) -> harness.Surface:
    desc, memory = _MACHINES[int(rng.integers(len(_MACHINES)))]
    topo = topology_of(desc)
    pus = len(topo.allowed)
    nodes = len({topo.numa_of(p).logical_index for p in topo.allowed})
    serial = float(np.exp(rng.uniform(math.log(0.002), math.log(0.15))))
    sync = float(np.exp(rng.uniform(math.log(1e-4), math.log(0.01))))
    smt = tuple(float(x) for x in np.cumprod([1.0, *rng.uniform(0.85, 1.35, 3)]))
    unbound = float(rng.uniform(0.8, 1.0))
    spin_cost = float(rng.uniform(0.5, 6.0))
    wake = {0: float(rng.uniform(0.0, 0.1)), 1: float(rng.uniform(0.0, 0.05)), 200: 0.0}
    cap = float(rng.uniform(0.2, 1.0)) * pus  # the bandwidth cap, in thread-equivalents
    per_copy = float(rng.uniform(0.5, 12.0))  # GB per copy: too many copies fail
    remote = float(rng.uniform(1.0, 2.0))  # the cost of pages on another node (several nodes)
    copies = [c for c in _powers(pus) if c <= 32][:6]
    threads = _powers(2 * pus)[-6:]
    space: dict[str, list[Any]] = {"instances": copies, "threads": threads,
                                   "affinity": ["none", "compact", "scatter"], "blocktime": [0, 1, 200]}
    if nodes > 1:
        space["membind"] = ["none", "local"]
    kinds = {None: Core(1.0, smt), "IntelCore": Core(1.0, smt), "IntelAtom": Core(float(rng.uniform(0.3, 0.7)), (1.0,))}

    def fits(cfg: dict[str, Any]) -> bool:
        return cfg["instances"] * per_copy + 2.0 <= memory

    def model(cfg: dict[str, Any]) -> float | None:
        n_copies, n = cfg["instances"], cfg["threads"]
        if not fits(cfg):
            return None
        shares = _shares(topo, n_copies)
        if shares is None:
            return None
        bt = cfg["blocktime"]
        spin = {0: 0.3, 1: 0.5, 200: spin_cost}[bt]
        total = 0.0
        for share in shares:
            sets = _sets(share, _spec(cfg), n)
            speeds = thread_speeds(share, sets, kinds, spin)
            if _spec(cfg) is None:
                speeds = [s * unbound for s in speeds]
            spans = len({share.numa_of(p).logical_index for p in share.allowed})
            if spans > 1 or cfg.get("membind", "local") == "none":
                far = (spans - 1) / spans if spans > 1 else (1 - 1 / nodes) * (n_copies > 1)
                speeds = [s / (1 + far * (remote - 1)) for s in speeds]
            total += team_rate(speeds, serial=serial, sync=sync, wake=wake[bt])
        return 10.0 * total / (1 + (total / cap) ** 4) ** 0.25

    return _surface(f"random_machine_{k}", desc, space, model,
                    f"random machine model {k}: {desc}, serial {serial:.3f}, SMT yield {smt[1]:.2f}, "
                    f"cap {cap:.0f} threads, {per_copy:.1f} GB per copy", lambda cfg: not fits(cfg))


def _naive(rng: np.random.Generator, k: int) -> harness.Surface:
    desc, space = _NAIVE[int(rng.integers(len(_NAIVE)))]
    at_omp, at_intra = (float(rng.choice(space["omp"])), float(rng.choice(space["intra"])))
    w_omp, w_intra = (float(x) for x in rng.uniform(0.6, 1.5, 2))
    factors: dict[str, dict[str, float]] = {}
    for n, values in space.items():
        if n in ("omp", "intra"):
            continue
        f = rng.uniform(0.8, 0.97, len(values))
        f[int(rng.integers(len(values)))] = 1.0
        factors[n] = {str(v): float(x) for v, x in zip(values, f)}

    def model(cfg: dict[str, Any]) -> float:
        v = math.exp(-0.5 * (math.log2(cfg["omp"] / at_omp) / w_omp) ** 2
                     - 0.5 * (math.log2(cfg["intra"] / at_intra) / w_intra) ** 2)
        for n, f in factors.items():
            v *= f[str(cfg[n])]
        return 100.0 * v

    return _surface(f"random_naive_{k}", desc, space, model,
                    f"random naive model {k}: {desc}, best OMP {at_omp:g} (width {w_omp:.2f}), "
                    f"intra {at_intra:g} (width {w_intra:.2f})")


def _surface(name: str, desc: str, space: dict[str, list[Any]], model, title: str,
             out_of_memory=lambda cfg: False) -> harness.Surface:
    params = tuple(space)
    table, oom = {}, set()
    for values in itertools.product(*(space[n] for n in params)):
        cfg = dict(zip(params, values))
        v = model(cfg)
        table[values] = None if v is None else round(v, 6)
        if v is None and out_of_memory(cfg):
            oom.add(values)
    return harness.Surface(name, title, "drawn at random", desc, params, space, table, out_of_memory=frozenset(oom))


def generate(family: str, k: int) -> harness.Surface:
    """The ``k``-th surface of ``family`` (one of :data:`FAMILIES`), the same on every call."""
    if family not in FAMILIES:
        raise ValueError(f"generate(): unknown family {family!r} (expected one of {', '.join(FAMILIES)})")
    rng = np.random.default_rng([k, FAMILIES.index(family), 20261124])
    return (_machine if family == "machine" else _naive)(rng, k)
