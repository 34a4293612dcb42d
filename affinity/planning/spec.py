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
from typing import Any, Callable, TypeVar, Union

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


def plural_keyword(layer: str) -> str:
    return _PLURAL[layer]


# ---------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Diagnostic:
    """One message a parser produced.

    ``text`` is what the runtime prints (without ``OMP: Warning #NNN:``);
    ``error`` tells whether the input was malformed (strict parsing raises)
    or the message is a notice about well-formed input (e.g. balanced
    affinity defaulting its granularity to core).
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


ProcItem = Union[int, ProcRange, "tuple[int, ...]"]


@dataclass(frozen=True)
class ProcList:
    """An explicit proc list: each item is one place (an OS proc id, a range
    expanding to one place per id, or a set ``{a,b,...}`` forming one place)."""

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
    scan = i
    empty = True
    n = len(s)
    while True:
        scan = _skip_ws(s, scan)
        nxt = scan
        if nxt >= n:
            break
        if s[nxt] == "{":
            nxt = _skip_ws(s, nxt + 1)
            scan = nxt
            if not _isdigit(_ch(s, nxt)):
                diag.warn(f"{var}: syntax error, not using affinity.", nxt,
                          detail="syntax error: expected a proc id after '{'")
                return None, i
            nxt = _skip_digits(s, nxt)
            members = [_str_to_int(s, scan, nxt)]
            while True:
                nxt = _skip_ws(s, nxt)
                if _ch(s, nxt) == "}":
                    nxt += 1
                    break
                if _ch(s, nxt) == ",":
                    nxt += 1
                nxt = _skip_ws(s, nxt)
                scan = nxt
                if not _isdigit(_ch(s, nxt)):
                    diag.warn(f"{var}: syntax error, not using affinity.", nxt,
                              detail="syntax error: expected a proc id or '}'")
                    return None, i
                nxt = _skip_digits(s, nxt)
                members.append(_str_to_int(s, scan, nxt))
            items.append(tuple(sorted(set(members))))
            empty = False
            nxt = _skip_ws(s, nxt)
            if _ch(s, nxt) == ",":
                nxt += 1
            scan = nxt
            continue
        item = nxt
        if not _isdigit(s[nxt]):
            if empty:
                diag.warn(f"{var}: syntax error, not using affinity.", nxt,
                          detail="syntax error: expected a proc id, a range or a set")
                return None, i
            break
        nxt = _skip_digits(s, nxt)
        start = _str_to_int(s, scan, nxt)
        nxt = _skip_ws(s, nxt)
        if _ch(s, nxt) != "-":
            items.append(start)
            empty = False
            if _ch(s, nxt) == ",":
                nxt += 1
            scan = nxt
            continue
        nxt = _skip_ws(s, nxt + 1)
        scan = nxt
        if not _isdigit(_ch(s, nxt)):
            diag.warn(f"{var}: syntax error, not using affinity.", nxt,
                      detail="syntax error: expected the end of the range")
            return None, i
        nxt = _skip_digits(s, nxt)
        end = _str_to_int(s, scan, nxt)
        stride = 1
        rpos = item
        nxt = _skip_ws(s, nxt)
        if _ch(s, nxt) == ":":
            sign = 1
            nxt = _skip_ws(s, nxt + 1)
            scan = nxt
            if _ch(s, nxt) == "-":
                sign = -1
                nxt = _skip_ws(s, nxt + 1)
                scan = nxt
            if not _isdigit(_ch(s, nxt)):
                diag.warn(f"{var}: syntax error, not using affinity.", nxt,
                          detail="syntax error: expected the stride")
                return None, i
            nxt = _skip_digits(s, nxt)
            stride = _str_to_int(s, scan, nxt) * sign
        if stride == 0:
            diag.warn(f"{var}: range error (zero stride), not using affinity.", rpos)
            return None, i
        if stride > 0 and start > end:
            diag.warn(f"{var}: range error ({start} > {end}), not using affinity.", rpos)
            return None, i
        if stride < 0 and start < end:
            diag.warn(f"{var}: range error ({start} < {end} & stride < 0), not using affinity.", rpos)
            return None, i
        if _cdiv(end - start, stride) > 65536:
            diag.warn(f"{var}: range error (({end}-{start})/{stride} too big), not using affinity.", rpos)
            return None, i
        items.append(ProcRange(start, end, stride))
        empty = False
        nxt = _skip_ws(s, nxt)
        if _ch(s, nxt) == ",":
            nxt += 1
        scan = nxt
    return ProcList(tuple(items)), nxt


# ---------------------------------------------------------------------------
# KMP_AFFINITY
# ---------------------------------------------------------------------------

_GRAN_ALIASES = {"fine": "thread", "package": "socket", "node": "numa_domain"}
_GRAN_PRINT = {"thread": "fine"}


@dataclass(frozen=True)
class KmpAffinity:
    """A ``KMP_AFFINITY`` setting.

    ``type`` is one of ``none, compact, scatter, balanced, explicit, disabled,
    logical, physical`` or ``None`` (no type given);  ``granularity`` a layer
    keyword (``thread`` for ``fine``, ``core``, ``socket``, ``numa_domain``,
    ``die``, ``tile``, ``l2_cache``, ..., or ``core_type`` /
    ``core_efficiency`` on hybrid CPUs) or ``None`` for the default;
    ``granularity_levels`` the numeric form ``granularity=<n>``.  Boolean
    modifiers are ``None`` when not given.
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


