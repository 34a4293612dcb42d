"""CPU-list strings as the kernel writes them (``0-3,8-11``) and back."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["format_list", "parse_list", "runs"]


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
