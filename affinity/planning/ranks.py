"""Local ranks, and disjoint shares of a node for ranks and instances.

Two parts, both pure:

* :func:`local_rank` reads a process's rank among the processes of its job on
  this node, and how many there are, from the variables MPI launchers, Slurm and
  torchrun set;
* :func:`partition` cuts a machine (the PUs a :class:`~affinity.machine.topology.Topology`
  allows) into ``count`` disjoint shares of whole physical cores, NUMA node by
  NUMA node -- mpibind's idea: spread the shares over the nodes first, so that
  each share's memory can be bound to its own node, then split each node's cores
  between the shares it holds.  Cores are :class:`~affinity.machine.topology.Core`
  objects with their own PU sets, so a "core id" (unique within a package only)
  is never mistaken for a CPU id, and siblings such as ``i`` and ``i+56`` stay
  together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..cpulist import format_list
from ..errors import PlanError
from ..machine.topology import Topology

__all__ = ["LAUNCHER_VARIABLES", "LocalRank", "Share", "local_rank", "parse_rank", "partition", "rank_share",
           "rank_topology"]

#: (launcher, local-rank variable, local-size variable), in the order they are
#: tried: MPI launchers first (an mpirun inside a Slurm allocation inherits the
#: allocation's SLURM_* variables), then torchrun, then Slurm's srun.
LAUNCHER_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("Open MPI", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPICH/Intel MPI (Hydra)", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("MVAPICH2", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("Cray PMI", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"),
    ("torchrun", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("Slurm srun", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"),
)


@dataclass(frozen=True)
class LocalRank:
    """This process's place among the processes of its job on this node."""

    rank: int
    size: int
    source: str  #: which launcher's variables said so, e.g. ``"Open MPI (OMPI_COMM_WORLD_LOCAL_RANK=1, ...)"``

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise PlanError(f"local rank {self.rank} of {self.size} is not a valid rank ({self.source})")


def local_rank(environ: Mapping[str, str]) -> LocalRank | None:
    """The local rank and size from the launcher variables in ``environ``, ``None``
    when no launcher set them.  Variables that are present but malformed raise
    :class:`PlanError` naming them."""
    for name, rank_var, size_var in LAUNCHER_VARIABLES:
        if rank_var not in environ:
            continue
        if size_var not in environ:
            # torchrun always sets both; for Slurm a SLURM_LOCALID without a step
            # (the batch script itself) is one process, not a rank of a step
            continue
        rank = _int(environ, rank_var)
        if size_var == "SLURM_STEP_TASKS_PER_NODE":
            node = _int(environ, "SLURM_NODEID") if "SLURM_NODEID" in environ else 0
            size = _slurm_tasks_on_node(environ[size_var], node)
        else:
            size = _int(environ, size_var)
        return LocalRank(rank, size, f"{name} ({rank_var}={environ[rank_var]}, "
                                     f"{size_var}={environ[size_var]})")
    return None


def parse_rank(text: str, environ: Mapping[str, str]) -> LocalRank:
    """``"auto"`` (from the launcher variables) or an explicit ``"RANK/SIZE"``."""
    if text == "auto":
        r = local_rank(environ)
        if r is None:
            names = ", ".join(v for _, v, _ in LAUNCHER_VARIABLES)
            raise PlanError(f"--ranks auto: no launcher variables found (looked for {names}); "
                            f"start under mpirun/srun/torchrun or give --ranks RANK/SIZE")
        return r
    rank_s, sep, size_s = text.partition("/")
    if not sep or not rank_s.strip().isdigit() or not size_s.strip().isdigit():
        raise PlanError(f"--ranks: expected 'auto' or RANK/SIZE such as '1/4', got {text!r}")
    return LocalRank(int(rank_s), int(size_s), f"--ranks {text}")


def _int(environ: Mapping[str, str], var: str) -> int:
    v = environ[var].strip()
    if not v.isdigit():
        raise PlanError(f"{var}={environ[var]!r} is not a non-negative integer")
    return int(v)