@dataclass
class _AffState:
    type: str | None = None
    bind: str | None = None  # proc-bind implied by the last type keyword
    gran: str | None = None
    gran_levels: int | None = None
    core_types_gran: bool = False
    core_effs_gran: bool = False
    proclist: ProcList | None = None
    verbose: bool | None = None
    warnings: bool | None = None
    respect: bool | None = None
    reset: bool | None = None
    dups: bool | None = None
    numbers: list[int] = field(default_factory=list)


def _parse_kmp_affinity(value: str, diag: _Diag, name: str = "KMP_AFFINITY") -> KmpAffinity:
    st = _AffState()
    guards: dict[str, int] = {}
    s = value
    n = len(s)
    buf = _skip_ws(s, 0)
    gran_set = False  # the runtime keeps this across tokens (see docs/semantics.md)

    def emit_skip(start: int, nxt: int, text: Callable[[str], str], detail: str | None = None) -> int:
        end = _skip_to(s, nxt, ",")
        diag.warn(text(s[start:end]), start, detail=detail and detail)
        return end + 1 if end < n else end

    def invalid(t: str) -> str:
        return f"{name}: parameter invalid, ignoring {_q(t)}."

    def guard(key: str, start: int, nxt: int) -> bool:
        c = guards.get(key, 0)
        guards[key] = c + 1
        if c:
            diag.warn(f"{name}: parameter has been specified already, ignoring {_q(s[start:nxt])}.", start)
            return False
        return True

    types = [("none", "none", "false"), ("scatter", "scatter", "intel"),
             ("compact", "compact", "intel"), ("logical", "logical", "intel"),
             ("physical", "physical", "intel"), ("explicit", "explicit", "intel"),
             ("balanced", "balanced", "intel"), ("disabled", "disabled", "false")]
    flags = [("verbose", "verbose", True), ("noverbose", "verbose", False),
             ("warnings", "warnings", True), ("nowarnings", "warnings", False),
             ("respect", "respect", True), ("norespect", "respect", False),
             ("reset", "reset", True), ("noreset", "reset", False),
             ("duplicates", "dups", True), ("dups", "dups", True),
             ("noduplicates", "dups", False), ("nodups", "dups", False)]

    while buf < n:
        start = buf
        nxt: int | None = None
        handled = False
        for tok, typ, bind in types:
            nxt = _match(tok, s, buf)
            if nxt is not None:
                if guard("type", start, nxt):
                    st.type = typ
                st.bind = bind
                handled = True
                break
        if not handled:
            for tok, attr, val in flags:
                nxt = _match(tok, s, buf)
                if nxt is not None:
                    if guard(attr, start, nxt):
                        setattr(st, attr, val)
                    handled = True
                    break
        if not handled:
            nxt = _match("granularity", s, buf)
            if nxt is None:
                nxt = _match("gran", s, buf)
            if nxt is not None:
                handled = True
                nxt = _skip_ws(s, nxt)
                if _ch(s, nxt) != "=":
                    buf = emit_skip(start, nxt, invalid,
                                    "granularity needs '=<layer>'")
                    continue
                nxt = _skip_ws(s, nxt + 1)
                buf = nxt
                gtype: str | None = None
                gflag = ""
                glevels: int | None = None
                if not gran_set:
                    for tok, flag in (("core_type", "types"), ("core_efficiency", "effs"),
                                      ("core_eff", "effs")):
                        e = _match(tok, s, buf)
                        if e is not None:
                            gtype, gflag, nxt = "core", flag, e
                            break
                    if gtype is None:
                        for layer in HW_LAYERS:
                            e = _match(layer, s, buf)
                            if e is not None:
                                gtype, nxt = layer, e
                                break
                    if gtype is None:
                        for alias, layer in _GRAN_ALIASES.items():
                            e = _match(alias, s, buf)
                            if e is not None:
                                gtype, nxt = layer, e
                                break
                    if gtype is None and _isdigit(_ch(s, buf)):
                        e = _skip_digits(s, buf)
                        glevels, nxt = _str_to_int(s, buf, e), e
                    if gtype is None and glevels is None:
                        buf = emit_skip(start, buf, invalid,
                                        "unknown granularity")
                        continue
                    gran_set = True
                    if guard("gran", start, nxt):
                        st.gran, st.gran_levels = gtype, glevels
                    if gflag == "types":
                        st.core_types_gran = True
                    elif gflag == "effs":
                        st.core_effs_gran = True
                else:
                    # A granularity was already set: the runtime's parser leaves
                    # the value unconsumed (reported below as trailing characters),
                    # except for core_type/core_eff which it always tries.
                    for tok, flag in (("core_type", "types"), ("core_efficiency", "effs"),
                                      ("core_eff", "effs")):
                        e = _match(tok, s, buf)
                        if e is not None:
                            guard("gran", start, e)
                            if flag == "types":
                                st.core_types_gran = True
                            else:
                                st.core_effs_gran = True
                            nxt = e
                            break
        if not handled:
            nxt = _match("proclist", s, buf)
            if nxt is not None:
                handled = True
                nxt = _skip_ws(s, nxt)
                if _ch(s, nxt) != "=":
                    buf = emit_skip(start, nxt, invalid,
                                    "proclist needs '=[...]'")
                    continue
                nxt = _skip_ws(s, nxt + 1)
                if _ch(s, nxt) != "[":
                    buf = emit_skip(start, nxt, invalid,
                                    "proclist needs '[' after '='")
                    continue
                nxt += 1
                buf = nxt
                pl, e = _parse_proc_id_list(name, s, buf, diag)
                if pl is None:
                    nxt = _skip_to(s, buf, "]")
                    if nxt < n:
                        nxt += 1
                    nxt = _skip_to(s, nxt, ",")
                    if nxt < n:
                        nxt += 1
                    buf = nxt
                    continue
                nxt = e
                if _ch(s, nxt) != "]":
                    buf = emit_skip(start, nxt, invalid,
                                    "proclist is not closed by ']'")
                    continue
                nxt += 1
                if guard("proclist", start, nxt):
                    st.proclist = pl
        if not handled and _isdigit(_ch(s, buf)):
            handled = True
            nxt = _skip_digits(s, buf)
            v = _str_to_int(s, buf, nxt)
            if len(st.numbers) < 2:
                st.numbers.append(v)
            else:
                diag.warn(f"{name}: too many integer parameters specified, ignoring {_q(s[start:])}.", start,
                          detail=f"too many integer parameters, ignoring {_q(s[start:nxt])}")
                st.numbers.append(v)
            buf = nxt
        if not handled:
            buf = emit_skip(start, buf, invalid)
            continue
        assert nxt is not None
        nxt = _skip_ws(s, nxt)
        if _ch(s, nxt) == ",":
            nxt = _skip_ws(s, nxt + 1)
        elif nxt < n:
            temp = nxt
            end = _skip_to(s, nxt, ",")
            diag.warn(f"{name}: extra trailing characters ignored: {_q(s[temp:end])}.", temp)
            buf = end + 1 if end < n else end
            continue
        buf = nxt

    count = len(st.numbers)
    numbers = st.numbers
    typ = st.type
    proclist = st.proclist
    permute: int | None = None
    offset: int | None = None
    if proclist is not None:
        if typ is None:
            diag.warn(f'{name}: proclist specified, setting affinity type to "explicit".',
                      0, detail='proclist given without the "explicit" type')
            typ = "explicit"
            st.bind = "intel"
        elif typ != "explicit":
            diag.warn(f'{name}: proclist specified without "explicit" affinity type, proclist ignored.',
                      0, detail=f'proclist given with the "{typ}" type (it needs "explicit")')
            proclist = None
    gran = st.gran
    if typ in ("logical", "physical"):
        if count > 0:
            offset = numbers[0]
        if count > 1:
            diag.warn(f"{name}: too many integer parameters specified for logical or physical type, "
                      f"ignoring {_q(str(numbers[1]))}.", 0)
    elif typ == "balanced":
        if count > 0:
            permute = numbers[0]
        if count > 1:
            offset = numbers[1]
        if gran is None and not (st.core_types_gran or st.core_effs_gran) and \
                (st.verbose or st.warnings is not False):
            diag.warn(f"{name}: granularity=core will be used.", error=False)
    elif typ in ("scatter", "compact"):
        if count > 0:
            permute = numbers[0]
        if count > 1:
            offset = numbers[1]
    elif typ == "explicit":
        if proclist is None:
            diag.warn(f'{name}: proclist not specified with explicit affinity type, using "none".', 0)
            typ = "none"
        if count > 0:
            diag.warn(f"{name}: 'explicit' type does not take any integer parameters, ignoring them.", 0)
    elif typ in ("none", "disabled"):
        if count > 0:
            diag.warn(f"{name}: '{typ}' type does not take any integer parameters, ignoring them.", 0)
    else:
        if count > 0:
            diag.warn(f"{name}: 'default' type does not take any integer parameters, ignoring them.", 0,
                      detail="integer parameters need an affinity type")
    # A later 'none'/'disabled' keyword (rejected as a repeated type) still
    # switches proc-bind off in the runtime, which then behaves as 'none'.
    if typ not in (None, "none", "disabled") and st.bind == "false":
        typ = "none"
        permute = offset = None
        proclist = None
    if st.core_types_gran:
        gran = "core_type"
    elif st.core_effs_gran:
        gran = "core_efficiency"
    return KmpAffinity(type=typ, granularity=gran, granularity_levels=st.gran_levels if gran is None else None,
                       permute=permute, offset=offset, proclist=proclist, verbose=st.verbose,
                       warnings=st.warnings, respect=st.respect, reset=st.reset, dups=st.dups)


