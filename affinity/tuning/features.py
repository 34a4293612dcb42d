"""What the topology says about a configuration, as numbers a model can generalise through.

A label such as ``instances=4`` or ``affinity=scatter`` teaches a model only about
that label.  Read with the machine (:class:`~affinity.tuning.priors.Layout`) the same
configuration is "4 copies of 17 cores each, 2 threads per core, one NUMA node each,
memory local, threads bound": numbers that configurations with other labels share,
so that what one measurement says carries over to them.

:func:`features` gives, per configuration, the values named in :data:`FEATURES`:

========================  ==============================================================
``instances``             log2 of the copies
``team``                  log2 of the busy threads per copy (max of OMP and intra)
``load``                  log2 of (copies x busy threads) / PUs: > 0 oversubscribed,
                          < 0 idle PUs
``threads_per_core``      log2 of busy threads per core the team's CPU sets touch
``cores``                 log2 of the cores a copy's threads use
``pus``                   log2 of the PUs of a copy's share
``nodes``                 log2 of the NUMA nodes a copy's share spans
``packages``              log2 of the packages a copy's share spans
``locality``              the share of a copy's memory on the node its thread runs on
                          (1 within one node; 1/nodes when it spans nodes or interleaves)
``bound``                 1 when each thread has its own CPU set (not ``none``/``disabled``)
``spin``                  KMP_BLOCKTIME on a log scale (0 ms: 0, 200 ms: 1, infinite: 1.5)
``spin_x_load``           ``spin`` times the oversubscription (spinning while time-sliced)
``inter``                 log2 of the inter-op pool
``omp_vs_intra``          log2 of OMP / intra
``slow_cores``            the share of the team's cores that are of a slower kind (hybrid
                          CPUs: E-cores), 0 elsewhere
``mixed_kinds``           1 when a team spans core kinds (paced by its slowest member)
========================  ==============================================================

An infeasible layout (more copies than PUs, a plan that fails) gets the row of zeros
and ``feasible = 0``.  Everything here is pure: a function of the topology (through
:class:`~affinity.tuning.priors.Priors`) and the configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .priors import Layout, Priors

__all__ = ["FEATURES", "features"]

FEATURES = ("instances", "team", "load", "threads_per_core", "cores", "pus", "nodes", "packages", "locality",
            "bound", "spin", "spin_x_load", "inter", "omp_vs_intra", "slow_cores", "mixed_kinds")


def _spin(blocktime: Any) -> float:
    if isinstance(blocktime, str):
        return 1.5 if blocktime == "infinite" else 0.0
    try:
        ms = float(blocktime)
    except (TypeError, ValueError):
        return 0.0
    return math.log10(1.0 + max(ms, 0.0)) / math.log10(201.0)


def _kinds(priors: Priors, lay: Layout) -> tuple[float, float]:
    """(share of the team's cores of a slower kind, 1 if the team spans kinds)."""
    topo = priors.machine.topology
    effs = {c.logical_index: c.efficiency for c in topo.cores}
    if all(e is None for e in effs.values()):
        return 0.0, 0.0
    top = max(e for e in effs.values() if e is not None)
    cores = {topo.pu(p).core for s in (lay.cpusets or ()) for p in s if p in topo.cpuset}
    if not cores:
        return 0.0, 0.0
    slow = sum(1 for c in cores if (effs.get(c) if effs.get(c) is not None else top) < top)
    kinds = {effs.get(c) for c in cores}
    return slow / len(cores), 1.0 if len(kinds) > 1 else 0.0


def features(priors: Priors, config: Mapping[str, Any]) -> tuple[tuple[float, ...], bool]:
    """The values of :data:`FEATURES` for ``config`` read with ``priors``' machine, and
    whether its layout is feasible.

    Parameters
    ----------
    priors : Priors
        The space and the machine.
    config : mapping
        A configuration of the space.

    Returns
    -------
    (tuple of float, bool)
    """
    lay = priors.layout(config)
    if lay is None or lay.cpusets is None:
        return (0.0,) * len(FEATURES), False
    m = priors.machine
    busy = max(lay.omp, lay.intra, 1)
    load = math.log2(lay.instances * busy / m.pus)
    used = max(lay.used_cores, 1)
    if not lay.bound:  # the OS spreads an unbound team over its share's cores first
        used = max(1, min(busy, lay.share_cores))
    if lay.membind == "interleave":
        locality = 1.0 / m.nodes
    else:
        locality = 1.0 / lay.share_nodes
    spin = _spin(lay.blocktime) if "blocktime" in priors.space.names else 0.0
    slow, mixed = _kinds(priors, lay)
    return (math.log2(lay.instances), math.log2(busy), load, math.log2(busy / used), math.log2(used),
            math.log2(lay.share_pus), math.log2(lay.share_nodes), math.log2(lay.share_packages), locality,
            1.0 if lay.bound else 0.0, spin, spin * max(load, 0.0), math.log2(max(lay.inter, 1)),
            math.log2(max(lay.omp, 1) / max(lay.intra, 1)), slow, mixed), True
