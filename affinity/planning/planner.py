"""The planner: where an OpenMP runtime would bind each thread.

:func:`plan_env` reads an environment (``KMP_AFFINITY``, ``OMP_NUM_THREADS``,
``KMP_HW_SUBSET``, ``OMP_PLACES``, ``OMP_PROC_BIND``, ``GOMP_CPU_AFFINITY``;
anything else is ignored) exactly as the runtime does, malformed values
included, and returns a :class:`Plan`: the team size of the first parallel
region, the OS-proc set of every thread, the place list and the warnings the
runtime would print.  :func:`plan` is the friendly form: a spec string or
value, a thread count, and strict parsing.

Whose rules: ``runtime=`` names a module of :data:`RUNTIMES` (Intel's libiomp5
by default); each runtime's rules live in a package of their own under
``planning/`` behind the interface of :mod:`affinity.planning.rules`.

Planning is a pure function of (settings, topology, process mask, runtime):
no system call is made; the machine is an input (``affinity.plan()`` and
``affinity.plan_env()``, in :mod:`affinity.binding.here`, supply this machine's
:meth:`Topology.from_system` when none is given).  Two caches, both keyed by
every input they depend on: how a runtime read an environment (:func:`_read`),
and per Topology value what its rules computed (:func:`_memo`).  The runtime's
rules are documented in ``docs/semantics.md``.
"""

from __future__ import annotations

import functools
import re
import threading
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping

from ..cpulist import check_ids, format_list, parse_list, runs
from ..errors import ArgumentTypeError, PlanError, UsageError
from ..machine.topology import Topology
from ..record import field, record
from .gnu.rules import GNU, GNU_TORCH
from .intel import llvm
from .intel import runtime as intel
from .intel.runtime import kmp_mask_str
from . import envvars
from .rules import Memo, Outcome, Rules
from .spec import SETTINGS_VARIABLES, VARIABLES, KmpAffinity, ProcList, Settings, parse_assignments, parse_lenient
from typing import Any


__all__ = ["Plan", "RUNTIMES", "plan", "plan_env", "unread"]

#: The runtimes whose rules the planner follows: name -> the module of its rules
#: (the interface is described in :mod:`affinity.planning.rules`).  A new runtime
#: is a sibling package of ``intel/`` and one entry here.
RUNTIMES: dict[str, Rules] = {
    intel.NAME: intel,
    llvm.NAME: llvm,
    GNU.NAME: GNU,  # GNU libgomp, GCC 12 (planning/gnu/)
    GNU_TORCH.NAME: GNU_TORCH,  # PyTorch's bundled libgomp, GCC 8.5 (planning/gnu/builds.py)
}
#: The runtime whose rules a plan follows when none is named.
DEFAULT_RUNTIME = "intel"


@record(eq=False)
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
    runtime : str
        Whose rules the plan followed (a name of :data:`RUNTIMES`: ``intel``, ...).
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
    runtime: str = DEFAULT_RUNTIME
    _view: Any = field(default=None, repr=False)

    # ------------------------------------------------------------ equality
    def _key(self) -> tuple[Any, ...]:
        """The values equality and hashing compare (the topology aside)."""
        return (self.threads, self.cpusets, self.places, self.place_nums, self.warnings,
                self.affinity_type, self.granularity, self.proc_bind, self.num_procs, self.env,
                self.initial_mask, self.runtime)

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
        granularity, the cores in use otherwise; never more than the team (a team
        of one thread whose set spans the machine -- ``none``, ``disabled`` -- is one)."""
        if self.granularity == "thread":
            return min(self.threads, len(self.union))
        return min(self.threads, len(self.cores))

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
            per thread, one per line (as the plan's runtime words them).
        """
        lines = RUNTIMES[self.runtime].explain(self)
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
            "runtime": self.runtime,
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
        import json  # lazy: only to_json prints JSON (affinity run starts without it)

        return json.dumps(self.to_dict(), **kw)

    # ---------------------------------------------------------- translations
    def _needs_norespect(self) -> bool:
        """Whether some thread runs outside the initial process mask."""
        return not self.union <= self.initial_mask

    def to_kmp_affinity(self) -> str:
        """An explicit ``KMP_AFFINITY`` giving every thread its set
        (:func:`affinity.planning.envvars.explicit_kmp_affinity`)."""
        return envvars.explicit_kmp_affinity(self)

    def to_omp_places(self) -> str:
        """An ``OMP_PLACES`` list with one place per thread, in thread order
        (:func:`affinity.planning.envvars.omp_places`)."""
        return envvars.omp_places(self)

    def to_gomp_cpu_affinity(self) -> str:
        """A ``GOMP_CPU_AFFINITY`` list (:func:`affinity.planning.envvars.gomp_cpu_affinity`)."""
        return envvars.gomp_cpu_affinity(self)

    def to_taskset(self) -> str:
        """The ``taskset -c`` list: the union of the threads' sets (taskset sets one mask
        for the whole process: only plans where every thread has that set round-trip)."""
        return format_list(self.union)

    def to_numactl(self) -> str:
        """The ``numactl --physcpubind=`` argument; same limits as :meth:`to_taskset`."""
        return "--physcpubind=" + format_list(self.union)

    def translation_env(self, target: str) -> dict[str, str]:
        """The environment that reproduces this plan with ``target`` (``"kmp_affinity"``,
        ``"omp_places"``, ``"gomp"``), team size included
        (:func:`affinity.planning.envvars.translation_env`)."""
        return envvars.translation_env(self, target)

    def __repr__(self) -> str:
        return (f"<Plan {self.threads} threads, {self.affinity_type}"
                f"{'/' + self.granularity if self.granularity else ''}, proc_bind={self.proc_bind}, "
                f"{len(self.warnings)} warnings on {self.topology.describe()}"
                f"{'' if self.runtime == DEFAULT_RUNTIME else ', by ' + self.runtime + ' rules'}>")


