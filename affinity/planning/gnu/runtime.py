"""GNU libgomp's start-up and first parallel region, as a pure function.

:func:`plan_gomp` reads the variables in libgomp's own order (``initialize_env``
in ``env.c``), builds the place list, binds the initial thread as the library's
constructor does, and places the team of the first parallel region as
``gomp_team_start`` (``team.c``) does.  The result, a :class:`GompPlan`, holds
what the real library was measured to do on every reference case
(``tests/golden_gomp``): team size, each thread's CPU set, the place list, the
initial thread's mask after load, the binding policy, the partitions, the
messages it prints.  Where the library aborts (a thread bound to a CPU the
kernel refuses) or never returns (the PyTorch build on a ``GOMP_CPU_AFFINITY``
word), :class:`~affinity.errors.PlanError` says so.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping

from ...cpulist import format_list
from ...errors import PlanError
from ...machine.topology import Topology
from ...record import field, record
from .builds import Build, build_of
from .cparse import Cursor, as_long, strtoul
from .places import Context, init_level, parse_affinity, parse_places_var
from .sysfs import SysfsView, sysfs_view

__all__ = ["GompPlan", "plan_gomp", "GOMP_VARIABLES", "PROC_BIND_NAMES", "MAX_TEAM"]

#: the variables libgomp reads that change placement, in its reading order
GOMP_VARIABLES = ("OMP_THREAD_LIMIT", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")

#: ``omp_get_proc_bind()`` values -> names (2 is both ``master`` and ``primary``)
PROC_BIND_NAMES = {0: "false", 1: "true", 2: "primary", 3: "close", 4: "spread"}

#: the largest team planned: a default Linux process cannot create more threads
#: (vm.max_map_count = 65530 mappings, two per thread stack: libgomp fails with
#: "Thread creation failed"), the limit Intel's rules use too
MAX_TEAM = 32768

_FALSE, _TRUE, _PRIMARY, _CLOSE, _SPREAD = range(5)


@record
class GompPlan:
    """What libgomp does at load and in the first parallel region."""

    build: str  #: the build followed (:data:`~affinity.planning.gnu.builds.BUILDS`)
    threads: int  #: team size of the first region
    cpusets: tuple[frozenset[int], ...]  #: thread i's CPU set
    places: tuple[frozenset[int], ...] | None  #: the place list (``None``: not bound)
    place_nums: tuple[int, ...]  #: thread i's place (``-1``: not bound)
    partitions: tuple[tuple[int, int], ...]  #: thread i's place partition (first place, count)
    init_mask: frozenset[int]  #: the initial thread's mask right after the library loaded
    proc_bind: str  #: ``false``, ``true``, ``primary``, ``close`` or ``spread``
    num_procs: int  #: ``omp_get_num_procs()``
    max_threads: int  #: ``omp_get_max_threads()`` before the region
    warnings: tuple[str, ...]  #: what libgomp prints, without ``libgomp: ``
    initial_mask: frozenset[int]  #: the process mask libgomp started with
    places_from: str | None  #: ``OMP_PLACES``, ``GOMP_CPU_AFFINITY``, ``threads`` (default) or None
    env: tuple[tuple[str, str], ...] = field(default=())

    @property
    def proc_bind_value(self) -> int:
        """``omp_get_proc_bind()``'s number."""
        return {v: k for k, v in PROC_BIND_NAMES.items()}[self.proc_bind]


# ------------------------------------------------------------- machine
#: id(topology) -> (weak reference, its sysfs view, {inputs: plan}); the plans of
#: one topology are remembered (they are immutable values), at most _MAX_MEMO
_VIEWS: dict[int, tuple[weakref.ref[Topology], SysfsView, dict]] = {}
_VIEWS_LOCK = threading.Lock()
_MAX_MEMO = 1024


def _view(topology: Topology) -> tuple[SysfsView, dict]:
    """:func:`sysfs_view` of ``topology`` and its plans, kept while the topology lives."""
    entry = _VIEWS.get(id(topology))
    if entry is not None and entry[0]() is topology:
        return entry[1], entry[2]
    view = sysfs_view(topology)
    key = id(topology)
    memo: dict = {}
    with _VIEWS_LOCK:
        _VIEWS[key] = (weakref.ref(topology, lambda _r, k=key: _VIEWS.pop(k, None)), view, memo)
    return view, memo


# ------------------------------------------------------- the variables
def _unsigned_long(name: str, value: str | None, messages: list[str]) -> int | None:
    """``parse_unsigned_long(name, allow_zero=false)``."""
    if value is None:
        return None
    cur = Cursor(value)
    cur.skip_space()
    start = cur.pos
    val, end, err = strtoul(value, start, 10)
    cur.pos = end
    cur.skip_space()
    if start < len(value) and not err and end != start and as_long(val) > 0 and cur.at_end():
        return val
    messages.append(f"Invalid value for environment variable {name}")
    return None


