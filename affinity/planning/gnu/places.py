"""libgomp's place lists: ``OMP_PLACES``, ``GOMP_CPU_AFFINITY`` and the abstract names.

Each function mirrors one routine of libgomp (``env.c``: ``parse_one_place``,
``parse_places_var``, ``parse_affinity``; ``config/linux/affinity.c``:
``gomp_affinity_init_level`` and its helpers), step for step, on values: a place
is a ``frozenset`` of CPU numbers, a message is appended to ``ctx.messages``
exactly when libgomp would print it (without its ``libgomp: `` prefix).
"""

from __future__ import annotations

from ...errors import MalformedValue, PlanError
from ...record import field, record
from .builds import Build
from .cparse import ULONG_MAX, Cursor, strtol, strtoul
from .sysfs import SysfsView

__all__ = ["Context", "parse_places_var", "parse_affinity", "init_level", "LEVELS", "cpu_limit", "affinity_hang"]

#: abstract place names -> libgomp's level numbers
LEVELS = {"threads": 1, "cores": 2, "sockets": 3, "ll_caches": 4, "numa_domains": 5}


def cpu_limit(mask: frozenset[int]) -> int:
    """CPU numbers at or above this do not fit libgomp's CPU sets: it sizes them
    (``CPU_ALLOC_SIZE``) for the highest CPU of the process mask, in 64-bit words."""
    return (max(mask) // 64 + 1) * 64


@record(frozen=False)
class Context:
    """What the parser works against: the process mask, the machine, the build."""

    mask: frozenset[int]
    view: SysfsView
    build: Build
    messages: list[str] = field(default_factory=list)
    #: the OMP_PLACES value being read (for refusals that name it)
    value: str | None = None

    def __post_init__(self) -> None:
        #: :func:`cpu_limit` of the process mask
        self.max_cpu = cpu_limit(self.mask)

    def error(self, text: str) -> None:
        self.messages.append(text)


def _invalid(detail: str = "invalid") -> MalformedValue:
    """A parse step failed (libgomp's ``return false`` / ``goto invalid``): the
    parsers' internal :class:`~affinity.errors.MalformedValue`, caught by the
    variable's parser, which prints libgomp's message."""
    return MalformedValue(-1, detail)


# --------------------------------------------------------------- CPU sets
def _add_cpus(ctx: Context, place: set[int], num: int, length: int, stride: int, quiet: bool) -> None:
    """``gomp_affinity_add_cpus``: ``length`` CPUs from ``num``, ``stride`` apart."""
    top = ctx.max_cpu
    if stride == 0:
        length = 1  # the same CPU again and again
    while True:
        if num >= top:
            if not quiet:
                ctx.error(f"Logical CPU number {num} out of range")
            raise _invalid()
        place.add(num)
        length -= 1
        if length == 0:
            return
        nxt = num + stride
        if nxt < 0 or nxt > ULONG_MAX:
            if not quiet:
                ctx.error(f"Logical CPU number {num}+{stride} out of range")
            raise _invalid()
        num = nxt


def _remove_cpu(ctx: Context, place: set[int], num: int) -> None:
    """``gomp_affinity_remove_cpu``."""
    if num >= ctx.max_cpu:
        ctx.error(f"Logical CPU number {num} out of range")
        raise _invalid()
    if num not in place:
        ctx.error(f"Logical CPU {num} to be removed is not in the set")
        raise _invalid()
    place.discard(num)


def _copy_place(ctx: Context, src: frozenset[int], stride: int) -> frozenset[int]:
    """``gomp_affinity_copy_place``: ``src`` shifted by ``stride``."""
    top = ctx.max_cpu
    for i in sorted(src):
        j = i + stride
        if j < 0 or (stride > 0 and j >= top):
            ctx.error(f"Logical CPU number {i}+{stride} out of range")
            raise _invalid()
    return frozenset(i + stride for i in src)


# ------------------------------------------------------------ one place
def _number(ctx: Context, cur: Cursor, signed: bool = False) -> int:
    """A number field: ``strtoul``/``strtol`` base 10, errno and (strict builds) no digits fail."""
    val, end, err = (strtol if signed else strtoul)(cur.text, cur.pos, 10)
    if err or (end == cur.pos and ctx.build.strict_numbers):
        raise _invalid()
    cur.pos = end
    return val


def _interval(ctx: Context, cur: Cursor, place: set[int] | None, negate: bool,
              pass_no: int) -> None:
    """One ``num[:len[:stride]]`` or ``!num`` item inside braces."""
    num = _number(ctx, cur)
    length, stride = 1, 1
    cur.skip_space()
    if cur.peek() == ":":
        cur.pos += 1
        if negate and ctx.build.strict_numbers:
            raise _invalid()
        cur.skip_space()
        length, cur.pos, err = strtoul(cur.text, cur.pos, 10)
        if err or length == 0:
            raise _invalid()
        cur.skip_space()
        if cur.peek() == ":":
            cur.pos += 1
            cur.skip_space()
            stride = _number(ctx, cur, signed=True)
            cur.skip_space()
    if negate and length != 1:
        raise _invalid()
    if place is not None and pass_no == int(negate):
        if negate:
            _remove_cpu(ctx, place, num)
        else:
            _add_cpus(ctx, place, num, length, stride, False)


def _braces(ctx: Context, cur: Cursor, place: set[int] | None) -> None:
    """The items between ``{`` and ``}``: additions first, then removals."""
    start = cur.pos
    passes, pass_no = 1, 0
    while pass_no < passes:
        cur.pos = start
        while True:
            negate = cur.peek() == "!"
            if negate:
                if place is not None:
                    passes = 2
                cur.pos += 1
                cur.skip_space()
            _interval(ctx, cur, place, negate, pass_no)
            if cur.peek() == "}":
                break
            if cur.peek() != ",":
                raise _invalid()
            cur.pos += 1
        pass_no += 1


def parse_one_place(ctx: Context, cur: Cursor, place: set[int] | None) -> tuple[bool, int, int]:
    """``parse_one_place``: one place and its ``:len:stride`` repeat.

    ``place`` is filled on the building pass (``None`` on the checking pass).
    Returns ``(negated, len, stride)``; raises :class:`~affinity.errors.MalformedValue` on bad syntax."""
    cur.skip_space()
    negated = cur.peek() == "!"
    if negated:
        cur.pos += 1
        cur.skip_space()
    if cur.peek() != "{":
        if not ctx.build.braceless_places:
            raise _invalid()
        val, end, err = strtoul(cur.text, cur.pos, 10)
        if err or end == cur.pos:
            raise _invalid()
        cur.pos = end
        if place is not None:
            _add_cpus(ctx, place, val, 1, 1, False)
    else:
        cur.pos += 1
        cur.skip_space()
        _braces(ctx, cur, place)
        cur.pos += 1  # past '}'
    cur.skip_space()
    length, stride = 1, 1
    if cur.peek() == ":":
        if negated and ctx.build.strict_numbers:
            raise _invalid()
        cur.pos += 1
        cur.skip_space()
        length, cur.pos, err = strtoul(cur.text, cur.pos, 10)
        if err or length == 0 or length >= 65536:
            raise _invalid()
        cur.skip_space()
        if cur.peek() == ":":
            cur.pos += 1
            cur.skip_space()
            stride = _number(ctx, cur, signed=True)
            cur.skip_space()
    if negated and length != 1:
        raise _invalid()
    return negated, length, stride


# --------------------------------------------------------- OMP_PLACES
def _abstract_name(ctx: Context, cur: Cursor) -> int:
    """The level of an abstract name at the cursor (0: none), consumed."""
    for name, level in LEVELS.items():
        if level >= 4 and not ctx.build.abstract_51:
            continue
        if cur.startswith_nocase(name):
            cur.pos += len(name)
            return level
    return 0


def _abstract_count(ctx: Context, cur: Cursor) -> int:
    """``name`` or ``name(count)``: the count (``ULONG_MAX``: none)."""
    cur.skip_space()
    if cur.at_end():
        return ULONG_MAX
    if cur.peek() != "(":
        raise _invalid()
    cur.pos += 1
    cur.skip_space()
    count = _number(ctx, cur)
    cur.skip_space()
    if cur.peek() != ")":
        raise _invalid()
    cur.pos += 1
    cur.skip_space()
    if not cur.at_end():
        raise _invalid()
    return count


def _check_list(ctx: Context, value: str) -> None:
    """The checking pass over an explicit list (syntax and sizes only)."""
    cur = Cursor(value)
    count, any_negate = 0, False
    while True:
        negated, length, _ = parse_one_place(ctx, cur, None)
        if negated:
            count += 0 if any_negate else 1
            any_negate = True
        else:
            count += length
        if count > 65536:
            raise _invalid()
        if cur.at_end():
            return
        if cur.peek() != ",":
            raise _invalid()
        cur.pos += 1


def _build_list(ctx: Context, value: str) -> list[frozenset[int]]:
    """The building pass: the places in list order, removals applied."""
    cur = Cursor(value)
    places: list[frozenset[int]] = []
    while True:
        work: set[int] = set()
        negated, length, stride = parse_one_place(ctx, cur, work)
        place = frozenset(work)
        if negated:
            if place not in places:
                ctx.error("Trying to remove a non-existing place from list of places")
                raise _invalid()
            places.remove(place)
        else:
            places.append(place)
            for _ in range(length - 1):
                place = _copy_place(ctx, place, stride)
                places.append(place)
        if cur.at_end():
            break
        cur.pos += 1
    if not places:
        ctx.error("All places have been removed")
        raise _invalid()
    return places


def finalize_place_list(ctx: Context, places: list[frozenset[int]]) -> list[frozenset[int]]:
    """``gomp_affinity_finalize_place_list``: every place cut to the process mask,
    empty places dropped (with libgomp's message)."""
    kept = [p & ctx.mask for p in places]
    kept = [p for p in kept if p]
    if not kept:
        ctx.error("None of the places contain usable logical CPUs")
        raise _invalid()
    if len(kept) < len(places):
        ctx.error(f"Number of places reduced from {len(places)} to {len(kept)} because some "
                  "places didn't contain any usable logical CPUs")
    return kept


def parse_places_var(ctx: Context, value: str | None, ignore: bool) -> list[frozenset[int]] | None:
    """``parse_places_var("OMP_PLACES")``: the place list, or ``None`` (unset,
    invalid, ignored because ``OMP_PROC_BIND=false``, or the machine gave none)."""
    if value is None:
        return None
    cur = Cursor(value)
    cur.skip_space()
    try:
        if cur.at_end():
            raise _invalid()
        level = _abstract_name(ctx, cur)
        if level:
            count = _abstract_count(ctx, cur)
            if ignore:
                return None
            ctx.value = value
            return init_level(ctx, level, count, quiet=False)
        rest = value[cur.pos:]
        _check_list(ctx, rest)
        if ignore:
            return None
        return finalize_place_list(ctx, _build_list(ctx, rest))
    except MalformedValue:
        ctx.error("Invalid value for environment variable OMP_PLACES")
        return None


# ----------------------------------------------------- abstract names
def init_level(ctx: Context, level: int, count: int, quiet: bool) -> list[frozenset[int]] | None:
    """``gomp_affinity_init_level``: the place list of an abstract name, from sysfs.

    Places follow CPU numbers: for each CPU of the process mask in ascending
    order not yet placed, its group (thread siblings, core siblings, last-level
    cache, NUMA node), cut to the mask; ``threads`` makes each CPU of the group
    a place of its own.  At most ``count`` places."""
    count = min(count, len(ctx.mask))
    copy = set(ctx.mask)
    if level == 5:
        places = _numa_places(ctx, copy, count)
    elif level == 4:
        places = _cache_places(ctx, copy, count)
    elif level == 3:
        places = _group_places(ctx.view.core_siblings, copy, count, split=False)
    else:
        overrun = (ctx.value, ctx.build.library) if ctx.build.threads_count_overrun else None
        places = _group_places(ctx.view.thread_siblings, copy, count, split=(level == 1), overrun=overrun)
    if not places:
        if not quiet:
            ctx.error("Error reading core/socket topology")
        return None
    return places


def _group_places(groups, copy: set[int], count: int, split: bool,
                  overrun: tuple[str | None, str] | None = None) -> list[frozenset[int]]:
    """Sibling-list places (``threads``, ``cores``, ``sockets``).  ``overrun``:
    ``(OMP_PLACES value, library)`` of a build that checks the count of
    ``threads`` only between cores (GCC 8) and crashes when it is reached inside one."""
    out: list[frozenset[int]] = []
    for cpu in sorted(copy):
        if len(out) >= count:
            break
        if cpu not in copy:
            continue
        members = groups.get(cpu)
        if members is None:
            copy.discard(cpu)
            continue
        if split:
            for c in sorted(members):
                if c in copy:
                    if len(out) >= count:
                        value, library = overrun  # type: ignore[misc]  # reached only with overrun
                        raise PlanError(f"OMP_PLACES={value!r}: {library} crashes at load (SIGSEGV): {count} "
                                        f"places end inside the core of CPU {cpu} and it writes past its place "
                                        "list; use a count that ends on a core boundary, or cores(N)")
                    out.append(frozenset((c,)))
                    copy.discard(c)
                    if len(out) >= count and overrun is None:
                        return out
        else:
            here = frozenset(c for c in members if c in copy)
            copy.difference_update(here)
            if cpu not in copy and here:
                out.append(here)
        copy.discard(cpu)
    return out


def _cache_places(ctx: Context, copy: set[int], count: int) -> list[frozenset[int]]:
    """``ll_caches``: libgomp opens the last-level cache list of the first CPU that
    has cache files and reads that same file for every CPU (GCC 12's code): one
    place, the caches of the other CPUs are never seen."""
    if ctx.build.abstract_51 and count > 0:
        for cpu in sorted(copy):
            shared = ctx.view.last_cache.get(cpu)
            if shared is None:
                continue
            here = frozenset(c for c in shared if c in copy)
            return [here] if cpu in here else []
    return []


def _numa_places(ctx: Context, copy: set[int], count: int) -> list[frozenset[int]]:
    """``numa_domains``: each online node (ascending) with its CPUs not yet placed."""
    out: list[frozenset[int]] = []
    for _node, cpus in ctx.view.numa_nodes:
        if len(out) >= count:
            break
        here = frozenset(c for c in cpus if c in copy)
        if here:
            copy.difference_update(here)
            out.append(here)
    return out


# ---------------------------------------------------- GOMP_CPU_AFFINITY
def _affinity_entries(ctx: Context, value: str) -> list[int]:
    """The CPUs of a ``GOMP_CPU_AFFINITY`` value, in order (``strtoul`` base 0).

    Raises :class:`~affinity.errors.MalformedValue` for an invalid value, :class:`PlanError` where the
    build never returns (GCC 8: a word that is no number)."""
    cur = Cursor(value)
    cpus: list[int] = []
    while True:
        cur.skip_space()
        start = cur.pos
        beg, end, err = strtoul(value, cur.pos, 0)
        if err or (end == cur.pos and ctx.build.strict_numbers) or beg >= 65536:
            raise _invalid()
        last, stride = beg, 1
        cur.pos = end
        if cur.peek() == "-":
            cur.pos += 1
            last, end, err = strtoul(value, cur.pos, 0)
            if err or (end == cur.pos and ctx.build.strict_numbers) or last >= 65536 or last < beg:
                raise _invalid()
            cur.pos = end
            if cur.peek() == ":":
                cur.pos += 1
                stride, end, err = strtoul(value, cur.pos, 0)
                if err or stride == 0 or stride >= 65536:
                    raise _invalid()
                cur.pos = end
        cpus.extend(range(beg, last + 1, stride))
        cur.skip_space()
        if cur.peek() == ",":
            cur.pos += 1
        elif cur.at_end():
            return cpus
        elif cur.pos == start:
            # nothing consumed and no separator: the next round starts from the same
            # state -- GCC 8's loop never ends (no "no digits" check)
            raise PlanError(f"GOMP_CPU_AFFINITY={value!r}: {ctx.build.library} never returns from "
                            f"loading on {value[cur.pos:]!r} (offset {cur.pos}): it loops for ever on a "
                            "token that is not a number; use CPU numbers and ranges only")


def affinity_hang(value: str, build: Build) -> str | None:
    """Why ``build`` never returns from loading with ``GOMP_CPU_AFFINITY=value``
    (``None``: it returns, the value valid or not)."""
    ctx = Context(frozenset({0}), SysfsView({}, {}, {}, (), frozenset()), build)
    try:
        _affinity_entries(ctx, value)
    except PlanError as e:
        return str(e)
    except MalformedValue:
        pass
    return None


def parse_affinity(ctx: Context, value: str | None, ignore: bool) -> list[frozenset[int]] | None:
    """``parse_affinity``: one place per listed CPU, in order, **not** cut to the
    process mask; CPUs beyond libgomp's set size are dropped silently.  ``None``:
    unset, invalid, ignored, or no CPU left."""
    if value is None:
        return None
    try:
        cpus = _affinity_entries(ctx, value)
    except MalformedValue:
        ctx.error("Invalid value for enviroment variable GOMP_CPU_AFFINITY")
        return None
    if ignore:
        return None
    top = ctx.max_cpu
    places = [frozenset((c,)) for c in cpus if c < top]
    return places or None
