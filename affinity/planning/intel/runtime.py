"""Emulation of Intel's OpenMP runtime affinity initialization and binding.

The ``"intel"`` rules of the planner (the interface of
:mod:`affinity.planning.rules`: :func:`read`, :func:`evaluate`, :func:`explain`).
:func:`process_env` reads the environment (as the runtime reads it) into
:class:`RuntimeSettings`; :func:`evaluate_settings` takes those settings, a
:class:`~affinity.machine.topology.Topology` and the process mask, and returns
what the runtime would do for the first parallel region: the team size, every
thread's OS-proc set, the place list and the messages it prints.  A sibling
runtime of the same source (LLVM's libomp, :mod:`.llvm`) runs these steps in
its :class:`~affinity.planning.syntax.Dialect`.  It follows, step by step:

* ``__kmp_env_initialize`` (``kmp_settings.cpp``): variables are processed in
  name order; ``KMP_AFFINITY`` with an affinity type overrides
  ``GOMP_CPU_AFFINITY``, ``OMP_PLACES`` and ``OMP_PROC_BIND``; defaults are
  filled in afterwards;
* ``__kmp_aux_affinity_initialize`` (``kmp_affinity.cpp``): full mask,
  topology, ``KMP_HW_SUBSET``, granularity, the per-proc mask table and the
  place list for each affinity type;
* ``__kmp_affinity_set_init_mask`` / ``__kmp_partition_places``
  (``kmp_runtime.cpp``) / ``__kmp_balanced_affinity``: which place each
  thread of the team is bound to.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter

from ...record import field, record
from . import topology as kt
from .limits import LIMIT_VARIABLES, cap_team, read_limits
from ...cpulist import format_list
from ...errors import PlanError, SpecError
from ..rules import Memo, Outcome
from ..spec import SETTINGS_VARIABLES, NumThreads, Settings, OmpPlaces, OmpProcBind, Place, parse_lenient, parse_strict
from ..syntax import INTEL, Diagnostic, Dialect, catalog
from ..kmp import KmpAffinity, KmpHwSubset, ProcList, ProcRange, kmp_affinity_has_type_name
from typing import Any


#: The name the planner's registry knows these rules by.
NAME = "intel"
#: The variables Intel's runtime reads to place threads and size the team, sorted.
VARIABLES = tuple(sorted(SETTINGS_VARIABLES + LIMIT_VARIABLES))

#: The most threads a team may have before the planner refuses: a default Linux
#: process cannot create more (vm.max_map_count = 65530 mappings, two per
#: thread stack), and the runtime aborts (``OMP: Error #34``) or crashes.
MAX_TEAM = 32768
#: The most places an explicit place list may make before the planner refuses
#: (``{0}:2147483647:0`` makes as many places as its count, each one CPU mask in the
#: runtime); libgomp refuses a list of more than this many itself.
MAX_PLACES = 65536


@record(frozen=False)
class RuntimeSettings:
    """The runtime's affinity globals after environment processing."""

    type: str = "default"  # default none compact scatter balanced explicit logical physical disabled
    gran: str | None = None  # layer keyword
    gran_levels: int | None = None
    core_types_gran: bool = False
    core_effs_gran: bool = False
    core_attr: str | None = None  # OMP_PLACES=cores:<attr>
    compact: int = 0
    offset: int = 0
    proclist: Any = None  # ProcList (KMP_AFFINITY / GOMP) or tuple[Place] (OMP_PLACES)
    verbose: bool = False
    warnings: bool = True
    respect: bool | None = None
    reset: bool = False
    dups: bool = True
    omp_places: bool = False  # type/granularity came from OMP_PLACES
    bind: list[str] = field(default_factory=lambda: ["default"])
    num_places: int = 0
    hw_subset: KmpHwSubset | None = None
    nth: NumThreads | None = None
    device_limit: int | None = None  # KMP_DEVICE_THREAD_LIMIT (limits.ALL: every CPU)
    cg_limit: int | None = None  # OMP_THREAD_LIMIT
    late_texts: tuple[str, ...] = ()  # messages libiomp5 prints after affinity initialization
    dialect: Dialect = INTEL  # whose rules (libiomp5's, or a sibling's such as LLVM's libomp)

    @functools.cached_property
    def key(self) -> "_Key":
        """What an initialization depends on besides the machine (hashed once)."""
        return _Key((self.type, self.gran, self.gran_levels, self.core_types_gran, self.core_effs_gran,
                     self.core_attr, self.compact, self.offset, self.proclist, self.verbose, self.warnings,
                     self.dups, self.omp_places, self.bind[0] == "intel", self.num_places, self.hw_subset,
                     self.dialect))


class _Key:
    """A tuple whose hash is computed once (a memo key looked up on every plan)."""

    __slots__ = ("items", "hash")

    def __init__(self, items: tuple[Any, ...]):
        self.items = items
        self.hash = hash(items)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self.hash == other.hash and self.items == other.items


# ---------------------------------------------------------------------------
# Environment processing
# ---------------------------------------------------------------------------

def process_env(env: Mapping[str, str], strict: bool,
                dialect: Dialect = INTEL) -> tuple[RuntimeSettings, list[str], dict[str, Any]]:
    """``__kmp_env_initialize`` (``kmp_settings.cpp``): the affinity settings
    of ``env``, the messages printed while reading it, and the parsed value of
    every variable read (those a rival made the runtime ignore left out).

    The variables are read in name order; each is first checked against its
    rivals (:data:`_RIVALS`), then parsed and applied (:data:`_APPLY`); the
    thread limits are read next (:mod:`.limits`) and the defaults filled in
    last (:func:`_fill_defaults`).  The messages come in the order the runtime
    prints them (:data:`_FIRST_READ`)."""
    st = RuntimeSettings(dialect=dialect)
    said: dict[str, list[str]] = {}
    values: dict[str, Any] = {}
    present = {k for k in SETTINGS_VARIABLES if k in env and env[k] is not None}
    aff_notype = "KMP_AFFINITY" in present and not kmp_affinity_has_type_name(env["KMP_AFFINITY"])
    parse = parse_strict if strict else parse_lenient
    for name in sorted(present):
        value = env[name]
        rival = _rival(name, present, aff_notype)
        if rival is not None:
            said[name] = [f"{name}: ignored because {rival} has been defined"]
            if strict:
                raise SpecError(f"ignored because {rival} has been defined", value, 0, what=name)
            continue
        parsed, diagnostics = parse(name, value, dialect)
        said[name] = [x.text for x in diagnostics]
        values[name] = parsed
        _APPLY[name](st, parsed, value, diagnostics)
    st.device_limit, st.cg_limit = read_limits(env, lambda name, text: said.setdefault(name, []).append(text),
                                               strict, libiomp5=dialect is INTEL)
    _fill_defaults(st)
    _explicit_list_as_read(st, env, values)
    if dialect is not INTEL:
        return st, [t for name in sorted(said) for t in said[name]], values
    st.late_texts = tuple(t for name in sorted(said) if name not in _FIRST_READ for t in said[name])
    return st, [t for name in _FIRST_READ if name in said for t in said[name]], values


