"""OpenMP affinity settings as immutable values.

Parsers for the environment variables the OpenMP runtimes read to bind
threads.  The standard OpenMP variables live here; Intel's own (and its
reading of proc lists) in :mod:`affinity.planning.kmp`, re-exported:

* ``KMP_AFFINITY``  -> :class:`KmpAffinity` (:func:`parse_kmp_affinity`)
* ``OMP_PLACES``    -> :class:`OmpPlaces` (:func:`parse_omp_places`)
* ``OMP_PROC_BIND`` -> :class:`OmpProcBind` (:func:`parse_omp_proc_bind`)
* ``KMP_HW_SUBSET`` -> :class:`KmpHwSubset` (:func:`parse_kmp_hw_subset`)
* ``OMP_NUM_THREADS`` -> :class:`NumThreads` (:func:`parse_num_threads`)
* ``GOMP_CPU_AFFINITY`` -> :class:`ProcList` (:func:`parse_gomp_cpu_affinity`)

Every value is a frozen record (:mod:`affinity.record`) whose ``str()`` is canonical and parses back
to an equal value (``parse(str(v)) == v``).

Each parser has two modes:

``strict=True`` (default)
    Anything the runtime would warn about and correct (an unknown word, a
    repeated parameter, a malformed proc list, ...) raises :class:`SpecError`
    showing the string with a caret under the offending token.

``strict=False``
    Behaves exactly like the runtime's own parser: it never raises, returns
    the *effective* value after the runtime's fallbacks, and the warnings the
    runtime prints (text as the runtime prints it, without the
    ``OMP: Warning #NNN:`` prefix) are available from :func:`parse_lenient`.

The grammar and the fallbacks follow ``kmp_settings.cpp`` of the LLVM OpenMP
runtime (which Intel's runtime shares) and, where Intel's libiomp5 differs,
what libiomp5 was observed to do (see ``docs/semantics.md``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ..errors import MalformedValue, SpecError, UsageError
from ..record import record
from .kmp import (HwSubsetItem, KmpAffinity, KmpHwSubset, ProcList, ProcRange, parse_gomp_cpu_affinity,
                             parse_kmp_affinity, parse_kmp_hw_subset)
from .kmp import _parse_gomp, _parse_kmp_affinity, _parse_kmp_hw_subset
from .syntax import (CORE_ATTRS, HW_LAYERS, INTEL, PLURAL, Diag, Dialect, Diagnostic, catalog, char_at, isalpha, isdigit,
                     lower, match, quote, run_parser, skip_digits, skip_to, skip_ws, str_to_int)
from typing import Any, Callable


__all__ = [
    "HwSubsetItem",
    "KmpAffinity",
    "KmpHwSubset",
    "NumThreads",
    "OmpPlaces",
    "OmpProcBind",
    "Place",
    "ProcList",
    "ProcRange",
    "Settings",
    "SubPlace",
    "parse_gomp_cpu_affinity",
    "parse_kmp_affinity",
    "parse_kmp_hw_subset",
    "parse_lenient",
    "parse_num_threads",
    "parse_omp_places",
    "parse_omp_proc_bind",
]

# ---------------------------------------------------------------------------
# OMP_PLACES
# ---------------------------------------------------------------------------

def _count_stride(count: int | None, stride: int | None) -> str:
    """The ``:count[:stride]`` suffix of an ``OMP_PLACES`` interval (none without a count)."""
    if count is None:
        return ""
    return f":{count}" + ("" if stride is None else f":{stride}")


@record
class SubPlace:
    """``start[:count[:stride]]`` inside ``{...}``."""

    start: int
    count: int | None = None
    stride: int | None = None

    def __str__(self) -> str:
        return str(self.start) + _count_stride(self.count, self.stride)


@record
class Place:
    """One item of an explicit place list: ``num``, ``{subplaces}`` or
    ``!place``, optionally replicated as ``place:count[:stride]``."""

    members: tuple[SubPlace, ...] | None = None  #: for ``{...}``
    proc: int | None = None  #: for a bare number
    exclude: "Place | None" = None  #: for ``!place``
    count: int | None = None
    stride: int | None = None

    def base_str(self) -> str:
        if self.exclude is not None:
            return "!" + str(self.exclude)
        if self.proc is not None:
            return str(self.proc)
        return "{" + ",".join(str(m) for m in (self.members or ())) + "}"

    def __str__(self) -> str:
        return self.base_str() + _count_stride(self.count, self.stride)


@record
class OmpPlaces:
    """An ``OMP_PLACES`` setting: an abstract name with an optional count and
    core attribute, or an explicit list of places.

    Attributes
    ----------
    kind : str or None
        The abstract name (``threads``, ``cores``, ``sockets``, ``numa_domains``,
        ``ll_caches`` and the runtime's other layer names such as ``tiles``,
        ``l2_caches``, ``dice``; ``core_types`` / ``core_effs`` on hybrid CPUs),
        or ``None`` for an explicit list.
    count : int or None
        The ``(count)`` after the name.
    attribute : str or None
        The core attribute of ``cores:<attr>`` (``intel_atom``, ``intel_core``, ``eff<N>``).
    places : tuple of Place or None
        The explicit list of places.
    """

    kind: str | None = None
    count: int | None = None
    attribute: str | None = None
    places: tuple[Place, ...] | None = None

    def __str__(self) -> str:
        if self.places is not None:
            return ",".join(str(p) for p in self.places)
        s = str(self.kind)
        if self.attribute:
            s += ":" + self.attribute
        if self.count is not None:
            s += f"({self.count})"
        return s

    @property
    def layer(self) -> str | None:
        """The runtime layer keyword of an abstract place name (``cores`` -> ``core``)."""
        if self.kind in ("core_types", "core_effs"):
            return "core"
        for k, v in PLURAL.items():
            if v == self.kind:
                return k
        return None


_STD_PLACES = ("threads", "cores", "numa_domains", "ll_caches", "sockets")


def _parse_signed(s: str, i: int, wrap: bool = False) -> tuple[int, int]:
    sign = 1
    while True:
        i = skip_ws(s, i)
        c = char_at(s, i)
        if c == "+":
            i += 1
            continue
        if c == "-":
            sign = -sign
            i += 1
            continue
        break
    i = skip_ws(s, i)
    if not isdigit(char_at(s, i)):
        raise MalformedValue(i, "expected a stride")
    j = skip_digits(s, i)
    return sign * str_to_int(s, i, j, wrap), j


def _parse_number(s: str, i: int, what: str, wrap: bool = False) -> tuple[int, int]:
    i = skip_ws(s, i)
    if not isdigit(char_at(s, i)):
        raise MalformedValue(i, f"expected {what}")
    j = skip_digits(s, i)
    return str_to_int(s, i, j, wrap), j


def _parse_subplaces(s: str, i: int, wrap: bool = False) -> tuple[tuple[SubPlace, ...], int]:
    subs: list[SubPlace] = []
    while True:
        start, i = _parse_number(s, i, "a proc id", wrap)
        i = skip_ws(s, i)
        if char_at(s, i) == "}":
            subs.append(SubPlace(start))
            return tuple(subs), i
        if char_at(s, i) == ",":
            subs.append(SubPlace(start))
            i += 1
            continue
        if char_at(s, i) != ":":
            raise MalformedValue(i, "expected ',', ':' or '}'")
        count, i = _parse_number(s, i + 1, "a count", wrap)
        i = skip_ws(s, i)
        if char_at(s, i) in ("}", ","):
            subs.append(SubPlace(start, count))
            if char_at(s, i) == "}":
                return tuple(subs), i
            i += 1
            continue
        if char_at(s, i) != ":":
            raise MalformedValue(i, "expected ',', ':' or '}'")
        stride, i = _parse_signed(s, i + 1, wrap)
        i = skip_ws(s, i)
        subs.append(SubPlace(start, count, stride))
        if char_at(s, i) == "}":
            return tuple(subs), i
        if char_at(s, i) == ",":
            i += 1
            continue
        raise MalformedValue(i, "expected ',' or '}'")


def _parse_place(s: str, i: int, wrap: bool = False) -> tuple[Place, int]:
    i = skip_ws(s, i)
    c = char_at(s, i)
    if c == "{":
        subs, i = _parse_subplaces(s, i + 1, wrap)
        if char_at(s, i) != "}":
            raise MalformedValue(i, "expected '}'")
        return Place(members=subs), i + 1
    if c == "!":
        inner, i = _parse_place(s, i + 1, wrap)
        return Place(exclude=inner), i
    if isdigit(c):
        j = skip_digits(s, i)
        return Place(proc=str_to_int(s, i, j, wrap)), j
    raise MalformedValue(i, "expected a place ('{...}', '!place' or a proc id)")


def _parse_place_list(s: str, wrap: bool = False) -> tuple[Place, ...]:
    places: list[Place] = []
    i = 0
    while True:
        p, i = _parse_place(s, i, wrap)
        i = skip_ws(s, i)
        if i >= len(s):
            places.append(p)
            break
        if s[i] == ",":
            places.append(p)
            i += 1
            continue
        if s[i] != ":":
            raise MalformedValue(i, "expected ',' or ':'")
        count, i = _parse_number(s, i + 1, "a count", wrap)
        i = skip_ws(s, i)
        if i >= len(s) or s[i] == ",":
            places.append(Place(p.members, p.proc, p.exclude, count))
            if i >= len(s):
                break
            i += 1
            continue
        if s[i] != ":":
            raise MalformedValue(i, "expected ',' or ':'")
        stride, i = _parse_signed(s, i + 1, wrap)
        i = skip_ws(s, i)
        places.append(Place(p.members, p.proc, p.exclude, count, stride))
        if i >= len(s):
            break
        if s[i] == ",":
            i += 1
            continue
        raise MalformedValue(i, "expected ',' or the end")
    return tuple(places)


#: The names ``__kmp_stg_parse_places`` tries after the standard ones: (token, kind).
_CORE_KINDS = (("core_types", "core_types"), ("core_effs", "core_effs"), ("core_efficiencies", "core_effs"))


def _places_kind(s: str) -> tuple[str | None, int]:
    """The abstract name ``s`` starts with (standard names, then hybrid-core kinds,
    then every layer's plural), and where it ends; ``(None, 0)`` for a place list."""
    names = [(std, std) for std in _STD_PLACES] + list(_CORE_KINDS) + \
        [(PLURAL[layer], PLURAL[layer]) for layer in HW_LAYERS]
    for token, kind in names:
        e = match(token, s, 0)
        if e is not None:
            return kind, e
    return None, 0


def _core_attribute(s: str, a: int, wrap: bool) -> tuple[str | None, int]:
    """The attribute of ``cores:<attr>`` starting at ``s[a]`` (``intel_atom``,
    ``intel_core``, ``eff<N>``, letters allowed between ``eff`` and the number)
    and where it ends; ``(None, a)`` for an unknown one."""
    for attr in CORE_ATTRS:
        e = match(attr, s, a)
        if e is not None:
            return attr, e
    e = match("eff", s, a)
    if e is None:
        return None, a
    j = e
    while j < len(s) and isalpha(s[j]):
        j += 1
    if not isdigit(char_at(s, j)):
        return None, a
    k = skip_digits(s, j)
    return "eff" + str(str_to_int(s, j, k, wrap)), k


def _parse_omp_places(value: str, diag: Diag, name: str = "OMP_PLACES") -> OmpPlaces:
    """``__kmp_stg_parse_places``: an abstract name (with ``:attr`` and
    ``(count)``), else a place list; malformed input falls back as the runtime does."""
    s = value
    kind, scan = _places_kind(s)
    if kind is None:
        try:
            return OmpPlaces(places=_parse_place_list(s, diag.dialect.wrap_ints))
        except MalformedValue as err:
            # Intel's libiomp5 falls back to "threads" (LLVM's libomp to "cores").
            fallback = diag.dialect.places_fallback
            diag.warn(f"{name}: syntax error, using {fallback}.", err.pos, detail=f"syntax error: {err.detail}")
            return OmpPlaces(kind=fallback)
    layer = "core" if kind in ("core_types", "core_effs") else \
        next(k for k, v in PLURAL.items() if v == kind)
    kind_name = catalog(layer, True)  # the runtime names the fallback by its catalog name
    if kind in ("core_types", "core_effs") and scan < len(s):
        # libiomp5 reports anything after these names, then goes on parsing
        diag.warn(f"{name}: extra trailing characters ignored: {quote(s[scan:])}.", scan)
    attribute: str | None = None
    if kind == "cores" and char_at(s, skip_ws(s, scan)) == ":":
        a = skip_ws(s, scan) + 1
        attribute, scan = _core_attribute(s, a, diag.dialect.wrap_ints)
        if attribute is None:
            diag.warn(f"{name}: syntax error, using {kind_name}.", a, detail="unknown core attribute")
            return OmpPlaces(kind=kind)
    return _places_count(s, scan, diag, name, OmpPlaces(kind=kind, attribute=attribute), kind_name)


def _places_count(s: str, scan: int, diag: Diag, name: str, places: OmpPlaces, kind_name: str) -> OmpPlaces:
    """The optional ``(count)`` after an abstract name (from ``s[scan]``)."""
    scan = skip_ws(s, scan)
    if scan >= len(s):
        return places
    if s[scan] != "(":
        diag.warn(f"{name}: syntax error, using {kind_name}.", scan, detail="expected '(count)' or the end")
        return places
    scan = skip_ws(s, scan + 1)
    e = skip_digits(s, scan)
    count = str_to_int(s, scan, e, diag.dialect.wrap_ints)
    scan = skip_ws(s, e)
    if char_at(s, scan) != ")":
        diag.warn(f"{name}: syntax error, using {kind_name}.", scan, detail="expected a count and ')'")
        return places
    scan = skip_ws(s, scan + 1)
    if scan < len(s):
        diag.warn(f"{name}: extra trailing characters ignored: {quote(s[scan:])}.", scan)
    return OmpPlaces(kind=places.kind, attribute=places.attribute, count=count if count > 0 else None)


# ---------------------------------------------------------------------------
# OMP_PROC_BIND
# ---------------------------------------------------------------------------

_BIND_WORDS = ("false", "true", "primary", "close", "spread", "disabled")


@record
class OmpProcBind:
    """An ``OMP_PROC_BIND`` setting.

    Attributes
    ----------
    policies : tuple of str
        One policy per nesting level: ``false``, ``true``, ``primary``
        (``master`` is read as ``primary``), ``close``, ``spread``; or Intel's
        ``disabled``.
    """

    policies: tuple[str, ...]

    def __str__(self) -> str:
        return ",".join(self.policies)

    @property
    def first(self) -> str:
        return self.policies[0]


def _parse_omp_proc_bind(value: str, diag: Diag, name: str = "OMP_PROC_BIND") -> OmpProcBind:
    s = value
    buf = skip_ws(s, 0)
    invalid = f"{name}: {quote(value)} is an invalid value; ignored."
    if isdigit(char_at(s, buf)):
        # libiomp5 does not accept the numeric form.
        diag.warn(invalid, buf, detail="expected false, true, primary, master, close or spread")
        return OmpProcBind(("false",))
    single = None
    for tok in ("disabled", "false", "true"):
        e = match(tok, s, buf)
        if e is not None:
            single, buf = tok, skip_ws(s, e)
            break
    if single is not None:
        pol: tuple[str, ...] = (single,)
    else:
        nelem = s[buf:].count(",") + 1
        out: list[str] = []
        while True:
            word = None
            for tok, pol1 in (("master", "primary"), ("primary", "primary"), ("close", "close"),
                              ("spread", "spread")):
                e = match(tok, s, buf)
                if e is not None:
                    word, buf = pol1, skip_ws(s, e)
                    break
            if word is None:
                diag.warn(invalid, buf, detail="expected primary, master, close or spread")
                return OmpProcBind(("false",))
            out.append(word)
            if len(out) >= nelem:
                break
            if char_at(s, buf) != ",":
                # libiomp5 reports the rest and resumes after the next comma
                diag.warn(f"{name}: extra trailing characters ignored: {quote(s[buf:])}.", buf)
                buf = skip_to(s, buf, ",")
            buf = skip_ws(s, buf + 1)
        pol = tuple(out)
    if buf < len(s):
        diag.warn(f"{name}: extra trailing characters ignored: {quote(s[buf:])}.", buf)
    return OmpProcBind(pol)

# ---------------------------------------------------------------------------
# OMP_NUM_THREADS
# ---------------------------------------------------------------------------

@record
class NumThreads:
    """An ``OMP_NUM_THREADS`` setting.

    Attributes
    ----------
    values : tuple of (int or None)
        One team size per nesting level (``None`` where a level is left empty,
        e.g. ``,4``).
    all : bool
        ``all``: one thread per processor of the machine.
    """

    values: tuple[int | None, ...] = ()
    all: bool = False

    def __str__(self) -> str:
        if self.all:
            return "all"
        text = ",".join("" if v is None else str(v) for v in self.values)
        if self.values and self.values[-1] is None:
            text += ","  # ",": level 1 left to the default (a lone "" would be no setting)
        return text

    @property
    def first(self) -> int | None:
        return self.values[0] if self.values else None


def _parse_num_threads(value: str, diag: Diag, name: str = "OMP_NUM_THREADS") -> NumThreads | None:
    s = value
    if lower(s) == "all":
        return NumThreads(all=True)
    invalid = f"{name}: {quote(value)} is an invalid value; ignored."
    # validation pass (as the runtime's first pass over the list)
    i = 0
    total = 0
    prev_comma = False
    n = len(s)
    while True:
        i = skip_ws(s, i)
        if i >= n:
            break
        c = s[i]
        if not isdigit(c) and c != ",":
            diag.warn(invalid, i, detail="expected positive integers separated by ','")
            return None
        if c == ",":
            if total == 0 or prev_comma:
                total += 1
            prev_comma = True
            i = skip_ws(s, i + 1)
        if isdigit(char_at(s, i)):
            prev_comma = False
            j = skip_digits(s, i)
            total += 1
            k = skip_ws(s, j)
            if char_at(s, j) in (" ", "\t") and isdigit(char_at(s, k)):
                diag.warn(invalid, k, detail="spaces between digits are not allowed")
                return None
            i = j
    if total <= 0:
        return None
    values: list[int | None] = []
    i = 0
    total = 0
    prev_comma = False
    small = False
    while True:
        i = skip_ws(s, i)
        if i >= n:
            break
        if s[i] == ",":
            if total == 0:
                values.append(None)
                total += 1
            elif prev_comma:
                values.append(values[-1])
                total += 1
            prev_comma = True
            i = skip_ws(s, i + 1)
        if isdigit(char_at(s, i)):
            prev_comma = False
            j = skip_digits(s, i)
            total += 1
            v = str_to_int(s, i, j, diag.dialect.wrap_ints)
            if v < 1:
                small = True
                v = 1
            values.append(v)
            i = j
    if small:
        diag.warn(f"{name}={quote(value)}: value too small.", 0, detail="team sizes must be at least 1")
    return NumThreads(tuple(values))


def parse_omp_places(value: str, *, strict: bool = True) -> OmpPlaces:
    """Parse an ``OMP_PLACES`` string (``cores(4)``, ``{0:4}:4:4``, ``!{0}``).

    Parameters
    ----------
    value : str
        An abstract name with an optional ``(count)``, or a list of places.
    strict : bool
        Raise where the runtime warns; lenient parsing falls back as the
        runtime does (to ``threads`` for a malformed list).

    Returns
    -------
    OmpPlaces
        Either an abstract ``kind`` or explicit ``places``.

    Raises
    ------
    SpecError
        In strict mode, on a syntax error or trailing characters.
    """
    return run_parser(_parse_omp_places, value, strict, "OMP_PLACES")[0]


def parse_omp_proc_bind(value: str, *, strict: bool = True) -> OmpProcBind:
    """Parse an ``OMP_PROC_BIND`` string (``spread,close``).

    Parameters
    ----------
    value : str
        ``true``, ``false``, ``disabled``, or a list of policies.
    strict : bool
        With ``False``, an invalid value gives ``false`` (as in the runtime)
        instead of an error.

    Returns
    -------
    OmpProcBind

    Raises
    ------
    SpecError
        In strict mode, on an invalid policy or trailing characters.
    """
    return run_parser(_parse_omp_proc_bind, value, strict, "OMP_PROC_BIND")[0]


def parse_num_threads(value: str, *, strict: bool = True) -> NumThreads | None:
    """Parse an ``OMP_NUM_THREADS`` string (``8`` or ``8,2``).

    Parameters
    ----------
    value : str
        Team sizes separated by commas, or ``all``.
    strict : bool
        Raise on a malformed list; ``False`` returns ``None`` where the runtime
        ignores it.

    Returns
    -------
    NumThreads or None
        ``None`` for a value without any team size, and in lenient mode where the
        runtime ignores the value.

    Raises
    ------
    SpecError
        In strict mode, on a malformed list or a team size below 1.
    """
    return run_parser(_parse_num_threads, value, strict, "OMP_NUM_THREADS")[0]


@record
class Variable:
    """One environment variable the runtimes read to place threads.

    Attributes
    ----------
    name : str
        The variable (``KMP_AFFINITY``).
    type : type
        The class of its parsed value (:class:`KmpAffinity`).
    parse : callable
        Its grammar: ``parse(value, diag, name)`` (strict or lenient as ``diag`` says).
    attribute : str or None
        The :class:`Settings` attribute holding it; ``None`` for a variable that is
        read but never written back (``KMP_PLACE_THREADS``, the old name of
        ``KMP_HW_SUBSET``).
    """

    name: str
    type: type
    parse: Callable[[str, Diag, str], Any]
    attribute: str | None

    @property
    def exported(self) -> bool:
        """Whether :meth:`Settings.to_env` writes it (``str()`` of the value)."""
        return self.attribute is not None


#: Every variable, in the runtime's processing order (``__kmp_env_initialize``
#: walks them sorted by name): the one table of variable, value type, parser,
#: Settings attribute and export.
VARIABLES = (
    Variable("GOMP_CPU_AFFINITY", ProcList, _parse_gomp, "gomp_cpu_affinity"),
    Variable("KMP_AFFINITY", KmpAffinity, _parse_kmp_affinity, "kmp_affinity"),
    Variable("KMP_HW_SUBSET", KmpHwSubset, _parse_kmp_hw_subset, "kmp_hw_subset"),
    Variable("KMP_PLACE_THREADS", KmpHwSubset, _parse_kmp_hw_subset, None),
    Variable("OMP_NUM_THREADS", NumThreads, _parse_num_threads, "num_threads"),
    Variable("OMP_PLACES", OmpPlaces, _parse_omp_places, "omp_places"),
    Variable("OMP_PROC_BIND", OmpProcBind, _parse_omp_proc_bind, "omp_proc_bind"),
)
_BY_NAME = {v.name: v for v in VARIABLES}


def parse_lenient(variable: str, value: str, dialect: Dialect = INTEL) -> tuple[Any, list[Diagnostic]]:
    """Parse ``value`` of environment variable ``variable`` the way the runtime
    does: never raises for bad input.

    Parameters
    ----------
    variable : str
        ``KMP_AFFINITY``, ``OMP_PLACES``, ``OMP_PROC_BIND``, ``KMP_HW_SUBSET``,
        ``KMP_PLACE_THREADS``, ``OMP_NUM_THREADS`` or ``GOMP_CPU_AFFINITY``.
    value : str
        Its value.
    dialect : Dialect
        Whose reading (default: Intel's libiomp5).

    Returns
    -------
    value : object
        The effective value (``None`` where the runtime ignores the variable).
    diagnostics : list of Diagnostic
        The messages the runtime prints.

    Raises
    ------
    ValueError
        ``variable`` is not one of the above.
    """
    return run_parser(_parser(variable), value, False, variable, dialect)


def parse_strict(variable: str, value: str, dialect: Dialect = INTEL) -> tuple[Any, list[Diagnostic]]:
    """Like :func:`parse_lenient` but raises :class:`SpecError` on malformed
    input; notices about well-formed input are returned.

    Parameters
    ----------
    variable : str
        An affinity variable, as for :func:`parse_lenient`.
    value : str
        Its value.
    dialect : Dialect
        Whose reading (default: Intel's libiomp5).

    Returns
    -------
    value : object
        The parsed value (``None`` for an ``OMP_NUM_THREADS`` without a team size).
    diagnostics : list of Diagnostic
        The notices (never errors).

    Raises
    ------
    SpecError
        The value is malformed.
    ValueError
        ``variable`` is not an affinity variable.
    """
    return run_parser(_parser(variable), value, True, variable, dialect)


def _parser(variable: str) -> Callable[[str, Diag, str], Any]:
    """The parser of an affinity variable; ValueError for any other name."""
    try:
        return _BY_NAME[variable].parse
    except KeyError:
        raise UsageError(f"not an affinity variable: {variable!r}") from None


# ---------------------------------------------------------------------------
# All settings together
# ---------------------------------------------------------------------------

#: The variables the runtime reads to place threads, in the order it processes them
#: (``__kmp_env_initialize`` walks them sorted by name): the planner's input.
SETTINGS_VARIABLES = tuple(v.name for v in VARIABLES)
#: Those of them that describe a placement on their own (a launcher without a spec
#: plans from them when the environment has one).
PLACEMENT_VARIABLES = ("KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND")
#: What ``apply()``, ``pinned()`` and ``affinity run`` plan when given no spec: one
#: thread per core, on the first PU of each core, cores in order.
DEFAULT_SPEC = "granularity=fine,compact,1,0"


#: A word that starts an assignment in a string of them (:func:`parse_assignments`).
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def parse_assignments(items: str | Iterable[str], *, what: str = "settings",
                      keys: Iterable[str] | None = SETTINGS_VARIABLES, unique: bool = False) -> dict[str, str]:
    """Read ``KEY=VALUE`` assignments into a dict.

    Parameters
    ----------
    items : str or iterable of str
        One string of assignments separated by blanks, or one assignment per item.
        In the string, an assignment starts at each word of the form ``NAME=``
        (``NAME`` a letter or ``_``, then letters, digits and ``_``) and its value
        runs to the next one, blanks included: ``GOMP_CPU_AFFINITY=0 2 4
        OMP_PROC_BIND=true`` sets ``GOMP_CPU_AFFINITY`` to ``0 2 4``, libgomp's
        own blank-separated form (no value of these variables has such a word).
    what : str
        Names the input in error messages.
    keys : iterable of str, optional
        The accepted keys (default: :data:`SETTINGS_VARIABLES`); ``None`` accepts any.
    unique : bool
        Refuse a key given twice; by default the last one wins (as in ``env A=1 A=2``).

    Raises
    ------
    SpecError
        An item without ``=``, a key not accepted, or (``unique``) a key given twice;
        the message shows the input with a caret under the bad item.
    """
    allowed = None if keys is None else tuple(keys)
    if isinstance(items, str):
        text, parts = items, []
        for m in re.finditer(r"\S+", items):
            if parts and not _ASSIGNMENT.match(m.group()):  # the value goes on (GOMP_CPU_AFFINITY=0 2 4)
                parts[-1] = (items[parts[-1][1]:m.end()], parts[-1][1])
            else:
                parts.append((m.group(), m.start()))
    else:
        parts, pos = [], 0
        words = list(items)
        text = " ".join(words)
        for word in words:
            parts.append((word, pos))
            pos += len(word) + 1
    env: dict[str, str] = {}
    for word, at in parts:
        key, eq, val = word.partition("=")
        if not eq or not key or (allowed is not None and key not in allowed):
            expected = "KEY=VALUE" + ("" if allowed is None else " with KEY one of " + ", ".join(allowed))
            raise SpecError(f"expected {expected}, got {word!r}{_near_name(key, allowed) if eq else ''}",
                            text, at, what=what)
        if unique and key in env:
            raise SpecError(f"{key} is given twice (strict: the runtime would read only the last)", text, at,
                            what=what)
        env[key] = val
    return env


def _near_name(key: str, allowed: tuple[str, ...] | None) -> str:
    """``: did you mean X?`` for a mistyped or lower-case variable name, else nothing."""
    if not allowed:
        return ""
    if key.upper() in allowed:
        return f": variable names are upper case, {key.upper()} (the runtimes read no other spelling)"
    import difflib  # lazy: only for an error (its import makes a namedtuple: code compiled at run time)

    close = difflib.get_close_matches(key.upper(), allowed, n=1, cutoff=0.8)
    return f": did you mean {close[0]}?" if close else ""


@record
class Settings:
    """The affinity-related environment of a process, parsed (strictly).

    ``str()`` renders it as ``KEY=VALUE`` pairs separated by spaces, in the
    runtime's processing order; :meth:`parse` reads that form back.

    Attributes
    ----------
    kmp_affinity : KmpAffinity or None
        ``KMP_AFFINITY``.
    omp_places : OmpPlaces or None
        ``OMP_PLACES``.
    omp_proc_bind : OmpProcBind or None
        ``OMP_PROC_BIND``.
    kmp_hw_subset : KmpHwSubset or None
        ``KMP_HW_SUBSET``.
    num_threads : NumThreads or None
        ``OMP_NUM_THREADS``.
    gomp_cpu_affinity : ProcList or None
        ``GOMP_CPU_AFFINITY``.
    """

    kmp_affinity: KmpAffinity | None = None
    omp_places: OmpPlaces | None = None
    omp_proc_bind: OmpProcBind | None = None
    kmp_hw_subset: KmpHwSubset | None = None
    num_threads: NumThreads | None = None
    gomp_cpu_affinity: ProcList | None = None

    def to_env(self) -> dict[str, str]:
        """The environment variables (canonical strings), in sorted order.

        Returns
        -------
        dict of str to str
            One entry per variable set.
        """
        env: dict[str, str] = {}
        for var in VARIABLES:
            value = getattr(self, var.attribute) if var.exported else None
            if value is not None:
                env[var.name] = str(value)
        return env

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.to_env().items())

    @staticmethod
    def from_env(env: "dict[str, str] | Any") -> "Settings":
        """Strictly parse the affinity variables of a mapping (others ignored).

        Parameters
        ----------
        env : mapping of str to str
            An environment, e.g. ``os.environ``.

        Returns
        -------
        Settings
            The variables found; the others stay ``None``.

        Raises
        ------
        SpecError
            A variable's value is malformed.
        """
        return Settings.of({var.name: run_parser(var.parse, env[var.name], True, var.name)[0]
                            for var in VARIABLES if var.exported and var.name in env})

    @staticmethod
    def of(values: Mapping[str, Any]) -> "Settings":
        """The settings of already parsed values.

        Parameters
        ----------
        values : mapping of str to value
            Variable name -> its parsed value (as :func:`parse_strict` returns it);
            variables without a :class:`Settings` attribute are left out.

        Returns
        -------
        Settings
        """
        return Settings(**{var.attribute: values[var.name] for var in VARIABLES
                           if var.exported and var.name in values})

    @staticmethod
    def parse(text: str) -> "Settings":
        """Read ``KEY=VALUE KEY=VALUE ...`` (a value runs to the next ``KEY=``, as
        :func:`parse_assignments` reads it: ``GOMP_CPU_AFFINITY=0 2 4`` holds blanks).

        Parameters
        ----------
        text : str
            The assignments, as ``str()`` of a :class:`Settings` writes them.

        Returns
        -------
        Settings
            Equal to the one whose ``str()`` gave ``text``.

        Raises
        ------
        SpecError
            An item is not an assignment to an affinity variable, or a value is malformed.
        """
        return Settings.from_env(parse_assignments(text))
