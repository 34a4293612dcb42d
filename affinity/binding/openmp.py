"""OpenMP runtimes already loaded in this process (libgomp, Intel libiomp5, LLVM libomp).

Found the way threadpoolctl finds them: by the shared objects mapped into the
process.  For each one, :class:`OpenMPRuntime` sets the team size and pins team
member ``i`` to a CPU set from *inside* a parallel region of that very runtime
(through its ``GOMP_parallel`` entry point, which all three export), so OpenMP
code gets ``KMP_AFFINITY`` semantics even under libgomp.  Later parallel regions
of the same size reuse those threads (the runtimes keep a hot team).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

from ..machine import _native
from ..record import record
from ..machine.loaded import family_of

__all__ = ["OpenMPRuntime", "loaded_runtimes"]


@record
class OpenMPRuntime:
    """One OpenMP runtime mapped into this process."""

    path: str
    kind: str  #: "libgomp", "libiomp5" or "libomp"

    def _lib(self) -> ctypes.CDLL:
        # RTLD_NOLOAD: a handle on the copy already loaded, never a second copy
        return ctypes.CDLL(self.path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)

    def _addr(self, name: str) -> int:
        fn = getattr(self._lib(), name)
        return ctypes.cast(fn, ctypes.c_void_p).value or 0

    def max_threads(self) -> int:
        """``omp_get_max_threads()``: the team size of the next parallel region."""
        f = self._lib().omp_get_max_threads
        f.restype = ctypes.c_int
        return int(f())

    def set_num_threads(self, n: int) -> None:
        """``omp_set_num_threads(n)`` for the calling thread's next regions."""
        if n < 1:
            raise ValueError(f"OpenMP thread count must be >= 1, got {n}")
        f = self._lib().omp_set_num_threads
        f.argtypes = [ctypes.c_int]
        f(int(n))

    def pin_team(self, cpusets: Sequence[frozenset[int]]) -> list[tuple[int, frozenset[int]]]:
        """Run one region of ``len(cpusets)`` threads, binding member ``i`` to
        ``cpusets[i]`` from inside; return ``[(tid, mask read back)]``."""
        return _native.omp_pin_team(self._addr("GOMP_parallel"), self._addr("omp_get_thread_num"),
                                    [frozenset(c) for c in cpusets])

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "path": self.path, "max_threads": self.max_threads()}


def loaded_runtimes() -> list[OpenMPRuntime]:
    """The OpenMP runtimes mapped into this process, one per file."""
    seen: dict[str, OpenMPRuntime] = {}
    try:
        with open("/proc/self/maps") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].strip()
        if path in seen or path.endswith(" (deleted)"):
            continue
        found = family_of(path)  # the runtimes' file names: machine.loaded
        if found is not None:
            seen[path] = OpenMPRuntime(os.path.realpath(path), found[0])
    # one entry per real file (symlinked names map the same object)
    out: dict[str, OpenMPRuntime] = {}
    for rt in seen.values():
        out.setdefault(rt.path, rt)
    return list(out.values())
