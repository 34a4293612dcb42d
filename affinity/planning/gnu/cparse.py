"""The C library's number parsing, as libgomp's environment parser sees it.

libgomp reads every number of its variables with ``strtoul``/``strtol``; their
quirks decide what a malformed value means (``" -1"`` is ``ULONG_MAX``, ``"010"``
is 8 in base 0, ``"x"`` is 0 with nothing consumed).  :class:`Cursor` walks a
value the way libgomp's pointer walks it; :func:`strtoul` and :func:`strtol`
return the value, the position after it and whether ``errno`` was set.
"""

from __future__ import annotations

from ...record import record

__all__ = ["ULONG_MAX", "LONG_MAX", "LONG_MIN", "Cursor", "strtoul", "strtol", "is_space"]

ULONG_MAX = (1 << 64) - 1
LONG_MAX = (1 << 63) - 1
LONG_MIN = -(1 << 63)

_SPACE = " \t\n\v\f\r"
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def is_space(ch: str) -> bool:
    """C ``isspace`` in the C locale."""
    return ch != "" and ch in _SPACE


@record(frozen=False)
class Cursor:
    """A position in a C string: reading past the end gives ``""`` (the NUL)."""

    text: str
    pos: int = 0

    def peek(self, ahead: int = 0) -> str:
        i = self.pos + ahead
        return self.text[i] if 0 <= i < len(self.text) else ""

    def skip_space(self) -> None:
        while is_space(self.peek()):
            self.pos += 1

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def startswith_nocase(self, word: str) -> bool:
        """``strncasecmp(p, word, len(word)) == 0``."""
        return self.text[self.pos:self.pos + len(word)].lower() == word


def _digits(text: str, i: int, base: int) -> int:
    """How many characters from ``i`` are digits of ``base``."""
    n = 0
    while i + n < len(text) and text[i + n].lower() in _DIGITS[:base]:
        n += 1
    return n


def _scan(text: str, pos: int, base: int) -> tuple[bool, int, int, int] | None:
    """The unsigned magnitude: (negative, magnitude, end, base) or ``None`` (no digits)."""
    i = pos
    while i < len(text) and text[i] in _SPACE:
        i += 1
    neg = False
    if i < len(text) and text[i] in "+-":
        neg = text[i] == "-"
        i += 1
    if base == 0:
        if text[i:i + 2].lower() == "0x" and _digits(text, i + 2, 16):
            base, i = 16, i + 2
        elif text[i:i + 1] == "0":
            base = 8
        else:
            base = 10
    elif base == 16 and text[i:i + 2].lower() == "0x" and _digits(text, i + 2, 16):
        i += 2
    n = _digits(text, i, base)
    if n == 0:
        return None
    return neg, int(text[i:i + n], base), i + n, base


def strtoul(text: str, pos: int, base: int) -> tuple[int, int, bool]:
    """``strtoul(text + pos, &end, base)``: (value, end, errno set).

    No digits: ``(0, pos, False)`` -- the end pointer is the start, as in C.
    A minus sign negates modulo 2**64; overflow gives ``ULONG_MAX`` and errno."""
    r = _scan(text, pos, base)
    if r is None:
        return 0, pos, False
    neg, mag, end, _ = r
    if mag > ULONG_MAX:
        return ULONG_MAX, end, True
    return ((-mag) & ULONG_MAX) if neg else mag, end, False


def strtol(text: str, pos: int, base: int) -> tuple[int, int, bool]:
    """``strtol(text + pos, &end, base)``: (value, end, errno set), clamped to long."""
    r = _scan(text, pos, base)
    if r is None:
        return 0, pos, False
    neg, mag, end, _ = r
    val = -mag if neg else mag
    if val > LONG_MAX:
        return LONG_MAX, end, True
    if val < LONG_MIN:
        return LONG_MIN, end, True
    return val, end, False


def as_long(value: int) -> int:
    """An unsigned long read as a signed long (``(long) value``)."""
    return value - (1 << 64) if value > LONG_MAX else value