#: Whose messages libiomp5 prints first, in this order, whatever the
#: environment's order; the other variables' messages come after those of the
#: affinity initialization, in the environment's order (``RuntimeSettings.late_texts``).
#: libomp 19 prints every variable's messages first, in the environment's order.
#: The planner gets the environment sorted by name (``Plan.env``), so where the
#: environment's order decides it is taken to be name order.  Checked on
#: libiomp5 2026.2 and libomp 19 with malformed values.
_FIRST_READ = ("KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND", "KMP_HW_SUBSET", "GOMP_CPU_AFFINITY")


def _rival(name: str, present: set[str], aff_notype: bool) -> str | None:
    """The variable that makes the runtime ignore ``name`` (its rivals are
    checked in order up to ``name`` itself; a ``KMP_AFFINITY`` without a type
    is no rival)."""
    for r in _RIVALS.get(name, ()):
        if r == name:
            return None
        if r == "KMP_AFFINITY" and aff_notype:
            continue
        if r in present:
            return r
    return None


def _explicit_list_as_read(st: RuntimeSettings, env: Mapping[str, str], values: Mapping[str, Any]) -> None:
    """The runtime keeps one explicit list as text -- ``KMP_AFFINITY``'s proclist, or
    an ``OMP_PLACES`` list read after a typeless ``KMP_AFFINITY=proclist=[...]``,
    which replaces it -- and parses it at initialization in the grammar of the
    binding (``__kmp_aux_affinity_initialize``): a proclist under proc-bind
    ``intel``, a place list otherwise (``OMP_PROC_BIND=true`` with a proclist;
    an ``OMP_PLACES`` list under ``KMP_AFFINITY``'s ``intel`` binding).  A text the
    other grammar cannot read makes libiomp5 abort (``OMP: Error #13: Assertion
    failure``); LLVM's libomp 19 aborts whenever an ``OMP_PLACES`` list replaced a
    proclist (it frees the proclist twice).  Probed with both runtimes: the proclist
    ``[1]`` under ``OMP_PROC_BIND=true`` is the place ``{1}``, ``OMP_PLACES={0},{1}``
    under ``proclist=[0]`` the proclist ``{0},{1}``; ``[1,3-5]`` as a place list and
    ``{2:2}`` as a proclist abort."""
    pl = st.proclist
    if st.type != "explicit" or pl is None:
        return
    aff = values.get("KMP_AFFINITY")
    if st.dialect.strict_crashes and not isinstance(pl, ProcList) and getattr(aff, "proclist", None) is not None:
        raise PlanError(f"OMP_PLACES={env['OMP_PLACES']!r} after KMP_AFFINITY={env['KMP_AFFINITY']!r}: LLVM's "
                        f"libomp 19 replaces the proclist with the place list and frees it twice (it aborts)")
    intel = st.bind[0] == "intel"
    if intel == isinstance(pl, ProcList):
        return
    name, text = ("KMP_AFFINITY", env.get("OMP_PLACES", "")) if intel else ("OMP_PLACES", str(pl))
    try:
        if intel:
            got = parse_strict(name, f"explicit,proclist=[{text}]", st.dialect)[0].proclist
        else:
            got = parse_strict(name, text, st.dialect)[0].places
    except SpecError:
        got = None
    if got is None:
        what = "proclist" if intel else "place list"
        raise PlanError(f"{text!r} is read as a {what} at initialization (proc-bind {st.bind[0]}), which it is "
                        f"not: the runtime aborts (OMP: Error #13: Assertion failure)")
    st.proclist = got


def _fill_defaults(st: RuntimeSettings) -> None:
    """The defaults ``__kmp_env_initialize`` fills in after reading the variables."""
    if st.type == "disabled":
        st.bind = ["false"]
        return
    if st.bind[0] == "true":
        st.bind[0] = "spread"
    if st.respect is None:
        st.respect = True
    if st.bind[0] not in ("intel", "default"):
        if st.type == "default":
            st.type = "compact"
            st.dups = False
    elif st.type == "default":
        st.bind[0] = "false"
        st.type = "none"
    if st.gran is None and (st.gran_levels is None or st.gran_levels < 0):
        st.gran = "core"
    # libiomp5: proc-bind false (OMP_PROC_BIND=false, or a 'none'/'disabled'
    # given after another type in KMP_AFFINITY) means no binding.
    if st.bind[0] == "false" and st.type not in ("none", "disabled"):
        st.type = "none"


def _apply_gomp(st: RuntimeSettings, pl: ProcList | None, raw: str, diagnostics: list[Diagnostic]) -> None:
    """``GOMP_CPU_AFFINITY``: an explicit proc list bound the Intel way."""
    if pl is not None:
        st.proclist, st.type, st.gran, st.gran_levels = pl, "explicit", "thread", None
        st.omp_places = False
        st.bind[0] = "intel"
    elif not any(x.detail == "unexpected characters" for x in diagnostics):
        # the list itself is malformed: no affinity
        st.type = "none"
        st.bind[0] = "false"


def _apply_hw_subset(st: RuntimeSettings, v: KmpHwSubset | None, raw: str, diagnostics: list[Diagnostic]) -> None:
    """``KMP_HW_SUBSET`` (or its old name ``KMP_PLACE_THREADS``)."""
    st.hw_subset = v


def _apply_num_threads(st: RuntimeSettings, v: NumThreads | None, raw: str, diagnostics: list[Diagnostic]) -> None:
    """``OMP_NUM_THREADS``: the team sizes (ignored when malformed; LLVM's libomp crashes)."""
    if v is not None:
        st.nth = v
    elif st.dialect.strict_crashes:
        raise PlanError(f"OMP_NUM_THREADS={raw!r} holds no valid team size: LLVM's libomp 19 warns "
                        "and then crashes (its list of team sizes is left unset)")


def _apply_kmp_affinity(st: RuntimeSettings, v: KmpAffinity, raw: str, diagnostics: list[Diagnostic]) -> None:
    """``KMP_AFFINITY``: type, granularity, flags, permute/offset, proc list."""
    if v.type is not None:
        st.type = v.type
        st.bind[0] = "false" if v.type in ("none", "disabled") else "intel"
    if v.granularity is not None:
        if v.granularity == "core_type":
            st.gran, st.core_types_gran = "core", True
        elif v.granularity == "core_efficiency":
            st.gran, st.core_effs_gran = "core", True
        else:
            st.gran = v.granularity
        st.gran_levels = None
        st.omp_places = False
    elif v.granularity_levels is not None:
        st.gran, st.gran_levels = None, v.granularity_levels
    if v.type == "balanced" and st.gran is None:
        st.gran = "core"
    for attr in ("verbose", "warnings", "respect", "reset", "dups"):
        val = getattr(v, attr)
        if val is not None:
            setattr(st, attr, val)
    if v.type in ("compact", "scatter", "balanced"):
        st.compact = v.permute or 0
        st.offset = v.offset or 0
    elif v.type in ("logical", "physical"):
        st.offset = v.offset or 0
    _refuse_wrapped(st, raw)
    if v.proclist is not None:
        st.proclist = v.proclist


def _refuse_wrapped(st: RuntimeSettings, raw: str) -> None:
    """A permute or offset LLVM's libomp read as a negative C ``int`` (2147483648 and
    up wrap around): its compact sort then compares sub-ids at negative indexes and
    its first place is a negative index -- memory outside its tables, not a
    placement -- so it is refused, not guessed (a permute of -2**31 also made the
    planner's sort key 2**31 entries long)."""
    for what, value in (("permute", st.compact), ("offset", st.offset)):
        if value < 0:
            raise PlanError(f"KMP_AFFINITY={raw!r}: LLVM's libomp 19 reads the {what} as a C int that wraps "
                            f"around to {value}, then indexes its tables with it (undefined: not planned)")