# ---------------------------------------------------------------------------
# OMP_PLACES
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class SubPlace:
    """``start[:count[:stride]]`` inside ``{...}``."""

    start: int
    count: int | None = None
    stride: int | None = None

    def __str__(self) -> str:
        s = str(self.start)
        if self.count is not None:
            s += f":{self.count}"
            if self.stride is not None:
                s += f":{self.stride}"
        return s


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
        s = self.base_str()
        if self.count is not None:
            s += f":{self.count}"
            if self.stride is not None:
                s += f":{self.stride}"
        return s


@dataclass(frozen=True)
class OmpPlaces:
    """An ``OMP_PLACES`` setting: an abstract name (``threads``, ``cores``,
    ``sockets``, ``numa_domains``, ``ll_caches`` and the runtime's other layer
    names such as ``tiles``, ``l2_caches``, ``dice``; ``core_types`` /
    ``core_effs`` on hybrid CPUs) with an optional count and core attribute,
    or an explicit list of places."""

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


class _PlacesSyntax(Exception):
    def __init__(self, pos: int, detail: str):
        self.pos = pos
        self.detail = detail


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
        raise _PlacesSyntax(i, "expected a stride")
    j = _skip_digits(s, i)
    return sign * _str_to_int(s, i, j), j


def _parse_number(s: str, i: int, what: str) -> tuple[int, int]:
    i = _skip_ws(s, i)
    if not _isdigit(_ch(s, i)):
        raise _PlacesSyntax(i, f"expected {what}")
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
            raise _PlacesSyntax(i, "expected ',', ':' or '}'")
        count, i = _parse_number(s, i + 1, "a count")
        i = _skip_ws(s, i)
        if _ch(s, i) in ("}", ","):
            subs.append(SubPlace(start, count))
            if _ch(s, i) == "}":
                return tuple(subs), i
            i += 1
            continue
        if _ch(s, i) != ":":
            raise _PlacesSyntax(i, "expected ',', ':' or '}'")
        stride, i = _parse_signed(s, i + 1)
        i = _skip_ws(s, i)
        subs.append(SubPlace(start, count, stride))
        if _ch(s, i) == "}":
            return tuple(subs), i
        if _ch(s, i) == ",":
            i += 1
            continue
        raise _PlacesSyntax(i, "expected ',' or '}'")


