"""The OpenMP runtime's view of a machine (``kmp_topology_t``), as a value.

Private to the planner.  Given a :class:`~affinity.machine.topology.Topology` and the
set of OS procs the runtime considers (its "full mask"), this builds the
runtime's table of hardware threads exactly as Intel's runtime does with its
``cpuinfo`` method plus the NUMA layer libiomp5 reads from sysfs:

1. one row per available PU: ids ``(physical id, core id, rank in core)``,
   sorted by ids then OS proc id (ranks count only the available PUs of a
   core, by OS id, as when the runtime numbers the hardware threads of a
   ``/proc/cpuinfo`` record without ``thread id``).  A core is its
   ``(physical id, core id)``: on machines whose core ids restart in every
   die, the same-numbered cores of a package's dies are one core to the
   runtime (checked against libiomp5 on such machines, ``x_die_*``);
2. extra layers a richer topology knows (dies, tiles, modules) are inserted
   by the runtime's layer insertion rule and the rows re-sorted (as the
   hwloc/x2APIC methods produce them) -- unless a layer cuts through one of
   the runtime's cores (die-restarting core ids), which the runtime then has
   no such layer; caches become equivalences, never layers;
3. the NUMA layer: libiomp5 reads ``node0``, ``node1``, ... until the first
   missing node; the nodes that hold procs of the full mask are numbered in
   that order, every PU gets the number of the node listing it (0 when none
   does; no layer when no node read holds one) and the layer is inserted
   *without* re-sorting the rows;
4. ``canonicalize``: radix-1 layers are removed (recording which layers are
   equivalent), counts/ratios, uniformity, per-level sub-ids, and the
   last-level-cache equivalence (socket when there are no caches);
5. ``KMP_HW_SUBSET`` filtering (counts/ratios recomputed, sub-ids kept).

Everything here is pure and deterministic; instances are cached by the
planner per (topology, full mask, NUMA layer or not).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..syntax import CATALOG, HW_LAYERS
from ..kmp import KmpHwSubset
from typing import Any


# kmp_hw_t, in the runtime's enumeration order
SOCKET, PROC_GROUP, NUMA, DIE, LLC, L3, TILE, MODULE, L2, L1, CORE, THREAD = range(12)
NLAYERS = 12
UNKNOWN = -1
KEYWORDS = HW_LAYERS  # the layer keywords, in kmp_hw_t order: index = layer type
TYPE_OF = {k: i for i, k in enumerate(KEYWORDS)}
_MAIN = (SOCKET, CORE, THREAD)
_PREFERENCE = {SOCKET: 110, PROC_GROUP: 100, CORE: 95, THREAD: 90, NUMA: 85, DIE: 80, TILE: 75,
               MODULE: 73, L3: 70, L2: 65, L1: 60, LLC: 5}
_GROUP_KINDS = {"die": DIE, "tile": TILE, "module": MODULE}
_CACHE_TYPES = {1: L1, 2: L2, 3: L3}


def cat(t: int, plural: bool = False) -> str:
    return CATALOG[KEYWORDS[t]][1 if plural else 0]


#: per layer L, the byte table of :meth:`KTopo.gather`: a change above L -> ``a``, at L -> ``b``
_RUNS = [bytes.maketrans(bytes(range(layer + 1)), b"a" * layer + b"b") for layer in range(NLAYERS + 1)]

#: core type indexer values (``kmp_hw_core_type_t``) of a hybrid machine's cores; 0 is unknown
CORE_TYPE_ATOM, CORE_TYPE_CORE = 1, 2


class KTopo:
    """The runtime's topology table.  Attributes mirror ``kmp_topology_t``."""

    __slots__ = ("depth", "types", "os", "ids", "_sub_ids", "_changes", "core_type", "core_eff", "equivalent",
                 "ratio", "count", "uniform", "n_threads_per_core", "n_cores_per_pkg", "n_packages",
                 "n_cores", "hybrid", "num_core_effs", "subset_warnings", "filtered",
                 "machine_procs")

    def __init__(self) -> None:
        self.depth = 0
        self.types: list[int] = []
        self.os: list[int] = []
        self.ids: list[list[int]] = []
        self._sub_ids: list[tuple[int, ...]] = []
        self._changes: list[int] | None = None  # sub_ids still to be made from these
        self.core_type: list[int] = []
        self.core_eff: list[int] = []
        self.equivalent = [UNKNOWN] * NLAYERS
        self.ratio: list[int] = []
        self.count: list[int] = []
        self.uniform = True
        self.n_threads_per_core = 1
        self.n_cores_per_pkg = 1
        self.n_packages = 1
        self.n_cores = 1
        self.hybrid = False
        self.num_core_effs = 0
        self.subset_warnings: list[str] = []
        self.filtered = False
        self.machine_procs = 0

    # ---------------------------------------------------------------- memo
    # ------------------------------------------------------------- queries
    @property
    def sub_ids(self) -> list[tuple[int, ...]]:
        """Per row, the index of its object at each layer within its parent
        (``kmp_hw_thread_t::sub_ids``).  Made on first use: a plan whose order
        is the table's own (``compact``) never needs them."""
        if self._changes is not None:
            self._sub_ids = _sub_ids(self._changes, self.depth)
            self._changes = None
        return self._sub_ids

    @sub_ids.setter
    def sub_ids(self, value: list[tuple[int, ...]]) -> None:
        self._sub_ids, self._changes = value, None

    @property
    def num_threads(self) -> int:
        return len(self.os)

    def get_level(self, t: int) -> int:
        eq = self.equivalent[t]
        if eq == UNKNOWN:
            return -1
        try:
            return self.types.index(eq)
        except ValueError:
            return -1

    def calculate_ratio(self, level1: int, level2: int) -> int:
        r = 1
        for level in range(level1, level2, -1):
            r *= self.ratio[level]
        return r

    def set_equivalent(self, t1: int, t2: int) -> None:
        real = self.equivalent[t2]
        if real == UNKNOWN:
            real = t2
        self.equivalent[t1] = real
        for t in range(NLAYERS):
            if self.equivalent[t] == t1:
                self.equivalent[t] = real

    @property
    def procs(self) -> frozenset[int]:
        return frozenset(self.os)

    # -------------------------------------------------------- construction
    def insert_layer(self, t: int, new_ids: Sequence[int]) -> None:
        """``_insert_layer``: put the layer above the first layer it does not
        refine (an equal layer goes above).  Rows are not re-sorted.

        Each layer is scanned, as in the runtime, for the first row where the
        layer and the new ids disagree about "a new object starts here"; the
        previous row's ids carry over from one layer's scan to the next (the
        runtime's ``previous_id``/``previous_new_id`` are not reset)."""
        prev_id: Any = UNKNOWN
        prev_new: Any = UNKNOWN
        target = 0
        n = len(self.os)
        new = list(new_ids)
        # rows 1..n-1: does the new layer start an object where the row before differs?
        new_starts = [a != b for a, b in zip(new[1:], new)]
        while target < self.depth and n:
            col = [row[target] for row in self.ids]
            # row 0 against the ids carried over, then the first disagreement after it
            start_cur, start_new = col[0] != prev_id, new[0] != prev_new
            cur_starts = [a != b for a, b in zip(col[1:], col)]
            if start_cur != start_new:
                i = 0
            elif cur_starts == new_starts:
                i = n
            else:
                i = next(j for j, (a, b) in enumerate(zip(cur_starts, new_starts)) if a != b) + 1
            if i == n:  # the layers are equal
                break
            above = (col[i] != prev_id) if i == 0 else (col[i] != col[i - 1])
            if i > 0:
                prev_id, prev_new = col[i - 1], new[i - 1]
            if above:  # the new layer is strictly above this one
                break
            target += 1
        self.types.insert(target, t)
        for row, v in zip(self.ids, new):
            row.insert(target, v)
        self.equivalent[t] = t
        self.depth += 1

    def sort_ids(self) -> None:
        order = sorted(range(len(self.os)), key=lambda i: (self.ids[i], self.os[i]))
        self._reorder(order)

    def _reorder(self, order: Sequence[int]) -> None:
        self.os = [self.os[i] for i in order]
        self.ids = [self.ids[i] for i in order]
        if self.sub_ids:
            self.sub_ids = [self.sub_ids[i] for i in order]
        self.core_type = [self.core_type[i] for i in order]
        self.core_eff = [self.core_eff[i] for i in order]

    def remove_radix1_layers(self) -> None:
        """``_remove_radix1_layers``: of two adjacent layers (not both socket, core
        or thread) where each object of the outer one holds one object of the
        inner one, remove the less preferred and record it as equivalent to
        the other."""
        t1, t2 = 0, 1
        while t1 < self.depth - 1 and t2 < self.depth:
            type1, type2 = self.types[t1], self.types[t2]
            if type1 in _MAIN and type2 in _MAIN:
                t1, t2 = t2, t2 + 1
                continue
            radix1, all_same = self._radix1(t1, t2)
            if radix1:
                if _PREFERENCE[type1] > _PREFERENCE[type2]:
                    remove_type, remove_layer, keep = type2, t2, type1
                else:
                    remove_type, remove_layer, keep = type1, t1, type2
                remove_ids = remove_layer
                if all_same:
                    remove_ids = t2
                self.set_equivalent(remove_type, keep)
                for row in self.ids:
                    del row[remove_ids]
                del self.types[remove_layer]
                self.depth -= 1
            else:
                t1, t2 = t2, t2 + 1

    def _radix1(self, t1: int, t2: int) -> tuple[bool, bool]:
        """(radix 1: layer ``t2`` never starts an object inside one of ``t1``,
        ``t2``'s id never changes)."""
        ids = self.ids
        radix1 = True
        all_same = True
        id1 = ids[0][t1]
        id2 = ids[0][t2]
        for row in ids:
            a, b = row[t1], row[t2]
            if a == id1 and b != id2:
                radix1 = False
                break
            if b != id2:
                all_same = False
            id1, id2 = a, b
        return radix1, all_same

    def first_changes(self) -> list[int]:
        """Per row, the first layer whose id differs from the previous row's
        (0 for the first row, ``depth`` for a row equal to the previous one):
        where the runtime's loops over ``hw_threads`` see a new object."""
        n, depth = len(self.ids), self.depth
        if not n:
            return []
        out = [depth] * n
        cols = list(zip(*self.ids))
        for layer in range(depth - 1, -1, -1):
            col = cols[layer]
            out[1:] = [layer if a != b else f for a, b, f in zip(col[1:], col, out[1:])]
        out[0] = 0
        return out

    def gather(self, changes: Sequence[int] | None = None) -> None:
        """``_gather_enumeration_information`` + ``_discover_uniformity``
        (``changes``: :meth:`first_changes`, when already known).

        A row whose first change is at layer L starts a new object at L and at
        every layer below it: the count of layer L is the number of rows whose
        change is at L or above.  The ratio of layer L (the most objects of L
        inside one object of the layer above) is one plus the most rows changing
        exactly at L between two rows changing above L -- read off a byte string
        of the changes (``b"a"`` above, ``b"b"`` at L, deeper ones dropped)."""
        depth = self.depth
        if changes is None:
            changes = self.first_changes()
        raw = bytes(changes)
        count = [raw.count(layer) for layer in range(depth)]
        for layer in range(1, depth):  # a new object at a layer is new at every layer below
            count[layer] += count[layer - 1]
        ratio = [count[0]] + [1 + max(map(len, raw.translate(_RUNS[layer], bytes(range(layer + 1, 256))).split(b"a")))
                              for layer in range(1, depth)]
        self.count, self.ratio = count, ratio
        if self.hybrid:
            self._gather_core_attributes(changes)
        num = 1
        for r in ratio:
            num *= r
        self.uniform = num == count[depth - 1]

    def _gather_core_attributes(self, changes: Sequence[int]) -> None:
        """``_gather_enumeration_information`` on a hybrid machine: the number of
        core efficiencies (the core types are only collected there)."""
        core_level = self.get_level(CORE)
        num_effs = 0
        if core_level >= 0:
            for i, layer in enumerate(changes):
                if layer <= core_level and self.core_eff[i] >= num_effs:
                    num_effs = self.core_eff[i] + 1
        self.num_core_effs = num_effs

    def set_globals(self) -> None:
        pkg = self.get_level(SOCKET)
        core = self.get_level(CORE)
        thread = self.get_level(THREAD)
        self.n_threads_per_core = self.calculate_ratio(thread, core)
        if pkg != -1:
            self.n_cores_per_pkg = self.calculate_ratio(core, pkg)
            self.n_packages = self.count[pkg]
        else:
            self.n_cores_per_pkg = self.count[core]
            self.n_packages = 1
        self.n_cores = self.count[core]

    def set_last_level_cache(self) -> None:
        eq = self.equivalent
        if eq[L3] != UNKNOWN:
            self.set_equivalent(LLC, L3)
        elif eq[L2] != UNKNOWN:
            self.set_equivalent(LLC, L2)
        elif eq[L1] != UNKNOWN:
            self.set_equivalent(LLC, L1)
        if self.equivalent[LLC] == UNKNOWN:
            if eq[SOCKET] != UNKNOWN:
                self.set_equivalent(LLC, SOCKET)
            elif eq[CORE] != UNKNOWN:
                self.set_equivalent(LLC, CORE)

    def canonicalize(self) -> None:
        self.remove_radix1_layers()
        changes = self.first_changes()
        self.gather(changes)
        self._sub_ids, self._changes = [], changes  # sub_ids made from these on first use
        self.set_globals()
        self.set_last_level_cache()

    def restrict(self, keep: frozenset[int] | set[int]) -> bool:
        """``restrict_to_mask``: drop the rows whose proc is not in ``keep``;
        sub-ids are *not* recomputed (as in the runtime)."""
        idx = [i for i, o in enumerate(self.os) if o in keep]
        if len(idx) == len(self.os):
            return False
        self._reorder(idx)
        self.gather()
        self.set_globals()
        self.set_last_level_cache()
        return True

    def copy(self) -> "KTopo":
        k = KTopo()
        k.depth = self.depth
        k.types = list(self.types)
        k.os = list(self.os)
        k.ids = [list(r) for r in self.ids]
        k._sub_ids, k._changes = list(self._sub_ids), self._changes
        k.core_type = list(self.core_type)
        k.core_eff = list(self.core_eff)
        k.equivalent = list(self.equivalent)
        k.ratio = list(self.ratio)
        k.count = list(self.count)
        k.uniform = self.uniform
        k.n_threads_per_core = self.n_threads_per_core
        k.n_cores_per_pkg = self.n_cores_per_pkg
        k.n_packages = self.n_packages
        k.n_cores = self.n_cores
        k.hybrid = self.hybrid
        k.num_core_effs = self.num_core_effs
        k.subset_warnings = list(self.subset_warnings)
        k.filtered = self.filtered
        k.machine_procs = self.machine_procs
        return k

    # --------------------------------------------------------- reporting
    def summary(self) -> str:
        """The runtime's one-line ``N sockets x M cores/socket x ...`` text."""
        print_types = list(self.types)
        if self.equivalent[CORE] != CORE:
            if print_types and print_types[-1] == THREAD:
                print_types[-1] = CORE
                print_types.append(THREAD)
            else:
                print_types.append(CORE)
        if self.equivalent[THREAD] != THREAD:
            print_types.append(THREAD)
        parts = []
        level = 0
        denom = None
        for p, t in enumerate(print_types):
            if self.equivalent[t] != t:
                c = 1
            else:
                c = self.ratio[level]
                level += 1
            name = cat(t, c > 1)
            if p == 0:
                parts.append(f"{c} {name}")
            else:
                parts.append(f" x {c} {name}/{cat(denom)}")  # type: ignore[arg-type]
            denom = t
        core_level = self.get_level(CORE)
        ncores = self.count[core_level] if core_level >= 0 else 0
        return "".join(parts) + f" ({ncores} total cores)"

    def equivalences(self) -> list[tuple[int, int]]:
        return [(t, self.equivalent[t]) for t in range(NLAYERS)
                if self.equivalent[t] not in (UNKNOWN, t)]

    def describe_thread(self, i: int) -> str:
        return " ".join(f"{cat(t)} {self.ids[i][lvl]}" for lvl, t in enumerate(self.types))