def _slurm_tasks_on_node(text: str, node: int) -> int:
    """``"2(x3),1"`` (tasks per node, run-length encoded) -> the count of node ``node``."""
    counts: list[int] = []
    for item in text.split(","):
        item = item.strip()
        n, _, rep = item.partition("(x")
        if not n.isdigit() or (rep and not rep.rstrip(")").isdigit()):
            raise PlanError(f"SLURM_STEP_TASKS_PER_NODE={text!r}: cannot read {item!r}")
        counts.extend([int(n)] * (int(rep.rstrip(")")) if rep else 1))
    if not 0 <= node < len(counts):
        raise PlanError(f"SLURM_NODEID={node} but SLURM_STEP_TASKS_PER_NODE={text!r} lists "
                        f"{len(counts)} nodes")
    return counts[node]


# --------------------------------------------------------------- partitioning

@dataclass(frozen=True)
class Share:
    """One share of a machine: whole cores (or, when there are more shares than
    cores, single PUs) and the NUMA nodes their PUs belong to."""

    index: int
    cpus: frozenset[int]  #: OS indexes of the PUs
    cores: tuple[int, ...]  #: logical indexes of the cores (a core appears in one share only,
    #: except when shares are single PUs)
    numa_nodes: frozenset[int]  #: OS indexes; empty when the topology knows no NUMA node

    def describe(self) -> str:
        nodes = f" NUMA node{'s' if len(self.numa_nodes) != 1 else ''} {format_list(self.numa_nodes)}" \
            if self.numa_nodes else ""
        cores = f"{len(self.cores)} core{'s' if len(self.cores) != 1 else ''}"
        return f"share {self.index}: cpus {format_list(self.cpus)} ({cores}{',' if nodes else ''}{nodes})"


def partition(topology: Topology, count: int, cores_per_share: int | None = None) -> tuple[Share, ...]:
    """Cut the allowed PUs of ``topology`` into ``count`` disjoint shares.

    * Cores are used whole: a core's allowed PUs stay in one share.
    * Shares are spread over NUMA nodes (packages when no node is known) before
      they are packed: with as many shares as nodes, one node each; with more,
      each node holds a number of shares proportional to its cores and splits its
      cores between them (balanced: sizes differ by at most one core); with
      fewer, each share takes whole neighbouring nodes.
    * ``cores_per_share=C`` gives every share exactly C cores, still node by node
      where they fit (a share never straddles nodes unless no node has C free
      cores); leftover cores are not used.
    * With more shares than cores (and no C), shares are single PUs, spread the
      same way.

    Raises :class:`PlanError` when the shares cannot be disjoint.
    """
    if count < 1:
        raise PlanError(f"partition: need at least one share, got {count}")
    if cores_per_share is not None and cores_per_share < 1:
        raise PlanError(f"partition: cores per share must be >= 1, got {cores_per_share}")
    units = _units(topology)
    if not units:
        raise PlanError(f"no allowed core in {topology.describe()}")
    ncores = sum(len(cs) for _, cs in units)
    if cores_per_share is not None:
        if count * cores_per_share > ncores:
            raise PlanError(
                f"{_n(count, 'share')} of {_n(cores_per_share, 'core')} need {_n(count * cores_per_share, 'core')}, "
                f"but only {ncores} {'is' if ncores == 1 else 'are'} allowed (cpus {format_list(topology.allowed)})")
        groups = _place_fixed(units, count, cores_per_share)
    elif count <= ncores:
        groups = _place_balanced(units, count)
    else:
        npus = len(topology.allowed)
        if count > npus:
            raise PlanError(f"cannot give {_n(count, 'disjoint share')} of cpus {format_list(topology.allowed)}: "
                            f"only {_n(npus, 'PU')} {'is' if npus == 1 else 'are'} allowed")
        # one PU per unit: each allowed PU becomes a "core" of its own
        pu_units = [(dom, [(c, frozenset({p})) for c, ps in cs for p in sorted(ps, key=_pu_order(topology))])
                    for dom, cs in units]
        groups = _place_balanced(pu_units, count)
    return tuple(_share(topology, i, g) for i, g in enumerate(groups))