def _apply_omp_places(st: RuntimeSettings, v: OmpPlaces, raw: str, diagnostics: list[Diagnostic]) -> None:
    """``OMP_PLACES``: an explicit place list, or a layer to build places from."""
    if v.places is not None:
        st.proclist = v.places
        st.type, st.gran, st.gran_levels, st.dups = "explicit", "thread", None, False
    else:
        layer = v.layer or "thread"
        st.type, st.gran, st.gran_levels, st.dups = "compact", layer, None, False
        if v.kind == "core_types":
            st.core_types_gran = True
        elif v.kind == "core_effs":
            st.core_effs_gran = True
        if v.attribute:
            st.core_attr = v.attribute
        if v.count:
            st.num_places = v.count
    st.omp_places = True
    if st.bind[0] == "default":
        st.bind[0] = "true"


def _apply_proc_bind(st: RuntimeSettings, v: OmpProcBind, raw: str, diagnostics: list[Diagnostic]) -> None:
    """``OMP_PROC_BIND``: the binding policy of each nesting level."""
    first = v.policies[0]
    if first == "disabled":
        st.type = "disabled"
        st.bind = ["false"]
    elif first == "false":
        st.type = "none"
        st.bind = ["false"]
    elif first == "true":
        st.bind = ["true"]
    else:
        st.bind = list(v.policies)


#: Per variable, the variables whose presence makes the runtime ignore it, in the
#: order it checks them (the check stops at the variable itself).
_RIVALS: dict[str, tuple[str, ...]] = {
    "GOMP_CPU_AFFINITY": ("KMP_AFFINITY", "GOMP_CPU_AFFINITY", "OMP_PROC_BIND"),
    "KMP_PLACE_THREADS": ("KMP_HW_SUBSET", "KMP_PLACE_THREADS"),
    "OMP_PLACES": ("KMP_AFFINITY", "GOMP_CPU_AFFINITY", "OMP_PLACES"),
    "OMP_PROC_BIND": ("KMP_AFFINITY", "GOMP_CPU_AFFINITY", "OMP_PROC_BIND"),
}
#: Per variable (every one of :data:`VARIABLES`), what the runtime does with its value.
_APPLY: dict[str, Callable[[RuntimeSettings, Any, str, list[Diagnostic]], None]] = {
    "GOMP_CPU_AFFINITY": _apply_gomp,
    "KMP_AFFINITY": _apply_kmp_affinity,
    "KMP_HW_SUBSET": _apply_hw_subset,
    "KMP_PLACE_THREADS": _apply_hw_subset,
    "OMP_NUM_THREADS": _apply_num_threads,
    "OMP_PLACES": _apply_omp_places,
    "OMP_PROC_BIND": _apply_proc_bind,
}


# ---------------------------------------------------------------------------
# Affinity initialization
# ---------------------------------------------------------------------------

class _Init:
    """State of one affinity initialization (mirrors ``kmp_affinity_t``)."""

    def __init__(self, st: RuntimeSettings, k: kt.KTopo, full: frozenset[int]):
        self.st = st
        self.k = k
        self.full = full
        self.type = st.type
        self.msgs: list[str] = []
        self.masks: list[frozenset[int]] = []
        self.offset = st.offset
        self.compact = st.compact
        self.gran_levels = -1
        self.gran = st.gran
        self.core_attr = st.core_attr
        self.core_types_gran = st.core_types_gran
        self.core_effs_gran = st.core_effs_gran
        self.st_gran_levels = st.gran_levels
        self._osid_mask: dict[int, frozenset[int]] = {}
        self._leader: set[int] = set()  # OS ids of the group leaders
        self.fine: list[int] | None = None  # thread granularity: the procs, each its own group
        self.order: list[int] | None = None  # hw thread order after sortTopology (sort_ids)
        self.procarr: list[int] | None = None
        self.balanced_order: list[int] = []
        self.shared = False  # k is the table cached per topology: copy before changing it
        self.machine: frozenset[int] = frozenset()  # every OS proc of the machine

    @property
    def osid_mask(self) -> dict[int, frozenset[int]]:
        """``osId2Mask``: each proc's group (made on first use at thread granularity)."""
        if self.fine is not None and not self._osid_mask:
            self._osid_mask = dict(zip(self.fine, map(_singleton, self.fine)))
        return self._osid_mask

    @property
    def leader(self) -> set[int]:
        """The OS ids of the group leaders (every proc at thread granularity)."""
        if self.fine is not None and not self._leader:
            self._leader = set(self.fine)
        return self._leader

    @property
    def env_var(self) -> str:
        return "OMP_PLACES" if self.st.omp_places else "KMP_AFFINITY"

    def warn(self, text: str) -> None:
        if self.st.verbose or (self.st.warnings and self.type != "none"):
            self.msgs.append(text)


def _set_granularity(ini: _Init) -> None:
    k, st = ini.k, ini.st
    env = ini.env_var
    if not k.hybrid:
        if ini.core_attr:
            ini.warn(f'{env} ignored: This machine is not a hybrid architecutre. Using "cores" instead.')
            ini.gran = "core"
            ini.core_attr = None
            ini.core_types_gran = ini.core_effs_gran = False
            ini.st_gran_levels = None
        elif ini.core_types_gran or ini.core_effs_gran:
            if st.omp_places:
                ini.warn(f'{env} ignored: This machine is not a hybrid architecutre. Using "cores" instead.')
            else:
                ini.warn(f"{env}: granularity setting: Intel(R) Hybrid Technology core attribute does not "
                         f"exist in topology.  Using granularity=core instead.")
            ini.gran = "core"
            ini.core_types_gran = ini.core_effs_gran = False
            ini.st_gran_levels = None
    if ini.st_gran_levels is not None and ini.st_gran_levels >= 0:
        ini.gran_levels = ini.st_gran_levels
        return
    gtype = k.equivalent[kt.TYPE_OF[ini.gran]] if ini.gran else kt.UNKNOWN
    if gtype == kt.UNKNOWN:
        for g in (kt.CORE, kt.THREAD, kt.SOCKET):
            if k.equivalent[g] != kt.UNKNOWN:
                gtype = g
                break
        ini.warn(f"{env}: granularity setting: {catalog(ini.gran)} does not exist in topology.  "
                 f"Using granularity={kt.cat(gtype)} instead.")
        ini.gran = kt.KEYWORDS[gtype]
    levels = 0
    i = k.depth - 1
    while i >= 0 and k.types[i] != gtype:
        levels += 1
        i -= 1
    ini.gran_levels = levels