# ---------------------------------------------------------------------------
# Building from a Topology
# ---------------------------------------------------------------------------

def _core_kind(kind: str | None) -> int:
    if not kind:
        return 0
    k = kind.lower()
    if "atom" in k:
        return CORE_TYPE_ATOM
    if "core" in k:
        return CORE_TYPE_CORE
    return 0


def build(topology: Any, procs: frozenset[int], numa: bool = True) -> KTopo:
    """The canonical runtime topology of ``topology`` restricted to ``procs``
    (the runtime's full mask): the steps of the module docstring."""
    k = _cpuinfo_table(topology, procs)
    # Layers a richer topology knows (hwloc XML of a real machine).
    if _insert_groups(k, topology):
        k.sort_ids()
    _cache_equivalences(k, topology)
    if numa and topology.numa_nodes:
        _insert_numa(k, topology)
    k.canonicalize()
    return k


def _cpuinfo_table(topology: Any, procs: frozenset[int]) -> KTopo:
    """``__kmp_affinity_create_cpuinfo_map``: one row ``[physical id, core id,
    thread]`` per available PU, sorted by ids then OS proc; the thread number
    counts the available PUs of a ``(physical id, core id)`` by OS proc.  The
    runtime knows a core only by those two ids: where core ids repeat in the
    dies of a package (the kernel numbers cores per die on multi-die parts), the
    same-numbered cores of a package are one core to it."""
    pkg_os = [p.os_index for p in topology.packages]
    cores = topology.cores
    core_os = [c.os_index for c in cores]
    # [physical id, core id, OS proc] per PU, sorted; the third id then becomes the rank
    pus = topology.pus
    if len(procs) < len(pus):  # else every PU (procs are PUs of the machine)
        pus = [pu for pu in pus if pu.os_index in procs]
    rows = [[pkg_os[pu.package], core_os[pu.core], pu.os_index] for pu in pus]
    if not rows:
        raise ValueError("no available processor")
    rows.sort()
    k = KTopo()
    k.machine_procs = len(topology.pus)
    kinds = {c.kind for c in cores if c.kind}
    k.hybrid = hybrid = len(kinds) > 1
    k.os = [r[2] for r in rows]
    last_pkg = last_core = None
    rank = 0
    for r in rows:
        pkg, cid = r[0], r[1]
        if cid == last_core and pkg == last_pkg:
            rank += 1
        else:
            rank = 0
            last_pkg, last_core = pkg, cid
        r[2] = rank
    k.ids = rows
    if hybrid:
        effs = sorted({c.efficiency for c in cores if c.efficiency is not None})
        core_of = [cores[topology.pu(o).core] for o in k.os]
        k.core_type = [_core_kind(c.kind) for c in core_of]
        k.core_eff = [effs.index(c.efficiency) if c.efficiency is not None else 0 for c in core_of]
    else:
        k.core_type = [0] * len(rows)
        k.core_eff = [-1] * len(rows)
    k.types = [SOCKET, CORE, THREAD]
    k.depth = 3
    for t in k.types:
        k.equivalent[t] = t
    return k


