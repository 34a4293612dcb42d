"""CPU-list strings as the kernel writes them (``0-3,8-11``) and back, and
numactl's form of them (:class:`IdList`: ``all``, ``+`` relative, ``!`` inverted)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .errors import PlanError

__all__ = ["IdList", "format_list", "parse_list", "runs"]


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


def parse_list(text: str) -> frozenset[int]:
    """``"0-3,8,10-14:2"`` -> frozenset of ints.

    Accepts the kernel's cpulist syntax, including the ``a-b:stride`` form.
    Raises ``ValueError`` naming the bad item.
    """
    out: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    for item in text.split(","):
        item = item.strip()
        stride = 1
        if ":" in item:
            item, _, s = item.partition(":")
            stride = _int(s, text)
            if stride <= 0:
                raise ValueError(f"bad stride {s!r} in cpu list {text!r}")
        if "-" in item:
            a, _, b = item.partition("-")
            lo, hi = _int(a, text), _int(b, text)
            if hi < lo:
                raise ValueError(f"bad range {item!r} in cpu list {text!r}")
            out.update(range(lo, hi + 1, stride))
        else:
            out.add(_int(item, text))
    return frozenset(out)


def _int(s: str, text: str) -> int:
    s = s.strip()
    if not s.isdigit():
        raise ValueError(f"bad cpu number {s!r} in cpu list {text!r}")
    return int(s)


@dataclass(frozen=True)
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
        ValueError
            A bad or empty list, or ``+all``.
        """
        t = text.strip()
        inverted = t.startswith("!")
        t = t[1:] if inverted else t
        relative = t.startswith("+")
        t = t[1:] if relative else t
        if t == "all":
            if relative:
                raise ValueError(f"'+all' is not a {what} list")
            return cls(text, what, frozenset(), True, False, inverted)
        try:
            ids = parse_list(t)
        except ValueError as e:
            raise ValueError(f"bad {what} list {text!r}: {e}") from None
        if not ids:
            raise ValueError(f"empty {what} list {text!r}")
        return cls(text, what, ids, False, relative, inverted)

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
            A relative index past the end of ``allowed``.
        """
        order = sorted(allowed)
        if self.everything:
            ids = frozenset(allowed)
        elif self.relative:
            bad = sorted(i for i in self.ids if i >= len(order))
            if bad:
                raise PlanError(f"{option} {self.text}: relative {self.what} index "
                                f"{format_list(bad)} is out of range: {len(order)} {self.what}s are "
                                f"allowed ({format_list(allowed)})")
            ids = frozenset(order[i] for i in self.ids)
        else:
            ids = self.ids
        return frozenset(allowed) - ids if self.inverted else ids