def _create_os_id_masks(ini: _Init, attr_filter: Any = None) -> bool:
    """``__kmp_create_os_id_masks``: group consecutive rows that are close at
    the granularity (each group's procs share one mask, its first proc leads
    it); returns False when no row has the attribute."""
    k = ini.k
    if attr_filter is None:
        rows: Sequence[int] = range(k.num_threads)
        procs = k.os
    else:
        rows = [i for i in range(k.num_threads) if attr_filter(i)]
        procs = [k.os[i] for i in rows]
    if not rows:
        return False
    if ini.gran_levels >= k.depth:
        ini.warn("Threads may migrate across all available OS procs (granularity setting too coarse).")
    if ini.gran_levels == 0 and not (ini.core_types_gran or ini.core_effs_gran):
        starts: Sequence[int] = range(len(procs))  # thread granularity: the rows' ids are unique
    else:
        keys = _closeness_keys(ini, rows)
        starts = [0] + [j + 1 for j, (a, b) in enumerate(zip(keys[1:], keys)) if a != b]
    if len(starts) == len(procs):  # one proc per group (granularity=fine): masks made when needed
        ini.fine, ini._osid_mask, ini._leader = list(procs), {}, set()
    else:
        osid_mask: dict[int, frozenset[int]] = {}
        for a, b in zip(starts, [*starts[1:], len(procs)]):
            group = procs[a:b]
            osid_mask.update(dict.fromkeys(group, frozenset(group)))
        ini.fine, ini._osid_mask, ini._leader = None, osid_mask, {procs[a] for a in starts}
    if attr_filter is not None:  # else the groups hold every proc: nothing to restrict
        _restrict_full(ini, frozenset(procs))  # the union of the groups
    return True


#: How many OS procs' singleton sets :func:`_singleton` keeps (ids 0..N-1; beyond, made anew).
_SINGLETONS_MAX = 16384
#: ``_SINGLETONS[o]`` is ``frozenset({o})``: constants, grown on demand up to the bound and
#: rebound whole (never mutated), so threads share them safely.
_SINGLETONS: tuple[frozenset[int], ...] = ()


def _singleton(o: int) -> frozenset[int]:
    """``{o}``, the mask of proc ``o`` at thread granularity, interned: a cold plan on
    1024 PUs would otherwise make 1024 new sets (and the garbage collector runs
    they cause -- ``bench/bench_plan.py``, row ``plan compact (cold)``)."""
    global _SINGLETONS
    if o < len(_SINGLETONS):
        return _SINGLETONS[o]
    if o >= _SINGLETONS_MAX:
        return frozenset((o,))
    grown = max(o + 1, 2 * len(_SINGLETONS), 64)
    _SINGLETONS = _SINGLETONS + tuple(map(frozenset, zip(range(len(_SINGLETONS), min(grown, _SINGLETONS_MAX)))))
    return _SINGLETONS[o]


def _closeness_keys(ini: _Init, rows: Sequence[int]) -> Sequence[Any]:
    """Per row, what two rows share when the runtime's ``close`` test groups them:
    everything (granularity at or above the topology's depth), the core type or
    efficiency (``core_type``/``core_efficiency`` granularity), else the ids
    down to the granularity layer."""
    k = ini.k
    depth = k.depth
    if ini.gran_levels >= depth:
        return [0] * len(rows)
    if ini.core_types_gran:
        return [k.core_type[i] for i in rows]
    if ini.core_effs_gran:
        return [k.core_eff[i] for i in rows]
    cut = depth - ini.gran_levels
    ids = k.ids
    if isinstance(rows, range):
        return ids if cut >= depth else [r[:cut] for r in ids]
    return [ids[i] if cut >= depth else ids[i][:cut] for i in rows]


def _restrict_full(ini: _Init, union: set[int] | frozenset[int]) -> None:
    """``kmp_full_mask_modifier_t::restrict_to_mask`` (on a copy of a shared table)."""
    if union and frozenset(union) != ini.full:
        _own_table(ini)
        ini.k.restrict(frozenset(union) & ini.full)
        ini.full = frozenset(ini.k.os)


def _own_table(ini: _Init) -> None:
    """Before the first change to ``ini.k``: the table cached per topology is
    shared by every initialization, so this one changes a copy of it."""
    if ini.shared:
        ini.k = ini.k.copy()
        ini.shared = False


def _add_mask_os(ini: _Init, out: list[frozenset[int]], os_id: int, max_os: int) -> None:
    m = ini.osid_mask.get(os_id) if os_id <= max_os else None
    if m is None:
        ini.warn(f"Ignoring invalid OS proc ID {os_id}.")
    else:
        out.append(m)


def _process_proclist(ini: _Init, pl: ProcList) -> list[frozenset[int]]:
    max_os = max(ini.k.os)
    out: list[frozenset[int]] = []
    for it in pl.items:
        if isinstance(it, int):
            _add_mask_os(ini, out, it, max_os)
        elif isinstance(it, ProcRange):
            for i in it.ids():
                _add_mask_os(ini, out, i, max_os)
        else:
            acc: set[int] = set()
            size = 0
            for j, num in enumerate(it):
                m = ini.osid_mask.get(num) if num <= max_os else None
                if m is None:
                    ini.warn(f"Ignoring invalid OS proc ID {num}.")
                    if j == 0:
                        acc = set()
                else:
                    acc |= m
                    size += 1
            if size > 0:
                out.append(frozenset(acc))
    return out


def _process_place(ini: _Init, p: Place, max_os: int, acc: set[int]) -> int:
    """``__kmp_process_place``; returns the number of procs added."""
    size = 0
    if p.exclude is not None:
        size = _process_place(ini, p.exclude, max_os, acc)
        if ini.st.dialect.strict_crashes:
            _check_complement(ini.machine)
        # libiomp5 complements within the available procs
        comp = set(ini.full) - acc
        acc.clear()
        acc |= comp
        return size
    if p.proc is not None:
        m = ini.osid_mask.get(p.proc) if p.proc <= max_os else None
        if m is None:
            ini.warn(f"Ignoring invalid OS proc ID {p.proc}.")
        else:
            acc |= m
            size += 1
        return size
    for sp in p.members or ():
        start = sp.start
        if sp.count is None:
            m = ini.osid_mask.get(start) if start <= max_os else None
            if m is None:
                ini.warn(f"Ignoring invalid OS proc ID {start}.")
            else:
                acc |= m
                size += 1
            continue
        stride = 1 if sp.stride is None else sp.stride
        for _ in range(sp.count):
            if start < 0:
                raise PlanError(f"OMP_PLACES: interval {sp} reaches OS proc {start}: the runtime crashes "
                                "on a negative proc id")
            m = ini.osid_mask.get(start) if start <= max_os else None
            if m is None:
                ini.warn(f"Ignoring invalid OS proc ID {start}.")
                break
            acc |= m
            start += stride
            size += 1
    return size