def _insert_groups(k: KTopo, topology: Any) -> bool:
    """Dies, tiles and modules of a richer topology (the hwloc and x2APIC
    methods' layers) inserted by the runtime's insertion rule; True when one
    was.  Such a layer holds whole cores: one that cuts through a runtime core
    (core ids repeating in every die, which the runtime's cores merge) is a
    layer the runtime cannot have, and is left out."""
    inserted = False
    groups = getattr(topology, "groups", ())
    for g in groups:
        t = _GROUP_KINDS.get(g.kind)
        if t is None or k.equivalent[t] != UNKNOWN:
            continue
        owner = {}
        for x in groups:
            if x.kind == g.kind:
                v = x.os_index if x.os_index is not None else x.logical_index
                for c in x.cpuset:
                    owner[c] = v
        new_ids = [owner.get(o, 0) for o in k.os]
        if _cuts_cores(k, new_ids):
            continue
        k.insert_layer(t, new_ids)
        inserted = True
    return inserted


def _cuts_cores(k: KTopo, new_ids: Sequence[int]) -> bool:
    """A new layer's ids differ between two PUs of one runtime core."""
    core_level = k.types.index(CORE)
    seen: dict[tuple[int, ...], int] = {}
    for row, v in zip(k.ids, new_ids):
        key = tuple(row[:core_level + 1])
        if seen.setdefault(key, v) != v:
            return True
    return False


