"""OpenMP affinity settings as immutable values.

Parsers for the environment variables Intel's OpenMP runtime (libiomp5, and
LLVM's libomp, which shares its source) reads to bind threads:

* ``KMP_AFFINITY``  -> :class:`KmpAffinity` (:func:`parse_kmp_affinity`)
* ``OMP_PLACES``    -> :class:`OmpPlaces` (:func:`parse_omp_places`)
* ``OMP_PROC_BIND`` -> :class:`OmpProcBind` (:func:`parse_omp_proc_bind`)
* ``KMP_HW_SUBSET`` -> :class:`KmpHwSubset` (:func:`parse_kmp_hw_subset`)
* ``OMP_NUM_THREADS`` -> :class:`NumThreads` (:func:`parse_num_threads`)
* ``GOMP_CPU_AFFINITY`` -> :class:`ProcList` (:func:`parse_gomp_cpu_affinity`)

Every value is a frozen dataclass whose ``str()`` is canonical and parses back
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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from ..errors import SpecError

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

INT_MAX = 2**31 - 1

# ---------------------------------------------------------------------------
# Hardware layer vocabulary (kmp_hw_t in the runtime)
# ---------------------------------------------------------------------------

#: Canonical layer keywords, in the runtime's enumeration order (KMP_FOREACH_HW_TYPE).
HW_LAYERS = ("socket", "proc_group", "numa_domain", "die", "ll_cache", "l3_cache",
             "tile", "module", "l2_cache", "l1_cache", "core", "thread")
_PLURAL = {"socket": "sockets", "proc_group": "proc_groups", "numa_domain": "numa_domains",
           "die": "dice", "ll_cache": "ll_caches", "l3_cache": "l3_caches", "tile": "tiles",
           "module": "modules", "l2_cache": "l2_caches", "l1_cache": "l1_caches",
           "core": "cores", "thread": "threads"}
#: Human names the runtime prints (kmp_i18n catalog), singular and plural.
CATALOG = {"socket": ("socket", "sockets"), "proc_group": ("processor group", "processor groups"),
           "numa_domain": ("NUMA domain", "NUMA domains"), "die": ("die", "dice"),
           "ll_cache": ("LL cache", "LL caches"), "l3_cache": ("L3 cache", "L3 caches"),
           "tile": ("tile", "tiles"), "module": ("module", "modules"),
           "l2_cache": ("L2 cache", "L2 caches"), "l1_cache": ("L1 cache", "L1 caches"),
           "core": ("core", "cores"), "thread": ("thread", "threads")}

AFFINITY_TYPES = ("none", "scatter", "compact", "logical", "physical", "explicit", "balanced",
                  "disabled")


def catalog(layer: str, plural: bool = False) -> str:
    """The runtime's printed name of a layer (``numa_domain`` -> ``NUMA domain``)."""
    return CATALOG[layer][1 if plural else 0]


# ---------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Diagnostic:
    """One message a parser produced.

    Attributes
    ----------
    text : str
        What the runtime prints (without ``OMP: Warning #NNN:``).
    error : bool
        Whether the input was malformed (strict parsing raises), rather than a
        notice about well-formed input (e.g. balanced affinity defaulting its
        granularity to core).
    pos : int or None
        Index in the value of the offending token, where known.
    detail : str or None
        A short explanation added to the runtime's text (strict mode shows it in
        parentheses), where there is one.
    """

    text: str
    error: bool
    pos: int | None = None
    detail: str | None = None


class _Diag:
    def __init__(self, strict: bool, value: str, what: str):
        self.strict = strict
        self.value = value
        self.what = what
        self.items: list[Diagnostic] = []

    def warn(self, text: str, pos: int | None = None, *, error: bool = True,
             detail: str | None = None) -> None:
        if self.strict and error:
            msg = text
            prefix = self.what + ": "
            if msg.startswith(prefix):
                msg = msg[len(prefix):]
            if detail:
                msg = f"{msg} ({detail})"
            raise SpecError(msg, self.value, pos if pos is not None else 0, what=self.what)
        self.items.append(Diagnostic(text, error, pos, detail))


class _Malformed(Exception):
    """A malformed value found inside a helper: where (``pos``), why (``detail``)
    and what kind of error; the parser that catches it issues the runtime's warning."""

    def __init__(self, pos: int, detail: str | None, what: str = "syntax error"):
        self.pos = pos
        self.detail = detail
        self.what = what


def _q(s: str) -> str:
    return '"' + s + '"'


# ---------------------------------------------------------------------------
# Low-level scanning helpers mirroring the runtime's C helpers
# ---------------------------------------------------------------------------

def _skip_ws(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in " \t":
        i += 1
    return i


def _skip_digits(s: str, i: int) -> int:
    n = len(s)
    while i < n and "0" <= s[i] <= "9":
        i += 1
    return i


def _skip_to(s: str, i: int, c: str) -> int:
    j = s.find(c, i)
    return len(s) if j < 0 else j


def _ch(s: str, i: int) -> str:
    return s[i] if i < len(s) else ""


def _isdigit(c: str) -> bool:
    return c != "" and "0" <= c <= "9"


def _isalpha(c: str) -> bool:
    return c != "" and ("a" <= c <= "z" or "A" <= c <= "Z")


def _isalnum(c: str) -> bool:
    return _isdigit(c) or _isalpha(c)


def _up(s: str) -> str:
    """C ``toupper`` (ASCII only, one character per character)."""
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in s)


def _low(s: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)


def _match(token: str, s: str, i: int) -> int | None:
    """``__kmp_match_str``: case-insensitive; the whole token must match at
    ``s[i:]`` (``s`` may go on).  Returns the index after the token."""
    n = len(token)
    seg = s[i:i + n]
    if len(seg) == n and (seg.lower() if seg.isascii() else _low(seg)) == token.lower():
        return i + n
    return None


def _str_to_int(s: str, i: int, j: int) -> int:
    """``__kmp_str_to_int`` on the digits ``s[i:j]``, seeing the rest of the
    string as the runtime does: a size suffix right after the digits
    (``b``, ``k``, ``m``) multiplies the value when it ends the string and
    makes it 0 otherwise.  Intel's runtime saturates at INT_MAX."""
    v = int(s[i:j]) if j > i else 0
    if v > INT_MAX:
        v = INT_MAX
    c = s[j] if j < len(s) else ""
    factor = {"b": 1, "B": 1, "k": 1024, "K": 1024, "m": 1024 * 1024, "M": 1024 * 1024}.get(c)
    if factor is None:
        return v
    if j + 1 < len(s):
        return 0
    return INT_MAX if v > INT_MAX // factor else v * factor


def _atoi(s: str, i: int = 0) -> int:
    """glibc ``atoi`` (``(int)strtol``): leading blanks, optional sign,
    digits; the long result is truncated to 32 bits."""
    n = len(s)
    while i < n and s[i] in " \t\n\v\f\r":
        i += 1
    sign = 1
    if i < n and s[i] in "+-":
        sign = -1 if s[i] == "-" else 1
        i += 1
    j = i
    while j < n and "0" <= s[j] <= "9":
        j += 1
    if j == i:
        return 0
    v = sign * int(s[i:j])
    v = max(-(2**63), min(2**63 - 1, v))
    v &= 0xFFFFFFFF
    return v - 2**32 if v >= 2**31 else v