def _parse_place(s: str, i: int) -> tuple[Place, int]:
    i = _skip_ws(s, i)
    c = _ch(s, i)
    if c == "{":
        subs, i = _parse_subplaces(s, i + 1)
        if _ch(s, i) != "}":
            raise _PlacesSyntax(i, "expected '}'")
        return Place(members=subs), i + 1
    if c == "!":
        inner, i = _parse_place(s, i + 1)
        return Place(exclude=inner), i
    if _isdigit(c):
        j = _skip_digits(s, i)
        return Place(proc=_str_to_int(s, i, j)), j
    raise _PlacesSyntax(i, "expected a place ('{...}', '!place' or a proc id)")


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
            raise _PlacesSyntax(i, "expected ',' or ':'")
        count, i = _parse_number(s, i + 1, "a count")
        i = _skip_ws(s, i)
        if i >= len(s) or s[i] == ",":
            places.append(Place(p.members, p.proc, p.exclude, count))
            if i >= len(s):
                break
            i += 1
            continue
        if s[i] != ":":
            raise _PlacesSyntax(i, "expected ',' or ':'")
        stride, i = _parse_signed(s, i + 1)
        i = _skip_ws(s, i)
        places.append(Place(p.members, p.proc, p.exclude, count, stride))
        if i >= len(s):
            break
        if s[i] == ",":
            i += 1
            continue
        raise _PlacesSyntax(i, "expected ',' or the end")
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
        except _PlacesSyntax as err:
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
    """An ``OMP_PROC_BIND`` setting: one policy per nesting level
    (``false``, ``true``, ``primary`` (``master`` is read as ``primary``),
    ``close``, ``spread``; or Intel's ``disabled``)."""

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
    """A ``KMP_HW_SUBSET`` setting; ``absolute`` is the ``:`` prefix."""

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
    invalid = (f'{name}: invalid value {_q(value)}, valid format is "N<item>[@N][,...][,Nt] '
               '(<item> can be S, N, L2, C, T  for Socket, NUMA Node, L2 Cache, Core, Thread)".')
    # canonicalize: drop spaces, upper-case, 'x' separates levels, 'o<digit>' is '@'
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
        diag.warn(invalid, 0, detail="empty or too long")
        return None
    text = "".join(chars)

    def bad(off: int, why: str) -> None:
        diag.warn(invalid, posmap[min(off, len(posmap) - 1)] if posmap else 0, detail=why)

    comps = text.split(",")
    if len(comps) > len(HW_LAYERS):
        bad(0, "too many components")
        return None
    items: list[HwSubsetItem] = []
    seen: set[str] = set()
    base = 0
    for comp in comps:
        cores = comp.split("&")
        cbase = base
        for cc in cores:
            off = cbase
            if _isdigit(cc[:1]):
                num: int | None = _atoi(cc)
                if num <= 0:
                    bad(off, "counts must be positive")
                    return None
                j = 0
                while j < len(cc) and _isdigit(cc[j]):
                    j += 1
                pos = cc[j:]
            elif cc[:1] == "*":
                num, pos = None, cc[1:]
            else:
                num, pos = None, cc
            offset = 0
            at = cc.find("@")
            colon = cc.find(":")
            attr: str | None = None
            if at >= 0:
                offset = _atoi(cc, at + 1)
            if colon >= 0:
                a = cc[colon + 1:]
                if at > colon:
                    a = cc[colon + 1:at]
                al = _low(a)
                if al in _CORE_ATTRS:
                    attr = al
                elif al[:3] == "eff":
                    k = 3
                    while k < len(a) and _isalpha(a[k]):
                        k += 1
                    if k >= len(a) or not _isdigit(a[k]):
                        bad(off + colon, "bad core attribute")
                        return None
                    attr = "eff" + str(_atoi(a, k))
                else:
                    bad(off + colon, "unknown core attribute")
                    return None
            # the layer name is what is left before '@' and ':'
            cut = len(pos)
            for mark in ("@", ":"):
                k = pos.find(mark)
                if k >= 0:
                    cut = min(cut, k)
            layer = _subset_layer(pos[:cut])
            if layer is None:
                bad(off, "unknown layer")
                return None
            if attr and layer != "core":
                bad(off, "only cores take an attribute")
                return None
            if layer != "core" and layer in seen:
                bad(off, f"{layer} given twice")
                return None
            seen.add(layer)
            items.append(HwSubsetItem(layer, num, offset, attr))
            cbase += len(cc) + 1
        base += len(comp) + 1
    return KmpHwSubset(tuple(items), absolute)


