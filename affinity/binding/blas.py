"""BLAS pools in this process: counted and limited (threadpoolctl), and OpenBLAS's own
worker threads pinned by TID.

A BLAS library with its own thread pool (OpenBLAS built with pthreads, the one numpy
and scipy wheels bundle) starts its workers when it loads; they are neither
TensorFlow's nor an OpenMP runtime's, and without this step they keep whatever mask
they inherited.  OpenBLAS exports ``openblas_setaffinity(i, size, set)``, which pins
its worker ``i``; the TID behind each worker is found by moving it between two CPUs
and reading every thread's mask back (the one that moved is it).  Worker ``i`` goes to
the plan's slot ``i + 1``: the calling thread is member 0 of every BLAS call, and
apply() leaves it where it is.

What cannot be done is said, one note per pool: no threadpoolctl (nothing limited), a
pool that offers no way to pin its threads from outside (MKL's, BLIS's), a pin the
library refused.  Pools on the OpenMP threading layer are OpenMP teams: the OpenMP
step pins them.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

from ..cpulist import format_list
from ..record import field, record
from .threads import task_ids

__all__ = ["BlasResult", "limit_and_pin"]

#: the names OpenBLAS builds give ``openblas_setaffinity`` (plain, and numpy's/scipy's
#: renamed 64-bit-integer build)
_SETAFFINITY = ("openblas_setaffinity", "scipy_openblas_setaffinity64_", "scipy_openblas_setaffinity")
_CPU_SET_BYTES = 128  # glibc's cpu_set_t: 1024 CPUs


@record(frozen=False)
class BlasResult:
    """What the BLAS step did: the threadpoolctl limiter to restore, the workers
    pinned (TID -> (worker index + 1, CPUs)) and what was not done."""

    limiter: Any = None
    pinned: dict[int, tuple[int, frozenset[int]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _pools() -> list[dict[str, Any]] | None:
    """threadpoolctl's BLAS pools, or None when threadpoolctl is missing."""
    try:
        from threadpoolctl import threadpool_info  # lazy: it loads every BLAS it finds
    except ImportError:
        return None
    return [i for i in threadpool_info() if i.get("user_api") == "blas"]


def limit_and_pin(threads: int, slots: Sequence[frozenset[int]]) -> BlasResult:
    """Limit every BLAS pool to ``threads`` and pin OpenBLAS's pthreads workers on
    ``slots`` (worker ``i`` on ``slots[(i + 1) % len(slots)]``).

    Returns
    -------
    BlasResult
        Nothing limited and a note when threadpoolctl is not installed.
    """
    out = BlasResult()
    pools = _pools()
    if pools is None:
        out.notes.append(f"BLAS pools were not limited to {threads} thread{'s' if threads != 1 else ''}: "
                         "threadpoolctl is not installed (pip install threadpoolctl)")
        return out
    if not pools:
        return out
    from threadpoolctl import threadpool_limits  # lazy: see _pools

    out.limiter = threadpool_limits(limits=threads, user_api="blas")
    for pool in _pools() or []:  # read again: the sizes they took
        _pin_pool(pool, int(pool.get("num_threads") or 1), slots, out)
    return out


def _pin_pool(pool: dict[str, Any], threads: int, slots: Sequence[frozenset[int]], out: BlasResult) -> None:
    name = f"{pool.get('internal_api')} ({os.path.basename(str(pool.get('filepath', '?')))})"
    layer = pool.get("threading_layer")
    if threads <= 1 or layer == "openmp":
        return  # no worker, or the OpenMP team the OpenMP step pins
    setaffinity = _setaffinity(pool) if pool.get("internal_api") == "openblas" and layer == "pthreads" else None
    if setaffinity is None:
        out.notes.append(f"the BLAS pool of {name} was limited to {threads} threads but its workers were "
                         f"not pinned: it offers no way to pin them from outside (threading layer {layer})")
        return
    for i in range(threads - 1):  # worker i; the calling thread is member 0
        cpus = slots[(i + 1) % len(slots)]
        tid = _identify(setaffinity, i, frozenset().union(*slots))
        if not _set(setaffinity, i, cpus):
            out.notes.append(f"the BLAS pool of {name}: worker {i} could not be pinned to "
                             f"{{{format_list(cpus)}}} ({os.strerror(ctypes.get_errno()) or 'refused'})")
            continue
        if tid is not None:
            out.pinned[tid] = (i + 1, cpus)


def _setaffinity(pool: dict[str, Any]) -> Any:
    try:
        lib = ctypes.CDLL(str(pool["filepath"]), mode=os.RTLD_NOLOAD | os.RTLD_LOCAL, use_errno=True)
    except (OSError, KeyError):
        return None
    for sym in _SETAFFINITY:
        fn = getattr(lib, sym, None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
            fn.restype = ctypes.c_int
            return fn
    return None


def _set(setaffinity: Any, i: int, cpus: frozenset[int]) -> bool:
    buf = (ctypes.c_ubyte * max(_CPU_SET_BYTES, max(cpus) // 8 + 1))()
    for c in cpus:
        buf[c // 8] |= 1 << (c % 8)
    return setaffinity(i, ctypes.sizeof(buf), ctypes.addressof(buf)) == 0


def _masks() -> dict[int, frozenset[int]]:
    out = {}
    for tid in task_ids():
        try:
            out[tid] = frozenset(os.sched_getaffinity(tid))
        except OSError:
            continue  # exited meanwhile
    return out


def _identify(setaffinity: Any, i: int, union: frozenset[int]) -> int | None:
    """The TID of OpenBLAS worker ``i``: moved to one CPU of the plan, then to
    another, it is the one thread whose mask followed (None on a one-CPU plan,
    or if another thread moved the same way meanwhile)."""
    if len(union) < 2:
        return None
    a, b = frozenset({min(union)}), frozenset({max(union)})
    if not _set(setaffinity, i, a):
        return None
    on_a = {t for t, m in _masks().items() if m == a}
    if not _set(setaffinity, i, b):
        return None
    moved = [t for t, m in _masks().items() if m == b and t in on_a]
    return moved[0] if len(moved) == 1 else None