def _cdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# ---------------------------------------------------------------------------
# Proc lists (KMP_AFFINITY proclist=[...], GOMP_CPU_AFFINITY)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcRange:
    """``start-end[:stride]`` in a proc list (stride may be negative)."""

    start: int
    end: int
    stride: int = 1

    def ids(self) -> list[int]:
        if self.stride > 0:
            return list(range(self.start, self.end + 1, self.stride))
        return list(range(self.start, self.end - 1, self.stride))

    def __str__(self) -> str:
        if self.stride == 1:
            return f"{self.start}-{self.end}"
        return f"{self.start}-{self.end}:{self.stride}"


@dataclass(frozen=True)
class ProcList:
    """An explicit proc list (``KMP_AFFINITY``'s ``proclist=[...]``, ``GOMP_CPU_AFFINITY``).

    Attributes
    ----------
    items : tuple
        Each item is one place: an OS proc id (``int``), a :class:`ProcRange`
        expanding to one place per id, or a set ``{a,b,...}`` (a ``tuple`` of
        ids) forming one place.
    """

    items: tuple[Any, ...]

    def places(self) -> list[tuple[int, ...]]:
        """The OS-proc ids of each place, in order (ranges expanded)."""
        out: list[tuple[int, ...]] = []
        for it in self.items:
            if isinstance(it, int):
                out.append((it,))
            elif isinstance(it, ProcRange):
                out.extend((i,) for i in it.ids())
            else:
                out.append(tuple(it))
        return out

    def __str__(self) -> str:
        parts = []
        for it in self.items:
            if isinstance(it, (int, ProcRange)):
                parts.append(str(it))
            else:
                parts.append("{" + ",".join(str(i) for i in it) + "}")
        return ",".join(parts)

    @staticmethod
    def of(places: Iterable[Iterable[int]]) -> "ProcList":
        """One item per place: a single id, or a set."""
        items: list[Any] = []
        for p in places:
            ids = tuple(sorted(set(p)))
            if not ids:
                raise ValueError("a proc list place cannot be empty")
            items.append(ids[0] if len(ids) == 1 else ids)
        return ProcList(tuple(items))


def _parse_proc_id_list(var: str, s: str, i: int, diag: _Diag) -> tuple[ProcList | None, int]:
    """``__kmp_parse_affinity_proc_id_list``: parses from ``s[i]`` up to the
    first character that cannot continue the list.  Returns (list, end) or
    (None, i) after a warning."""
    items: list[Any] = []
    nxt = i
    try:
        while True:
            nxt = _skip_ws(s, nxt)
            c = _ch(s, nxt)
            if c == "{":
                item, nxt = _parse_proc_set(s, nxt + 1)
            elif _isdigit(c):
                item, nxt = _parse_proc_range(s, nxt)
            elif c == "" or items:
                break
            else:
                raise _Malformed(nxt, "expected a proc id, a range or a set")
            items.append(item)
            nxt = _skip_ws(s, nxt)
            if _ch(s, nxt) == ",":
                nxt += 1
    except _Malformed as err:
        detail = None if err.detail is None else f"{err.what}: {err.detail}"
        diag.warn(f"{var}: {err.what}, not using affinity.", err.pos, detail=detail)
        return None, i
    return ProcList(tuple(items)), nxt


def _proc_id(s: str, i: int, expected: str) -> tuple[int, int]:
    """One proc id of a proc list, blanks before it skipped: (id, end)."""
    i = _skip_ws(s, i)
    if not _isdigit(_ch(s, i)):
        raise _Malformed(i, expected)
    j = _skip_digits(s, i)
    return _str_to_int(s, i, j), j


def _parse_proc_set(s: str, i: int) -> tuple[tuple[int, ...], int]:
    """The ``{a,b,...}`` branch of ``__kmp_parse_affinity_proc_id_list`` (from
    after the ``{``; commas optional): one place, ids sorted.  Returns (ids, end)."""
    first, nxt = _proc_id(s, i, "expected a proc id after '{'")
    members = [first]
    while True:
        nxt = _skip_ws(s, nxt)
        if _ch(s, nxt) == "}":
            return tuple(sorted(set(members))), nxt + 1
        if _ch(s, nxt) == ",":
            nxt += 1
        member, nxt = _proc_id(s, nxt, "expected a proc id or '}'")
        members.append(member)


def _parse_proc_range(s: str, i: int) -> tuple[int | ProcRange, int]:
    """The ``start[-end[:stride]]`` branch of ``__kmp_parse_affinity_proc_id_list``
    (``s[i]`` is a digit): a proc id, or a range checked as the runtime checks it."""
    j = _skip_digits(s, i)
    start = _str_to_int(s, i, j)
    nxt = _skip_ws(s, j)
    if _ch(s, nxt) != "-":
        return start, nxt
    end, nxt = _proc_id(s, nxt + 1, "expected the end of the range")
    stride = 1
    nxt = _skip_ws(s, nxt)
    if _ch(s, nxt) == ":":
        nxt = _skip_ws(s, nxt + 1)
        sign = 1
        if _ch(s, nxt) == "-":
            sign, nxt = -1, nxt + 1
        stride, nxt = _proc_id(s, nxt, "expected the stride")
        stride *= sign
    _check_proc_range(start, end, stride, i)
    return ProcRange(start, end, stride), nxt


def _check_proc_range(start: int, end: int, stride: int, pos: int) -> None:
    """The range checks of ``__kmp_parse_affinity_proc_id_list`` (zero stride,
    bounds against the stride's sign, at most 65536 steps)."""
    if stride == 0:
        raise _Malformed(pos, None, "range error (zero stride)")
    if stride > 0 and start > end:
        raise _Malformed(pos, None, f"range error ({start} > {end})")
    if stride < 0 and start < end:
        raise _Malformed(pos, None, f"range error ({start} < {end} & stride < 0)")
    if _cdiv(end - start, stride) > 65536:
        raise _Malformed(pos, None, f"range error (({end}-{start})/{stride} too big)")


# ---------------------------------------------------------------------------
# KMP_AFFINITY
# ---------------------------------------------------------------------------

_GRAN_ALIASES = {"fine": "thread", "package": "socket", "node": "numa_domain"}
_GRAN_PRINT = {"thread": "fine"}