def _num_threads(value: str | None, messages: list[str]) -> int | None:
    """``parse_unsigned_long_list("OMP_NUM_THREADS")``: the first value of the list."""
    if value is None:
        return None
    cur = Cursor(value)
    cur.skip_space()
    values: list[int] = []
    ok = not cur.at_end()
    while ok:
        val, end, err = strtoul(value, cur.pos, 10)
        if err or as_long(val) <= 0:
            ok = False
            break
        values.append(val)
        cur.pos = end
        cur.skip_space()
        if cur.at_end():
            break
        if cur.peek() != ",":
            ok = False
            break
        cur.pos += 1
        cur.skip_space()
        if cur.at_end():
            ok = False
    if ok:
        return values[0]
    messages.append("Invalid value for environment variable OMP_NUM_THREADS")
    return None


def _proc_bind(value: str | None, build: Build, messages: list[str]) -> int | None:
    """``parse_bind_var("OMP_PROC_BIND")``: the first policy of the list."""
    if value is None:
        return None
    kinds = [("false", _FALSE), ("true", _TRUE), ("master", _PRIMARY)]
    if build.primary:
        kinds.append(("primary", _PRIMARY))
    kinds += [("close", _CLOSE), ("spread", _SPREAD)]
    cur = Cursor(value)

    def word(choices: list[tuple[str, int]]) -> int | None:
        for name, kind in choices:
            if cur.startswith_nocase(name):
                cur.pos += len(name)
                return kind
        return None

    cur.skip_space()
    first = word(kinds)
    ok = first is not None
    if ok:
        cur.skip_space()
        if not cur.at_end():
            ok = cur.peek() == "," and first not in (_FALSE, _TRUE)
            while ok:
                cur.pos += 1
                cur.skip_space()
                ok = word(kinds[2:]) is not None
                cur.skip_space()
                if cur.at_end():
                    break
                ok = ok and cur.peek() == ","
    if ok:
        return first
    messages.append("Invalid value for environment variable OMP_PROC_BIND")
    return None