def _cache_equivalences(k: KTopo, topology: Any) -> None:
    """Caches never become layers (as with the x2APIC method): a cache level is
    equivalent to the innermost layer (threads excluded) whose objects share it
    exactly."""
    caches = getattr(topology, "caches", ())
    if not caches:
        return
    prefixes: dict[int, tuple[int, ...]] = {}
    for level in sorted({c.level for c in caches}):
        t = _CACHE_TYPES.get(level)
        if t is None:
            continue
        owner: dict[int, int] = {}
        for c in caches:
            if c.level == level:
                for cpu in c.cpuset:
                    owner[cpu] = c.logical_index
        part = _labels([owner.get(o, -1) for o in k.os])
        for lvl in range(k.depth - 2, -1, -1):  # innermost first, threads excluded
            if lvl not in prefixes:
                prefixes[lvl] = _labels([tuple(r[:lvl + 1]) for r in k.ids])
            if part == prefixes[lvl]:
                k.set_equivalent(t, k.types[lvl])
                break


def _insert_numa(k: KTopo, topology: Any) -> None:
    """libiomp5's NUMA layer: ``node0``, ``node1``, ... until the first missing
    node; the nodes holding procs of the full mask are domains 0, 1, ... in that
    order, a proc no such node lists is in domain 0; no layer at all when no node
    read holds a proc of the full mask (node ids with a gap, a mask on the nodes
    after it); inserted without re-sorting.  Checked against libiomp5 with node
    ids {0, 2} and {0, 1, 3} under process masks and ``KMP_HW_SUBSET``."""
    by_id = {n.os_index: n for n in topology.numa_nodes}
    procs = frozenset(k.os)
    node_of: dict[int, int] = {}
    i = 0
    while i in by_id:
        mine = by_id[i].cpuset & procs
        if mine:
            node_of.update(dict.fromkeys(mine, len(set(node_of.values()))))
        i += 1
    if node_of:
        k.insert_layer(NUMA, [node_of.get(o, 0) for o in k.os])


