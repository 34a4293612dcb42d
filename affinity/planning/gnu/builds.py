"""The libgomp builds the planner follows, and what separates them.

Two builds matter to users and both were measured (``tests/golden_gomp``):

``gcc12``
    GCC 12's libgomp (Debian 12 ``libgomp1`` 12.2.0): what ``gcc -fopenmp``
    programs load on current distributions.  The default.
``torch``
    The ``torch/lib/libgomp.so.1`` that PyTorch's Linux CPU wheels bundle: GCC
    8.5's libgomp (AlmaLinux 8, the manylinux_2_28 build image).  What a
    PyTorch program runs.

GCC 8 predates OpenMP 5.0/5.1's additions and the stricter number checks of
later releases; each difference is one flag here, read by the parser and the
runtime rules (never a comparison of version strings).
"""

from __future__ import annotations

from ...errors import PlanError
from ...record import record

__all__ = ["Build", "BUILDS", "DEFAULT_BUILD", "build_of"]


@record
class Build:
    """One libgomp build's behaviour switches."""

    name: str
    #: what it is, for messages and docs
    library: str
    #: ``OMP_PLACES=ll_caches`` / ``numa_domains`` (OpenMP 5.1) are known
    abstract_51: bool
    #: ``OMP_PROC_BIND=primary`` (OpenMP 5.1) is known
    primary: bool
    #: explicit places may be a bare number (``0:4:2``) besides ``{...}``
    braceless_places: bool
    #: a number field that holds no digits is an error (later GCCs check
    #: ``end == start`` after ``strtoul``); GCC 8 reads it as 0
    strict_numbers: bool
    #: ``OMP_PLACES=threads(N)`` with N ending inside a core writes past its place
    #: array and crashes at load (SIGSEGV): GCC 8 checks N only between cores
    threads_count_overrun: bool


BUILDS: dict[str, Build] = {
    "gcc12": Build(name="gcc12", library="GCC 12 libgomp (Debian 12 libgomp1 12.2.0)", abstract_51=True, primary=True,
                   braceless_places=True, strict_numbers=True, threads_count_overrun=False),
    "torch": Build(name="torch", library="PyTorch's bundled libgomp (GCC 8.5, AlmaLinux 8)", abstract_51=False,
                   primary=False, braceless_places=False, strict_numbers=False, threads_count_overrun=True),
}

#: the build :func:`affinity.plan` follows for ``runtime="gnu"`` when none is named
DEFAULT_BUILD = "gcc12"


def build_of(name: str | Build | None) -> Build:
    """The :class:`Build` called ``name`` (``None``: :data:`DEFAULT_BUILD`)."""
    if isinstance(name, Build):
        return name
    if name is None:
        name = DEFAULT_BUILD
    try:
        return BUILDS[name]
    except (KeyError, TypeError):
        raise PlanError(f"unknown libgomp build {name!r} (known: {', '.join(BUILDS)})") from None