@dataclass(frozen=True)
class KmpAffinity:
    """A ``KMP_AFFINITY`` setting.

    Attributes
    ----------
    type : str or None
        One of ``none, compact, scatter, balanced, explicit, disabled, logical,
        physical``, or ``None`` (no type given).
    granularity : str or None
        A layer keyword (``thread`` for ``fine``, ``core``, ``socket``,
        ``numa_domain``, ``die``, ``tile``, ``l2_cache``, ..., or ``core_type`` /
        ``core_efficiency`` on hybrid CPUs), or ``None`` for the default.
    granularity_levels : int or None
        The numeric form ``granularity=<n>``.
    permute : int or None
        The first integer parameter of ``compact``, ``scatter``, ``balanced``.
    offset : int or None
        The second integer parameter (the only one of ``logical``, ``physical``).
    proclist : ProcList or None
        ``proclist=[...]``, for the ``explicit`` type.
    verbose : bool or None
        ``verbose`` / ``noverbose``; like all boolean modifiers, ``None`` when not given.
    warnings : bool or None
        ``warnings`` / ``nowarnings``.
    respect : bool or None
        ``respect`` / ``norespect``.
    reset : bool or None
        ``reset`` / ``noreset``.
    dups : bool or None
        ``dups`` / ``duplicates`` / ``nodups`` / ``noduplicates``.
    """

    type: str | None = None
    granularity: str | None = None
    granularity_levels: int | None = None
    permute: int | None = None
    offset: int | None = None
    proclist: ProcList | None = None
    verbose: bool | None = None
    warnings: bool | None = None
    respect: bool | None = None
    reset: bool | None = None
    dups: bool | None = None

    def __str__(self) -> str:
        parts: list[str] = []
        for name, val in (("verbose", self.verbose), ("warnings", self.warnings),
                          ("respect", self.respect), ("reset", self.reset), ("dups", self.dups)):
            if val is not None:
                parts.append(name if val else "no" + name)
        if self.granularity is not None:
            parts.append("granularity=" + _GRAN_PRINT.get(self.granularity, self.granularity))
        elif self.granularity_levels is not None:
            parts.append(f"granularity={self.granularity_levels}")
        if self.proclist is not None:
            parts.append(f"proclist=[{self.proclist}]")
        if self.type is not None:
            parts.append(self.type)
        if self.type in ("logical", "physical"):
            if self.offset is not None:
                parts.append(str(self.offset))
        else:
            if self.permute is not None or self.offset is not None:
                parts.append(str(self.permute or 0))
            if self.offset is not None:
                parts.append(str(self.offset))
        return ",".join(parts)

    @property
    def has_type(self) -> bool:
        return self.type is not None


def kmp_affinity_has_type_name(value: str) -> bool:
    """Whether the runtime considers ``KMP_AFFINITY`` to name an affinity type:
    it searches (case-insensitively) for any type name anywhere in the string.
    A ``KMP_AFFINITY`` without one does not override ``OMP_PLACES`` /
    ``OMP_PROC_BIND`` / ``GOMP_CPU_AFFINITY``."""
    low = _low(value)
    return any(t in low for t in AFFINITY_TYPES)


_AFF_TYPES = (("none", "false"), ("scatter", "intel"), ("compact", "intel"), ("logical", "intel"),
              ("physical", "intel"), ("explicit", "intel"), ("balanced", "intel"), ("disabled", "false"))
_AFF_FLAGS = (("verbose", "verbose", True), ("noverbose", "verbose", False),
              ("warnings", "warnings", True), ("nowarnings", "warnings", False),
              ("respect", "respect", True), ("norespect", "respect", False),
              ("reset", "reset", True), ("noreset", "reset", False),
              ("duplicates", "dups", True), ("dups", "dups", True),
              ("noduplicates", "dups", False), ("nodups", "dups", False))
_CORE_GRANS = (("core_type", "types"), ("core_efficiency", "effs"), ("core_eff", "effs"))


@dataclass
class _AffState:
    """What ``__kmp_parse_affinity_env`` reads and keeps while it walks the tokens."""

    s: str
    name: str
    diag: _Diag
    type: str | None = None
    bind: str | None = None  # proc-bind implied by the last type keyword
    gran: str | None = None
    gran_levels: int | None = None
    gran_set: bool = False  # the runtime keeps this across tokens (see docs/semantics.md)
    core_types_gran: bool = False
    core_effs_gran: bool = False
    proclist: ProcList | None = None
    verbose: bool | None = None
    warnings: bool | None = None
    respect: bool | None = None
    reset: bool | None = None
    dups: bool | None = None
    numbers: list[int] = field(default_factory=list)
    guards: dict[str, int] = field(default_factory=dict)

    def guard(self, key: str, start: int, nxt: int) -> bool:
        """The runtime's ``set_*`` guards: False (with a warning) when ``key`` was given already."""
        count = self.guards.get(key, 0)
        self.guards[key] = count + 1
        if count:
            self.diag.warn(f"{self.name}: parameter has been specified already, "
                           f"ignoring {_q(self.s[start:nxt])}.", start)
            return False
        return True

    def skip_invalid(self, start: int, nxt: int, detail: str | None = None) -> int:
        """Report the token from ``start`` to the next comma as invalid; the index after that comma."""
        end = _skip_to(self.s, nxt, ",")
        self.diag.warn(f"{self.name}: parameter invalid, ignoring {_q(self.s[start:end])}.", start,
                       detail=detail)
        return min(end + 1, len(self.s))

    def after_token(self, nxt: int) -> int:
        """The end of each token: a comma (blanks around it skipped) or the end of the
        string; anything else is reported up to the next comma.  The next token's index."""
        s = self.s
        nxt = _skip_ws(s, nxt)
        if _ch(s, nxt) == ",":
            return _skip_ws(s, nxt + 1)
        if nxt < len(s):
            end = _skip_to(s, nxt, ",")
            self.diag.warn(f"{self.name}: extra trailing characters ignored: {_q(s[nxt:end])}.", nxt)
            return min(end + 1, len(s))
        return nxt

    def mark_core_gran(self, flag: str) -> None:
        """Record ``granularity=core_type`` (``types``) or ``core_eff[iciency]`` (``effs``)."""
        if flag == "types":
            self.core_types_gran = True
        else:
            self.core_effs_gran = True


def _parse_kmp_affinity(value: str, diag: _Diag, name: str = "KMP_AFFINITY") -> KmpAffinity:
    """``__kmp_parse_affinity_env``: the token loop (each token a keyword, a
    ``granularity=``, a ``proclist=`` or an integer), then the end-of-parse resolution."""
    st = _AffState(value, name, diag)
    buf = _skip_ws(value, 0)
    while buf < len(value):
        for clause in (_aff_keyword, _aff_assignment, _aff_integer):
            nxt = clause(st, buf)
            if nxt is not None:
                buf = nxt
                break
        else:
            buf = st.skip_invalid(buf, buf)
    return _aff_finish(st)


def _aff_keyword(st: _AffState, start: int) -> int | None:
    """The type keywords (each also sets proc-bind) and the boolean modifiers of
    ``__kmp_parse_affinity_env``.  The next token's index, or None if no keyword."""
    for typ, bind in _AFF_TYPES:
        nxt = _match(typ, st.s, start)
        if nxt is not None:
            if st.guard("type", start, nxt):
                st.type = typ
            st.bind = bind
            return st.after_token(nxt)
    for tok, attr, val in _AFF_FLAGS:
        nxt = _match(tok, st.s, start)
        if nxt is not None:
            if st.guard(attr, start, nxt):
                setattr(st, attr, val)
            return st.after_token(nxt)
    return None


