"""Who wins when what the caller asks for and the environment disagree: one rule for
:func:`affinity.apply` and ``affinity run``.

HPC modules and job scripts set ``OMP_NUM_THREADS``, ``KMP_AFFINITY``... for every
program; a caller of ``apply(spec, threads=2)`` or ``affinity run SPEC -t 2`` asks for
something else.  The rule, defined here once:

1. the team size is the one given explicitly (``threads=``, ``-t``); without one, the
   environment's ``OMP_NUM_THREADS`` (its first level, as the runtime reads it); without
   that, the runtime's default (None here);
2. the variables a plan exports replace the environment's, and each value replaced by a
   different one is said (a note: nothing is kept or dropped silently);
3. a team larger than its CPUs is said too, wherever its size came from.

Pure: mappings in, values and sentences out.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ..cpulist import format_list

__all__ = ["oversubscription", "replaced", "team_size"]


def team_size(threads: int | None, environ: Mapping[str, str]) -> tuple[int | None, list[str]]:
    """The team size by the rule: ``threads``, else ``OMP_NUM_THREADS``, else None.

    Returns
    -------
    (int or None, list of str)
        The size, and a warning for an ``OMP_NUM_THREADS`` that is no positive count
        (ignored, as the runtime ignores it).
    """
    if threads is not None:
        return threads, []
    text = environ.get("OMP_NUM_THREADS")
    if text is None:
        return None, []
    first = text.split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first), []
    return None, [f"ignoring OMP_NUM_THREADS={text!r}: not a positive thread count"]


def replaced(exported: Mapping[str, str], environ: Mapping[str, str]) -> list[str]:
    """One note per variable of ``environ`` that ``exported`` replaces with another value."""
    return [f"{k}={environ[k]} from the environment replaced by {k}={v}"
            for k, v in exported.items() if k in environ and environ[k] != v]


def oversubscription(threads: int, cpus: Collection[int], what: str = "threads") -> list[str]:
    """A warning when ``threads`` exceed ``cpus`` (``what`` names where the count came from:
    a variable or argument, ``what=N``, or words such as ``the runtime's default team``)."""
    if threads <= len(cpus):
        return []
    n = len(cpus)
    count = f"{what}={threads}" if " " not in what else f"{what} of {threads} threads"
    return [f"{count} on {n} CPU{'s' if n != 1 else ''} oversubscribes them "
            f"({format_list(cpus)}): several threads share a CPU"]
