"""Disjoint shares of a node for ranks and instances, and a rank's share: pure.

* :func:`partition` cuts a machine (the PUs a :class:`~affinity.machine.topology.Topology`
  allows) into ``count`` disjoint shares of whole physical cores, NUMA node by
  NUMA node -- mpibind's idea: spread the shares over the nodes first, so that
  each share's memory can be bound to its own node, then split each node's cores
  between the shares it holds.  Cores are :class:`~affinity.machine.topology.Core`
  objects with their own PU sets, so a "core id" (unique within a package only)
  is never mistaken for a CPU id, and siblings such as ``i`` and ``i+56`` stay
  together.
* :func:`place_rank` gives a local rank its share: a launcher that bound the rank
  itself (:class:`~affinity.planning.launchers.LauncherBinding`) is followed -- it
  never fights the launcher --, else the node is cut between the ranks.
* :func:`kinds_note`, :func:`unranked_warning`, :func:`crowded_hint`: what is said
  about shares (core kinds on hybrid machines, ranks that would plan on one node's
  CPUs, a share that cannot be cut).

The launcher variables are read elsewhere (:mod:`affinity.binding.launchvars`);
here they arrive as values (:class:`~affinity.planning.launchers.Job`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..cpulist import format_list
from ..errors import PlanError
from ..machine.topology import Topology
from ..record import record, replace
from .launchers import Job, LauncherBinding, LocalRank

__all__ = ["Share", "crowded_hint", "kinds_note", "partition", "place_rank", "rank_kinds_note", "rank_share",
           "replaced_binding", "unranked_warning", "whole_share"]


@record
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
    * On a hybrid machine (cores of several kinds, ``Core.efficiency``), a node's
      shares keep the kinds apart when shares of those same balanced sizes can
      (8 P-cores and 16 E-cores in 3 shares: 8 | 8 | 8); otherwise they are cut
      as on any machine, and :func:`kinds_note` says which shares mix kinds.
    * ``cores_per_share=C`` gives every share exactly C cores; leftover cores are
      not used.  As many shares as possible stay within one node (a share spans
      nodes only when no node has C free cores left); those that must span nodes
      stay within one package where its leftover cores allow, take the nodes with
      the most cores left first (so they span few), and come after the shares
      that fit in a node.  Inside a node, shares keep to one core kind and then
      to one last-level cache where the node's shares fit that way.
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
    kind = _kind_of(topology)
    if cores_per_share is not None:
        if count * cores_per_share > ncores:
            raise PlanError(
                f"{_n(count, 'share')} of {_n(cores_per_share, 'core')} need {_n(count * cores_per_share, 'core')}, "
                f"but only {ncores} {'is' if ncores == 1 else 'are'} allowed (cpus {format_list(topology.allowed)})")
        groups = _place_fixed(topology, units, count, cores_per_share)
    elif count <= ncores:
        groups = _place_balanced(units, count, kind)
    else:
        npus = len(topology.allowed)
        if count > npus:
            raise PlanError(f"cannot give {_n(count, 'disjoint share')} of cpus {format_list(topology.allowed)}: "
                            f"only {_n(npus, 'PU')} {'is' if npus == 1 else 'are'} allowed")
        # one PU per unit: each allowed PU becomes a "core" of its own
        pu_units = [(dom, [(c, frozenset({p})) for c, ps in cs for p in sorted(ps, key=_pu_order(topology))])
                    for dom, cs in units]
        groups = _place_balanced(pu_units, count, kind)
    return tuple(_share(topology, i, g) for i, g in enumerate(groups))


def _n(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def whole_share(topology: Topology, index: int) -> Share:
    """The allowed PUs of ``topology`` as one share numbered ``index``."""
    units = [u for _, cs in _units(topology) for u in cs]
    if not units:
        raise PlanError(f"no allowed core in {topology.describe()}")
    return _share(topology, index, units)


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


def _kind_of(topology: Topology) -> Callable[[int], int] | None:
    """A core's kind (its efficiency rank, -1 when unknown; higher is faster) by its
    logical index, or ``None`` on a machine whose cores are all of one kind."""
    cores = topology.cores
    if not cores or all(c.efficiency == cores[0].efficiency for c in cores):
        return None
    return [-1 if c.efficiency is None else c.efficiency for c in cores].__getitem__


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
    return _chunks(items, [q + 1] * r + [q] * (parts - r))


def _chunks(items: list, sizes: list[int]) -> list[list]:
    out, at = [], 0
    for n in sizes:
        out.append(items[at:at + n])
        at += n
    return out


def _runs(units: list[Unit], key: Callable[[int], object]) -> list[list[Unit]]:
    """``units`` cut where ``key`` of the core changes (topology order kept)."""
    runs: list[list[Unit]] = []
    last: object = object()
    for u in units:
        k = key(u[0])
        if k != last:
            runs.append([])
            last = k
        runs[-1].append(u)
    return runs


def _split_kinds(units: list[Unit], parts: int, kind: Callable[[int], int] | None) -> list[list[Unit]]:
    """:func:`_split`, with the chunks' sizes (the same sizes) ordered so that no
    chunk mixes core kinds, when such an order exists; else :func:`_split`."""
    runs = [len(r) for r in _runs(units, kind)] if kind is not None else []
    sizes = _kind_sizes(runs, parts) if len(runs) > 1 else None
    return _split(units, parts) if sizes is None else _chunks(units, sizes)


def _kind_sizes(runs: list[int], parts: int) -> list[int] | None:
    """Sizes q+1 (r of them) and q, as :func:`_split` gives for ``parts`` chunks of
    ``sum(runs)`` items, in an order whose chunk boundaries fall on every run
    boundary (larger chunks first in each run), or ``None`` when none does."""
    q, r = divmod(sum(runs), parts)
    if q == 0:
        return None
    ways: dict[int, tuple[int, ...]] = {0: ()}  # big chunks used so far -> big chunks per run
    for length in runs:
        after: dict[int, tuple[int, ...]] = {}
        for used, path in ways.items():
            for a in range(min(r - used, length // (q + 1)), -1, -1):
                if (length - a * (q + 1)) % q == 0:
                    after.setdefault(used + a, path + (a,))
        ways = after
    if r not in ways:
        return None
    sizes: list[int] = []
    for length, a in zip(runs, ways[r]):
        sizes += [q + 1] * a + [q] * ((length - a * (q + 1)) // q)
    return sizes


def _place_balanced(units: list[tuple[object, list[Unit]]], count: int,
                    kind: Callable[[int], int] | None = None) -> list[list[Unit]]:
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
        parts = _split_kinds(cs, k, kind)
        if orphans:
            parts[0][:0] = orphans
            orphans = []
        groups.extend(parts)
    return groups


# shares of exactly C cores

def _place_fixed(topology: Topology, units: list[tuple[object, list[Unit]]], count: int,
                 c: int) -> list[list[Unit]]:
    """``count`` shares of ``c`` cores: as many as can be inside one node each (in
    topology order), then those that must span nodes (:func:`_span`)."""
    levels = _inner_levels(topology)
    inside: list[list[Unit]] = []
    pools: list[list[Unit]] = []  # each node's cores left over
    for (_, cs), k in zip(units, _fixed_counts(units, count, c)):
        got, left = _pack(cs, k, c, levels)
        inside.extend(sorted(got, key=lambda g: g[0][0]))
        pools.append(list(left))
    return inside + _span(topology, units, pools, count - len(inside), c)


def _fixed_counts(units: list[tuple[object, list[Unit]]], count: int, c: int) -> list[int]:
    """How many shares of ``c`` cores each node holds whole: every one it can when
    they are too few for ``count``; else spread (one share per chunk of neighbouring
    nodes with fewer shares than nodes, else in proportion to what each holds)."""
    caps = [len(cs) // c for _, cs in units]
    if sum(caps) <= count:
        return caps
    if count < len(units):
        per = [0] * len(units)
        for chunk in _split(list(range(len(units))), count):
            first = next((i for i in chunk if caps[i]), None)
            if first is None:
                return _apportion(caps, count, caps)
            per[first] += 1
        return per
    return _apportion(caps, count, caps)


Level = tuple[Callable[[int], object], bool]  # (a core's group by its logical index, fill fastest first)


def _inner_levels(topology: Topology) -> list[Level]:
    """The groups a node's shares keep to, in order: one core kind (the fastest
    kind filled first), then one last-level cache (spread over the caches)."""
    levels: list[Level] = []
    kind = _kind_of(topology)
    if kind is not None:
        levels.append((kind, True))
    llcs = topology.llcs
    if len(llcs) > 1:
        llc_of = {p: llc.logical_index for llc in llcs for p in llc.cpuset}
        levels.append(([llc_of.get(next(iter(c.cpuset)), -1) for c in topology.cores].__getitem__, False))
    return levels


def _pack(units: list[Unit], k: int, c: int, levels: list[Level]) -> tuple[list[list[Unit]], list[Unit]]:
    """``k`` shares of ``c`` cores out of ``units`` (``k * c <= len(units)``), each
    inside one group of the first level where they fit, and the units left over."""
    if k == 0:
        return [], units
    for at, (key, fastest_first) in enumerate(levels):
        runs = _runs(units, key)
        if 1 < len(runs) < len(units):  # a level of one group, or of one core per group, says nothing
            break
    else:
        return [units[i * c:(i + 1) * c] for i in range(k)], units[k * c:]
    caps = [len(r) // c for r in runs]
    if sum(caps) <= k:
        per = caps
    elif fastest_first:
        per, left = [0] * len(runs), k
        for i in sorted(range(len(runs)), key=lambda i: -key(runs[i][0][0])):  # type: ignore[operator]
            per[i] = min(caps[i], left)
            left -= per[i]
    else:
        per = _apportion(caps, k, caps)
    shares: list[list[Unit]] = []
    pools: list[list[Unit]] = []
    for run, n in zip(runs, per):
        got, left_over = _pack(run, n, c, levels[at + 1:])
        shares.extend(got)
        pools.append(list(left_over))
    if len(shares) < k:
        shares.extend(_gather(pools, k - len(shares), c))
    return shares, [u for p in pools for u in p]


def _gather(pools: list[list[Unit]], n: int, c: int) -> list[list[Unit]]:
    """``n`` shares of ``c`` units taken out of ``pools`` (emptied in place), each from
    as few pools as it can: the fullest pools first, the rest from the smallest pool
    that holds it."""
    out: list[list[Unit]] = []
    for _ in range(n):
        need, share = c, []
        while need:
            fit = [i for i, p in enumerate(pools) if len(p) >= need]
            i = min(fit, key=lambda i: len(pools[i])) if fit else max(range(len(pools)), key=lambda i: len(pools[i]))
            take = min(need, len(pools[i]))
            share.extend(pools[i][:take])
            del pools[i][:take]
            need -= take
        out.append(sorted(share, key=lambda u: u[0]))
    return out


def _span(topology: Topology, units: list[tuple[object, list[Unit]]], pools: list[list[Unit]], n: int,
          c: int) -> list[list[Unit]]:
    """``n`` shares of ``c`` cores out of the nodes' leftover ``pools``: inside one
    package where its leftover cores allow (spread over the packages), then across."""
    if n == 0:
        return []
    packages: dict[int, list[list[Unit]]] = {}
    for (_, cs), pool in zip(units, pools):
        packages.setdefault(topology.cores[cs[0][0]].package, []).append(pool)
    fits = [sum(len(p) for p in ps) // c for ps in packages.values()]
    per = fits if sum(fits) <= n else _apportion(fits, n, fits)
    out: list[list[Unit]] = []
    for ps, k in zip(packages.values(), per):
        out.extend(_gather(ps, k, c))
    return out + _gather(pools, n - len(out), c)


def _share(topology: Topology, index: int, group: list[Unit]) -> Share:
    cpus = frozenset().union(*(pus for _, pus in group))
    cores = tuple(dict.fromkeys(c for c, _ in group))
    nodes = frozenset(topology.numa_nodes[topology.pu(p).numa].os_index for p in cpus
                      if topology.pu(p).numa is not None)
    return Share(index, cpus, cores, nodes)


# core kinds (hybrid machines)

def kinds_note(topology: Topology, shares: Sequence[Share], cores_per_share: int | None = None,
               noun: str = "share", mine: int | None = None) -> str | None:
    """A sentence when ``shares`` of a hybrid ``topology`` are not all of one core
    kind, ``None`` otherwise: each share's core kinds (shares alike grouped; with
    ``mine``, that one's first, for the rank that holds it), that a team on mixed
    kinds runs at the pace of its slower cores and that shares of different kinds do
    not run at the same speed; for a balanced split (no ``cores_per_share``) that
    mixes kinds, the nearest share counts that keep them apart.  ``noun`` names a
    share in the sentence (``"rank"``, ``"instance"``)."""
    kind = _kind_of(topology)
    if kind is None:
        return None
    kinds = [_kinds_in(topology, s) for s in shares]
    if len(set(kinds)) == 1 and len(kinds[0]) <= 1:
        return None
    mixed = any(len(k) > 1 for k in kinds)
    others = [i for i in range(len(shares)) if i != mine]
    said = [f"this {noun}'s share: {_kinds_text(kinds[mine])}"] if mine is not None else []
    alike: dict[tuple[tuple[str, int], ...], list[int]] = {}
    for i in others:
        alike.setdefault(kinds[i], []).append(i)
    listed = ", ".join(f"{noun}{'s' if len(ix) > 1 else ''} {format_list(ix)}: {_kinds_text(k)}"
                       for k, ix in alike.items())
    whose = ("the other " if mine is not None else "the ") + noun + ("s" if noun == "share" else "s' shares")
    said.append(f"{whose}: {listed}")
    why = []
    if mixed:
        why.append("a team on cores of several kinds runs at the pace of its slower ones")
    if len(set(kinds)) > 1:
        why.append(f"the {noun}s do not run at the same speed")
    text = f"core kinds differ: {'; '.join(said)}: {' and '.join(why)}"
    if mixed and cores_per_share is None:
        text += "; " + _apart_text(topology, len(shares), kind)
    return text


def rank_kinds_note(topology: Topology, rank: LocalRank, share: Share) -> str | None:
    """:func:`kinds_note` for local rank ``rank`` when its ``share`` is its part of
    :func:`partition` of ``topology`` (not a launcher's own mask); ``None`` on a
    machine of one core kind."""
    if rank.size < 2 or _kind_of(topology) is None:
        return None
    shares = partition(topology, rank.size)
    if shares[rank.rank].cpus != share.cpus:
        return None
    return kinds_note(topology, shares, noun="rank", mine=rank.rank)


def _kinds_in(topology: Topology, share: Share) -> tuple[tuple[str, int], ...]:
    """(kind, cores) of ``share``, the fastest kind first."""
    count: dict[tuple[int, str], int] = {}
    for i in share.cores:
        core = topology.cores[i]
        eff = -1 if core.efficiency is None else core.efficiency
        key = (eff, core.kind or f"efficiency-{eff}")
        count[key] = count.get(key, 0) + 1
    return tuple((name, n) for (_, name), n in sorted(count.items(), key=lambda kv: -kv[0][0]))


def _kinds_text(kinds: tuple[tuple[str, int], ...]) -> str:
    return " + ".join(f"{n} {name}" for name, n in kinds) + f" core{'' if sum(n for _, n in kinds) == 1 else 's'}"


def _apart_text(topology: Topology, count: int, kind: Callable[[int], int]) -> str:
    """Which share counts nearest ``count`` give balanced shares of one kind each."""
    units = _units(topology)
    ncores = sum(len(cs) for _, cs in units)

    def apart(k: int) -> bool:
        return all(len({kind(c) for c, _ in g}) == 1 for g in _place_balanced(units, k, kind))

    below = next((k for k in range(count - 1, 1, -1) if apart(k)), None)
    above = next((k for k in range(count + 1, ncores + 1) if apart(k)), None)
    near = " or ".join(str(k) for k in (below, above) if k is not None)
    return (f"no split into {count} shares of balanced size keeps the kinds apart here"
            + (f"; {near} shares would" if near else ""))


# ------------------------------------------------------------- placing a rank

def place_rank(topology: Topology, rank: LocalRank, binding: LauncherBinding | None = None,
               whole: frozenset[int] | None = None) -> tuple[Share, str]:
    """This rank's share of ``topology.allowed`` (the CPUs it inherited), and a
    sentence saying how it was chosen.

    * No launcher binding: ``partition(topology, rank.size)[rank.rank]``.
    * The launcher bound the rank and lists every rank's mask (srun), and this
      process's CPUs lie inside its listed mask: the ranks it gave the same mask
      cut those CPUs between them; a rank alone on its mask plans inside all of it.
    * The launcher bound the rank without listing the others' (Open MPI, Hydra), or
      its list does not hold this process's CPUs: a mask narrower than ``whole``
      (the CPUs the job's ranks started from: the cgroup's cpuset, default the
      machine) is the rank's own, planned inside as it is; a mask as wide as
      ``whole`` says nothing, and is cut as without binding.
    """
    mine = topology.allowed
    whole = (whole if whole is not None else topology.cpuset) & topology.cpuset
    if binding is None:
        share = rank_share(topology, rank.rank, rank.size)
        return share, f"rank {rank.rank} of {rank.size} on this node ({rank.source}): {share.describe()}"
    said = f"{binding.launcher} bound local rank {rank.rank} of {rank.size} to cpus {format_list(mine)} " \
           f"({binding.evidence})"
    listed = binding.mask_of(rank.rank)
    if listed is not None and mine <= listed:
        peers = [i for i in range(rank.size) if binding.mask_of(i) == listed]
        if len(peers) > 1:
            share = replace(partition(topology, len(peers))[peers.index(rank.rank)], index=rank.rank)
            return share, (f"{said}, as it bound local ranks {format_list(peers)}: this rank takes share "
                           f"{peers.index(rank.rank)} of {len(peers)} of that mask: {share.describe()}")
    elif not mine < whole:
        share = rank_share(topology, rank.rank, rank.size)
        return share, (f"{said}, all the CPUs the ranks have: cut between the {rank.size} ranks: "
                       f"{share.describe()}")
    share = whole_share(topology, rank.rank)
    return share, f"{said}: planning inside that mask, not cutting the node again: {share.describe()}"


def replaced_binding(binding: LauncherBinding, rank: LocalRank, inherited: frozenset[int],
                     start: frozenset[int]) -> str:
    """What ``--norespect`` says under a launcher's binding: the ranks start from
    ``start`` (the cgroup's cpuset) in place of the mask ``inherited`` the launcher
    gave, and are cut as if unbound (:func:`place_rank` without the binding)."""
    return (f"--norespect: starting from the cgroup's cpuset {format_list(start)} in place of the binding "
            f"{binding.launcher} gave local rank {rank.rank} of {rank.size} ({_cpus(inherited)}, "
            f"{binding.evidence})")


def _cpus(cpus: frozenset[int]) -> str:
    """``CPU 0``, ``CPUs 0,3``: a CPU list that cannot be read as a count."""
    return f"{'CPU' if len(cpus) == 1 else 'CPUs'} {format_list(cpus)}"


def crowded_hint(job: Job, rank: LocalRank, binding: LauncherBinding | None,
                 mine: frozenset[int], cgroup: frozenset[int]) -> str:
    """What to do when ``rank``'s share cannot be cut from ``mine``, the CPUs this
    process may use, narrower than the ``cgroup``'s cpuset: the launcher whose
    binding was followed (``binding``), one whose binding (``job.binding``) an
    explicit ``--ranks R/N`` cut as if it were the node, or a binding no variable
    announced."""
    only = f"this process may use only {_cpus(mine)} of the cgroup's {format_list(cgroup)}"
    unbound = "start the ranks unbound (srun --cpu-bind=none, mpirun --bind-to none)"
    norespect = f"pass --norespect to cut the cgroup's cpuset {format_list(cgroup)} between the ranks instead"
    if binding is not None:
        listed = binding.mask_of(rank.rank)
        peers = [i for i in range(rank.size) if listed is not None and binding.mask_of(i) == listed]
        shared = f" and gave local ranks {format_list(peers)} that same mask" if len(peers) > 1 else ""
        return (f"; {only}: {binding.launcher} bound it there ({binding.evidence}){shared}: have the launcher "
                f"give each rank CPUs of its own (srun --cpu-bind=cores, mpirun --bind-to core), {unbound}, "
                f"or {norespect}")
    theirs = job.binding
    if theirs is not None and rank.launcher == "":
        return (f"; {only}: {theirs.launcher} bound it there ({theirs.evidence}), and {rank.source} cuts "
                f"that mask as if it were the node: use --ranks auto to follow the launcher's binding, "
                f"{unbound}, or {norespect}")
    return (f"; {only}, and no launcher variable says it was bound: if something bound the ranks without a "
            f"variable saying so (torchrun --numa-binding, taskset, an MPI launcher affinity does not read), "
            f"{unbound} or {norespect}")


def unranked_warning(topology: Topology, job: Job, whole: frozenset[int] | None = None,
                     norespect: bool = False) -> str | None:
    """The warning for a process planned without a rank that a launcher started as
    local rank R of N > 1 (``job.rank``) and that would plan on CPUs its rank
    shares with the others (``topology.allowed``: what it plans on; ``norespect``:
    the launcher's binding is replaced); ``None`` for a single rank, or a rank the
    launcher gave CPUs of its own (malformed launcher variables: ``--ranks auto``
    names them)."""
    r = job.rank
    if r is None or r.size < 2:
        return None
    binding = None if norespect else job.binding
    try:
        share: Share | None = place_rank(topology, r, binding, whole)[0]
    except PlanError:
        share = None
    if share is not None and share.cpus == topology.allowed:
        return None  # the launcher gave this rank CPUs of its own
    said = (f"{r.source}: this process is local rank {r.rank} of {r.size} on this node and, without --ranks, "
            f"plans on all of cpus {format_list(topology.allowed)}, which other ranks plan on too")
    if share is None:
        return f"{said}: there are more ranks than these CPUs can give disjoint shares to; start fewer per node"
    return f"{said}: --ranks auto gives each a disjoint share (this rank's: cpus {format_list(share.cpus)})"