# ---------------------------------------------------------------------------
# KMP_HW_SUBSET
# ---------------------------------------------------------------------------

def filter_hw_subset(k: KTopo, subset: KmpHwSubset) -> tuple[bool, list[str]]:
    """``kmp_topology_t::filter_hw_subset`` (``kmp_affinity.cpp``), applied to ``k`` in place.

    Returns (filtered, messages); messages are gated affinity warnings.
    Non-absolute subsets are first completed with ``*`` items for socket,
    core and thread and treated as absolute (the runtime's
    ``kmp_hw_subset_t::canonicalize``)."""
    msgs: list[str] = []
    items, absolute = _subset_items(k, subset)
    checked = _check_subset_items(k, items, absolute, msgs)
    if checked is None:
        return False, msgs
    levels, using_types, using_effs = checked
    abs_sub = _absolute_sub_ids(k, levels) if absolute else None
    attr_sub = _attribute_sub_ids(k, using_types) if using_types or using_effs else None
    keep = _kept_procs(k, items, levels, abs_sub, attr_sub, using_types)
    if not keep:
        msgs.append("KMP_HW_SUBSET ignored: all hardware resources would be filtered, please reduce the filter.")
        return False, msgs
    k.restrict(frozenset(keep))
    return True, msgs


def _subset_items(k: KTopo, subset: KmpHwSubset) -> tuple[list[list[Any]], bool]:
    """The start of ``filter_hw_subset``: the items, one per layer type as
    ``[type, [(num, offset, attr), ...]]``, sorted by topology level
    (``kmp_hw_subset_t::sort``), and ``kmp_hw_subset_t::canonicalize``: a
    non-absolute subset on a machine with socket, core and thread levels gets
    ``*`` items for the missing ones and becomes absolute.  Returns (items,
    absolute)."""
    items: list[list[Any]] = []
    for it in subset.items:
        t = TYPE_OF[it.layer]
        for entry in items:
            if entry[0] == t:
                entry[1].append((it.count, it.offset, it.attr))
                break
        else:
            items.append([t, [(it.count, it.offset, it.attr)]])
    items.sort(key=lambda e: k.get_level(e[0]))
    absolute = subset.absolute
    if not absolute:
        targeted = (SOCKET, CORE, THREAD)
        if all(k.get_level(t) != -1 for t in targeted):
            for t in targeted:
                if not any(k.equivalent[e[0]] == t for e in items):
                    items.append([t, [(None, 0, None)]])
            items.sort(key=lambda e: k.get_level(e[0]))
            absolute = True
    return items, absolute


