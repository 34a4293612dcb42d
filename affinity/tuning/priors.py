"""What the machine says about a configuration, before anything is measured.

A generic optimizer sees ``intra=56`` as one of seven labels.  Read with the
topology it is "one thread per core of both packages", and this module turns
that reading into three things the sampler (:mod:`~affinity.tuning.sampler`) uses:

* :meth:`Priors.seeds`: the seeds' rules as first candidates, snapped to the
  space: intra = physical cores (of each instance's share), inter = packages,
  OMP = intra, KMP_BLOCKTIME 1 (else 0), instances x threads = cores, and the
  affinity, granularity and memory policy whose placement the planner scores best;
* :meth:`Priors.score`: a prior in units of log-throughput (0 = nothing against
  it; -0.7 = expected about half as fast): oversubscription is rarely best, idle
  cores cost, counts that do not divide the cores rarely win, OMP and intra go
  together, inter-op pools about the packages, several teams that time-slice with
  spinning workers (a long KMP_BLOCKTIME) do badly, a placement that doubles
  threads on a core while cores are free does badly (the planner says where each
  thread goes), big teams lose to Amdahl's law;
* :meth:`Priors.twin`: which configurations launch the same thing (the same
  process masks, per-thread CPU sets, exported counts, blocktime and effective
  memory policy): on a one-package machine without SMT ``compact`` and ``scatter``
  are the same placement, ``granularity`` means nothing without hyper-threads, and
  every memory policy is local with one NUMA node.

Everything here is pure: a function of the topology and the configuration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import AffinityError
from ..machine.topology import Topology
from ..planning.planner import plan
from ..planning.partition import partition
from ..planning.spec import DEFAULT_SPEC, parse_kmp_affinity
from ..record import record
from .space import KNOWN, Space

__all__ = ["COMPONENTS", "Layout", "Machine", "Priors", "affinity_spec"]

#: the terms of the prior, in the order :meth:`Priors.components` returns them
COMPONENTS = ("load", "pairing", "amdahl", "placement", "counts", "blocktime", "membind")

#: what an infeasible layout (more instances than PUs, a spec the planner refuses) scores
INFEASIBLE = -6.0


def affinity_spec(config: Mapping[str, Any]) -> str | None:
    """The ``KMP_AFFINITY`` string of a configuration's ``affinity`` and ``granularity``.

    Parameters
    ----------
    config : mapping
        A configuration.

    Returns
    -------
    str or None
        ``granularity=G,TYPE`` (or the full string given as ``affinity``, with the
        granularity added when it names none); None when neither is tuned (the
        launcher's default spec applies).
    """
    aff = config.get("affinity")
    gran = config.get("granularity")
    if aff is None and gran is None:
        return None
    aff = "compact,1,0" if aff is None else str(aff)
    if aff in ("none", "disabled"):
        return aff
    if gran is None or "granularity" in aff:
        return aff
    return f"granularity={gran},{aff}"


class Machine:
    """The counts of a topology, and its shares for ``k`` instances (cached).

    Parameters
    ----------
    topology : Topology
        The machine (its allowed PUs).
    """

    def __init__(self, topology: Topology):
        self.topology = topology
        allowed = topology.allowed
        self.cores = max(1, sum(1 for c in topology.cores if c.cpuset & allowed))
        self.pus = max(1, len(allowed))
        self.packages = max(1, sum(1 for p in topology.packages if p.cpuset & allowed))
        self.nodes = max(1, sum(1 for n in topology.numa_nodes if n.cpuset & allowed))
        self.tpc = max(1, self.pus // self.cores)
        self._shares: dict[int, tuple[Topology, int, int, int, int] | None] = {}

    def share(self, k: int) -> tuple[Topology, int, int, int, int] | None:
        """(topology of the first share, its cores, PUs, packages, NUMA nodes) for ``k``
        instances; None when ``k`` disjoint shares cannot be cut."""
        if k not in self._shares:
            try:
                shares = (None,) if k == 1 else partition(self.topology, k)
            except AffinityError:
                self._shares[k] = None
                return None
            topo = self.topology if k == 1 else self.topology.with_allowed(shares[0].cpus)
            cpus = topo.allowed
            cores = sum(1 for c in topo.cores if c.cpuset & cpus)
            pkgs = sum(1 for p in topo.packages if p.cpuset & cpus)
            nodes = sum(1 for n in topo.numa_nodes if n.cpuset & cpus)
            self._shares[k] = (topo, max(1, cores), max(1, len(cpus)), max(1, pkgs), max(1, nodes))
        return self._shares[k]


@record
class Layout:
    """A configuration read with the machine: per instance, what runs where."""

    instances: int
    share_cores: int
    share_pus: int
    share_packages: int
    share_nodes: int
    team: int  #: ``affinity run -t``: threads, else omp, else intra, else one per core
    omp: int  #: OMP_NUM_THREADS exported
    intra: int  #: TF_NUM_INTRAOP_THREADS exported
    inter: int  #: TF_NUM_INTEROP_THREADS exported
    spec: str  #: the KMP_AFFINITY string planned
    blocktime: Any
    membind: str  #: the effective memory policy: "local" or "interleave"
    cpusets: tuple[frozenset[int], ...] | None  #: the team's CPU sets (None: the plan failed)
    bound: bool  #: threads have their own sets (not 'none'/'disabled')
    used_cores: int  #: the cores the team's sets touch


class Priors:
    """Seeds, prior scores and twins of the configurations of ``space`` on ``topology``.

    Parameters
    ----------
    space : Space
        What is searched.
    topology : Topology
        The machine the configurations run on.
    """

    def __init__(self, space: Space, topology: Topology):
        self.space = space
        self.machine = Machine(topology)
        self._layouts: dict[tuple[int, ...], Layout | None] = {}
        self._scores: dict[tuple[int, ...], tuple[float, ...]] = {}
        self._plans: dict[tuple[int, str, int], tuple[Any, ...] | None] = {}

    # ------------------------------------------------------------ layout
    def layout(self, config: Mapping[str, Any]) -> Layout | None:
        """``config`` read with the machine; None when it cannot be laid out (more
        instances than PUs)."""
        key = self.space.key(config)
        if key not in self._layouts:
            self._layouts[key] = self._layout(config)
        return self._layouts[key]

    def _layout(self, cfg: Mapping[str, Any]) -> Layout | None:
        k = int(cfg.get("instances", 1))
        share = self.machine.share(k)
        if share is None:
            return None
        topo, cores, pus, pkgs, nodes = share
        team = int(cfg.get("threads") or cfg.get("omp") or cfg.get("intra") or cores)
        spec = affinity_spec(cfg) or DEFAULT_SPEC
        sets = self._plan(k, topo, spec, team)
        bound = _bound(spec)
        intra_default = _distinct_cores(topo, sets) if sets is not None else min(team, cores)
        pkgs_default = _packages(topo, sets) if sets is not None else 1
        mem = str(cfg.get("membind", "none"))
        mem = "interleave" if mem == "interleave" and self.machine.nodes > 1 else "local"
        return Layout(instances=k, share_cores=cores, share_pus=pus, share_packages=pkgs, share_nodes=nodes,
                      team=team, omp=int(cfg.get("omp", team)),
                      intra=int(cfg.get("intra", cfg.get("threads") or cfg.get("omp") or intra_default)),
                      inter=int(cfg.get("inter", pkgs_default)), spec=spec, blocktime=cfg.get("blocktime", 1),
                      membind=mem, cpusets=sets, bound=bound, used_cores=intra_default if sets is not None else 0)

    def _plan(self, k: int, topo: Topology, spec: str, team: int) -> tuple[frozenset[int], ...] | None:
        key = (k, spec, team)
        if key not in self._plans:
            try:
                self._plans[key] = tuple(plan(spec, team, topo, strict=True).cpusets)
            except (AffinityError, ValueError):
                self._plans[key] = None
        return self._plans[key]

    # ------------------------------------------------------------- twins
    def twin(self, config: Mapping[str, Any]) -> tuple[Any, ...]:
        """A key equal for configurations that launch the same processes the same way.

        Parameters
        ----------
        config : mapping
            A configuration of the space.

        Returns
        -------
        tuple
            Instances, the team's CPU sets, the exported OMP/intra/inter counts, the
            blocktime, the effective memory policy and every parameter the tuner does
            not interpret.
        """
        lay = self.layout(config)
        others = tuple((n, config[n]) for n in self.space.names if n not in KNOWN)
        if lay is None or lay.cpusets is None:
            return ("as-is",) + tuple(sorted(config.items(), key=lambda kv: kv[0]))
        return (lay.instances, lay.cpusets, lay.omp, lay.intra, lay.inter, str(lay.blocktime), lay.membind,
                others)

    # ------------------------------------------------------------- score
    def score(self, config: Mapping[str, Any]) -> float:
        """The prior of ``config`` in units of log-throughput (0 best, negative worse).

        Parameters
        ----------
        config : mapping
            A configuration of the space.

        Returns
        -------
        float
            The sum of :meth:`components`.
        """
        return float(sum(self.components(config)))

    def components(self, config: Mapping[str, Any]) -> tuple[float, ...]:
        """The prior of ``config`` term by term, in the order of :data:`COMPONENTS`.

        Parameters
        ----------
        config : mapping
            A configuration of the space.

        Returns
        -------
        tuple of float
            One penalty (<= 0, log-throughput units) per component; an infeasible
            layout puts :data:`INFEASIBLE` in the first.
        """
        key = self.space.key(config)
        if key not in self._scores:
            lay = self.layout(config)
            if lay is None or lay.cpusets is None:
                self._scores[key] = (INFEASIBLE,) + (0.0,) * (len(COMPONENTS) - 1)
            else:
                self._scores[key] = self._components(config, lay)
        return self._scores[key]

    def _components(self, cfg: Mapping[str, Any], lay: Layout) -> tuple[float, ...]:
        m = self.machine
        return (_load_penalty(lay, m), _pairing_penalty(lay), _amdahl_penalty(lay),
                _placement_penalty(lay), _count_penalty(cfg, lay, m),
                _blocktime_penalty(lay, m) if "blocktime" in cfg else 0.0,
                _membind_penalty(str(cfg["membind"]), lay, m) if "membind" in cfg else 0.0)

    # ------------------------------------------------------------- seeds
    def seeds(self) -> list[dict[str, Any]]:
        """The seeds' rules as configurations of the space (first candidates).

        Returns
        -------
        list of dict
            One configuration: intra = the cores of an instance's share, inter = its
            packages, omp = intra, threads = its cores, blocktime 1 (else 0, else the
            smallest), instances the count whose rule configuration the prior scores
            best; affinity, granularity, membind and other parameters set, one after
            the other, to the choice the prior scores best.
        """
        ks = self.space.choices("instances") if "instances" in self.space.names else (1,)
        best: tuple[float, int, dict[str, Any]] | None = None
        for i, k in enumerate(ks):
            cfg = self._rule(k)
            if cfg is None:
                continue
            cand = (self.score(cfg), -i, cfg)
            if best is None or cand[:2] > best[:2]:
                best = cand
        return [best[2]] if best is not None else [next(self.space.configs())]

    def _rule(self, k: int) -> dict[str, Any] | None:
        share = self.machine.share(k)
        if share is None:
            return None
        _, cores, pus, pkgs, _ = share
        names = self.space.names
        cfg: dict[str, Any] = {}
        for name in names:
            ch = self.space.choices(name)
            if name == "instances":
                cfg[name] = k
            elif name in ("intra", "threads", "omp", "torch_threads"):
                cfg[name] = _snap(ch, cores)
            elif name in ("inter", "interop"):
                cfg[name] = _snap(ch, pkgs)
            elif name == "dataloader_workers":  # the SMT siblings compute leaves free, 1 to 4
                cfg[name] = _snap(ch, max(1, min(pus - cores, 4)))
            elif name == "blocktime":
                cfg[name] = 1 if 1 in ch else 0 if 0 in ch else _snap(ch, 1)
            else:
                cfg[name] = ch[0]
        if "omp" in names and "intra" in names:
            cfg["omp"] = _snap(self.space.choices("omp"), cfg["intra"])
        for name in names:  # the rest: the prior's choice, one parameter after the other
            if name not in ("instances", "intra", "threads", "omp", "inter", "blocktime", "torch_threads",
                            "interop", "dataloader_workers"):
                cfg[name] = max(self.space.choices(name), key=lambda v: self.score({**cfg, name: v}))
        return cfg


# ------------------------------------------------------------------ helpers

def _bound(spec: str) -> bool:
    """Whether ``spec`` gives each thread its own place (not ``none``/``disabled``)."""
    if spec in ("none", "disabled"):
        return False
    try:
        return parse_kmp_affinity(spec, strict=True).type not in ("none", "disabled")
    except (AffinityError, ValueError):
        return True


def _distinct_cores(topo: Topology, sets: tuple[frozenset[int], ...]) -> int:
    return len({topo.pu(p).core for s in sets for p in s if p in topo.cpuset})


def _packages(topo: Topology, sets: tuple[frozenset[int], ...]) -> int:
    return max(1, len({topo.pu(p).package for s in sets for p in s if p in topo.cpuset}))


def _snap(choices: tuple[Any, ...], target: float) -> Any:
    """The numeric choice nearest ``target`` on a log scale (the smaller on a tie)."""
    nums = [c for c in choices if isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0]
    if not nums:
        return choices[0]
    return min(nums, key=lambda c: (abs(math.log2(c / max(target, 1e-9))), c))


def _load_penalty(lay: Layout, m: Machine) -> float:
    """Oversubscription (rarely best), hyper-threads, idle cores."""
    busy = max(lay.omp, lay.intra)
    total = lay.instances * busy
    s = 0.0
    if total > m.pus:
        s -= 1.0 + 1.5 * math.log2(total / m.pus)
    elif total > m.cores:
        s -= 0.15 * math.log2(total / m.cores)
    elif total < m.cores:
        s -= 0.5 * math.log2(m.cores / total)
    if busy > lay.share_pus and total <= m.pus:  # uneven shares: this one is oversubscribed
        s -= 1.0 + 1.5 * math.log2(busy / lay.share_pus)
    return s


def _pairing_penalty(lay: Layout) -> float:
    """OMP = intra, inter-op pool = packages, concurrent teams within the PUs."""
    s = -0.35 * abs(math.log2(lay.omp / lay.intra))
    s -= 0.15 * abs(math.log2(lay.inter / lay.share_packages))
    conc = min(lay.inter, 2)
    if conc * lay.omp > lay.share_pus:  # concurrent ops, each with its team
        s -= 0.2 * math.log2(conc * lay.omp / lay.share_pus)
    return s


def _amdahl_penalty(lay: Layout) -> float:
    """Big teams scale worse than several instances with small ones."""
    return -0.06 * math.log2(max(lay.team, 1))


def _placement_penalty(lay: Layout) -> float:
    """Threads doubled on a core (or a PU) while others are free; unbound threads."""
    if not lay.bound:
        return -0.1
    sets = lay.cpusets or ()
    per_pu: dict[int, float] = {}
    for st in sets:
        for p in st:
            per_pu[p] = per_pu.get(p, 0.0) + 1.0 / len(st)
    s = 0.0
    if per_pu and max(per_pu.values()) > 1.0 + 1e-9 and lay.team <= lay.share_pus:
        s -= 1.0
    used = lay.used_cores
    want = min(lay.team, lay.share_cores)
    if 0 < used < want:  # e.g. 'compact' filling hyper-threads while cores stay idle
        s -= 0.6 * math.log2(want / used)
    return s


def _count_penalty(cfg: Mapping[str, Any], lay: Layout, m: Machine) -> float:
    """Counts that do not divide the cores or PUs; instances that do not fit the nodes."""
    s = 0.0
    for name in ("intra", "omp", "threads"):
        n = cfg.get(name)
        if n is not None and n <= lay.share_pus and lay.share_cores % n and lay.share_pus % n:
            s -= 0.3
    k = lay.instances
    if k > 1 and m.cores % k and m.pus % k:
        s -= 0.3
    if m.nodes > 1 and k > 1 and k % m.nodes and m.nodes % k:
        s -= 0.2
    return s


def _blocktime_penalty(lay: Layout, m: Machine) -> float:
    """0/1 ms is the rule; long spinning hurts most where threads share cores."""
    b = lay.blocktime
    crowded = lay.instances * max(lay.omp, lay.intra) > m.cores or min(lay.inter, 2) > 1
    if b == "infinite":
        return -0.35 * (2 if crowded else 1)
    b = int(b)
    if b <= 1:
        return -0.02 if b == 0 else 0.0
    return (-0.1 if b <= 50 else -0.25) * (2 if crowded else 1)


def _membind_penalty(mb: str, lay: Layout, m: Machine) -> float:
    """Interleave an instance that spans nodes; keep one within a node local.  Where the
    policies place memory alike, the explicit ``local`` comes first."""
    if m.nodes <= 1:
        return -0.005 if mb != "local" else 0.0
    if lay.share_nodes > 1:  # an instance spanning nodes: interleave spreads its memory
        return 0.0 if mb == "interleave" else -0.1
    return -0.15 if mb == "interleave" else -0.005 if mb == "none" else 0.0