def _aff_assignment(st: _AffState, start: int) -> int | None:
    """The ``keyword=value`` clauses of ``__kmp_parse_affinity_env`` (``granularity=``
    or ``gran=``, ``proclist=``): the ``=`` they share, then the clause's own value.
    The next token's index, or None if the token is none of them."""
    s = st.s
    for keyword, clause, missing in _AFF_ASSIGNMENTS:
        nxt = _match(keyword, s, start)
        if nxt is not None:
            nxt = _skip_ws(s, nxt)
            if _ch(s, nxt) != "=":
                return st.skip_invalid(start, nxt, missing)
            return clause(st, start, _skip_ws(s, nxt + 1))
    return None


def _aff_granularity(st: _AffState, start: int, i: int) -> int:
    """The value of ``granularity=`` in ``__kmp_parse_affinity_env`` (``s[i]``, after
    the ``=``).  The next token's index."""
    if not st.gran_set:
        return _aff_gran_value(st, start, i)
    # A granularity was already set: the runtime's parser leaves the value
    # unconsumed (reported as trailing characters), except for core_type/core_eff
    # which it always tries.
    core = _core_gran(st.s, i)
    if core is None:
        return st.after_token(i)
    flag, nxt = core
    st.guard("gran", start, nxt)
    st.mark_core_gran(flag)
    return st.after_token(nxt)


def _aff_gran_value(st: _AffState, start: int, i: int) -> int:
    """The first granularity value of ``__kmp_parse_affinity_env``: ``core_type`` /
    ``core_eff[iciency]``, a layer, an alias (``fine``, ``package``, ``node``) or a
    number of levels at ``s[i]``.  The next token's index."""
    core = _core_gran(st.s, i)
    if core is not None:
        flag, nxt = core
        layer, levels = "core", None
    else:
        found = _layer_gran(st.s, i)
        if found is None:
            return st.skip_invalid(start, i, "unknown granularity")
        layer, levels, nxt = found
        flag = ""
    st.gran_set = True
    if st.guard("gran", start, nxt):
        st.gran, st.gran_levels = layer, levels
    if flag:
        st.mark_core_gran(flag)
    return st.after_token(nxt)


def _core_gran(s: str, i: int) -> tuple[str, int] | None:
    """``core_type`` / ``core_eff[iciency]`` at ``s[i]``: (flag, end), or None."""
    for tok, flag in _CORE_GRANS:
        e = _match(tok, s, i)
        if e is not None:
            return flag, e
    return None


def _layer_gran(s: str, i: int) -> tuple[str | None, int | None, int] | None:
    """A layer keyword, an alias or a number of levels at ``s[i]``: (layer, levels, end), or None."""
    for layer in HW_LAYERS:
        e = _match(layer, s, i)
        if e is not None:
            return layer, None, e
    for alias, layer in _GRAN_ALIASES.items():
        e = _match(alias, s, i)
        if e is not None:
            return layer, None, e
    if _isdigit(_ch(s, i)):
        e = _skip_digits(s, i)
        return None, _str_to_int(s, i, e), e
    return None


def _aff_proclist(st: _AffState, start: int, i: int) -> int:
    """The value of ``proclist=[...]`` in ``__kmp_parse_affinity_env`` (``s[i]``,
    after the ``=``).  The next token's index."""
    s = st.s
    if _ch(s, i) != "[":
        return st.skip_invalid(start, i, "proclist needs '[' after '='")
    pl, end = _parse_proc_id_list(st.name, s, i + 1, st.diag)
    if pl is None:
        # resume after the closing ']' and the comma after it
        close = min(_skip_to(s, i + 1, "]") + 1, len(s))
        return min(_skip_to(s, close, ",") + 1, len(s))
    if _ch(s, end) != "]":
        return st.skip_invalid(start, end, "proclist is not closed by ']'")
    if st.guard("proclist", start, end + 1):
        st.proclist = pl
    return st.after_token(end + 1)


#: The ``keyword=`` clauses, in the order the runtime tries them: (keyword, value
#: parser, detail when the ``=`` is missing).
_AFF_ASSIGNMENTS: tuple[tuple[str, Callable[[_AffState, int, int], int], str], ...] = (
    ("granularity", _aff_granularity, "granularity needs '=<layer>'"),
    ("gran", _aff_granularity, "granularity needs '=<layer>'"),
    ("proclist", _aff_proclist, "proclist needs '=[...]'"),
)


def _aff_integer(st: _AffState, start: int) -> int | None:
    """An integer parameter of ``__kmp_parse_affinity_env`` (permute, then offset;
    a third one is reported).  The next token's index, or None if not a number."""
    s = st.s
    if not _isdigit(_ch(s, start)):
        return None
    nxt = _skip_digits(s, start)
    if len(st.numbers) >= 2:
        st.diag.warn(f"{st.name}: too many integer parameters specified, ignoring {_q(s[start:])}.", start,
                     detail=f"too many integer parameters, ignoring {_q(s[start:nxt])}")
    st.numbers.append(_str_to_int(s, start, nxt))
    return st.after_token(nxt)


def _aff_finish(st: _AffState) -> KmpAffinity:
    """The end of ``__kmp_parse_affinity_env``: resolves the type against the
    proclist and the integer parameters, then proc-bind and the hybrid granularities."""
    _aff_resolve_proclist(st)
    permute, offset = _aff_integer_params(st)
    typ, proclist = st.type, st.proclist
    # A later 'none'/'disabled' keyword (rejected as a repeated type) still
    # switches proc-bind off in the runtime, which then behaves as 'none'.
    if typ not in (None, "none", "disabled") and st.bind == "false":
        typ = "none"
        permute = offset = None
        proclist = None
    gran = st.gran
    if st.core_types_gran:
        gran = "core_type"
    elif st.core_effs_gran:
        gran = "core_efficiency"
    return KmpAffinity(type=typ, granularity=gran, granularity_levels=st.gran_levels if gran is None else None,
                       permute=permute, offset=offset, proclist=proclist, verbose=st.verbose,
                       warnings=st.warnings, respect=st.respect, reset=st.reset, dups=st.dups)


def _aff_resolve_proclist(st: _AffState) -> None:
    """``__kmp_parse_affinity_env``'s proclist check: a proclist without a type makes
    it ``explicit``; one with another type is dropped."""
    if st.proclist is None:
        return
    if st.type is None:
        st.diag.warn(f'{st.name}: proclist specified, setting affinity type to "explicit".',
                     0, detail='proclist given without the "explicit" type')
        st.type = "explicit"
        st.bind = "intel"
    elif st.type != "explicit":
        st.diag.warn(f'{st.name}: proclist specified without "explicit" affinity type, proclist ignored.',
                     0, detail=f'proclist given with the "{st.type}" type (it needs "explicit")')
        st.proclist = None


