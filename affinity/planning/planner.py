"""The planner: where Intel's OpenMP runtime would bind each thread.

:func:`plan_env` reads an environment (``KMP_AFFINITY``, ``OMP_NUM_THREADS``,
``KMP_HW_SUBSET``, ``OMP_PLACES``, ``OMP_PROC_BIND``, ``GOMP_CPU_AFFINITY``;
anything else is ignored) exactly as the runtime does, malformed values
included, and returns a :class:`Plan`: the team size of the first parallel
region, the OS-proc set of every thread, the place list and the warnings the
runtime would print.  :func:`plan` is the friendly form: a spec string or
value, a thread count, and strict parsing.

Planning is a pure function of (settings, topology, process mask): no system
call is made unless ``topology`` is left out, in which case this machine's
topology is loaded (once) through hwloc.  The runtime's rules are documented
in ``docs/semantics.md``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import runtime as rt
from . import ktopo as kt
from ..cpulist import format_list, parse_list, runs
from ..errors import PlanError, SpecError
from .spec import (SETTINGS_VARIABLES, KmpAffinity, KmpHwSubset, NumThreads, OmpPlaces, OmpProcBind, ProcList,
                   Settings, parse_assignments)
from ..machine.topology import Topology

__all__ = ["Plan", "plan", "plan_env"]


def kmp_mask_str(cpus: Iterable[int]) -> str:
    """An OS-proc set printed the way the runtime prints it (``0,1``,
    ``0-3,8``; three or more consecutive procs become a range)."""
    ids = sorted(set(cpus))
    if not ids:
        return "{<empty>}"
    out = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        if j - i > 1:
            out.append(f"{ids[i]}-{ids[j]}")
        elif j - i == 1:
            out.append(f"{ids[i]},{ids[j]}")
        else:
            out.append(str(ids[i]))
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True, eq=False)
class Plan:
    """Where the runtime binds the threads of the first parallel region.

    Made by :func:`plan` and :func:`plan_env`; immutable.

    Attributes
    ----------
    threads : int
        The team size.
    cpusets : tuple of frozenset of int
        ``cpusets[i]`` is the OS-proc set of thread ``i``.
    places : tuple of frozenset of int or None
        The runtime's place list (``None`` when affinity is disabled).
    place_nums : tuple of int
        ``place_nums[i]`` is the place of thread ``i`` (``omp_get_place_num()``,
        ``-1`` when disabled).
    warnings : tuple of str
        The messages the runtime prints, in order, without their
        ``OMP: Warning #NNN:`` prefix (a message printed twice appears twice).
    affinity_type : str
        The effective type (``compact``, ``scatter``, ``balanced``,
        ``explicit``, ``logical``, ``physical``, ``none``, ``disabled``).
    granularity : str or None
        The effective granularity layer (``thread``, ``core``, ``socket``, ...;
        ``None`` when no place list is built from the topology).
    proc_bind : str
        The binding policy of the team (``intel`` for ``KMP_AFFINITY`` types,
        ``close``/``spread``/``primary`` for ``OMP_PROC_BIND``/``OMP_PLACES``,
        ``false``).
    num_procs : int
        What ``omp_get_num_procs()`` returns.
    env : tuple of (str, str)
        The settings variables planned, as sorted ``(name, value)`` pairs.
    initial_mask : frozenset of int
        The process affinity mask the runtime starts with.
    topology : Topology
        The machine planned for.
    settings : Settings or None
        The parsed settings (:class:`~affinity.planning.spec.Settings`) of a
        strict plan; ``None`` otherwise.
    """

    threads: int
    cpusets: tuple[frozenset[int], ...]
    places: tuple[frozenset[int], ...] | None
    place_nums: tuple[int, ...]
    warnings: tuple[str, ...]
    affinity_type: str
    granularity: str | None
    proc_bind: str
    num_procs: int
    env: tuple[tuple[str, str], ...]
    initial_mask: frozenset[int]
    topology: Topology = field(repr=False)
    settings: Settings | None = field(default=None, repr=False)
    _view: Any = field(default=None, repr=False)

    # ------------------------------------------------------------ equality
    def _key(self) -> tuple[Any, ...]:
        """The values equality and hashing compare (the topology aside)."""
        return (self.threads, self.cpusets, self.places, self.place_nums, self.warnings,
                self.affinity_type, self.granularity, self.proc_bind, self.num_procs, self.env,
                self.initial_mask)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return self._key() == other._key() and self.topology == other.topology

    def __hash__(self) -> int:
        return hash(self._key())

    # ------------------------------------------------------- derived counts
    @property
    def omp_threads(self) -> int:
        """The OpenMP team size."""
        return self.threads

    @functools.cached_property
    def union(self) -> frozenset[int]:
        """Every OS proc some thread may run on."""
        out: set[int] = set()
        for s in set(self.cpusets):
            out |= s
        return frozenset(out)

    @functools.cached_property
    def cores(self) -> tuple[Any, ...]:
        """The cores (``Topology.cores`` entries) the threads may run on."""
        t = self.topology
        seen = sorted({t.pu(o).core for o in self.union if o in t.cpuset})
        return tuple(t.cores[i] for i in seen)

    @functools.cached_property
    def packages(self) -> tuple[Any, ...]:
        """The packages the threads may run on."""
        t = self.topology
        seen = sorted({t.pu(o).package for o in self.union if o in t.cpuset})
        return tuple(t.packages[i] for i in seen)

    @functools.cached_property
    def numa_nodes(self) -> tuple[Any, ...]:
        """The NUMA nodes whose processors the threads may run on."""
        return tuple(n for n in self.topology.numa_nodes if n.cpuset & self.union)

    @property
    def intra_op_threads(self) -> int:
        """Threads for an intra-op pool: the PUs in use at thread (fine)
        granularity, the cores in use otherwise."""
        if self.granularity == "thread":
            return len(self.union)
        return len(self.cores)

    @property
    def inter_op_threads(self) -> int:
        """Threads for an inter-op pool: the packages in use."""
        return len(self.packages)

    # -------------------------------------------------------------- reports
    def explain(self) -> str:
        """The runtime's view, as its ``verbose`` output shows it.

        Returns
        -------
        str
            The warnings, the topology summary, the OS proc -> (socket, core,
            thread) map and one ``thread N bound to OS proc set {...}`` line
            per thread, one per line.
        """
        var = "KMP_AFFINITY"
        if self.proc_bind in ("close", "spread", "primary"):
            var = "OMP_PROC_BIND"
        lines = [f"OMP: Warning: {w}" for w in self.warnings]
        view: kt.KTopo | None = self._view
        if self.affinity_type == "disabled" or view is None:
            lines.append(f"{var}: affinity disabled; threads run on the process mask "
                         f"{{{kmp_mask_str(self.initial_mask)}}}")
        else:
            respect = "not respected" if self._needs_norespect() else "respected"
            lines.append(f"{var}: Initial OS proc set {respect}: {kmp_mask_str(self.initial_mask)}")
            lines.append(f"{var}: {view.num_threads} available OS procs")
            lines.append(f"{var}: {'Uniform' if view.uniform else 'Nonuniform'} topology")
            for t, eq in view.equivalences():
                lines.append(f'{var}: topology layer "{kt.cat(t)}" is equivalent to "{kt.cat(eq)}".')
            lines.append(f"{var}: {view.summary()}")
            lines.append(f"{var}: OS proc to physical thread map:")
            order = sorted(range(view.num_threads), key=lambda i: (view.ids[i], view.os[i]))
            for i in order:
                lines.append(f"{var}: OS proc {view.os[i]} maps to {view.describe_thread(i)}")
        for i, s in enumerate(self.cpusets):
            lines.append(f"{var}: thread {i} bound to OS proc set {{{kmp_mask_str(s)}}}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary of the plan.

        Returns
        -------
        dict
            ``threads``, ``cpusets``, ``places``, ``warnings``, the effective
            settings and the derived counts (pool sizes, packages, cores, NUMA
            nodes in use).
        """
        return {
            "threads": self.threads,
            "cpusets": [sorted(s) for s in self.cpusets],
            "places": None if self.places is None else [sorted(p) for p in self.places],
            "place_nums": list(self.place_nums),
            "warnings": list(self.warnings),
            "affinity_type": self.affinity_type,
            "granularity": self.granularity,
            "proc_bind": self.proc_bind,
            "num_procs": self.num_procs,
            "initial_mask": format_list(self.initial_mask),
            "env": dict(self.env),
            "topology": self.topology.describe(),
            "omp_threads": self.omp_threads,
            "intra_op_threads": self.intra_op_threads,
            "inter_op_threads": self.inter_op_threads,
            "packages": [p.os_index for p in self.packages],
            "cores": [[self.topology.packages[c.package].os_index, c.os_index] for c in self.cores],
            "numa_nodes": [n.os_index for n in self.numa_nodes],
        }

    def to_json(self, **kw: Any) -> str:
        """:meth:`to_dict` as JSON.

        Parameters
        ----------
        **kw
            Passed to :func:`json.dumps` (``indent=2``, ...).

        Returns
        -------
        str
            The JSON text.
        """
        return json.dumps(self.to_dict(), **kw)

    # ---------------------------------------------------------- translations
    def _needs_norespect(self) -> bool:
        """Whether some thread runs outside the initial process mask."""
        return not self.union <= self.initial_mask

    def to_kmp_affinity(self) -> str:
        """An explicit ``KMP_AFFINITY`` giving every thread its set.

        Use it with ``OMP_NUM_THREADS=<threads>`` (:meth:`translation_env`).

        Returns
        -------
        str
            ``granularity=fine,proclist=[...],explicit`` (with ``norespect``
            when a set lies outside the initial mask).
        """
        pl = ProcList.of(self.cpusets)
        spec = KmpAffinity(type="explicit", granularity="thread", proclist=pl,
                           respect=False if self._needs_norespect() else None)
        return str(spec)

    def to_omp_places(self) -> str:
        """An ``OMP_PLACES`` list with one place per thread, in thread order.

        With ``OMP_PROC_BIND=close`` and ``OMP_NUM_THREADS=<threads>`` thread
        ``i`` gets place ``i`` (:meth:`translation_env`).

        Returns
        -------
        str
            The place list, e.g. ``{0:2},{2:2}``.
        """
        return ",".join("{" + _place_members(s) + "}" for s in self.cpusets)

    def to_gomp_cpu_affinity(self) -> str:
        """A ``GOMP_CPU_AFFINITY`` list (libgomp binds thread ``i`` to the ``i``-th CPU).

        Returns
        -------
        str
            The CPUs of the threads, in thread order, separated by spaces.

        Raises
        ------
        PlanError
            Some thread has more than one CPU: only plans where every thread
            has a single CPU can be expressed.
        """
        out = []
        for i, s in enumerate(self.cpusets):
            if len(s) != 1:
                raise PlanError(f"GOMP_CPU_AFFINITY binds each thread to one CPU; thread {i} has "
                                f"{{{kmp_mask_str(s)}}}")
            out.append(str(next(iter(s))))
        return " ".join(out)

    def to_taskset(self) -> str:
        """The ``taskset -c`` list.

        taskset sets one mask for the whole process, so only plans where every
        thread has that same set round-trip.

        Returns
        -------
        str
            The union of the threads' sets, as a cpulist (``0-3,8``).
        """
        return format_list(self.union)

    def to_numactl(self) -> str:
        """The ``numactl --physcpubind=`` argument; same limits as :meth:`to_taskset`.

        Returns
        -------
        str
            ``--physcpubind=`` followed by the union of the threads' sets.
        """
        return "--physcpubind=" + format_list(self.union)

    def translation_env(self, target: str) -> dict[str, str]:
        """The environment that reproduces this plan with ``target``, team size included.

        Parameters
        ----------
        target : {"kmp_affinity", "omp_places", "gomp"}
            The variables to use: ``KMP_AFFINITY``, ``OMP_PLACES`` with
            ``OMP_PROC_BIND=close``, or ``GOMP_CPU_AFFINITY``.

        Returns
        -------
        dict of str to str
            The variables to export, ``OMP_NUM_THREADS`` included.

        Raises
        ------
        PlanError
            ``gomp``: the plan cannot be expressed (a thread with several
            CPUs, or CPUs outside the process mask).
        ValueError
            An unknown ``target``.
        """
        n = str(self.threads)
        if target == "kmp_affinity":
            return {"KMP_AFFINITY": self.to_kmp_affinity(), "OMP_NUM_THREADS": n}
        if target == "omp_places":
            env = {"OMP_PLACES": self.to_omp_places(), "OMP_PROC_BIND": "close", "OMP_NUM_THREADS": n}
            if self._needs_norespect():
                env["KMP_AFFINITY"] = "norespect"
            return env
        if target == "gomp":
            if self._needs_norespect():
                raise PlanError("GOMP_CPU_AFFINITY cannot bind outside the process mask")
            return {"GOMP_CPU_AFFINITY": self.to_gomp_cpu_affinity(), "OMP_NUM_THREADS": n}
        raise ValueError(f"unknown translation target {target!r} (kmp_affinity, omp_places or gomp)")

    def __repr__(self) -> str:
        return (f"<Plan {self.threads} threads, {self.affinity_type}"
                f"{'/' + self.granularity if self.granularity else ''}, proc_bind={self.proc_bind}, "
                f"{len(self.warnings)} warnings on {self.topology.describe()}>")