# ---------------------------------------------------------------------------
# Caches
# ---------------------------------------------------------------------------

#: the most topologies whose memo is kept (the oldest goes first)
_MAX_TOPOLOGIES = 128
#: the most entries of one topology's memo (then it starts over)
_MAX_ENTRIES = 1024
#: the most environments whose reading is memoized (least recently used go first)
_MAX_READS = 4096
#: id(topology) -> (weak reference to it, {(runtime, key): value}): the one
#: topology cache, what the rules of a runtime keep per topology (its table of the
#: machine per full mask, initializations, teams).  Keyed by identity (hashing a
#: Topology walks all its PUs); the reference checks the id was not reused and its
#: callback drops the entry when the topology dies.
_BASES: dict[int, tuple[weakref.ref[Topology], dict[Any, Any]]] = {}
_BASES_LOCK = threading.Lock()  # serializes the making of entries; lookups are single dict reads


def _memo(topology: Topology, runtime: str) -> Memo:
    """The per-topology memo handed to ``runtime``'s rules (see :mod:`affinity.planning.rules`)."""
    entry = _BASES.get(id(topology))
    if entry is None or entry[0]() is not topology:
        entry = _bases_entry(topology)
    store = entry[1]

    def memo(key: Hashable, make: Callable[[], Any]) -> Any:
        k = (runtime, key)
        value = store.get(k)
        if value is None:
            value = make()
            if len(store) >= _MAX_ENTRIES:
                store.clear()
            store[k] = value
        return value

    return memo


def _fresh_memo() -> Memo:
    """A memo that keeps nothing: the uncached computation (tests compare the caches with it)."""
    return lambda key, make: make()


@functools.lru_cache(maxsize=_MAX_READS)
def _read(runtime: str, env_items: tuple[tuple[str, str], ...], strict: bool) -> Any:
    """The one memo at plan(): how ``runtime`` reads sorted variables (it depends on them alone)."""
    return RUNTIMES[runtime].read(env_items, strict=strict)


def _bases_entry(topology: Topology) -> tuple[weakref.ref[Topology], dict[Any, Any]]:
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
        checked = check_ids(initial_mask, where="initial_mask")
        m = initial_mask if isinstance(initial_mask, frozenset) and checked == initial_mask else checked
    m = frozenset(m)  # the same object when it is one already
    if not m <= topology.cpuset:
        m &= topology.cpuset
    if not m:
        raise PlanError(f"initial_mask {format_list(initial_mask) if not isinstance(initial_mask, str) else initial_mask}"
                        f" selects no processor of {topology.describe()}")
    return m


def _rules(runtime: Any) -> Rules:
    """The registered rules of ``runtime``."""
    if not isinstance(runtime, str):
        raise ArgumentTypeError(f"runtime must be a string, not {type(runtime).__name__} ({runtime!r:.40})")
    rules = RUNTIMES.get(runtime)
    if rules is None:
        raise PlanError(f"unknown runtime {runtime!r}: the planner knows {', '.join(sorted(RUNTIMES))}")
    return rules