def _aff_integer_params(st: _AffState) -> tuple[int | None, int | None]:
    """``__kmp_parse_affinity_env``'s per-type use of the integer parameters:
    (permute, offset); ``explicit`` without a proclist becomes ``none``."""
    name, numbers, typ = st.name, st.numbers, st.type
    count = len(numbers)
    permute: int | None = None
    offset: int | None = None
    if typ in ("logical", "physical"):
        if count > 0:
            offset = numbers[0]
        if count > 1:
            st.diag.warn(f"{name}: too many integer parameters specified for logical or physical type, "
                         f"ignoring {_q(str(numbers[1]))}.", 0)
    elif typ in ("balanced", "scatter", "compact"):
        if count > 0:
            permute = numbers[0]
        if count > 1:
            offset = numbers[1]
        if typ == "balanced" and st.gran is None and not (st.core_types_gran or st.core_effs_gran) and \
                (st.verbose or st.warnings is not False):
            st.diag.warn(f"{name}: granularity=core will be used.", error=False)
    else:
        label = typ or "default"
        if typ == "explicit" and st.proclist is None:
            st.diag.warn(f'{name}: proclist not specified with explicit affinity type, using "none".', 0)
            st.type = "none"
        if count > 0:
            st.diag.warn(f"{name}: '{label}' type does not take any integer parameters, ignoring them.", 0,
                         detail="integer parameters need an affinity type" if typ is None else None)
    return permute, offset

# ---------------------------------------------------------------------------
# OMP_PLACES
# ---------------------------------------------------------------------------

def _count_stride(count: int | None, stride: int | None) -> str:
    """The ``:count[:stride]`` suffix of an ``OMP_PLACES`` interval (none without a count)."""
    if count is None:
        return ""
    return f":{count}" + ("" if stride is None else f":{stride}")


@dataclass(frozen=True)
class SubPlace:
    """``start[:count[:stride]]`` inside ``{...}``."""

    start: int
    count: int | None = None
    stride: int | None = None

    def __str__(self) -> str:
        return str(self.start) + _count_stride(self.count, self.stride)


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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
        for k, v in _PLURAL.items():
            if v == self.kind:
                return k
        return None


_STD_PLACES = ("threads", "cores", "numa_domains", "ll_caches", "sockets")


def _parse_signed(s: str, i: int) -> tuple[int, int]:
    sign = 1
    while True:
        i = _skip_ws(s, i)
        c = _ch(s, i)
        if c == "+":
            i += 1
            continue
        if c == "-":
            sign = -sign
            i += 1
            continue
        break
    i = _skip_ws(s, i)
    if not _isdigit(_ch(s, i)):
        raise _Malformed(i, "expected a stride")
    j = _skip_digits(s, i)
    return sign * _str_to_int(s, i, j), j


def _parse_number(s: str, i: int, what: str) -> tuple[int, int]:
    i = _skip_ws(s, i)
    if not _isdigit(_ch(s, i)):
        raise _Malformed(i, f"expected {what}")
    j = _skip_digits(s, i)
    return _str_to_int(s, i, j), j


def _parse_subplaces(s: str, i: int) -> tuple[tuple[SubPlace, ...], int]:
    subs: list[SubPlace] = []
    while True:
        start, i = _parse_number(s, i, "a proc id")
        i = _skip_ws(s, i)
        if _ch(s, i) == "}":
            subs.append(SubPlace(start))
            return tuple(subs), i
        if _ch(s, i) == ",":
            subs.append(SubPlace(start))
            i += 1
            continue
        if _ch(s, i) != ":":
            raise _Malformed(i, "expected ',', ':' or '}'")
        count, i = _parse_number(s, i + 1, "a count")
        i = _skip_ws(s, i)
        if _ch(s, i) in ("}", ","):
            subs.append(SubPlace(start, count))
            if _ch(s, i) == "}":
                return tuple(subs), i
            i += 1
            continue
        if _ch(s, i) != ":":
            raise _Malformed(i, "expected ',', ':' or '}'")
        stride, i = _parse_signed(s, i + 1)
        i = _skip_ws(s, i)
        subs.append(SubPlace(start, count, stride))
        if _ch(s, i) == "}":
            return tuple(subs), i
        if _ch(s, i) == ",":
            i += 1
            continue
        raise _Malformed(i, "expected ',' or '}'")


def _parse_place(s: str, i: int) -> tuple[Place, int]:
    i = _skip_ws(s, i)
    c = _ch(s, i)
    if c == "{":
        subs, i = _parse_subplaces(s, i + 1)
        if _ch(s, i) != "}":
            raise _Malformed(i, "expected '}'")
        return Place(members=subs), i + 1
    if c == "!":
        inner, i = _parse_place(s, i + 1)
        return Place(exclude=inner), i
    if _isdigit(c):
        j = _skip_digits(s, i)
        return Place(proc=_str_to_int(s, i, j)), j
    raise _Malformed(i, "expected a place ('{...}', '!place' or a proc id)")


def _parse_place_list(s: str) -> tuple[Place, ...]:
    places: list[Place] = []
    i = 0
    while True:
        p, i = _parse_place(s, i)
        i = _skip_ws(s, i)
        if i >= len(s):
            places.append(p)
            break
        if s[i] == ",":
            places.append(p)
            i += 1
            continue
        if s[i] != ":":
            raise _Malformed(i, "expected ',' or ':'")
        count, i = _parse_number(s, i + 1, "a count")
        i = _skip_ws(s, i)
        if i >= len(s) or s[i] == ",":
            places.append(Place(p.members, p.proc, p.exclude, count))
            if i >= len(s):
                break
            i += 1
            continue
        if s[i] != ":":
            raise _Malformed(i, "expected ',' or ':'")
        stride, i = _parse_signed(s, i + 1)
        i = _skip_ws(s, i)
        places.append(Place(p.members, p.proc, p.exclude, count, stride))
        if i >= len(s):
            break
        if s[i] == ",":
            i += 1
            continue
        raise _Malformed(i, "expected ',' or the end")
    return tuple(places)


_CORE_ATTRS = ("intel_atom", "intel_core")