def _check_subset_items(k: KTopo, items: list[list[Any]], absolute: bool,
                        msgs: list[str]) -> tuple[list[int], bool, bool] | None:
    """``filter_hw_subset``'s check that ``KMP_HW_SUBSET`` is a valid subset of
    the detected topology: every layer detected, no two equivalent layers,
    counts within the ratios (non-absolute subsets), core attributes valid.
    Replaces each item's type by its equivalent.  Returns (the items' levels,
    using core types, using core efficiencies), or None (the subset is
    ignored; the reason is in ``msgs``)."""
    specified: dict[int, int] = {}
    levels: list[int] = []
    using_types = using_effs = False
    core_level = k.get_level(CORE)
    for e in items:
        t = e[0]
        eq = k.equivalent[t]
        level = k.get_level(t)
        levels.append(level)
        if eq == UNKNOWN:
            msgs.append(f"KMP_HW_SUBSET ignored: {cat(t)}: level not detected in machine topology.")
            return None
        e[0] = eq
        if eq in specified:
            msgs.append(f"KMP_HW_SUBSET ignored: {cat(t)}, {cat(specified[eq])}: layers are equivalent, "
                        "please only specify one.")
            return None
        specified[eq] = t
        num, offset, _ = e[1][0]
        max_count = k.ratio[level]
        if not absolute:
            if max_count < 0 or (num is not None and num + offset > max_count):
                msgs.append(f"KMP_HW_SUBSET ignored: {cat(t, (num or 0) > 1)}: too many requested.")
                return None
        if level == core_level:
            attrs = _check_core_attributes(k, e[1], using_types, using_effs, msgs)
            if attrs is None:
                return None
            using_types, using_effs = attrs
    return levels, using_types, using_effs