def _run(env_items: tuple[tuple[str, str], ...], topology: Topology | None, initial_mask: Any,
         strict: bool, rules: Rules, cached: bool = True) -> Plan:
    """Plan sorted settings variables on ``topology`` by ``rules`` (``cached``: through
    the read memo and the topology cache; else computed afresh)."""
    if topology is None:
        raise ArgumentTypeError("topology is required: planning is pure and never reads the machine; "
                        "affinity.plan() and affinity.plan_env() plan for this machine")
    if not isinstance(topology, Topology):
        raise ArgumentTypeError(f"topology must be a Topology, not {type(topology).__name__}")
    init = _mask(topology, initial_mask)
    if cached:
        settings, memo = _read(rules.NAME, env_items, strict), _memo(topology, rules.NAME)
    else:
        settings, memo = rules.read(env_items, strict=strict), _fresh_memo()
    res: Outcome = rules.evaluate(settings, topology, init, memo=memo)
    return Plan(threads=res.threads, cpusets=res.cpusets, places=res.places, place_nums=res.place_nums,
                warnings=res.warnings, affinity_type=res.affinity_type, granularity=res.granularity,
                proc_bind=res.proc_bind, num_procs=res.num_procs, env=env_items, initial_mask=init,
                topology=topology, settings=res.settings, runtime=rules.NAME, _view=res.view)


