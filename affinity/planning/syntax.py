"""What the parsers of every runtime's settings share: the layer vocabulary,
diagnostics, and scanning helpers that mirror the C helpers of the OpenMP
runtimes (``__kmp_match_str``, ``__kmp_str_to_int``, glibc ``atoi``).

The grammars themselves live with the runtime whose reading they follow
(``planning/kmp.py`` for Intel's ``KMP_*`` variables) or, for the
standard OpenMP variables, in ``planning/spec.py``.
"""

from __future__ import annotations

from ..errors import ArgumentTypeError, SpecError
from ..record import record
from typing import Callable, TypeVar


INT_MAX = 2**31 - 1

# ---------------------------------------------------------------------------
# Hardware layer vocabulary (kmp_hw_t in the runtime)
# ---------------------------------------------------------------------------

#: Canonical layer keywords, in the runtime's enumeration order (KMP_FOREACH_HW_TYPE).
HW_LAYERS = ("socket", "proc_group", "numa_domain", "die", "ll_cache", "l3_cache",
             "tile", "module", "l2_cache", "l1_cache", "core", "thread")
PLURAL = {"socket": "sockets", "proc_group": "proc_groups", "numa_domain": "numa_domains",
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


#: The core attributes of ``OMP_PLACES=cores:<attr>`` and ``KMP_HW_SUBSET`` items
#: (besides ``eff<N>``).
CORE_ATTRS = ("intel_atom", "intel_core")


def catalog(layer: str, plural: bool = False) -> str:
    """The runtime's printed name of a layer (``numa_domain`` -> ``NUMA domain``)."""
    return CATALOG[layer][1 if plural else 0]


# ---------------------------------------------------------------------------
# Diagnostics
# ---------------------------------------------------------------------------

@record
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
    hint : str or None
        What the input was probably meant to be, or what an ignored word made of
        the rest (``did you mean "compact"?``): said beside the runtime's words by
        the lenient faces (:func:`affinity.planning.planner.hinted`), and in strict
        mode's error instead of ``detail``.
    """

    text: str
    error: bool
    pos: int | None = None
    detail: str | None = None
    hint: str | None = None


@record
class Dialect:
    """Where a runtime of the Intel/LLVM family reads or applies its settings
    differently from Intel's libiomp5 (the reference: :data:`INTEL`).

    Attributes
    ----------
    name : str
        The runtime's registry name.
    wrap_ints : bool
        ``__kmp_str_to_int`` lets a number beyond ``INT_MAX`` wrap around as a C
        ``int`` does (LLVM's libomp) instead of saturating at ``INT_MAX`` (libiomp5).
    places_fallback : str
        The abstract place name a malformed ``OMP_PLACES`` falls back to.
    numa_layer : bool
        The runtime's table of the machine has a NUMA layer read from sysfs
        (libiomp5); LLVM's libomp knows NUMA domains only through hwloc.
    strict_crashes : bool
        The runtime crashes where libiomp5 warns and goes on: a ``proclist`` with
        an affinity type other than ``explicit``, an ``OMP_NUM_THREADS`` without a
        valid team size, an ``OMP_PLACES`` exclusion that sets bits beyond the
        machine's OS procs (libomp 19).
    """

    name: str
    wrap_ints: bool = False
    places_fallback: str = "threads"
    numa_layer: bool = True
    strict_crashes: bool = False


#: Intel's libiomp5: the reference every other dialect is described against.
INTEL = Dialect("intel")


class Diag:
    def __init__(self, strict: bool, value: str, what: str, dialect: Dialect = INTEL):
        self.strict = strict
        self.value = value
        self.what = what
        self.dialect = dialect
        self.items: list[Diagnostic] = []

    def warn(self, text: str, pos: int | None = None, *, error: bool = True,
             detail: str | None = None, refused: str | None = None, hint: str | None = None) -> None:
        """Say ``text`` (what the runtime prints); with strict parsing, an error is
        raised instead, worded ``refused`` where the runtime's words do not fit an
        error (``... ignoring "x"``: nothing is ignored, the call fails)."""
        if self.strict and error:
            msg = refused or text
            prefix = self.what + ": "
            if msg.startswith(prefix):
                msg = msg[len(prefix):]
            if hint or detail:
                msg = f"{msg} ({hint or detail})"
            raise SpecError(msg, self.value, pos if pos is not None else 0, what=self.what)
        self.items.append(Diagnostic(text, error, pos, detail, hint))


def quote(s: str) -> str:
    return '"' + s + '"'


# ---------------------------------------------------------------------------
# Low-level scanning helpers mirroring the runtime's C helpers
# ---------------------------------------------------------------------------

def skip_ws(s: str, i: int) -> int:
    n = len(s)
    while i < n and s[i] in " \t":
        i += 1
    return i


def skip_digits(s: str, i: int) -> int:
    n = len(s)
    while i < n and "0" <= s[i] <= "9":
        i += 1
    return i


def skip_to(s: str, i: int, c: str) -> int:
    j = s.find(c, i)
    return len(s) if j < 0 else j


def char_at(s: str, i: int) -> str:
    return s[i] if i < len(s) else ""


def isdigit(c: str) -> bool:
    return c != "" and "0" <= c <= "9"


def isalpha(c: str) -> bool:
    return c != "" and ("a" <= c <= "z" or "A" <= c <= "Z")


def isalnum(c: str) -> bool:
    return isdigit(c) or isalpha(c)


def upper(s: str) -> str:
    """C ``toupper`` (ASCII only, one character per character)."""
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in s)


def lower(s: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in s)


def match(token: str, s: str, i: int) -> int | None:
    """``__kmp_match_str``: case-insensitive; the whole token must match at
    ``s[i:]`` (``s`` may go on).  Returns the index after the token."""
    n = len(token)
    seg = s[i:i + n]
    if len(seg) == n and (seg.lower() if seg.isascii() else lower(seg)) == token.lower():
        return i + n
    return None


def str_to_int(s: str, i: int, j: int, wrap: bool = False) -> int:
    """``__kmp_str_to_int`` on the digits ``s[i:j]``, seeing the rest of the
    string as the runtime does: a size suffix right after the digits
    (``b``, ``k``, ``m``) multiplies the value when it ends the string and
    makes it 0 otherwise.  Intel's runtime saturates at INT_MAX; with ``wrap``
    (LLVM's libomp) the digits accumulate in a C ``int`` that wraps around."""
    v = int(s[i:j]) if j > i else 0
    if wrap:
        v &= 0xFFFFFFFF
        v = v - 2**32 if v > INT_MAX else v
    elif v > INT_MAX:
        v = INT_MAX
    c = s[j] if j < len(s) else ""
    factor = {"b": 1, "B": 1, "k": 1024, "K": 1024, "m": 1024 * 1024, "M": 1024 * 1024}.get(c)
    if factor is None:
        return v
    if j + 1 < len(s):
        return 0
    return INT_MAX if v > INT_MAX // factor else v * factor


def atoi(s: str, i: int = 0) -> int:
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


def cdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------

T = TypeVar("T")


def run_parser(fn: Callable[[str, Diag, str], T], value: str, strict: bool, what: str,
               dialect: Dialect = INTEL) -> tuple[T, list[Diagnostic]]:
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{what} must be a string, not {type(value).__name__}")
    diag = Diag(strict, value, what, dialect)
    v = fn(value, diag, what)
    return v, diag.items