def _place_members(s: frozenset[int]) -> str:
    """``{0, 1, 2, 3, 8}`` -> ``"0:4,8"`` (OMP_PLACES interval form)."""
    return ",".join(str(a) if a == b else f"{a}:{b - a + 1}" for a, b in runs(s))


# ---------------------------------------------------------------------------
# Caches
# ---------------------------------------------------------------------------

#: the most topologies whose runtime tables are kept (the oldest goes first)
_MAX_TOPOLOGIES = 128
#: the most full masks per topology whose runtime table is kept (then it starts over)
_MAX_MASKS = 64
#: id(topology) -> (weak reference to it, {full mask: canonical runtime topology}).
#: Keyed by identity (hashing a Topology walks all its PUs); the reference checks
#: the id was not reused and its callback drops the entry when the topology dies.
_BASES: dict[int, tuple[weakref.ref[Topology], dict[frozenset[int], kt.KTopo]]] = {}
_BASES_LOCK = threading.Lock()  # serializes the making of entries; lookups are single dict reads


def _base_topology(topology: Topology, procs: frozenset[int]) -> kt.KTopo:
    """The runtime's canonical topology for a full mask, cached per Topology instance."""
    entry = _BASES.get(id(topology))
    if entry is None or entry[0]() is not topology:
        entry = _bases_entry(topology)
    bases = entry[1]
    k = bases.get(procs)
    if k is None:
        k = kt.build(topology, procs)
        if len(bases) > _MAX_MASKS:
            bases.clear()
        bases[procs] = k
    return k


