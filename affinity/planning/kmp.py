"""Intel's settings syntax: ``KMP_AFFINITY``, ``KMP_HW_SUBSET`` (and its old name
``KMP_PLACE_THREADS``) and the proc lists of ``KMP_AFFINITY=proclist=[...]`` and
``GOMP_CPU_AFFINITY`` as Intel's runtime (libiomp5, and LLVM's libomp, which
shares its source) reads them.

* ``KMP_AFFINITY``  -> :class:`KmpAffinity` (:func:`parse_kmp_affinity`)
* ``KMP_HW_SUBSET`` -> :class:`KmpHwSubset` (:func:`parse_kmp_hw_subset`)
* ``GOMP_CPU_AFFINITY`` -> :class:`ProcList` (:func:`parse_gomp_cpu_affinity`)

Values are frozen records (:mod:`affinity.record`) whose ``str()`` is canonical and parses back to an
equal value; the strict and lenient modes are those of :mod:`affinity.planning.spec`.
The grammar and the fallbacks follow ``kmp_settings.cpp``.  It sits beside
:mod:`affinity.planning.spec` (the table of every runtime's variables, which reads these
values) and below ``intel/`` (the runtime's steps, which act on them): before issue #36
it lived in ``intel/`` and the folder ``intel/`` and ``spec.py`` imported each other.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import MalformedValue, PlanError
from ..record import field, record
from .syntax import (CORE_ATTRS, HW_LAYERS, Diag, atoi, cdiv, char_at, isalnum, isalpha,
                      isdigit, lower, match, quote, run_parser, skip_digits, skip_to, skip_ws, str_to_int, upper)
from typing import Any, Callable


__all__ = ["HwSubsetItem", "KmpAffinity", "KmpHwSubset", "ProcList", "ProcRange", "parse_gomp_cpu_affinity",
           "parse_kmp_affinity", "parse_kmp_hw_subset"]

#: The ``KMP_AFFINITY`` types.
AFFINITY_TYPES = ("none", "scatter", "compact", "logical", "physical", "explicit", "balanced",
                  "disabled")


# ---------------------------------------------------------------------------
# Proc lists (KMP_AFFINITY proclist=[...], GOMP_CPU_AFFINITY)
# ---------------------------------------------------------------------------

@record
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


@record
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


def _parse_proc_id_list(var: str, s: str, i: int, diag: Diag) -> tuple[ProcList | None, int]:
    """``__kmp_parse_affinity_proc_id_list``: parses from ``s[i]`` up to the
    first character that cannot continue the list.  Returns (list, end) or
    (None, i) after a warning."""
    items: list[Any] = []
    nxt = i
    try:
        while True:
            nxt = skip_ws(s, nxt)
            c = char_at(s, nxt)
            if c == "{":
                item, nxt = _parse_proc_set(s, nxt + 1, diag.dialect.wrap_ints)
            elif isdigit(c):
                item, nxt = _parse_proc_range(s, nxt, diag.dialect.wrap_ints)
            elif c == "" or items:
                break
            else:
                raise MalformedValue(nxt, "expected a proc id, a range or a set")
            items.append(item)
            nxt = skip_ws(s, nxt)
            if char_at(s, nxt) == ",":
                nxt += 1
    except MalformedValue as err:
        detail = None if err.detail is None else f"{err.what}: {err.detail}"
        diag.warn(f"{var}: {err.what}, not using affinity.", err.pos, detail=detail)
        return None, i
    return ProcList(tuple(items)), nxt


def _proc_id(s: str, i: int, expected: str, wrap: bool = False) -> tuple[int, int]:
    """One proc id of a proc list, blanks before it skipped: (id, end)."""
    i = skip_ws(s, i)
    if not isdigit(char_at(s, i)):
        raise MalformedValue(i, expected)
    j = skip_digits(s, i)
    return str_to_int(s, i, j, wrap), j


def _parse_proc_set(s: str, i: int, wrap: bool = False) -> tuple[tuple[int, ...], int]:
    """The ``{a,b,...}`` branch of ``__kmp_parse_affinity_proc_id_list`` (from
    after the ``{``; commas optional): one place, its ids as written, repeats
    kept (the runtime looks them up, and warns about invalid ones, in that
    order).  Returns (ids, end)."""
    first, nxt = _proc_id(s, i, "expected a proc id after '{'", wrap)
    members = [first]
    while True:
        nxt = skip_ws(s, nxt)
        if char_at(s, nxt) == "}":
            return tuple(members), nxt + 1
        if char_at(s, nxt) == ",":
            nxt += 1
        member, nxt = _proc_id(s, nxt, "expected a proc id or '}'", wrap)
        members.append(member)


def _parse_proc_range(s: str, i: int, wrap: bool = False) -> tuple[int | ProcRange, int]:
    """The ``start[-end[:stride]]`` branch of ``__kmp_parse_affinity_proc_id_list``
    (``s[i]`` is a digit): a proc id, or a range checked as the runtime checks it."""
    j = skip_digits(s, i)
    start = str_to_int(s, i, j, wrap)
    nxt = skip_ws(s, j)
    if char_at(s, nxt) != "-":
        return start, nxt
    end, nxt = _proc_id(s, nxt + 1, "expected the end of the range", wrap)
    stride = 1
    nxt = skip_ws(s, nxt)
    if char_at(s, nxt) == ":":
        nxt = skip_ws(s, nxt + 1)
        sign = 1
        if char_at(s, nxt) == "-":
            sign, nxt = -1, nxt + 1
        stride, nxt = _proc_id(s, nxt, "expected the stride", wrap)
        stride *= sign
    _check_proc_range(start, end, stride, i)
    return ProcRange(start, end, stride), nxt


def _check_proc_range(start: int, end: int, stride: int, pos: int) -> None:
    """The range checks of ``__kmp_parse_affinity_proc_id_list`` (zero stride,
    bounds against the stride's sign, at most 65536 steps)."""
    if stride == 0:
        raise MalformedValue(pos, None, "range error (zero stride)")
    if stride > 0 and start > end:
        raise MalformedValue(pos, None, f"range error ({start} > {end})")
    if stride < 0 and start < end:
        raise MalformedValue(pos, None, f"range error ({start} < {end} & stride < 0)")
    if cdiv(end - start, stride) > 65536:
        raise MalformedValue(pos, None, f"range error (({end}-{start})/{stride} too big)")


# ---------------------------------------------------------------------------
# KMP_AFFINITY
# ---------------------------------------------------------------------------

_GRAN_ALIASES = {"fine": "thread", "package": "socket", "node": "numa_domain"}
_GRAN_PRINT = {"thread": "fine"}


@record
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
    low = lower(value)
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


@record(frozen=False)
class _AffState:
    """What ``__kmp_parse_affinity_env`` reads and keeps while it walks the tokens."""

    s: str
    name: str
    diag: Diag
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
    ignored: list[str] = field(default_factory=list)  #: words that are no keyword, as written

    def guard(self, key: str, start: int, nxt: int) -> bool:
        """The runtime's ``set_*`` guards: False (with a warning) when ``key`` was given already."""
        count = self.guards.get(key, 0)
        self.guards[key] = count + 1
        if count:
            self.diag.warn(f"{self.name}: parameter has been specified already, "
                           f"ignoring {quote(self.s[start:nxt])}.", start,
                           refused=f"{self.name}: {quote(self.s[start:nxt])}: a {key} was specified already")
            return False
        return True

    def skip_invalid(self, start: int, nxt: int, detail: str | None = None, *, unknown: bool = False) -> int:
        """Report the token from ``start`` to the next comma as invalid; the index after
        that comma.  ``unknown``: the token is no keyword at all (a typo: the keyword
        it is closest to, if any, is the detail)."""
        end = skip_to(self.s, nxt, ",")
        token = self.s[start:end].strip()
        what, hint = "invalid parameter", None
        if unknown:
            self.ignored.append(token)
            what = "unknown word"
        if unknown or "=" in token:  # a keyword mistyped before its '=' is matched by its prefix (gran)
            close = closest_keyword(token)
            hint = f"did you mean {quote(close)}?" if close and close != token.lower() else None
        self.diag.warn(f"{self.name}: parameter invalid, ignoring {quote(self.s[start:end])}.", start,
                       detail=detail, hint=hint, refused=f"{self.name}: {what} {quote(token)}")
        return min(end + 1, len(self.s))

    def after_token(self, nxt: int) -> int:
        """The end of each token: a comma (blanks around it skipped) or the end of the
        string; anything else is reported up to the next comma.  The next token's index."""
        s = self.s
        nxt = skip_ws(s, nxt)
        if char_at(s, nxt) == ",":
            return skip_ws(s, nxt + 1)
        if nxt < len(s):
            end = skip_to(s, nxt, ",")
            self.diag.warn(f"{self.name}: extra trailing characters ignored: {quote(s[nxt:end])}.", nxt,
                           refused=f"{self.name}: extra trailing characters {quote(s[nxt:end])}")
            return min(end + 1, len(s))
        return nxt

    def mark_core_gran(self, flag: str) -> None:
        """Record ``granularity=core_type`` (``types``) or ``core_eff[iciency]`` (``effs``)."""
        if flag == "types":
            self.core_types_gran = True
        else:
            self.core_effs_gran = True


def _parse_kmp_affinity(value: str, diag: Diag, name: str = "KMP_AFFINITY") -> KmpAffinity:
    """``__kmp_parse_affinity_env``: the token loop (each token a keyword, a
    ``granularity=``, a ``proclist=`` or an integer), then the end-of-parse resolution."""
    st = _AffState(value, name, diag)
    buf = skip_ws(value, 0)
    while buf < len(value):
        for clause in (_aff_keyword, _aff_assignment, _aff_integer):
            nxt = clause(st, buf)
            if nxt is not None:
                buf = nxt
                break
        else:
            buf = st.skip_invalid(buf, buf, unknown=True)
    return _aff_finish(st)


def closest_keyword(token: str) -> str | None:
    """The ``KMP_AFFINITY`` keyword a mistyped ``token`` was probably meant to be
    (``compcat``: ``compact``; ``granulatiry=fine``: ``granularity=fine``), or None."""
    import difflib  # lazy: only for a malformed value

    name, eq, value = token.lower().partition("=")
    words = ([k for k, _, _ in _AFF_ASSIGNMENTS] if eq else
             [t for t, _ in _AFF_TYPES] + [f for f, _, _ in _AFF_FLAGS])
    close = difflib.get_close_matches(name.strip(), words, n=1, cutoff=0.7)
    return f"{close[0]}{eq}{value}" if close else None


def _aff_keyword(st: _AffState, start: int) -> int | None:
    """The type keywords (each also sets proc-bind) and the boolean modifiers of
    ``__kmp_parse_affinity_env``.  The next token's index, or None if no keyword."""
    for typ, bind in _AFF_TYPES:
        nxt = match(typ, st.s, start)
        if nxt is not None:
            if st.guard("type", start, nxt):
                st.type = typ
            st.bind = bind
            return st.after_token(nxt)
    for tok, attr, val in _AFF_FLAGS:
        nxt = match(tok, st.s, start)
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
        nxt = match(keyword, s, start)
        if nxt is not None:
            nxt = skip_ws(s, nxt)
            if char_at(s, nxt) != "=":
                return st.skip_invalid(start, nxt, missing)
            return clause(st, start, skip_ws(s, nxt + 1))
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
        found = _layer_gran(st.s, i, st.diag.dialect.wrap_ints)
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
        e = match(tok, s, i)
        if e is not None:
            return flag, e
    return None


def _layer_gran(s: str, i: int, wrap: bool = False) -> tuple[str | None, int | None, int] | None:
    """A layer keyword, an alias or a number of levels at ``s[i]``: (layer, levels, end), or None."""
    for layer in HW_LAYERS:
        e = match(layer, s, i)
        if e is not None:
            return layer, None, e
    for alias, layer in _GRAN_ALIASES.items():
        e = match(alias, s, i)
        if e is not None:
            return layer, None, e
    if isdigit(char_at(s, i)):
        e = skip_digits(s, i)
        return None, str_to_int(s, i, e, wrap), e
    return None


def _aff_proclist(st: _AffState, start: int, i: int) -> int:
    """The value of ``proclist=[...]`` in ``__kmp_parse_affinity_env`` (``s[i]``,
    after the ``=``).  The next token's index."""
    s = st.s
    if char_at(s, i) != "[":
        return st.skip_invalid(start, i, "proclist needs '[' after '='")
    pl, end = _parse_proc_id_list(st.name, s, i + 1, st.diag)
    if pl is None:
        # resume after the closing ']' and the comma after it
        close = min(skip_to(s, i + 1, "]") + 1, len(s))
        return min(skip_to(s, close, ",") + 1, len(s))
    if char_at(s, end) != "]":
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
    if not isdigit(char_at(s, start)):
        return None
    nxt = skip_digits(s, start)
    if len(st.numbers) >= 2:
        st.diag.warn(f"{st.name}: too many integer parameters specified, ignoring {quote(s[start:])}.", start,
                     refused=f"{st.name}: too many integer parameters: {quote(s[start:nxt])} is a third")
    st.numbers.append(str_to_int(s, start, nxt, st.diag.dialect.wrap_ints))
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
        if st.diag.dialect.strict_crashes:
            raise PlanError(f"{st.name}={st.s!r}: a proclist with the {st.type!r} type: LLVM's libomp 19 warns "
                            "that it ignores the proclist, then crashes (SIGSEGV)")


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
                         f"ignoring {quote(str(numbers[1]))}.", 0,
                         refused=f"{name}: the {typ} type takes one integer parameter, not two")
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
            typo = (f"the type is 'default' because {quote(st.ignored[0])} was ignored"
                    if typ is None and st.ignored else None)  # the type the user meant was mistyped
            st.diag.warn(f"{name}: '{label}' type does not take any integer parameters, ignoring them.", 0,
                         refused=f"{name}: the '{label}' type does not take integer parameters",
                         detail="integer parameters need an affinity type" if typ is None else None, hint=typo)
    return permute, offset


# ---------------------------------------------------------------------------
# KMP_HW_SUBSET
# ---------------------------------------------------------------------------

_SUBSET_NAMES = {"socket": "s", "core": "c", "thread": "t", "numa_domain": "n", "die": "d",
                 "tile": "tile", "module": "module", "l1_cache": "l1", "l2_cache": "l2",
                 "l3_cache": "l3", "ll_cache": "ll", "proc_group": "proc_group"}


@record
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


@record
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
    while end < len(token) and (isalnum(token[end]) or token[end] == "_"):
        end += 1
    possible = list(HW_LAYERS)
    idx = 0
    while len(possible) > 1 and idx < end:
        c = upper(token[idx])
        possible = [p for p in possible if not (idx < len(p) and upper(p[idx]) != c)]
        idx += 1
    if len(possible) > 1:
        # the runtime returns the first of thread/core/socket in list order
        for p in possible:
            if p in ("thread", "core", "socket"):
                return p
        return None
    return possible[0] if possible else None


def _parse_kmp_hw_subset(value: str, diag: Diag, name: str = "KMP_HW_SUBSET") -> KmpHwSubset | None:
    """``__kmp_stg_parse_hw_subset``: canonicalizes the string, then reads its
    items; any error makes the runtime ignore the whole setting (None)."""
    invalid = (f'{name}: invalid value {quote(value)}, valid format is "N<item>[@N][,...][,Nt] '
               '(<item> can be S, N, L2, C, T  for Socket, NUMA Node, L2 Cache, Core, Thread)".')
    canonical = _subset_canonical(value)
    if canonical is None:
        diag.warn(invalid, 0, detail="empty or too long")
        return None
    text, posmap, absolute = canonical
    try:
        items = _subset_items(text)
    except MalformedValue as err:
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
        c = upper(ch)
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
    (cores excepted).  Raises :class:`MalformedValue` with an index into ``text``."""
    comps = text.split(",")
    if len(comps) > len(HW_LAYERS):
        raise MalformedValue(0, "too many components")
    items: list[HwSubsetItem] = []
    seen: set[str] = set()
    base = 0
    for comp in comps:
        off = base
        for cc in comp.split("&"):
            item = _subset_item(cc, off)
            if item.layer != "core" and item.layer in seen:
                raise MalformedValue(off, f"{item.layer} given twice")
            seen.add(item.layer)
            items.append(item)
            off += len(cc) + 1
        base += len(comp) + 1
    return tuple(items)


def _subset_item(cc: str, off: int) -> HwSubsetItem:
    """One ``[n|*]ID[@offset][:attr]`` item of ``__kmp_stg_parse_hw_subset`` (``off``:
    its index in the canonical text, for errors)."""
    if isdigit(cc[:1]):
        num: int | None = atoi(cc)
        if num <= 0:
            raise MalformedValue(off, "counts must be positive")
        pos = cc[skip_digits(cc, 0):]
    elif cc[:1] == "*":
        num, pos = None, cc[1:]
    else:
        num, pos = None, cc
    at = cc.find("@")
    colon = cc.find(":")
    offset = atoi(cc, at + 1) if at >= 0 else 0
    attr = _subset_attr(cc, colon, at, off) if colon >= 0 else None
    # the layer name is what is left before '@' and ':'
    cut = len(pos)
    for mark in ("@", ":"):
        k = pos.find(mark)
        if k >= 0:
            cut = min(cut, k)
    layer = _subset_layer(pos[:cut])
    if layer is None:
        raise MalformedValue(off, "unknown layer")
    if attr and layer != "core":
        raise MalformedValue(off, "only cores take an attribute")
    return HwSubsetItem(layer, num, offset, attr)


def _subset_attr(cc: str, colon: int, at: int, off: int) -> str:
    """The ``:attr`` of an item (``intel_atom``, ``intel_core`` or ``eff<N>``), as
    ``__kmp_stg_parse_hw_subset`` reads it."""
    a = cc[colon + 1:at] if at > colon else cc[colon + 1:]
    al = lower(a)
    if al in CORE_ATTRS:
        return al
    if al[:3] != "eff":
        raise MalformedValue(off + colon, "unknown core attribute")
    k = 3
    while k < len(a) and isalpha(a[k]):
        k += 1
    if k >= len(a) or not isdigit(a[k]):
        raise MalformedValue(off + colon, "bad core attribute")
    return "eff" + str(atoi(a, k))


# ---------------------------------------------------------------------------
# GOMP_CPU_AFFINITY
# ---------------------------------------------------------------------------

def _parse_gomp(value: str, diag: Diag, name: str = "GOMP_CPU_AFFINITY") -> ProcList | None:
    pl, e = _parse_proc_id_list(name, value, 0, diag)
    if pl is None:
        return None
    e = skip_ws(value, e)
    if e < len(value):
        diag.warn(f"{name}: syntax error, not using affinity.", e, detail="unexpected characters")
        return None
    return pl


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
    return run_parser(_parse_kmp_affinity, value, strict, "KMP_AFFINITY")[0]


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
    return run_parser(_parse_kmp_hw_subset, value, strict, "KMP_HW_SUBSET")[0]


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
    return run_parser(_parse_gomp, value, strict, "GOMP_CPU_AFFINITY")[0]
