"""Exceptions raised by affinity.

Every exception is an :class:`AffinityError` and also the builtin a caller would
naturally catch: a bad spec string is a ``ValueError``, a failed system call an
``OSError`` (with ``errno`` set), an operation the platform cannot do a
``NotImplementedError``.
"""

from __future__ import annotations

import errno as _errno
import os as _os

__all__ = [
    "AccessDenied",
    "AffinityError",
    "ArgumentTypeError",
    "AffinityWarning",
    "BindError",
    "CannotExecute",
    "CommandError",
    "EngineError",
    "ForeignTopologyError",
    "FrozenInstanceError",
    "MalformedValue",
    "MaskNarrowedError",
    "NoSuchThread",
    "NativeUnavailableError",
    "PictureError",
    "PictureUnavailableError",
    "PlanError",
    "SeedMismatch",
    "Signalled",
    "SpaceError",
    "SpecError",
    "TopologyError",
    "TrialPruned",
    "TuneError",
    "TuneUnavailableError",
    "TuneUsageError",
    "UnsafeFile",
    "UnsupportedError",
    "UsageError",
    "exit_status",
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
    """A system call that binds or reads a binding failed.

    Attributes
    ----------
    errno : int
        The C ``errno``; the subclasses below name the common ones, so callers
        catch a class rather than compare numbers.
    call : str
        The C function that failed (``hwloc_linux_set_tid_cpubind``, ``set_mempolicy``...).
    argument : object
        What it was called with (``tid=..., cpus={...}``).
    """

    def __init__(self, err: int, call: str, argument: object = None, detail: str | None = None,
                 *, message: str | None = None):
        self.call = call
        self.argument = argument
        msg = message or f"{call}({argument if argument is not None else ''}) failed: {_os.strerror(err)}"
        if detail:
            msg += f" ({detail})"
        super().__init__(err, msg)
        # OSError.__init__ with two args sets errno/strerror; keep our message in str().
        self._msg = msg

    def __str__(self) -> str:  # OSError would render "[Errno N] msg"
        return f"[Errno {self.errno}] {self._msg}"


class NoSuchThread(BindError, ProcessLookupError):
    """The thread or process is gone (``ESRCH``): it exited before or during the call."""


class AccessDenied(BindError, PermissionError):
    """The kernel refused (``EPERM``/``EACCES``): another user's process, or a memory
    policy in a container without ``CAP_SYS_NICE``."""


class MaskNarrowedError(BindError):
    """The kernel applied less than was asked (``EXDEV``, with ``strict=True``): CPUs
    outside the process's cpuset are dropped silently, a policy read back differs."""


class UnsupportedError(BindError, NotImplementedError):
    """This platform or kernel cannot do it: ``ENOSYS``, or hwloc's ``EXDEV`` (the
    binding cannot be enforced here)."""

    def __init__(self, message: str, call: str | None = None, err: int = _errno.ENOSYS,
                 argument: object = None):
        super().__init__(err, call or "?", argument, message=message)


class ForeignTopologyError(UnsupportedError):
    """Binding through a topology that does not describe this machine (XML,
    synthetic, cpuinfo): hwloc would accept the call and bind nothing."""

    def __init__(self, message: str, call: str | None = None):
        super().__init__(message, call, _errno.EXDEV)


#: errno -> the class that names it (everything else is a plain :class:`BindError`)
ERRNO_CLASSES = {_errno.ESRCH: NoSuchThread, _errno.EPERM: AccessDenied, _errno.EACCES: AccessDenied}


class UnsafeFile(AffinityError, OSError):
    """A file or folder of ours (the tuner's study, its lock file) that is not what we created: a
    symlink, another user's, writable by others, a FIFO or device (see
    :mod:`affinity.machine.userfiles`)."""


class NativeUnavailableError(AffinityError, ImportError):
    """The compiled core (hwloc binding) cannot be loaded; the reason says why."""


class ArgumentTypeError(AffinityError, TypeError):
    """An argument of the wrong type (``plan(threads=1.5)``): still the ``TypeError``
    Python code expects, and an :class:`AffinityError` the command line reports in
    one line."""


class PlanError(AffinityError, ValueError):
    """A binding plan cannot be computed (e.g. a thread count the runtime itself
    would abort on)."""


class EngineError(PlanError):
    """An inference engine cannot be told a plan in its own words (a thread on several
    CPUs for vLLM's one-CPU-per-thread list, a CPU past llama.cpp's 512-bit mask, a
    set with holes for ``--cpu-range``): the message names the engine, the rule and
    the value."""


class FrozenInstanceError(AffinityError, AttributeError):
    """Assigning to (or deleting) a field of a frozen value (:mod:`affinity.record`):
    a plan, a topology, settings.  Make a changed copy with ``record.replace``."""


class AffinityWarning(RuntimeWarning):
    """Something was applied differently from what was asked (and said so)."""


class UsageError(AffinityError, ValueError):
    """A command or a call was given something it cannot take, in a way its parser
    could not see: a command's exit status 2."""


class CommandError(AffinityError):
    """A command failed on something the user named (a path to write, ...): one line,
    exit status 1."""


class CannotExecute(AffinityError, OSError):
    """``affinity run``'s command cannot be executed; ``status`` is the shell's exit
    status for it.

    Parameters
    ----------
    status : int
        ``127``: not found; ``126``: found but not executable.
    message : str
        What is wrong, naming the command.
    """

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status

    def __str__(self) -> str:
        return str(self.args[0])


class TuneUsageError(UsageError):
    """The tuner was asked something it cannot do (a bad space, budget, storage URL, option)."""


class SpaceError(TuneUsageError):
    """A space that is empty, has an empty or unknown-typed list of choices, or a choice a
    known parameter cannot take."""


class SeedMismatch(TuneUsageError):
    """A stored study resumed with another seed than the one it was started with.

    Attributes
    ----------
    study : str
        The study's name.
    stored : int
        Its seed.
    """

    def __init__(self, study: str, stored: int):
        super().__init__(f"study {study!r} was started with seed {stored}; resume it with seed={stored} "
                         f"(or None), or give another study name")
        self.study, self.stored = study, stored


class TuneError(AffinityError):
    """Tuning failed (every trial failed, a metric never found, a storage that is not a
    study): a command's exit status 1."""


class TrialPruned(TuneError):
    """Raised by an objective that was told to stop early (multi-fidelity): the trial is
    recorded as pruned -- it may not win -- and never reported as a finalist."""


class TuneUnavailableError(TuneError, ImportError):
    """The tuner's dependency (optuna, the ``tune`` extra) is not installed."""


class PictureError(AffinityError, ValueError):
    """The arguments of a picture function are unusable.

    Raised for an unknown PU, an empty set, a bad role, a bad ``max_columns`` or
    ``scale``, an unsupported file extension, ...; a ``ValueError``.
    """


class PictureUnavailableError(AffinityError, ImportError):
    """PNG output needs Pillow, which is not installed.

    An ``ImportError``; install the ``picture`` extra (or write SVG).
    """


class Signalled(KeyboardInterrupt):
    """SIGTERM or SIGHUP, stopping a command the way Ctrl-C does (``affinity tune``:
    the running trial is stopped, finished ones are kept); ``signum`` is the signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def exit_status(error: BaseException) -> int:
    """The exit status of every ``affinity`` command for an error it raised: 2 usage,
    130 interrupted (128 + N for signal N), a command that cannot be executed its shell
    status (126/127),
    1 any other error of affinity.

    Parameters
    ----------
    error : BaseException

    Returns
    -------
    int
    """
    if isinstance(error, Signalled):
        return 128 + error.signum
    if isinstance(error, KeyboardInterrupt):
        return 130
    if isinstance(error, UsageError):
        return 2
    if isinstance(error, CannotExecute):
        return error.status
    return 1


class MalformedValue(AffinityError):
    """Internal to the settings parsers (``affinity.planning``): a malformed value
    found inside a helper -- where (``pos``), why (``detail``) and what kind of
    error.  The parser that catches it issues the runtime's warning (or, strict,
    a :class:`SpecError`); it never reaches a caller."""

    def __init__(self, pos: int, detail: str | None, what: str = "syntax error"):
        super().__init__(f"{what} at {pos}" + (f": {detail}" if detail else ""))
        self.pos = pos
        self.detail = detail
        self.what = what