def _check_core_attributes(k: KTopo, entries: list[tuple[Any, ...]], using_types: bool, using_effs: bool,
                           msgs: list[str]) -> tuple[bool, bool] | None:
    """``filter_hw_subset``'s check of the core item's attributes (core type
    or efficiency): only on a hybrid machine (a single attributed item is
    ignored elsewhere), not both kinds, efficiencies in range, no item without
    an attribute beside attributed ones, no attribute twice.  Returns (using
    core types, using core efficiencies), or None (the subset is ignored)."""
    for (_n, _o, attr) in entries:
        if attr:
            if attr.startswith("eff"):
                using_effs = True
            else:
                using_types = True
    if (using_effs or using_types) and not k.hybrid:
        if len(entries) == 1:
            msgs.append("KMP_HW_SUBSET: ignoring %s attribute. This machine is not a hybrid "
                        "architecutre." % ("efficiency" if using_effs else "core_type"))
            using_effs = using_types = False
        else:
            msgs.append("KMP_HW_SUBSET ignored: Too many attributes specified. This machine is not "
                        "a hybrid architecutre.")
            return None
    problem = _attribute_conflict(k, entries, using_types, using_effs)
    if problem is not None:
        msgs.append(problem)
        return None
    return using_types, using_effs


def _attribute_conflict(k: KTopo, entries: list[tuple[Any, ...]], using_types: bool,
                        using_effs: bool) -> str | None:
    """Why ``filter_hw_subset`` ignores the core item's attributes, if it does:
    both kinds given, an efficiency out of range, an item without an attribute
    beside attributed ones, or an attribute given twice."""
    if using_types and using_effs:
        return "KMP_HW_SUBSET ignored: core_type, efficiency: attributes are ambiguous, please only specify one."
    if using_effs:
        for (_n, _o, attr) in entries:
            if attr and attr.startswith("eff"):
                eff = int(attr[3:])
                if eff < 0 or eff >= k.num_core_effs:
                    return f"KMP_HW_SUBSET ignored: efficiency: attribute value {eff} is invalid."
    if (using_types or using_effs) and len(entries) > 1:
        attrs = [a for (_n, _o, a) in entries]
        if any(a is None for a in attrs):
            other = next(a for a in attrs if a is not None)
            return (f"KMP_HW_SUBSET ignored: core, {_attr_name(other, True)}: attributes are "
                    "ambiguous, please only specify one.")
        if len(set(attrs)) != len(attrs):
            dup = next(a for a in attrs if attrs.count(a) > 1)
            return f"KMP_HW_SUBSET ignored: {_attr_name(dup, True)}: attribute specified more than once."
    return None