def _bases_entry(topology: Topology) -> tuple[weakref.ref[Topology], dict[frozenset[int], kt.KTopo]]:
    """The cache entry of ``topology`` in :data:`_BASES`, made if missing."""
    key = id(topology)
    with _BASES_LOCK:
        entry = _BASES.get(key)
        if entry is None or entry[0]() is not topology:
            for old in list(_BASES)[:max(0, len(_BASES) + 1 - _MAX_TOPOLOGIES)]:
                _BASES.pop(old, None)
            entry = (weakref.ref(topology, functools.partial(_forget_topology, key)), {})
            _BASES[key] = entry
    return entry


def _forget_topology(key: int, ref: weakref.ref[Topology]) -> None:
    """Weak-reference callback: drop the cache entry of a collected topology.

    Takes no lock (it may run inside :func:`_bases_entry`, in a garbage
    collection); the entry is dropped only if it is still this reference's."""
    entry = _BASES.get(key)
    if entry is not None and entry[0] is ref:
        _BASES.pop(key, None)


@functools.lru_cache(maxsize=4096)
def _settings(items: tuple[tuple[str, str], ...],
              strict: bool) -> tuple[rt.RuntimeSettings, tuple[str, ...], tuple[Any, ...]]:
    """The runtime's settings for sorted variables, with its messages (memoized)."""
    st, texts, diags = rt.process_env(dict(items), strict)
    return st, tuple(texts), tuple(diags)