def _n(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def rank_share(topology: Topology, rank: int, size: int) -> Share:
    """The share of local rank ``rank`` among ``size`` ranks: ``partition(topology, size)[rank]``."""
    if not 0 <= rank < size:
        raise PlanError(f"rank {rank} is not in 0..{size - 1}")
    return partition(topology, size)[rank]


Unit = tuple[int, frozenset[int]]  # (core logical index, its allowed PUs)


def _pu_order(topology: Topology):
    return lambda os_index: topology.pu(os_index).logical_index


def _units(topology: Topology) -> list[tuple[object, list[Unit]]]:
    """Allowed cores grouped by NUMA node (or package), both in topology order."""
    domains: dict[object, list[Unit]] = {}
    for core in topology.cores:
        pus = core.cpuset & topology.allowed
        if not pus:
            continue
        first = topology.pu(min(pus, key=_pu_order(topology)))
        key: object = ("numa", first.numa) if first.numa is not None else ("package", first.package)
        domains.setdefault(key, []).append((core.logical_index, frozenset(pus)))
    return list(domains.items())


def _apportion(weights: list[int], count: int, caps: list[int]) -> list[int]:
    """Split ``count`` over domains in proportion to ``weights`` (largest remainder;
    ties go to the earlier domain), never above ``caps``."""
    total = sum(weights)
    quotas = [count * w / total if total else 0.0 for w in weights]
    k = [min(int(q), c) for q, c in zip(quotas, caps)]
    while sum(k) < count:
        spare = [i for i in range(len(k)) if k[i] < caps[i]]
        if not spare:
            break
        i = max(spare, key=lambda i: (quotas[i] - k[i], -i))
        k[i] += 1
    return k


def _split(items: list, parts: int) -> list[list]:
    """Consecutive chunks whose sizes differ by at most one, larger first."""
    q, r = divmod(len(items), parts)
    out, at = [], 0
    for i in range(parts):
        n = q + (1 if i < r else 0)
        out.append(items[at:at + n])
        at += n
    return out


def _place_balanced(units: list[tuple[object, list[Unit]]], count: int) -> list[list[Unit]]:
    sizes = [len(cs) for _, cs in units]
    if count < len(units):
        # fewer shares than domains: each share takes whole neighbouring domains
        return [[u for _, cs in chunk for u in cs] for chunk in _split(units, count)]
    per = _apportion(sizes, count, sizes)
    groups: list[list[Unit]] = []
    orphans: list[Unit] = []  # cores of a domain too small for a share of its own
    for (_, cs), k in zip(units, per):
        if k == 0:
            if groups:
                groups[-1].extend(cs)
            else:
                orphans.extend(cs)
            continue
        parts = _split(cs, k)
        if orphans:
            parts[0][:0] = orphans
            orphans = []
        groups.extend(parts)
    return groups


def _place_fixed(units: list[tuple[object, list[Unit]]], count: int, c: int) -> list[list[Unit]]:
    caps = [len(cs) // c for _, cs in units]
    groups: list[list[Unit]] = []
    if count >= len(units) and sum(caps) >= count:
        per = _apportion(caps, count, caps)
        for (_, cs), k in zip(units, per):
            groups.extend(cs[i * c:(i + 1) * c] for i in range(k))
    elif count < len(units):
        # fewer shares than domains: one share per chunk of neighbouring domains,
        # from the first domain of the chunk that holds C cores
        for chunk in _split(units, count):
            fitting = next((cs for _, cs in chunk if len(cs) >= c), None)
            groups.append(fitting[:c] if fitting is not None else [u for _, cs in chunk for u in cs][:c])
    if len(groups) == count and all(len(g) == c for g in groups):
        return groups
    # no placement node by node: take cores in topology order, across nodes
    flat = [u for _, cs in units for u in cs]
    return [flat[i * c:(i + 1) * c] for i in range(count)]


def _share(topology: Topology, index: int, group: list[Unit]) -> Share:
    cpus = frozenset().union(*(pus for _, pus in group))
    cores = tuple(dict.fromkeys(c for c, _ in group))
    nodes = frozenset(topology.numa_nodes[topology.pu(p).numa].os_index for p in cpus
                      if topology.pu(p).numa is not None)
    return Share(index, cpus, cores, nodes)


def rank_topology(topology: Topology, rank: str | LocalRank = "auto",
                  environ: Mapping[str, str] | None = None) -> tuple[Topology, LocalRank, Share]:
    """``topology`` restricted to this rank's share of the node, for in-process use
    (``affinity.apply(..., rank="auto")``): ``rank`` is ``"auto"`` (launcher
    variables of ``environ``, default ``os.environ``), ``"R/N"`` or a
    :class:`LocalRank`.  Returns the restricted topology, the rank and its share."""
    import os

    r = rank if isinstance(rank, LocalRank) else parse_rank(rank, os.environ if environ is None else environ)
    share = rank_share(topology, r.rank, r.size)
    return topology.with_allowed(share.cpus), r, share