def _absolute_sub_ids(k: KTopo, levels: Sequence[int]) -> list[dict[int, int]]:
    """``filter_hw_subset``'s ``abs_sub_ids`` of an absolute subset: per
    hardware thread, the index of its object at each targeted level within
    its nearest targeted ancestor (or the whole machine)."""
    targeted = sorted({lv for lv in levels if lv >= 0})
    abs_sub: list[dict[int, int]] = []
    prev_row: Any = None
    counters = {lv: -1 for lv in targeted}
    for i in range(k.num_threads):
        sub = k.sub_ids[i]
        if prev_row is None:
            for lv in targeted:
                counters[lv] = 0
        else:
            # first level whose object changed
            changed = next((lv for lv in range(k.depth) if sub[lv] != prev_row[lv]), None)
            if changed is not None:
                first = True
                for lv in targeted:
                    if lv < changed:
                        continue
                    if first:
                        counters[lv] += 1
                        first = False
                    else:
                        counters[lv] = 0
        prev_row = sub
        abs_sub.append(dict(counters))
    return abs_sub


def _attribute_sub_ids(k: KTopo, using_types: bool) -> list[int]:
    """``filter_hw_subset``'s per-attribute core sub-ids (``core_type_sub_ids``
    / ``core_eff_sub_ids``): per hardware thread, the running index of its
    core among the cores of the same type (efficiency) within the level above
    cores."""
    core_level = k.get_level(CORE)
    attr_sub: list[int] = []
    run: dict[int, int] = {}
    prev = None
    for i in range(k.num_threads):
        key = k.core_type[i] if using_types else k.core_eff[i]
        sub = k.sub_ids[i]
        if prev is not None:
            changed = next((lv for lv in range(core_level + 1) if sub[lv] != prev[lv]), None)
            if changed is not None:
                if changed < core_level:
                    run[key] = -1
                run[key] = run.get(key, -1) + 1
        else:
            run[key] = 0
        prev = sub
        attr_sub.append(run[key])
    return attr_sub


def _kept_procs(k: KTopo, items: list[list[Any]], levels: Sequence[int], abs_sub: list[dict[int, int]] | None,
                attr_sub: list[int] | None, using_types: bool) -> set[int]:
    """``filter_hw_subset``'s ``should_be_filtered`` over every hardware
    thread: the OS procs whose object at each item's level lies within the
    item's offset and count (the sub-ids of ``abs_sub`` for an absolute
    subset, else the topology's; at the core level, the per-attribute sub-ids
    ``attr_sub`` of the item with the core's attribute, when attributes are
    used)."""
    core_level = k.get_level(CORE)
    keep = set()
    for i in range(k.num_threads):
        drop = False
        for e, level in zip(items, levels):
            if level == -1:
                continue
            if attr_sub is not None and level == core_level:
                val = k.core_type[i] if using_types else k.core_eff[i]
                match = None
                for (num, offset, attr) in e[1]:
                    if attr is None:
                        continue
                    av = _attr_value(attr, using_types)
                    if av == val:
                        match = (num, offset)
                        break
                if match is None:
                    drop = True
                    break
                num, offset = match
                sid = attr_sub[i]
            else:
                num, offset, _ = e[1][0]
                sid = abs_sub[i][level] if abs_sub is not None else k.sub_ids[i][level]
            if sid < offset or (num is not None and sid >= offset + num):
                drop = True
                break
        if not drop:
            keep.add(k.os[i])
    return keep


def _attr_value(attr: str, types: bool) -> int:
    if types:
        return CORE_TYPE_ATOM if attr == "intel_atom" else CORE_TYPE_CORE
    return int(attr[3:])


def _attr_name(attr: str, plural: bool) -> str:
    if attr.startswith("eff"):
        return f"{'cores' if plural else 'core'} eff={attr[3:]}"
    kind = "Intel Atom(R) processor" if attr == "intel_atom" else "Intel(R) Core(TM) processor"
    return f"{kind} {'cores' if plural else 'core'}"


def _sub_ids(changes: Sequence[int], depth: int) -> list[tuple[int, ...]]:
    """``_set_sub_ids``: per row, a counter per layer that grows where the row
    starts a new object at that layer and restarts at 0 below it."""
    sub = [-1] * depth
    out = []
    last = depth - 1
    for layer in changes:
        if layer == last:
            sub[last] += 1
        elif layer < depth:
            sub[layer] += 1
            sub[layer + 1:] = [0] * (last - layer)
        out.append(tuple(sub))
    return out


def _labels(keys: Sequence[Any]) -> tuple[int, ...]:
    """The partition of positions that ``keys`` defines, as canonical labels (each
    key numbered by its first appearance): equal labels, equal partitions."""
    first: dict[Any, int] = {}
    return tuple([first.setdefault(key, len(first)) for key in keys])