def _parse_omp_places(value: str, diag: _Diag, name: str = "OMP_PLACES") -> OmpPlaces:
    s = value
    scan = 0
    kind: str | None = None
    for std in _STD_PLACES:
        e = _match(std, s, scan)
        if e is not None:
            kind, scan = std, e
            break
    if kind is None:
        for tok, k in (("core_types", "core_types"), ("core_effs", "core_effs"),
                       ("core_efficiencies", "core_effs")):
            e = _match(tok, s, scan)
            if e is not None:
                kind, scan = k, e
                break
    if kind is None:
        for layer in HW_LAYERS:
            e = _match(_PLURAL[layer], s, scan)
            if e is not None:
                kind, scan = _PLURAL[layer], e
                break
    if kind is None:
        try:
            return OmpPlaces(places=_parse_place_list(s))
        except _Malformed as err:
            # Intel's libiomp5 falls back to "threads" (LLVM's libomp to "cores").
            diag.warn(f"{name}: syntax error, using threads.", err.pos, detail=f"syntax error: {err.detail}")
            return OmpPlaces(kind="threads")
    layer = "core" if kind in ("core_types", "core_effs") else \
        next(k for k, v in _PLURAL.items() if v == kind)
    kind_name = catalog(layer, True)  # the runtime names the fallback by its catalog name
    if kind in ("core_types", "core_effs") and scan < len(s):
        # libiomp5 reports anything after these names, then goes on parsing
        diag.warn(f"{name}: extra trailing characters ignored: {_q(s[scan:])}.", scan)
    attribute: str | None = None
    if kind == "cores" and _ch(s, _skip_ws(s, scan)) == ":":
        a = _skip_ws(s, scan) + 1
        for attr in _CORE_ATTRS:
            e = _match(attr, s, a)
            if e is not None:
                attribute, scan = attr, e
                break
        if attribute is None:
            e = _match("eff", s, a)
            if e is not None:
                j = e
                while j < len(s) and _isalpha(s[j]):
                    j += 1
                if _isdigit(_ch(s, j)):
                    k = _skip_digits(s, j)
                    attribute, scan = "eff" + str(_str_to_int(s, j, k)), k
        if attribute is None:
            diag.warn(f"{name}: syntax error, using {kind_name}.", a, detail="unknown core attribute")
            return OmpPlaces(kind=kind)
    scan = _skip_ws(s, scan)
    if scan >= len(s):
        return OmpPlaces(kind=kind, attribute=attribute)
    if s[scan] != "(":
        diag.warn(f"{name}: syntax error, using {kind_name}.", scan, detail="expected '(count)' or the end")
        return OmpPlaces(kind=kind, attribute=attribute)
    scan = _skip_ws(s, scan + 1)
    e = _skip_digits(s, scan)
    count = _str_to_int(s, scan, e)
    scan = _skip_ws(s, e)
    if _ch(s, scan) != ")":
        diag.warn(f"{name}: syntax error, using {kind_name}.", scan, detail="expected a count and ')'")
        return OmpPlaces(kind=kind, attribute=attribute)
    scan = _skip_ws(s, scan + 1)
    if scan < len(s):
        diag.warn(f"{name}: extra trailing characters ignored: {_q(s[scan:])}.", scan)
    return OmpPlaces(kind=kind, attribute=attribute, count=count if count > 0 else None)


# ---------------------------------------------------------------------------
# OMP_PROC_BIND
# ---------------------------------------------------------------------------

_BIND_WORDS = ("false", "true", "primary", "close", "spread", "disabled")


@dataclass(frozen=True)
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


def _parse_omp_proc_bind(value: str, diag: _Diag, name: str = "OMP_PROC_BIND") -> OmpProcBind:
    s = value
    buf = _skip_ws(s, 0)
    invalid = f"{name}: {_q(value)} is an invalid value; ignored."
    if _isdigit(_ch(s, buf)):
        # libiomp5 does not accept the numeric form.
        diag.warn(invalid, buf, detail="expected false, true, primary, master, close or spread")
        return OmpProcBind(("false",))
    single = None
    for tok in ("disabled", "false", "true"):
        e = _match(tok, s, buf)
        if e is not None:
            single, buf = tok, _skip_ws(s, e)
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
                e = _match(tok, s, buf)
                if e is not None:
                    word, buf = pol1, _skip_ws(s, e)
                    break
            if word is None:
                diag.warn(invalid, buf, detail="expected primary, master, close or spread")
                return OmpProcBind(("false",))
            out.append(word)
            if len(out) >= nelem:
                break
            if _ch(s, buf) != ",":
                # libiomp5 reports the rest and resumes after the next comma
                diag.warn(f"{name}: extra trailing characters ignored: {_q(s[buf:])}.", buf)
                buf = _skip_to(s, buf, ",")
            buf = _skip_ws(s, buf + 1)
        pol = tuple(out)
    if buf < len(s):
        diag.warn(f"{name}: extra trailing characters ignored: {_q(s[buf:])}.", buf)
    return OmpProcBind(pol)


# ---------------------------------------------------------------------------
# KMP_HW_SUBSET
# ---------------------------------------------------------------------------

_SUBSET_NAMES = {"socket": "s", "core": "c", "thread": "t", "numa_domain": "n", "die": "d",
                 "tile": "tile", "module": "module", "l1_cache": "l1", "l2_cache": "l2",
                 "l3_cache": "l3", "ll_cache": "ll", "proc_group": "proc_group"}


@dataclass(frozen=True)
class HwSubsetItem:
    """One ``[n|*]ID[@offset][:attr]`` item.  ``layer`` is a layer keyword
    (``socket``, ``core``, ``thread``, ``numa_domain``, ``die``, ``tile``,
    ``module``, ``l1_cache``, ``l2_cache``, ``l3_cache``, ``ll_cache``);
    ``count`` ``None`` means all (``*``); ``attr`` is ``intel_atom``,
    ``intel_core`` or ``eff<N>`` (cores only)."""

    layer: str
    count: int | None = None
    offset: int = 0
    attr: str | None = None

    def __str__(self) -> str:
        s = ("*" if self.count is None else str(self.count)) + _SUBSET_NAMES[self.layer]
        if self.offset:
            s += f"@{self.offset}"
        if self.attr:
            s += ":" + self.attr
        return s


@dataclass(frozen=True)
class KmpHwSubset:
    """A ``KMP_HW_SUBSET`` setting.

    Attributes
    ----------
    items : tuple of HwSubsetItem
        The layers kept, in the order given.
    absolute : bool
        The ``:`` prefix.
    """

    items: tuple[HwSubsetItem, ...]
    absolute: bool = False

    def __str__(self) -> str:
        return (":" if self.absolute else "") + ",".join(str(i) for i in self.items)


def _subset_layer(token: str) -> str | None:
    """``__kmp_stg_parse_hw_subset_name``: narrow the layer names by prefix
    until one is left; ties on short tokens prefer thread, core, socket."""
    end = 0
    while end < len(token) and (_isalnum(token[end]) or token[end] == "_"):
        end += 1
    possible = list(HW_LAYERS)
    idx = 0
    while len(possible) > 1 and idx < end:
        c = _up(token[idx])
        possible = [p for p in possible if not (idx < len(p) and _up(p[idx]) != c)]
        idx += 1
    if len(possible) > 1:
        # the runtime returns the first of thread/core/socket in list order
        for p in possible:
            if p in ("thread", "core", "socket"):
                return p
        return None
    return possible[0] if possible else None


def _parse_kmp_hw_subset(value: str, diag: _Diag, name: str = "KMP_HW_SUBSET") -> KmpHwSubset | None:
    """``__kmp_stg_parse_hw_subset``: canonicalizes the string, then reads its
    items; any error makes the runtime ignore the whole setting (None)."""
    invalid = (f'{name}: invalid value {_q(value)}, valid format is "N<item>[@N][,...][,Nt] '
               '(<item> can be S, N, L2, C, T  for Socket, NUMA Node, L2 Cache, Core, Thread)".')
    canonical = _subset_canonical(value)
    if canonical is None:
        diag.warn(invalid, 0, detail="empty or too long")
        return None
    text, posmap, absolute = canonical
    try:
        items = _subset_items(text)
    except _Malformed as err:
        diag.warn(invalid, posmap[min(err.pos, len(posmap) - 1)], detail=err.detail)
        return None
    return KmpHwSubset(items, absolute)