# ---------------------------------------------------------------------------
# OMP_NUM_THREADS
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class NumThreads:
    """An ``OMP_NUM_THREADS`` setting: one team size per nesting level
    (``None`` where a level is left empty, e.g. ``,4``), or ``all`` (every
    processor of the machine)."""

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
    """Parse a ``KMP_AFFINITY`` string (``granularity=fine,compact,1,0``)."""
    return _run(_parse_kmp_affinity, value, strict, "KMP_AFFINITY")[0]


def parse_omp_places(value: str, *, strict: bool = True) -> OmpPlaces:
    """Parse an ``OMP_PLACES`` string (``cores(4)``, ``{0:4}:4:4``, ``!{0}``)."""
    return _run(_parse_omp_places, value, strict, "OMP_PLACES")[0]


def parse_omp_proc_bind(value: str, *, strict: bool = True) -> OmpProcBind:
    """Parse an ``OMP_PROC_BIND`` string (``spread,close``)."""
    return _run(_parse_omp_proc_bind, value, strict, "OMP_PROC_BIND")[0]


def parse_kmp_hw_subset(value: str, *, strict: bool = True) -> KmpHwSubset | None:
    """Parse a ``KMP_HW_SUBSET`` string (``2s,4c@2,1t``); lenient mode returns
    ``None`` where the runtime ignores the whole setting."""
    return _run(_parse_kmp_hw_subset, value, strict, "KMP_HW_SUBSET")[0]