def _check_complement(machine: frozenset[int]) -> None:
    """LLVM's libomp 19 complements an excluded place over every bit of its mask
    words (64 OS procs each, enough for the machine's highest OS proc), then
    asserts on a bit that is no OS proc of the machine (``kmp_affinity.h``)."""
    capacity = 64 * ((max(machine) + 64) // 64)
    missing = frozenset(range(capacity)) - machine
    if missing:
        raise PlanError(f"OMP_PLACES: an excluded place ('!') is complemented over OS procs 0-{capacity - 1}, "
                        f"and {format_list(missing)} are no OS procs of this machine: LLVM's libomp 19 aborts "
                        "(Assertion failure at kmp_affinity.h)")


def _process_placelist(ini: _Init, places: Sequence[Place]) -> list[frozenset[int]]:
    max_os = max(ini.k.os)
    out: list[frozenset[int]] = []
    full = ini.full
    for p in places:
        acc: set[int] = set()
        size = _process_place(ini, p, max_os, acc)
        if p.count is None:
            if size > 0:
                out.append(frozenset(acc))
            continue
        stride = 1 if p.stride is None else p.stride
        count = p.count
        for i in range(count):
            if size == 0:
                break
            if len(out) >= MAX_PLACES:
                raise PlanError(f"{ini.env_var}: the place list makes more than {MAX_PLACES} places ({count} "
                                f"copies {stride} apart): the runtime builds one CPU mask per place; not planned")
            prev = frozenset(acc)
            out.append(prev)
            acc = set()
            size = 0
            for j in sorted(prev):
                nj = j + stride
                if nj > max_os or nj < 0 or j not in full or nj not in ini.osid_mask:
                    if i < count - 1:
                        ini.warn(f"Ignoring invalid OS proc ID {nj}.")
                    continue
                acc.add(nj)
                size += 1
    return out


def _compact_order(compact: int, depth: int) -> list[int]:
    """``__kmp_affinity_cmp_hw_thread_compact``'s key: the sub-id layers in the
    order they are compared -- the ``compact`` innermost ones first (innermost
    first), then the others from the outermost."""
    return [depth - i - 1 for i in range(compact)] + [i - compact for i in range(compact, depth)]


def _sorted_by_layers(k: kt.KTopo, layers: Sequence[int]) -> list[int]:
    """Row indexes sorted (stably) by the sub-ids of ``layers``, in that order.
    Sub-ids grow along the rows (each row's tuple is the previous one's with
    one counter up and the ones below it reset), so with every layer in its
    own order the rows are sorted already."""
    if not layers or list(layers) == list(range(k.depth)):
        return list(range(k.num_threads))
    sub = k.sub_ids
    pick = itemgetter(*layers)
    keys = [pick(s) for s in sub] if len(layers) > 1 else [(pick(s),) for s in sub]
    return sorted(range(len(sub)), key=keys.__getitem__)


def _find_core_level(k: kt.KTopo, rows: Sequence[int], bottom: int) -> int:
    core_level = 0
    for i in rows:
        ids = k.ids[i]
        for j in range(bottom, 0, -1):
            if ids[j] > 0 and core_level < j - 1:
                core_level = j - 1
    return core_level


def _core_index(k: kt.KTopo, order: Sequence[int], core_level: int) -> list[int]:
    """``__kmp_affinity_find_core`` for every position of ``order`` at once:
    the number of changes of ``sub_ids[0..core_level]`` before it."""
    out = []
    core = 0
    prev = None
    for i in order:
        key = k.sub_ids[i][:core_level + 1]
        if prev is not None and key != prev:
            core += 1
        prev = key
        out.append(core)
    return out


def _sort_topology(ini: _Init) -> None:
    k, st = ini.k, ini.st
    depth = k.depth
    avail = k.num_threads
    if st.dups:
        num_masks = avail
    else:
        num_masks = len(ini.fine) if ini.fine is not None else len(ini.leader)
    if st.bind[0] != "intel" and 0 < st.num_places < num_masks:
        num_masks = st.num_places
    compact = ini.compact
    order = _sorted_by_layers(k, _compact_order(compact, depth))
    os_ = k.os
    if ini.fine is not None:  # every proc leads its own group: {proc} in the sorted order
        masks = [_singleton(os_[i]) for i in order[:num_masks]]
    elif st.dups:
        osid_mask = ini.osid_mask
        masks = [osid_mask[os_[i]] for i in order[:num_masks]]
    else:
        osid_mask = ini.osid_mask
        leader = ini.leader
        masks = [osid_mask[o] for o in (os_[i] for i in order) if o in leader][:num_masks]
    ini.masks = masks
    if not (st.dups and len(masks) == avail):  # else every row's mask: the union is the full mask
        _restrict_full(ini, frozenset().union(*masks))
    if ini.type == "balanced":  # the one user of the runtime's re-sorted table
        k = ini.k
        ini.order = sorted(range(k.num_threads), key=[(r, o) for r, o in zip(k.ids, k.os)].__getitem__)


def initialize(st: RuntimeSettings, topology: Any, base: kt.KTopo) -> _Init:
    """``__kmp_aux_affinity_initialize``: ``KMP_HW_SUBSET``, the granularity, the
    per-proc masks, then the place list the affinity type builds
    (:data:`_INIT_BY_TYPE`)."""
    ini = _Init(st, base, frozenset(base.os))
    ini.machine = frozenset(topology.cpuset)
    ini.shared = True  # copied before the first change (_own_table)
    if st.hw_subset is not None:
        _own_table(ini)
        _filtered, msgs = kt.filter_hw_subset(ini.k, st.hw_subset)
        for m in msgs:
            ini.warn(m)
        ini.full = frozenset(ini.k.os)
    if ini.type == "none":
        ini.masks = [ini.full]
        return ini
    _set_granularity(ini)
    _make_os_id_masks(ini)
    if _INIT_BY_TYPE[ini.type](ini):
        _sort_topology(ini)
    return ini


def _make_os_id_masks(ini: _Init) -> None:
    """``__kmp_create_os_id_masks`` for the granularity, restricted to the cores
    of ``OMP_PLACES=cores:<attr>`` when there are such cores."""
    if ini.core_attr is not None:
        k = ini.k
        want = (kt.CORE_TYPE_ATOM if ini.core_attr == "intel_atom" else kt.CORE_TYPE_CORE) \
            if ini.core_attr.startswith("intel") else None
        eff = None if want is not None else int(ini.core_attr[3:])
        if _create_os_id_masks(ini, (lambda i: k.core_type[i] == want) if want is not None
                               else (lambda i: k.core_eff[i] == eff)):
            return
        what = "core_efficiency" if eff is not None else "core_type"
        ini.warn(f'{ini.env_var} ignored: {what} is not available. Using "cores" instead.')
    _create_os_id_masks(ini)


def _no_affinity(ini: _Init) -> bool:
    """Fall back to affinity ``none`` (one place: the full mask); no sort."""
    ini.type = "none"
    ini.masks = [ini.full]
    return False


def _init_explicit(ini: _Init) -> bool:
    """``explicit``: the masks of a proc list (``KMP_AFFINITY``,
    ``GOMP_CPU_AFFINITY``) or of an ``OMP_PLACES`` place list, in order."""
    if ini.st.bind[0] == "intel":
        ini.masks = _process_proclist(ini, ini.st.proclist)
    else:
        ini.masks = _process_placelist(ini, ini.st.proclist)
    if not ini.masks:
        ini.warn("No valid OS proc IDs specified - not using affinity.")
        return _no_affinity(ini)
    return False


def _init_logical(ini: _Init) -> bool:
    """``logical``: compact order; the offset counts cores."""
    k = ini.k
    ini.compact = 0
    if ini.offset:
        ini.offset = k.n_threads_per_core * ini.offset % k.num_threads
    return True


def _init_physical(ini: _Init) -> bool:
    """``physical``: threads of a core last (permute 1 with SMT); the offset counts cores."""
    k = ini.k
    ini.compact = 1 if k.n_threads_per_core > 1 and k.depth > 1 else 0
    if ini.offset:
        ini.offset = k.n_threads_per_core * ini.offset % k.num_threads
    return True


def _init_scatter(ini: _Init) -> bool:
    """``scatter``: compact with the permutation reversed."""
    depth = ini.k.depth
    ini.compact = 0 if ini.compact >= depth else depth - 1 - ini.compact
    return True


def _init_compact(ini: _Init) -> bool:
    """``compact``: the permute is at most the depth below the top."""
    depth = ini.k.depth
    if ini.compact >= depth:
        ini.compact = depth - 1
    return True


def _init_balanced(ini: _Init) -> bool:
    """``balanced``: needs more than one layer and, on a non-uniform machine,
    the per-core proc table (``procarr``) of ``__kmp_balanced_affinity``."""
    k = ini.k
    depth = k.depth
    if depth <= 1:
        ini.warn(f"{ini.env_var}: Affinity balanced is not available.")
        return _no_affinity(ini)
    if not k.uniform:
        rows = list(range(k.num_threads))
        core_level = _find_core_level(k, rows, depth - 1)
        ncores = k.count[core_level]
        maxpc = 1 if core_level >= depth - 1 else k.calculate_ratio(k.get_level(kt.THREAD), core_level)
        nproc = ncores * maxpc
        if nproc < 2 or nproc < k.num_threads:
            ini.warn(f"{ini.env_var}: Affinity balanced is not available.")
            return _no_affinity(ini)
        procarr = [-1] * nproc
        lastcore, inlast = -1, 0
        cidx = _core_index(k, rows, core_level)
        for i in range(k.num_threads):
            core = cidx[i]
            inlast = inlast + 1 if core == lastcore else 0
            lastcore = core
            procarr[core * maxpc + inlast] = k.os[i]
        ini.procarr = procarr
    return _init_compact(ini)


#: Per affinity type, what ``__kmp_aux_affinity_initialize`` does before sorting the
#: table; each returns whether the sorted table gives the places (False: done).
_INIT_BY_TYPE: dict[str, Callable[[_Init], bool]] = {
    "explicit": _init_explicit,
    "logical": _init_logical,
    "physical": _init_physical,
    "scatter": _init_scatter,
    "compact": _init_compact,
    "balanced": _init_balanced,
}


# ---------------------------------------------------------------------------
# Binding the team
# ---------------------------------------------------------------------------

def _partition(bind: str, n_th: int, num_masks: int, masters_place: int = 0) -> list[int]:
    """``__kmp_partition_places`` for the top-level team: each thread's place."""
    first_place, last_place = 0, num_masks - 1
    n_places = last_place - first_place + 1
    places = [masters_place] * n_th

    def nxt(p: int) -> int:
        if p == last_place:
            return first_place
        if p == num_masks - 1:
            return 0
        return p + 1

    if bind == "primary":
        return places
    if bind == "close":
        if n_th <= n_places:
            place = masters_place
            for f in range(1, n_th):
                place = nxt(place)
                places[f] = place
            return places
        return _spread_fill(n_th, n_places, masters_place, nxt)
    if bind == "spread":
        if n_th <= n_places:
            if n_places != num_masks:  # pragma: no cover - nested teams only
                raise AssertionError("nested partitions are not planned")
            current = float(masters_place)
            spacing = float(n_places + 1) / float(n_th)
            for f in range(n_th):
                first = int(current)
                if first >= n_places:
                    if masters_place:
                        first -= n_places
                        if first == masters_place + 1:
                            first -= 1
                    else:
                        first = 0
                places[f] = first
                current += spacing
            return places
        return _spread_fill(n_th, n_places, masters_place, nxt)
    return places


def _spread_fill(n_th: int, n_places: int, masters_place: int, nxt: Any) -> list[int]:
    s_ = n_th // n_places
    rem = n_th - s_ * n_places
    gap = n_places // rem if rem > 0 else n_places
    place = masters_place
    gap_ct = gap
    s_count = 0
    out = []
    for _f in range(n_th):
        out.append(place)
        s_count += 1
        if rem and gap_ct == gap:
            if s_count == s_ + 1:
                place = nxt(place)
                s_count = 0
                gap_ct = 1
                rem -= 1
        elif s_count == s_:
            place = nxt(place)
            gap_ct += 1
            s_count = 0
    return out


def _balanced(ini: _Init, nthreads: int) -> list[frozenset[int]]:
    """``__kmp_balanced_affinity`` (``kmp_affinity.cpp``) for every thread of a team of ``nthreads``."""
    k = ini.k
    order = ini.order or list(range(k.num_threads))
    fine = _balanced_fine_gran(k, ini.gran)
    if k.uniform:
        return _balanced_uniform(k, order, nthreads, fine)
    return _balanced_nonuniform(ini, order, nthreads, fine)


def _balanced_fine_gran(k: kt.KTopo, gran: str | None) -> bool:
    """``__kmp_balanced_affinity``'s ``fine_gran``: whether a thread is bound
    to one proc (granularity thread, or a coarser one with a single proc per
    granule) rather than to all the procs of its core."""
    if gran == "thread":
        return True
    if gran == "core":
        return k.n_threads_per_core <= 1
    if gran == "socket":
        return k.n_cores_per_pkg <= 1
    return False


def _balanced_uniform(k: kt.KTopo, order: Sequence[int], nthreads: int, fine: bool) -> list[frozenset[int]]:
    """``__kmp_balanced_affinity`` on a uniform topology: threads are spread
    in equal chunks over the cores (over the packages when cores have one
    proc), the first ``nthreads % ncores`` cores taking one more."""
    avail = k.num_threads
    nth_per_core = avail // k.n_cores
    ncores = k.n_cores
    if k.n_packages > 1 and nth_per_core <= 1:
        nth_per_core = avail // k.n_packages
        ncores = k.n_packages
    chunk = nthreads // ncores
    big_cores = nthreads % ncores
    big_nth = (chunk + 1) * big_cores
    out: list[frozenset[int]] = []
    for tid in range(nthreads):
        if tid < big_nth:
            core_id = tid // (chunk + 1)
            thread_id = (tid % (chunk + 1)) % nth_per_core
        else:
            core_id = (tid - big_cores) // chunk
            thread_id = ((tid - big_cores) % chunk) % nth_per_core
        if fine:
            out.append(frozenset((k.os[order[core_id * nth_per_core + thread_id]],)))
        else:
            out.append(frozenset(k.os[order[core_id * nth_per_core + i]] for i in range(nth_per_core)))
    return out


def _balanced_nonuniform(ini: _Init, order: Sequence[int], nthreads: int, fine: bool) -> list[frozenset[int]]:
    """``__kmp_balanced_affinity`` on a non-uniform topology: core level and
    procs per core from the table, then one of its three cases (a thread per
    available proc, at most one thread per core, or the ``newarr``
    distribution)."""
    k = ini.k
    depth = k.depth
    procarr = ini.procarr or []
    core_level = _find_core_level(k, order, depth - 1)
    ncores = k.count[core_level]
    nth_per_core = 1 if core_level >= depth - 1 else k.calculate_ratio(k.get_level(kt.THREAD), core_level)
    if nthreads == k.num_threads:
        return _balanced_every_proc(k, order, core_level, nthreads, fine)
    if nthreads <= ncores:
        return _balanced_one_per_core(procarr, ncores, nth_per_core, nthreads, fine)
    newarr = _balanced_newarr(procarr, ncores, nth_per_core, nthreads)
    return _balanced_from_newarr(procarr, newarr, nth_per_core, nthreads, fine)


def _balanced_every_proc(k: kt.KTopo, order: Sequence[int], core_level: int, nthreads: int,
                         fine: bool) -> list[frozenset[int]]:
    """``__kmp_balanced_affinity``, non-uniform, ``nthreads == __kmp_avail_proc``:
    thread ``tid`` gets the ``tid``-th proc (or all the procs of its core)."""
    cidx = _core_index(k, order, core_level)
    by_core: dict[int, set[int]] = {}
    for i in range(k.num_threads):
        by_core.setdefault(cidx[i], set()).add(k.os[order[i]])
    out: list[frozenset[int]] = []
    for tid in range(nthreads):
        if fine:
            out.append(frozenset((k.os[order[tid]],)))
        else:
            out.append(frozenset(by_core[cidx[tid]]))
    return out


def _balanced_one_per_core(procarr: Sequence[int], ncores: int, nth_per_core: int, nthreads: int,
                           fine: bool) -> list[frozenset[int]]:
    """``__kmp_balanced_affinity``, non-uniform, ``nthreads <= __kmp_ncores``:
    thread ``tid`` goes to the ``tid``-th core with an available proc (its
    first proc, or all of them)."""
    out: list[frozenset[int]] = []
    for tid in range(nthreads):
        mask: set[int] = set()
        core = 0
        for i in range(ncores):
            in_mask = any(procarr[i * nth_per_core + j] != -1 for j in range(nth_per_core))
            if in_mask:
                if tid == core:
                    for j in range(nth_per_core):
                        o = procarr[i * nth_per_core + j]
                        if o != -1:
                            mask.add(o)
                            if fine:
                                break
                    break
                core += 1
        out.append(frozenset(mask))
    return out


def _balanced_newarr(procarr: Sequence[int], ncores: int, nth_per_core: int, nthreads: int) -> list[int]:
    """``__kmp_balanced_affinity``, non-uniform, ``nthreads > __kmp_ncores``:
    the ``newarr`` distribution, how many threads each proc slot of
    ``procarr`` gets (``nproc_at_core``, ``ncores_with_x_procs``,
    ``ncores_with_x_to_max_procs``, then rounds over the cores)."""
    nproc_at_core = [sum(1 for j in range(nth_per_core) if procarr[i * nth_per_core + j] != -1)
                     for i in range(ncores)]
    with_x = [0] * (nth_per_core + 1)
    for c in nproc_at_core:
        with_x[c] += 1
    x_to_max = [sum(with_x[j] for j in range(i, nth_per_core + 1)) for i in range(nth_per_core + 1)]
    newarr = [0] * (nth_per_core * ncores)
    nth = nthreads
    flag = 0
    while nth > 0:
        for j in range(1, nth_per_core + 1):
            cnt = x_to_max[j]
            for i in range(ncores):
                if nproc_at_core[i] == 0:
                    continue
                for kk in range(nth_per_core):
                    if procarr[i * nth_per_core + kk] != -1:
                        if newarr[i * nth_per_core + kk] == 0:
                            newarr[i * nth_per_core + kk] = 1
                            cnt -= 1
                            nth -= 1
                            break
                        if flag != 0:
                            newarr[i * nth_per_core + kk] += 1
                            cnt -= 1
                            nth -= 1
                            break
                if cnt == 0 or nth == 0:
                    break
            if nth == 0:
                break
        flag = 1
    return newarr


def _balanced_from_newarr(procarr: Sequence[int], newarr: Sequence[int], nth_per_core: int, nthreads: int,
                          fine: bool) -> list[frozenset[int]]:
    """``__kmp_balanced_affinity``, non-uniform, ``nthreads > __kmp_ncores``:
    thread ``tid`` goes to the first proc slot where the running sum of
    ``newarr`` exceeds ``tid`` (that proc, or all the procs of its core)."""
    out: list[frozenset[int]] = []
    for tid in range(nthreads):
        total = 0
        mask: set[int] = set()
        for i in range(len(newarr)):
            total += newarr[i]
            if total > tid:
                if fine:
                    mask.add(procarr[i])
                else:
                    core_id = i // nth_per_core
                    for ii in range(nth_per_core):
                        o = procarr[core_id * nth_per_core + ii]
                        if o != -1:
                            mask.add(o)
                break
        out.append(frozenset(mask))
    return out


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------

def team_size(st: RuntimeSettings, avail: int, machine_procs: int) -> int:
    """The team size of the first parallel region: ``OMP_NUM_THREADS`` (``all``:
    every proc of the machine), else one thread per available proc."""
    if st.nth is not None and st.nth.all:
        n = machine_procs
    elif st.nth is not None and st.nth.first is not None:
        n = st.nth.first
    else:
        n = avail
    return max(1, n)


def evaluate_settings(st: RuntimeSettings, texts: tuple[str, ...], topology: Any, initial: frozenset[int], *,
                      memo: Memo, settings: Any = None) -> Outcome:
    """Run the emulation for settings :func:`process_env` made (``texts``:
    the messages it printed; ``settings``: the parsed values, carried to the
    plan).  What depends on the topology alone -- the runtime's table for a
    full mask, an initialization, a team -- is kept in the planner's
    per-topology ``memo``."""
    # __kmp_xproc: sysconf(_SC_NPROCESSORS_CONF), offline CPUs included
    nprocs_machine = len(topology.pus) + getattr(topology, "offline_cpus", 0)
    bind0 = st.bind[0]
    if st.type == "disabled":
        n, capped = _limited_team(st, nprocs_machine, nprocs_machine)
        return Outcome(threads=n, cpusets=(initial,) * n, places=None, place_nums=(-1,) * n,
                       warnings=texts + st.late_texts + tuple(capped), affinity_type="disabled", granularity=None,
                       proc_bind="false", num_procs=nprocs_machine, view=None, settings=settings)
    if st.respect:
        full = initial
    else:
        full = topology.cpuset
        _check_norespect(topology)
    numa = st.dialect.numa_layer
    table = ("table", full, numa)
    base = memo(table, lambda: kt.build(topology, full, numa=numa))
    key = ("init", full, numa, st.key)
    ini = memo(key, lambda: initialize(st, topology, base))
    k = ini.k
    avail = k.num_threads
    n, capped = _limited_team(st, avail, nprocs_machine)
    cpusets, place_nums, pb = memo(("team", key, bind0, n), lambda: _team(ini, bind0, n))
    if not cpusets[0]:
        # the primary thread keeps the process mask it started with
        cpusets = (initial,) + tuple(cpusets[1:])
    warnings = texts + tuple(ini.msgs) + st.late_texts + tuple(capped)
    if ini.type == "none":
        return Outcome(threads=n, cpusets=cpusets, places=(ini.full,), place_nums=place_nums, warnings=warnings,
                       affinity_type="none", granularity=None, proc_bind=pb, num_procs=avail, view=k,
                       settings=settings)
    return Outcome(threads=n, cpusets=cpusets, places=tuple(ini.masks), place_nums=place_nums, warnings=warnings,
                   affinity_type=ini.type, granularity=ini.gran if ini.gran_levels >= 0 else None, proc_bind=pb,
                   num_procs=avail, view=k, settings=settings)


def _limited_team(st: RuntimeSettings, avail: int, xproc: int) -> tuple[int, list[str]]:
    """The team :func:`team_size` asks for, cut by the thread limits (and the
    warning that says so), or :class:`PlanError` where the runtime cannot make it."""
    asked = team_size(st, avail, xproc)
    if asked >= 2**31 - 1:  # INT_MAX threads: both runtimes crash before any limit applies
        _check_team(asked)
    n, capped = cap_team(asked, st.device_limit, st.cg_limit, xproc)
    _check_team(n)
    return n, capped


def _check_norespect(topology: Any) -> None:
    """``norespect``: the runtime's full mask is every OS proc of the machine, and
    it binds to each of them while decoding the topology (x2APIC ids), then
    binds threads there.  The kernel refuses a CPU outside the process's cpuset
    (``topology.allowed``; the process mask may be narrower, that is fine):
    libiomp5 aborts with ``OMP: Error #179: Function pthread_setaffinity_np()
    failed: Invalid argument``.  Raised here instead of planning CPUs that
    cannot be had.  The machine's CPUs are those it has configured
    (``__kmp_xproc``): CPUs an hwloc XML taken inside a cgroup cpuset leaves out
    (its ``complete_cpuset`` counts them, ``Topology.offline_cpus``) and offline
    ones abort it just the same."""
    allowed = topology.allowed
    outside = topology.cpuset - allowed if allowed else frozenset()
    if outside:
        raise PlanError(
            f"norespect: the runtime binds to every OS proc of the machine, but "
            f"{_cpu_list(outside)} {'is' if len(outside) == 1 else 'are'} outside this process's cpuset "
            f"({_cpu_list(allowed)}): the kernel refuses them and libiomp5 aborts (OMP: Error #179: "
            f"Function pthread_setaffinity_np() failed); respect the process mask instead")
    unlisted = getattr(topology, "offline_cpus", 0)
    if unlisted:
        # (__kmp_affinity_entire_machine_mask: procs 0 to __kmp_xproc - 1, the CPUs configured)
        raise PlanError(
            f"norespect: the runtime binds to every CPU the machine has configured, {unlisted} more than "
            f"the {len(topology.pus)} PUs described (offline, or outside the cpuset where the description "
            f"was taken: an hwloc XML's complete_cpuset): the kernel refuses them and libiomp5 aborts (OMP: "
            f"Error #179: Function pthread_setaffinity_np() failed); respect the process mask instead")


def _cpu_list(cpus: frozenset[int]) -> str:
    return f"CPU{'s' if len(cpus) != 1 else ''} {format_list(cpus)}"


def _team(ini: _Init, bind0: str, n: int) -> tuple[tuple[frozenset[int], ...], tuple[int, ...], str]:
    """Each thread's set and place for a team of ``n``."""
    masks = ini.masks
    nm = len(masks)
    if ini.type == "none":
        pb = "false" if bind0 in ("false", "default") else bind0
        return (ini.full,) * n, (0,) * n, pb
    if bind0 in ("intel", "false"):
        if ini.type == "balanced":
            cpusets = _balanced(ini, n) if n > 1 else [ini.full]
            place_nums = [0] * n
        else:
            off = ini.offset
            if off == 0 and n <= nm:
                place_nums, cpusets = list(range(n)), masks[:n]
            else:
                place_nums = [(i + off) % nm for i in range(n)]
                cpusets = [masks[p] for p in place_nums]
        pb = "intel" if bind0 == "intel" else "false"
    else:
        masters = ini.offset % nm
        place_nums = [masters] if n == 1 else _partition(bind0, n, nm, masters)
        cpusets = [masks[p] for p in place_nums]
        pb = bind0
    # An empty place (``OMP_PLACES=!{...}`` excluding everything): a worker
    # cannot be bound to it and the runtime aborts; the primary thread's
    # failed binding is ignored (see evaluate_settings).
    if not all(cpusets[1:]):
        i = next(i for i, c in enumerate(cpusets) if not c and i > 0)
        raise PlanError(f"thread {i} would be bound to an empty place: the runtime aborts "
                        "(pthread_setaffinity_np() failed)")
    return tuple(cpusets), tuple(place_nums), pb


def _check_team(n: int) -> None:
    if n >= 2**31 - 1 or n > MAX_TEAM:
        raise PlanError(
            f"a team of {n} threads cannot be created: the runtime aborts (OMP: Error #34, System unable "
            f"to allocate necessary resources for OMP thread) or crashes beyond {MAX_TEAM} threads")


# ---------------------------------------------------------------------------
# The planner's entry points (see affinity.planning.rules)
# ---------------------------------------------------------------------------

@record
class Read:
    """What the runtime made of the environment: its settings, the messages it
    printed while reading, and (strict) the parsed values as :class:`Settings`."""

    st: RuntimeSettings
    texts: tuple[str, ...]
    settings: Settings | None


def read(env: tuple[tuple[str, str], ...], *, strict: bool, dialect: Dialect = INTEL) -> Read:
    """How libiomp5 (or the sibling runtime of ``dialect``) reads the sorted
    variables ``env`` (see :mod:`affinity.planning.rules`)."""
    st, texts, values = process_env(dict(env), strict, dialect)
    return Read(st, tuple(texts), Settings.of(values) if strict else None)


def evaluate(settings: Read, topology: Any, initial: frozenset[int], *, memo: Memo) -> Outcome:
    """What the runtime does on ``topology`` with the settings it read
    (see :mod:`affinity.planning.rules`)."""
    return evaluate_settings(settings.st, settings.texts, topology, initial, memo=memo, settings=settings.settings)


def kmp_mask_str(cpus: Any) -> str:
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


def explain(plan: Any) -> list[str]:
    """The runtime's ``verbose`` account of ``plan``: its warnings, the
    topology summary, the OS proc -> (socket, core, thread) map and one
    ``thread N bound to OS proc set {...}`` line per thread."""
    var = "KMP_AFFINITY"
    if plan.proc_bind in ("close", "spread", "primary"):
        var = "OMP_PROC_BIND"
    lines = [f"OMP: Warning: {w}" for w in plan.warnings]
    view: kt.KTopo | None = plan._view
    if plan.affinity_type == "disabled" or view is None:
        lines.append(f"{var}: affinity disabled; threads run on the process mask "
                     f"{{{kmp_mask_str(plan.initial_mask)}}}")
    else:
        respect = "respected" if plan.union <= plan.initial_mask else "not respected"
        lines.append(f"{var}: Initial OS proc set {respect}: {kmp_mask_str(plan.initial_mask)}")
        lines.append(f"{var}: {view.num_threads} available OS procs")
        lines.append(f"{var}: {'Uniform' if view.uniform else 'Nonuniform'} topology")
        for t, eq in view.equivalences():
            lines.append(f'{var}: topology layer "{kt.cat(t)}" is equivalent to "{kt.cat(eq)}".')
        lines.append(f"{var}: {view.summary()}")
        lines.append(f"{var}: OS proc to physical thread map:")
        order = sorted(range(view.num_threads), key=lambda i: (view.ids[i], view.os[i]))
        for i in order:
            lines.append(f"{var}: OS proc {view.os[i]} maps to {view.describe_thread(i)}")
    for i, s in enumerate(plan.cpusets):
        lines.append(f"{var}: thread {i} bound to OS proc set {{{kmp_mask_str(s)}}}")
    return lines