def _subset_canonical(value: str) -> tuple[str, list[int], bool] | None:
    """The copy loop of ``__kmp_stg_parse_hw_subset``: drops spaces and a leading
    ``:`` (absolute), upper-cases, ``x`` separates levels, ``o<digit>`` is ``@``.
    Returns (text, index in ``value`` of each character, absolute), or None
    when nothing is left or the string is too long."""
    chars: list[str] = []
    posmap: list[int] = []
    absolute = False
    mlen = 512
    for i, ch in enumerate(value):
        if mlen == 0:
            break
        mlen -= 1
        if ch == " ":
            continue
        if not chars and ch == ":" and not absolute:
            absolute = True
            continue
        c = _up(ch)
        if c == "X":
            c = ","
        # strchr("0123456789", next) also matches the terminating NUL
        if c == "O" and (i + 1 >= len(value) or "0" <= value[i + 1] <= "9"):
            c = "@"
        chars.append(c)
        posmap.append(i)
    if not chars or mlen == 0:
        return None
    return "".join(chars), posmap, absolute


def _subset_items(text: str) -> tuple[HwSubsetItem, ...]:
    """The component loop of ``__kmp_stg_parse_hw_subset`` over the canonical text
    (``,`` between levels, ``&`` between core kinds); each layer at most once
    (cores excepted).  Raises :class:`_Malformed` with an index into ``text``."""
    comps = text.split(",")
    if len(comps) > len(HW_LAYERS):
        raise _Malformed(0, "too many components")
    items: list[HwSubsetItem] = []
    seen: set[str] = set()
    base = 0
    for comp in comps:
        off = base
        for cc in comp.split("&"):
            item = _subset_item(cc, off)
            if item.layer != "core" and item.layer in seen:
                raise _Malformed(off, f"{item.layer} given twice")
            seen.add(item.layer)
            items.append(item)
            off += len(cc) + 1
        base += len(comp) + 1
    return tuple(items)


def _subset_item(cc: str, off: int) -> HwSubsetItem:
    """One ``[n|*]ID[@offset][:attr]`` item of ``__kmp_stg_parse_hw_subset`` (``off``:
    its index in the canonical text, for errors)."""
    if _isdigit(cc[:1]):
        num: int | None = _atoi(cc)
        if num <= 0:
            raise _Malformed(off, "counts must be positive")
        pos = cc[_skip_digits(cc, 0):]
    elif cc[:1] == "*":
        num, pos = None, cc[1:]
    else:
        num, pos = None, cc
    at = cc.find("@")
    colon = cc.find(":")
    offset = _atoi(cc, at + 1) if at >= 0 else 0
    attr = _subset_attr(cc, colon, at, off) if colon >= 0 else None
    # the layer name is what is left before '@' and ':'
    cut = len(pos)
    for mark in ("@", ":"):
        k = pos.find(mark)
        if k >= 0:
            cut = min(cut, k)
    layer = _subset_layer(pos[:cut])
    if layer is None:
        raise _Malformed(off, "unknown layer")
    if attr and layer != "core":
        raise _Malformed(off, "only cores take an attribute")
    return HwSubsetItem(layer, num, offset, attr)


def _subset_attr(cc: str, colon: int, at: int, off: int) -> str:
    """The ``:attr`` of an item (``intel_atom``, ``intel_core`` or ``eff<N>``), as
    ``__kmp_stg_parse_hw_subset`` reads it."""
    a = cc[colon + 1:at] if at > colon else cc[colon + 1:]
    al = _low(a)
    if al in _CORE_ATTRS:
        return al
    if al[:3] != "eff":
        raise _Malformed(off + colon, "unknown core attribute")
    k = 3
    while k < len(a) and _isalpha(a[k]):
        k += 1
    if k >= len(a) or not _isdigit(a[k]):
        raise _Malformed(off + colon, "bad core attribute")
    return "eff" + str(_atoi(a, k))


# ---------------------------------------------------------------------------
# OMP_NUM_THREADS
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
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


def _parse_num_threads(value: str, diag: _Diag, name: str = "OMP_NUM_THREADS") -> NumThreads | None:
    s = value
    if _low(s) == "all":
        return NumThreads(all=True)
    invalid = f"{name}: {_q(value)} is an invalid value; ignored."
    # validation pass (as the runtime's first pass over the list)
    i = 0
    total = 0
    prev_comma = False
    n = len(s)
    while True:
        i = _skip_ws(s, i)
        if i >= n:
            break
        c = s[i]
        if not _isdigit(c) and c != ",":
            diag.warn(invalid, i, detail="expected positive integers separated by ','")
            return None
        if c == ",":
            if total == 0 or prev_comma:
                total += 1
            prev_comma = True
            i = _skip_ws(s, i + 1)
        if _isdigit(_ch(s, i)):
            prev_comma = False
            j = _skip_digits(s, i)
            total += 1
            k = _skip_ws(s, j)
            if _ch(s, j) in (" ", "\t") and _isdigit(_ch(s, k)):
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
        i = _skip_ws(s, i)
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
            i = _skip_ws(s, i + 1)
        if _isdigit(_ch(s, i)):
            prev_comma = False
            j = _skip_digits(s, i)
            total += 1
            v = _str_to_int(s, i, j)
            if v < 1:
                small = True
                v = 1
            values.append(v)
            i = j
    if small:
        diag.warn(f"{name}={_q(value)}: value too small.", 0, detail="team sizes must be at least 1")
    return NumThreads(tuple(values))


# ---------------------------------------------------------------------------
# GOMP_CPU_AFFINITY
# ---------------------------------------------------------------------------

def _parse_gomp(value: str, diag: _Diag, name: str = "GOMP_CPU_AFFINITY") -> ProcList | None:
    pl, e = _parse_proc_id_list(name, value, 0, diag)
    if pl is None:
        return None
    e = _skip_ws(value, e)
    if e < len(value):
        diag.warn(f"{name}: syntax error, not using affinity.", e, detail="unexpected characters")
        return None
    return pl


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------

T = TypeVar("T")


def _run(fn: Callable[[str, _Diag, str], T], value: str, strict: bool, what: str) -> tuple[T, list[Diagnostic]]:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    diag = _Diag(strict, value, what)
    v = fn(value, diag, what)
    return v, diag.items


def parse_kmp_affinity(value: str, *, strict: bool = True) -> KmpAffinity:
    """Parse a ``KMP_AFFINITY`` string (``granularity=fine,compact,1,0``).

    Parameters
    ----------
    value : str
        Keywords, ``granularity=<layer>``, ``proclist=[...]`` and up to two
        integers, separated by commas.
    strict : bool
        Raise on anything the runtime would warn about and correct; with
        ``False``, return the setting the runtime ends up with.

    Returns
    -------
    KmpAffinity
        The setting; what was not given is ``None``.

    Raises
    ------
    SpecError
        In strict mode, where the value is malformed.
    """
    return _run(_parse_kmp_affinity, value, strict, "KMP_AFFINITY")[0]


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
    return _run(_parse_omp_places, value, strict, "OMP_PLACES")[0]


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
    return _run(_parse_omp_proc_bind, value, strict, "OMP_PROC_BIND")[0]