# ---------------------------------------------------------------- team
def _team_places(bind: int, n: int, nplaces: int) -> list[tuple[int, int, int]]:
    """``gomp_team_start``'s placement of a first region: ``(place, partition first,
    partition length)`` for each of ``n`` threads, the primary on place 0 of a
    partition holding all ``nplaces`` places."""
    p, off, plen = 0, 0, nplaces
    s = rest = 0
    k = 1
    if bind in (_TRUE, _CLOSE):
        s, rest = (n // nplaces, n % nplaces) if n > nplaces else (1, 0)
    elif bind == _SPREAD:
        if n <= nplaces:
            s, rest = nplaces // n, nplaces % n
            rest = (s + 1) * rest
            plen = s + 1 if p < rest else s
            k = 0
        else:
            s, rest = n // nplaces, n % nplaces
            plen = 1
    out = [(p, p if bind == _SPREAD else off, plen)]
    for i in range(1, n):
        t_off, t_len = 0, nplaces
        if bind in (_TRUE, _CLOSE) or (bind == _SPREAD and k != 0):
            if k == s:
                p += 1
                if p == nplaces:
                    p = 0
                k = 1
                if i == n - rest:
                    s = 1
            else:
                k += 1
            if bind == _SPREAD:
                t_off, t_len = p, 1
        elif bind == _SPREAD:
            p += s + 1 if p < rest else s
            if p == nplaces:
                p = 0
            t_off, t_len = p, (s + 1 if p < rest else s)
        out.append((p, t_off, t_len))
    return out


def _bound_masks(places: list[frozenset[int]], slots: list[tuple[int, int, int]], init_mask: frozenset[int],
                 usable: frozenset[int], source: str, value: str | None) -> list[frozenset[int]]:
    """Each thread's mask: the primary keeps ``init_mask``, every other thread gets
    its place as the kernel applies it; a place the kernel refuses aborts libgomp."""
    masks = [init_mask]
    for i, (p, _, _) in enumerate(slots[1:], 1):
        got = places[p] & usable
        if not got:
            raise PlanError(f"{source}={value!r}: thread {i} would be bound to CPU {format_list(places[p])}, "
                            f"which the kernel refuses (offline, absent or outside the cpuset "
                            f"{format_list(usable)}): libgomp aborts with 'Thread creation failed: "
                            "Invalid argument' (exit status 1)")
        masks.append(got)
    return masks


def _settings(env: Mapping[str, str | None], build: Build, ctx: Context):
    """``initialize_env``'s steps for placement: limits, team size, policy, places."""
    msgs = ctx.messages
    limit = _unsigned_long("OMP_THREAD_LIMIT", env.get("OMP_THREAD_LIMIT"), msgs)
    nthreads = _num_threads(env.get("OMP_NUM_THREADS"), msgs)
    bind = _proc_bind(env.get("OMP_PROC_BIND"), build, msgs)
    ignore = bind == _FALSE
    bind = _FALSE if bind is None else bind
    places, source = None, None
    got = parse_places_var(ctx, env.get("OMP_PLACES"), ignore)
    if got is not None:
        places, source, ignore = got, "OMP_PLACES", True
        bind = _TRUE if bind == _FALSE else bind
    got = parse_affinity(ctx, env.get("GOMP_CPU_AFFINITY"), ignore)
    if got is not None:
        places, source = got, "GOMP_CPU_AFFINITY"
        bind = _TRUE if bind == _FALSE else bind
    if bind != _FALSE and places is None:
        places = init_level(ctx, 1, len(ctx.mask), quiet=True)
        source = "threads" if places is not None else None
    return limit, nthreads, bind, places, source


def plan_gomp(env: Mapping[str, str | None], topology: Topology, initial_mask: Iterable[int] | None = None,
              build: str | Build | None = None) -> GompPlan:
    """What libgomp does with ``env`` on ``topology`` for a process started with
    ``initial_mask`` (default: ``topology.allowed``).

    Parameters
    ----------
    env : mapping of str to str
        The environment; the variables of :data:`GOMP_VARIABLES` are read.
    topology : Topology
        The machine (libgomp's sysfs view of it is :func:`~affinity.planning.gnu.sysfs.sysfs_view`).
    initial_mask : iterable of int, optional
        The process affinity mask.
    build : str or Build, optional
        ``"gcc12"`` (default) or ``"torch"`` (PyTorch's bundled GCC 8.5 libgomp).

    Raises
    ------
    PlanError
        Where libgomp aborts or never returns, or the team would exceed :data:`MAX_TEAM`.
    """
    b = build_of(build)
    mask = frozenset(topology.allowed or topology.cpuset) if initial_mask is None else frozenset(initial_mask)
    # a process mask holds only CPUs the kernel lets the process use (topology.allowed)
    mask &= topology.allowed or topology.cpuset
    if not mask:
        raise PlanError(f"initial_mask selects no processor of {topology.describe()} this process may use "
                        f"(allowed: {format_list(topology.allowed or topology.cpuset)})")
    view, memo = _view(topology)
    key = (tuple(sorted((k, v) for k, v in env.items() if k in GOMP_VARIABLES and v is not None)), mask, b)
    hit = memo.get(key)
    if hit is None:
        hit = _plan(env, view, mask, b)
        if len(memo) >= _MAX_MEMO:
            memo.clear()
        memo[key] = hit
    return hit


def _plan(env: Mapping[str, str | None], view: SysfsView, mask: frozenset[int], b: Build) -> GompPlan:
    """:func:`plan_gomp` once its inputs are checked (a pure function of them)."""
    ctx = Context(mask, view, b)
    limit, nthreads, bind, places, source = _settings(env, b, ctx)
    max_threads = nthreads if nthreads is not None else len(mask)
    team = max_threads if limit is None else min(max_threads, limit)
    if team > MAX_TEAM:
        raise PlanError(f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS')!r}: a team of {team} threads; a process "
                        f"cannot create more than about {MAX_TEAM} (libgomp aborts: 'Thread creation failed')")
    init_mask = mask
    if places is not None:
        init_mask = (places[0] & view.usable) or mask  # refused: the thread stays where it was
        slots = _team_places(bind, team, len(places))
        masks = _bound_masks(places, slots, init_mask, view.usable, source or "",
                             env.get(source) if source in env else None)
    else:
        slots = [(-1, 0, 0)] * team
        masks = [mask] * team
    env_items = tuple(sorted((k, v) for k, v in env.items() if k in GOMP_VARIABLES and v is not None))
    return GompPlan(build=b.name, threads=team, cpusets=tuple(masks),
                    places=None if places is None else tuple(places),
                    place_nums=tuple(s[0] for s in slots), partitions=tuple((s[1], s[2]) for s in slots),
                    init_mask=init_mask, proc_bind=PROC_BIND_NAMES[bind], num_procs=len(mask),
                    max_threads=max_threads, warnings=tuple(ctx.messages), initial_mask=mask,
                    places_from=source, env=env_items)