@functools.lru_cache(maxsize=1024)
def _spec_settings(items: tuple[tuple[str, str], ...]) -> Settings | None:
    """The spec-level settings of (strictly validated) sorted variables (memoized)."""
    try:
        return Settings.from_env(dict(items))
    except SpecError:  # pragma: no cover - strict settings were validated before
        return None


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------

def _mask(topology: Topology, initial_mask: Any) -> frozenset[int]:
    """The initial process mask (default: the topology's allowed procs), checked."""
    if initial_mask is None:
        m = topology.allowed or topology.cpuset
    elif isinstance(initial_mask, str):
        try:
            m = parse_list(initial_mask)
        except ValueError as e:
            raise PlanError(f"bad initial_mask: {e}") from e
    else:
        m = frozenset(int(c) for c in initial_mask)
    m = frozenset(m) & topology.cpuset
    if not m:
        raise PlanError(f"initial_mask {format_list(initial_mask) if not isinstance(initial_mask, str) else initial_mask}"
                        f" selects no processor of {topology.describe()}")
    return m


def _run(env_items: tuple[tuple[str, str], ...], topology: Topology | None, initial_mask: Any,
         strict: bool, threads: int | None) -> Plan:
    """Plan sorted settings variables on ``topology`` (default: this machine)."""
    if topology is None or isinstance(topology, (str, os.PathLike)):
        topology = Topology.load(topology)  # the forms plan, apply and tune all take
    if not isinstance(topology, Topology):
        raise TypeError(f"topology must be a Topology, 'system', 'synthetic:...' or a file, "
                        f"not {type(topology).__name__}")
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads must be an int, not {type(threads).__name__}")
        if threads < 1:
            raise PlanError(f"threads must be at least 1, got {threads}")
    init = _mask(topology, initial_mask)
    st, texts, _diags = _settings(env_items, strict)
    res = rt.evaluate_settings(st, list(texts), topology, init, threads=threads,
                               base_for=lambda procs: _base_topology(topology, procs))
    spec_settings = _spec_settings(env_items) if strict else None
    return Plan(threads=res.threads, cpusets=res.cpusets if isinstance(res.cpusets, tuple) else tuple(res.cpusets),
                places=None if res.places is None else tuple(res.places),
                place_nums=tuple(res.place_nums), warnings=tuple(res.warnings),
                affinity_type=res.affinity_type, granularity=res.granularity, proc_bind=res.proc_bind,
                num_procs=res.num_procs, env=env_items, initial_mask=init, topology=topology,
                settings=spec_settings, _view=res.ktopo)