def _env_items(env: Mapping[str, Any], variables: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The ``variables`` of ``env``, sorted, as ``(name, value)`` pairs."""
    if not isinstance(env, Mapping):
        raise ArgumentTypeError(f"env must be a mapping of variable names to strings, not "
                                f"{type(env).__name__} ({env!r:.40})")
    items = []
    for k, v in env.items():
        if k in variables and v is not None:
            if not isinstance(v, str):
                raise ArgumentTypeError(f"{k} must be a string, not {type(v).__name__}")
            items.append((k, v))
    return tuple(sorted(items))


def plan_env(env: Mapping[str, Any], *, topology: Topology | None = None,
             initial_mask: Iterable[int] | str | None = None, runtime: str = DEFAULT_RUNTIME) -> Plan:
    """Plan from environment variables, read exactly as the runtime reads them.

    Malformed values produce the runtime's warnings and fallbacks (never
    :class:`SpecError`).

    Parameters
    ----------
    env : mapping of str to str
        The environment; only ``KMP_AFFINITY``, ``OMP_NUM_THREADS``,
        ``KMP_HW_SUBSET`` (``KMP_PLACE_THREADS``), ``OMP_PLACES``,
        ``OMP_PROC_BIND`` and ``GOMP_CPU_AFFINITY`` are read, and the thread
        limits each runtime reads (``OMP_THREAD_LIMIT``; Intel/LLVM also
        ``KMP_DEVICE_THREAD_LIMIT``, ``KMP_ALL_THREADS``); anything else is
        ignored.  The runtime's ``rules.VARIABLES`` lists them.
    topology : Topology
        The machine.  Required here (planning never reads the machine);
        ``affinity.plan_env`` / ``affinity.plan`` default it to this machine's.
    initial_mask : iterable of int or str, optional
        The process affinity mask (OS proc ids or a cpulist string); by
        default ``topology.allowed``.
    runtime : str
        Whose rules to follow: a name of :data:`RUNTIMES` (``"intel"``, the
        default: Intel's libiomp5).

    Returns
    -------
    Plan
        What the runtime would do for the first parallel region.

    Raises
    ------
    PlanError
        Where the runtime itself would abort (e.g. ``OMP_NUM_THREADS`` too
        large), ``initial_mask`` selects no processor of ``topology``, or
        ``runtime`` is not a known runtime.
    ArgumentTypeError
        ``env`` is not a mapping, a value of it is not a string, or ``topology``
        is not a :class:`~affinity.machine.topology.Topology` (a ``TypeError``).
    """
    rules = _rules(runtime)
    return _run(_env_items(env, rules.VARIABLES), topology, initial_mask, False, rules)


#: A spec string is ``KEY=VALUE`` assignments (else a ``KMP_AFFINITY`` string) when its first
#: word is ``NAME=`` with NAME holding an underscore, in any case -- an environment variable's
#: shape, known or not (``OMP_PLACE=cores`` and ``omp_places=cores`` are refused naming them,
#: not read as KMP_AFFINITY).  No KMP_AFFINITY string starts so: Intel reads it
#: case-insensitively (``GRANULARITY=FINE,COMPACT``), but its only ``NAME=`` words
#: (``kmp._AFF_ASSIGNMENTS``: ``granularity``, ``gran``, ``proclist``) hold no underscore.
_ENV_FORM = re.compile(r"^\s*(?=[A-Za-z0-9]*_)[A-Za-z_][A-Za-z0-9_]*=")


def unread(spec: Any, runtime: str = DEFAULT_RUNTIME) -> list[str]:
    """One sentence per variable ``spec`` sets that ``runtime`` does not read: the
    caller asked for it, and :func:`plan` drops it as the runtime would (libgomp never
    reads ``KMP_AFFINITY``: ``compact`` under ``runtime="gnu"`` binds nothing).

    Parameters
    ----------
    spec, runtime
        As :func:`plan` takes them.

    Returns
    -------
    list of str
        Empty when the runtime reads every variable of ``spec``.
    """
    rules = _rules(runtime)
    words = ", ".join(v for v in rules.VARIABLES if v not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT",
                                                              "KMP_DEVICE_THREAD_LIMIT", "KMP_ALL_THREADS"))
    return [f"{k}={v} is not read by the {runtime} runtime, which places threads by {words} alone: "
            f"it changes nothing in this plan" for k, v in _spec_env(spec).items() if k not in rules.VARIABLES]


def hinted(spec: Any, warnings: Iterable[str]) -> list[str]:
    """``warnings`` (a plan's for ``spec``), each followed by its parser's hint where
    it has one: what a mistyped word was probably meant to be (``KMP_AFFINITY:
    parameter invalid, ignoring "compakt". (did you mean "compact"?)``), and what an
    ignored word made of the rest (the ``'default' type`` that then takes no
    integers).  The runtime's words stay as it prints them; a hint is found by the
    warning's text, so one the runtime of another family words otherwise (libgomp)
    gets none.

    Parameters
    ----------
    spec
        As :func:`plan` takes it.
    warnings : iterable of str
        ``Plan.warnings`` of that spec.

    Returns
    -------
    list of str
    """
    hints: dict[str, str] = {}
    for name, value in _spec_env(spec).items():
        try:
            _, diagnostics = parse_lenient(name, str(value))
        except ValueError:  # not a variable of the spec grammar (OMP_NUM_THREADS...): no hints
            continue
        hints.update((d.text, d.hint) for d in diagnostics if d.hint)
    return [f"{w} ({hints[w]})" if w in hints else w for w in warnings]


def _spec_env(spec: Any, strict: bool = False) -> dict[str, str]:
    """The variables a :func:`plan` spec stands for (``strict``: a variable given twice is refused)."""
    if spec is None:
        return {}
    if isinstance(spec, str):
        if _ENV_FORM.match(spec):
            return parse_assignments(spec, what="spec", unique=strict)
        return {"KMP_AFFINITY": spec}
    if isinstance(spec, Settings):
        return spec.to_env()
    if isinstance(spec, Mapping):
        return {k: v for k, v in spec.items()}
    for var in VARIABLES:
        if var.exported and isinstance(spec, var.type):
            return {var.name: str(spec)}
    raise ArgumentTypeError(f"cannot plan from a {type(spec).__name__} ({spec!r:.40}): give a KMP_AFFINITY "
                            f"string, KEY=VALUE words, a spec value, Settings or a mapping of variables")


def plan(spec: Any = None, threads: int | None = None, topology: Topology | None = None, *,
         strict: bool = True, env: Mapping[str, str] | None = None,
         initial_mask: Iterable[int] | str | None = None, runtime: str = DEFAULT_RUNTIME) -> Plan:
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
    topology : Topology
        The machine.  Required here (planning never reads the machine);
        ``affinity.plan_env`` / ``affinity.plan`` default it to this machine's.
    strict : bool
        ``True`` (default): malformed or conflicting settings raise
        :class:`SpecError`; ``False`` behaves like :func:`plan_env`.
    env : mapping of str to str, optional
        Further variables (``spec`` wins).
    initial_mask : iterable of int or str, optional
        The process affinity mask (OS proc ids or a cpulist string); by
        default ``topology.allowed``.
    runtime : str
        Whose rules to follow: a name of :data:`RUNTIMES` (``"intel"``, the
        default: Intel's libiomp5).

    Returns
    -------
    Plan
        What the runtime would do for the first parallel region.

    Raises
    ------
    SpecError
        Malformed or conflicting settings, with ``strict=True``.
    PlanError
        Where the runtime itself would abort, ``threads`` below 1, an
        ``initial_mask`` that selects no processor of ``topology``, or an
        unknown ``runtime``.
    ArgumentTypeError
        ``threads`` is not an int, ``topology`` not a
        :class:`~affinity.machine.topology.Topology`, ``spec`` of an unknown
        kind, ``env`` not a mapping of strings, ``runtime`` not a string (a
        ``TypeError``).
    """
    rules = _rules(runtime)
    if env is not None and not isinstance(env, Mapping):
        raise ArgumentTypeError(f"env must be a mapping of variable names to strings, not "
                                f"{type(env).__name__} ({env!r:.40})")
    merged: dict[str, str] = dict(env or {})
    merged.update(_spec_env(spec, strict))
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise ArgumentTypeError(f"threads must be an int, not {type(threads).__name__} ({threads!r:.40})")
        if threads < 1:
            raise PlanError(f"threads must be at least 1, got {threads}")
        merged["OMP_NUM_THREADS"] = str(threads)
    return _run(_env_items(merged, rules.VARIABLES), topology, initial_mask, strict, rules)