def parse_num_threads(value: str, *, strict: bool = True) -> NumThreads | None:
    """Parse an ``OMP_NUM_THREADS`` string (``8`` or ``8,2``); lenient mode
    returns ``None`` where the runtime ignores it."""
    return _run(_parse_num_threads, value, strict, "OMP_NUM_THREADS")[0]


def parse_gomp_cpu_affinity(value: str, *, strict: bool = True) -> ProcList | None:
    """Parse a ``GOMP_CPU_AFFINITY`` list (``0 3 1-2 4-15:2``)."""
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
    does: never raises for bad input; returns the effective value (``None``
    where the runtime ignores the variable) and the messages it prints."""
    try:
        fn = _PARSERS[variable]
    except KeyError:
        raise ValueError(f"not an affinity variable: {variable!r}") from None
    return _run(fn, value, False, variable)


def parse_strict(variable: str, value: str) -> tuple[Any, list[Diagnostic]]:
    """Like :func:`parse_lenient` but raises :class:`SpecError` on malformed
    input; notices about well-formed input are returned."""
    try:
        fn = _PARSERS[variable]
    except KeyError:
        raise ValueError(f"not an affinity variable: {variable!r}") from None
    return _run(fn, value, True, variable)


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
    """

    kmp_affinity: KmpAffinity | None = None
    omp_places: OmpPlaces | None = None
    omp_proc_bind: OmpProcBind | None = None
    kmp_hw_subset: KmpHwSubset | None = None
    num_threads: NumThreads | None = None
    gomp_cpu_affinity: ProcList | None = None

    def to_env(self) -> dict[str, str]:
        """The environment variables (canonical strings), in sorted order."""
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
        """Strictly parse the affinity variables of a mapping (others ignored)."""
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
        """Read ``KEY=VALUE KEY=VALUE ...`` (values must not contain spaces)."""
        return Settings.from_env(parse_assignments(text))