def _env_items(env: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The settings variables of ``env``, sorted, as ``(name, value)`` pairs."""
    items = []
    for k, v in env.items():
        if k in SETTINGS_VARIABLES and v is not None:
            if not isinstance(v, str):
                raise TypeError(f"{k} must be a string, not {type(v).__name__}")
            items.append((k, v))
    return tuple(sorted(items))


def plan_env(env: Mapping[str, Any], *, topology: Topology | None = None,
             initial_mask: Iterable[int] | str | None = None) -> Plan:
    """Plan from environment variables, read exactly as the runtime reads them.

    Malformed values produce the runtime's warnings and fallbacks (never
    :class:`SpecError`).

    Parameters
    ----------
    env : mapping of str to str
        The environment; only ``KMP_AFFINITY``, ``OMP_NUM_THREADS``,
        ``KMP_HW_SUBSET`` (``KMP_PLACE_THREADS``), ``OMP_PLACES``,
        ``OMP_PROC_BIND`` and ``GOMP_CPU_AFFINITY`` are read; anything else
        is ignored.
    topology : Topology, optional
        The machine (default: this machine's, loaded once through hwloc).
    initial_mask : iterable of int or str, optional
        The process affinity mask (OS proc ids or a cpulist string); by
        default ``topology.allowed``.

    Returns
    -------
    Plan
        What the runtime would do for the first parallel region.

    Raises
    ------
    PlanError
        Where the runtime itself would abort (e.g. ``OMP_NUM_THREADS`` too
        large), or ``initial_mask`` selects no processor of ``topology``.
    TypeError
        A value of ``env`` is not a string, or ``topology`` is not a
        :class:`~affinity.machine.topology.Topology`.
    """
    return _run(_env_items(env), topology, initial_mask, False, None)


_ENV_FORM = re.compile(r"^\s*(" + "|".join(SETTINGS_VARIABLES) + r")=")


# spec value -> the variable its str() is a value of
_SPEC_VARS = ((KmpAffinity, "KMP_AFFINITY"), (OmpPlaces, "OMP_PLACES"), (OmpProcBind, "OMP_PROC_BIND"),
              (KmpHwSubset, "KMP_HW_SUBSET"), (NumThreads, "OMP_NUM_THREADS"), (ProcList, "GOMP_CPU_AFFINITY"))


def _spec_env(spec: Any) -> dict[str, str]:
    """The variables a :func:`plan` spec stands for."""
    if spec is None:
        return {}
    if isinstance(spec, str):
        if _ENV_FORM.match(spec):
            return parse_assignments(spec, what="spec")
        return {"KMP_AFFINITY": spec}
    if isinstance(spec, Settings):
        return spec.to_env()
    for cls, var in _SPEC_VARS:
        if isinstance(spec, cls):
            return {var: str(spec)}
    if isinstance(spec, Mapping):
        return {k: v for k, v in spec.items()}
    raise TypeError(f"cannot plan from a {type(spec).__name__}")


def plan(spec: Any = None, threads: int | None = None, topology: Topology | None = None, *,
         strict: bool = True, env: Mapping[str, str] | None = None,
         initial_mask: Iterable[int] | str | None = None) -> Plan:
    """Plan the binding of ``threads`` OpenMP threads.

    Parameters
    ----------
    spec : str, spec value, mapping or None
        A ``KMP_AFFINITY`` string (``"granularity=fine,compact"``),
        ``KEY=VALUE`` assignments (``"OMP_PLACES=cores OMP_PROC_BIND=spread"``),
        a spec value (:class:`~affinity.planning.spec.KmpAffinity`, ``OmpPlaces``, ...,
        :class:`~affinity.planning.spec.Settings`), a mapping of variables, or
        ``None`` (the runtime's defaults).
    threads : int, optional
        Overrides ``OMP_NUM_THREADS``; ``None`` gives the runtime's default
        team size.
    topology : Topology, optional
        The machine (default: this machine's, loaded once through hwloc).
    strict : bool
        ``True`` (default): malformed or conflicting settings raise
        :class:`SpecError`; ``False`` behaves like :func:`plan_env`.
    env : mapping of str to str, optional
        Further variables (``spec`` wins).
    initial_mask : iterable of int or str, optional
        The process affinity mask (OS proc ids or a cpulist string); by
        default ``topology.allowed``.

    Returns
    -------
    Plan
        What the runtime would do for the first parallel region.

    Raises
    ------
    SpecError
        Malformed or conflicting settings, with ``strict=True``.
    PlanError
        Where the runtime itself would abort, ``threads`` below 1, or an
        ``initial_mask`` that selects no processor of ``topology``.
    TypeError
        ``threads`` is not an int, ``topology`` not a
        :class:`~affinity.machine.topology.Topology`, or ``spec`` of an
        unknown kind.
    """
    merged: dict[str, str] = dict(env or {})
    merged.update(_spec_env(spec))
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads must be an int, not {type(threads).__name__}")
        if threads < 1:
            raise PlanError(f"threads must be at least 1, got {threads}")
        merged["OMP_NUM_THREADS"] = str(threads)
    return _run(_env_items(merged), topology, initial_mask, strict, None)