def parse_kmp_hw_subset(value: str, *, strict: bool = True) -> KmpHwSubset | None:
    """Parse a ``KMP_HW_SUBSET`` string (``2s,4c@2,1t``).

    Parameters
    ----------
    value : str
        The value of ``KMP_HW_SUBSET`` (or of its old name ``KMP_PLACE_THREADS``).
    strict : bool
        Raise on an invalid value; ``False`` returns ``None`` instead.

    Returns
    -------
    KmpHwSubset or None
        ``None`` (lenient mode only) where the runtime ignores the whole setting.

    Raises
    ------
    SpecError
        In strict mode, on an invalid value.
    """
    return _run(_parse_kmp_hw_subset, value, strict, "KMP_HW_SUBSET")[0]


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
    return _run(_parse_num_threads, value, strict, "OMP_NUM_THREADS")[0]


def parse_gomp_cpu_affinity(value: str, *, strict: bool = True) -> ProcList | None:
    """Parse a ``GOMP_CPU_AFFINITY`` list (``0 3 1-2 4-15:2``).

    Parameters
    ----------
    value : str
        OS proc ids, ranges ``a-b[:stride]`` and sets ``{a,b}``, separated by
        blanks or commas.
    strict : bool
        Raise on a malformed list; ``False`` returns ``None`` where the runtime
        does not use it.

    Returns
    -------
    ProcList or None
        The places in order, or (lenient mode) ``None``: not used.

    Raises
    ------
    SpecError
        In strict mode, on a syntax or range error.
    """
    return _run(_parse_gomp, value, strict, "GOMP_CPU_AFFINITY")[0]


_PARSERS: dict[str, Callable[[str, _Diag, str], Any]] = {
    "KMP_AFFINITY": _parse_kmp_affinity,
    "OMP_PLACES": _parse_omp_places,
    "OMP_PROC_BIND": _parse_omp_proc_bind,
    "KMP_HW_SUBSET": _parse_kmp_hw_subset,
    "KMP_PLACE_THREADS": _parse_kmp_hw_subset,
    "OMP_NUM_THREADS": _parse_num_threads,
    "GOMP_CPU_AFFINITY": _parse_gomp,
}


def parse_lenient(variable: str, value: str) -> tuple[Any, list[Diagnostic]]:
    """Parse ``value`` of environment variable ``variable`` the way the runtime
    does: never raises for bad input.

    Parameters
    ----------
    variable : str
        ``KMP_AFFINITY``, ``OMP_PLACES``, ``OMP_PROC_BIND``, ``KMP_HW_SUBSET``,
        ``KMP_PLACE_THREADS``, ``OMP_NUM_THREADS`` or ``GOMP_CPU_AFFINITY``.
    value : str
        Its value.

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
    return _run(_parser(variable), value, False, variable)


def parse_strict(variable: str, value: str) -> tuple[Any, list[Diagnostic]]:
    """Like :func:`parse_lenient` but raises :class:`SpecError` on malformed
    input; notices about well-formed input are returned.

    Parameters
    ----------
    variable : str
        An affinity variable, as for :func:`parse_lenient`.
    value : str
        Its value.

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
    return _run(_parser(variable), value, True, variable)


def _parser(variable: str) -> Callable[[str, _Diag, str], Any]:
    """The parser of an affinity variable; ValueError for any other name."""
    try:
        return _PARSERS[variable]
    except KeyError:
        raise ValueError(f"not an affinity variable: {variable!r}") from None


# ---------------------------------------------------------------------------
# All settings together
# ---------------------------------------------------------------------------

#: The variables the runtime reads to place threads, in the order it processes them
#: (``__kmp_env_initialize`` walks them sorted by name): the planner's input.
SETTINGS_VARIABLES = ("GOMP_CPU_AFFINITY", "KMP_AFFINITY", "KMP_HW_SUBSET", "KMP_PLACE_THREADS",
                      "OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND")
#: Those of them that describe a placement on their own (a launcher without a spec
#: plans from them when the environment has one).
PLACEMENT_VARIABLES = ("KMP_AFFINITY", "OMP_PLACES", "OMP_PROC_BIND")
#: What ``apply()``, ``pinned()`` and ``affinity run`` plan when given no spec: one
#: thread per core, on the first PU of each core, cores in order.
DEFAULT_SPEC = "granularity=fine,compact,1,0"


def parse_assignments(items: str | Iterable[str], *, what: str = "settings",
                      keys: Iterable[str] | None = SETTINGS_VARIABLES) -> dict[str, str]:
    """Read ``KEY=VALUE`` assignments into a dict.

    Parameters
    ----------
    items : str or iterable of str
        One string of assignments separated by blanks (values cannot hold blanks),
        or one assignment per item (values may hold blanks, as in
        ``GOMP_CPU_AFFINITY=0 2 4``).
    what : str
        Names the input in error messages.
    keys : iterable of str, optional
        The accepted keys (default: :data:`SETTINGS_VARIABLES`); ``None`` accepts any.

    Raises
    ------
    SpecError
        An item without ``=``, or a key not accepted; the message shows the input
        with a caret under the bad item.
    """
    allowed = None if keys is None else tuple(keys)
    if isinstance(items, str):
        text, parts, pos = items, [], 0
        for word in items.split(" "):
            if word.strip():
                parts.append((word.strip(), pos + len(word) - len(word.lstrip())))
            pos += len(word) + 1
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
            raise SpecError(f"expected {expected}, got {word!r}", text, at, what=what)
        env[key] = val
    return env


@dataclass(frozen=True)
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
        if self.gomp_cpu_affinity is not None:
            env["GOMP_CPU_AFFINITY"] = str(self.gomp_cpu_affinity)
        if self.kmp_affinity is not None:
            env["KMP_AFFINITY"] = str(self.kmp_affinity)
        if self.kmp_hw_subset is not None:
            env["KMP_HW_SUBSET"] = str(self.kmp_hw_subset)
        if self.num_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.num_threads)
        if self.omp_places is not None:
            env["OMP_PLACES"] = str(self.omp_places)
        if self.omp_proc_bind is not None:
            env["OMP_PROC_BIND"] = str(self.omp_proc_bind)
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
        kw: dict[str, Any] = {}
        for key, attr, fn in (("KMP_AFFINITY", "kmp_affinity", parse_kmp_affinity),
                              ("OMP_PLACES", "omp_places", parse_omp_places),
                              ("OMP_PROC_BIND", "omp_proc_bind", parse_omp_proc_bind),
                              ("KMP_HW_SUBSET", "kmp_hw_subset", parse_kmp_hw_subset),
                              ("OMP_NUM_THREADS", "num_threads", parse_num_threads),
                              ("GOMP_CPU_AFFINITY", "gomp_cpu_affinity", parse_gomp_cpu_affinity)):
            if key in env:
                kw[attr] = fn(env[key])
        return Settings(**kw)

    @staticmethod
    def parse(text: str) -> "Settings":
        """Read ``KEY=VALUE KEY=VALUE ...`` (values must not contain spaces).

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
