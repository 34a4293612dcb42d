"""Exceptions raised by affinity.

Every exception is an :class:`AffinityError` and also the builtin a caller would
naturally catch: a bad spec string is a ``ValueError``, a failed system call an
``OSError`` (with ``errno`` set), an operation the platform cannot do a
``NotImplementedError``.
"""

from __future__ import annotations

import os as _os

__all__ = [
    "AffinityError",
    "AffinityWarning",
    "BindError",
    "NativeUnavailableError",
    "PlanError",
    "SpecError",
    "TopologyError",
    "UnsupportedError",
]


class AffinityError(Exception):
    """Base class of every error raised by affinity."""


class SpecError(AffinityError, ValueError):
    """A binding specification could not be parsed.

    ``str(err)`` shows the offending text with a caret under the bad token.
    """

    def __init__(self, message: str, text: str | None = None, pos: int | None = None,
                 *, what: str | None = None):
        self.message = message
        self.text = text
        self.pos = pos
        self.what = what
        super().__init__(self._render())

    def _render(self) -> str:
        head = f"{self.what}: {self.message}" if self.what else self.message
        if self.text is None or self.pos is None:
            return head
        pos = max(0, min(self.pos, len(self.text)))
        return f"{head}\n    {self.text}\n    {' ' * pos}^"


class TopologyError(AffinityError, ValueError):
    """A topology source (file, synthetic description, system) is unusable.

    ``source`` names the file or description, ``line`` the 1-based line number
    where the problem was found (when it is a file).
    """

    def __init__(self, message: str, source: str | None = None, line: int | None = None):
        self.message = message
        self.source = source
        self.line = line
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        super().__init__(f"{where}{message}")


class BindError(AffinityError, OSError):
    """A binding system call failed (EPERM, EINVAL, ESRCH, ...).

    Carries ``errno``, ``call`` (the C function that failed) and ``argument``
    (what it was called with).
    """

    def __init__(self, err: int, call: str, argument: object = None, detail: str | None = None):
        self.call = call
        self.argument = argument
        msg = f"{call}({argument if argument is not None else ''}) failed: {_os.strerror(err)}"
        if detail:
            msg += f" ({detail})"
        super().__init__(err, msg)
        # OSError.__init__ with two args sets errno/strerror; keep our message in str().
        self._msg = msg

    def __str__(self) -> str:  # OSError would render "[Errno N] msg"
        return f"[Errno {self.errno}] {self._msg}"


class UnsupportedError(AffinityError, NotImplementedError):
    """The operation is not supported on this platform or kernel (ENOSYS, EXDEV)."""

    def __init__(self, message: str, call: str | None = None, err: int | None = None):
        self.call = call
        self.errno = err
        super().__init__(message)


class NativeUnavailableError(AffinityError, ImportError):
    """The compiled core (hwloc binding) cannot be loaded; the reason says why."""


class PlanError(AffinityError, ValueError):
    """A binding plan cannot be computed (e.g. a thread count the runtime itself
    would abort on)."""


class AffinityWarning(RuntimeWarning):
    """Something was applied differently from what was asked (and said so)."""
