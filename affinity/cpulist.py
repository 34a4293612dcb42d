"""CPU-list strings as the kernel writes them (``0-3,8-11``) and back, and
numactl's form of them (:class:`IdList`: ``all``, ``+`` relative, ``!`` inverted).

Every CPU or node id that enters the library from outside -- a list's text, a set
passed to a binding call -- is read by :func:`parse_list` or :func:`check_id`: an
``int`` (not a ``bool``, not a float) at least 0 and below a bound, written in ASCII
digits.  A range is checked against the bound before it is expanded, so
``0-99999999`` is refused at once instead of filling memory.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

from .errors import ArgumentTypeError, PlanError, SpecError
from .record import record

__all__ = ["MAX_CPUS", "MAX_NODES", "IdList", "check_id", "check_ids", "format_list", "parse_list",
           "runs"]

#: The most CPUs an id may name: Linux runs on at most 8,192 (``NR_CPUS`` with
#: ``CONFIG_MAXSMP``), so a CPU id is below 8192.
MAX_CPUS = 8192
#: The most NUMA nodes: ``MAX_NUMNODES`` with ``CONFIG_NODES_SHIFT=10``.
MAX_NODES = 1024
#: The longest id text read (a bound is 4 digits; a few more say "too large" clearly).
_MAX_DIGITS = 12


def _limit_for(what: str) -> int:
    return MAX_NODES if what.lower().startswith("node") else MAX_CPUS


def runs(cpus: Iterable[int]) -> list[tuple[int, int]]:
    """``{0, 1, 2, 3, 8}`` -> ``[(0, 3), (8, 8)]``: the maximal runs of consecutive ids,
    as (first, last), in increasing order."""
    out: list[tuple[int, int]] = []
    for c in sorted(set(cpus)):
        if out and c == out[-1][1] + 1:
            out[-1] = (out[-1][0], c)
        else:
            out.append((c, c))
    return out


def format_list(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 3, 8}`` -> ``"0-3,8"`` (sysfs ``cpulist`` / ``taskset -c`` form)."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs(cpus))


def parse_list(text: str, what: str = "CPU", limit: int | None = None) -> frozenset[int]:
    """``"0-3,8,10-14:2"`` -> frozenset of ints.

    Accepts the kernel's cpulist syntax, including the ``a-b:stride`` form.

    Parameters
    ----------
    text : str
        The list.
    what : str
        ``"CPU"`` or ``"node"``: names the ids in messages and picks the default bound.
    limit : int, optional
        Every id must be below it (default :data:`MAX_CPUS` for CPUs,
        :data:`MAX_NODES` for nodes).  Ranges are checked before they are expanded.

    Raises
    ------
    SpecError
        (a ``ValueError``) naming the bad item: not ASCII digits, a reversed range, a
        stride of 0, or an id at or beyond the bound.
    """
    bound = _limit_for(what) if limit is None else limit
    out: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    for item in text.split(","):
        item = item.strip()
        stride = 1
        if ":" in item:
            item, _, s = item.partition(":")
            stride = _int(s, text, what, None)
            if stride <= 0:
                raise SpecError(f"bad stride {s!r} in {what} list {text!r}")
        if "-" in item:
            a, _, b = item.partition("-")
            lo, hi = _int(a, text, what, bound), _int(b, text, what, bound)
            if hi < lo:
                raise SpecError(f"bad range {item!r} in {what} list {text!r}")
            out.update(range(lo, hi + 1, stride))
        else:
            out.add(_int(item, text, what, bound))
    return frozenset(out)


def _int(s: str, text: str, what: str, bound: int | None) -> int:
    s = s.strip()
    if not (s.isascii() and s.isdigit()):  # str.isdigit alone accepts '²' and '٣'
        raise SpecError(f"bad {what} number {s!r} in {what} list {text!r}")
    if len(s) > _MAX_DIGITS or (bound is not None and int(s) >= bound):
        shown = f"{s[:_MAX_DIGITS]}... ({len(s)} digits)" if len(s) > _MAX_DIGITS else s
        raise SpecError(f"{shown} in {what} list {text[:80]!r} is out of range"
                        + (f": {what} ids are 0 to {bound - 1}" if bound is not None else ""))
    return int(s)


def check_id(value: object, what: str = "CPU", limit: int | None = None, where: str = "") -> int:
    """``value`` as a checked id: an integer (``int`` or anything with ``__index__``,
    never a ``bool``), at least 0 and below ``limit`` (default by ``what``, as for
    :func:`parse_list`).  ``where`` names the caller in the message.

    Raises
    ------
    SpecError
        (a ``ValueError``) naming the caller and the bad value.
    """
    bound = _limit_for(what) if limit is None else limit
    try:
        if isinstance(value, bool):
            raise TypeError
        i = operator.index(value)  # type: ignore[call-overload]
    except TypeError:
        raise SpecError(f"{where + ': ' if where else ''}{what} id {value!r} is not an integer"
                        ) from None
    if not 0 <= i < bound:
        raise SpecError(f"{where + ': ' if where else ''}{what} id {i if i.bit_length() < 64 else '(huge)'}"
                        f" is out of range: {what} ids are 0 to {bound - 1}")
    return i


def check_ids(values: Iterable[object], what: str = "CPU", limit: int | None = None, where: str = ""
              ) -> frozenset[int]:
    """:func:`check_id` on each of ``values``, as a frozenset (a string is refused:
    ``"12"`` would otherwise be the ids 1 and 2).

    Raises
    ------
    SpecError
        (a ``ValueError``) a string, or a bad id (:func:`check_id`).
    ArgumentTypeError
        (a ``TypeError``) not a collection: one id (``0``) where a set of them is wanted.
    """
    if isinstance(values, (str, bytes)):
        raise SpecError(f"{where + ': ' if where else ''}expected {what} ids, got the string {values!r}"
                        f" (parse_list reads a list's text)")
    if not isinstance(values, Iterable):
        shown = repr(values) if len(repr(values)) <= 40 else repr(values)[:40] + "..."
        raise ArgumentTypeError(f"{where + ': ' if where else ''}expected a set of {what} ids "
                                f"({{{shown}}} for one), got {type(values).__name__} {shown}")
    return frozenset(check_id(v, what, limit, where) for v in values)


@record
class IdList:
    """A numactl CPU or node list: ``0-3,8``, ``all``, ``+0-1`` (relative to the
    allowed set), ``!1`` (all but).

    Parsed from the command line first (:meth:`parse`), resolved against what is
    allowed once the machine is known (:meth:`resolve`).

    Parameters
    ----------
    text : str
        The list as given (kept for messages).
    what : str
        ``"CPU"`` or ``"node"``, for messages.
    ids : frozenset of int
        The ids written (indexes into the allowed set when ``relative``).
    everything : bool
        ``all``.
    relative : bool
        ``+``: the ids count within the allowed set.
    inverted : bool
        ``!``: every allowed id but these.
    """

    text: str
    what: str  #: "CPU" or "node"
    ids: frozenset[int] = frozenset()
    everything: bool = False
    relative: bool = False
    inverted: bool = False

    @classmethod
    def parse(cls, text: str, what: str) -> IdList:
        """Read a numactl list.

        Parameters
        ----------
        text : str
            ``[!][+]LIST`` or ``[!]all``, ``LIST`` in :func:`parse_list`'s syntax.
        what : str
            ``"CPU"`` or ``"node"``, for messages.

        Returns
        -------
        IdList

        Raises
        ------
        SpecError
            (a ``ValueError``) a bad or empty list, an id beyond the bound
            (:func:`parse_list`), or ``+all``.
        """
        t = text.strip()
        inverted = t.startswith("!")
        t = t[1:] if inverted else t
        relative = t.startswith("+")
        t = t[1:] if relative else t
        if t == "all":
            if relative:
                raise SpecError(f"'+all' is not a {what} list")
            return cls(text=text, what=what, ids=frozenset(), everything=True, relative=False, inverted=inverted)
        try:
            ids = parse_list(t, what)
        except SpecError as e:
            raise SpecError(f"bad {what} list {text!r}: {e}") from None
        if not ids:
            raise SpecError(f"empty {what} list {text!r}")
        return cls(text=text, what=what, ids=ids, everything=False, relative=relative, inverted=inverted)

    def resolve(self, allowed: frozenset[int], option: str) -> frozenset[int]:
        """The OS indexes this list means for a process allowed ``allowed``.

        Parameters
        ----------
        allowed : frozenset of int
            The CPUs or nodes this process may use.
        option : str
            The option that gave the list (``--physcpubind``), for messages.

        Returns
        -------
        frozenset of int
            OS indexes; not checked against ``allowed`` except for relative lists.

        Raises
        ------
        PlanError
            A relative index past the end of ``allowed``, or an inverted list
            (``!0-3``) that leaves out every one of ``allowed``.
        """
        order = sorted(allowed)
        if self.everything:
            ids = frozenset(allowed)
        elif self.relative:
            bad = sorted(i for i in self.ids if i >= len(order))
            if bad:
                n = len(order)
                raise PlanError(f"{option} {self.text}: relative {self.what} "
                                f"{'index' if len(bad) == 1 else 'indexes'} {format_list(bad)} "
                                f"{'is' if len(bad) == 1 else 'are'} out of range: "
                                f"{'only ' if n == 1 else ''}{n} {self.what}{'s are' if n != 1 else ' is'} "
                                f"allowed ({format_list(allowed)}), so +0 to +{n - 1}")
            ids = frozenset(order[i] for i in self.ids)
        else:
            ids = self.ids
        if self.inverted and not frozenset(allowed) - ids:
            raise PlanError(f"{option} {self.text}: selects no {self.what}: it leaves out every {self.what} "
                            f"allowed ({format_list(allowed) or 'none'})")
        return frozenset(allowed) - ids if self.inverted else ids
