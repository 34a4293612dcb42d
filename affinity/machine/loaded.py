"""Which OpenMP runtimes a process really runs: path, family, how many copies.

Read from ``/proc/PID/maps`` (any process of this user): every mapped shared
object whose name is an OpenMP runtime's, grouped by the file it maps (device and
inode, so two names of one file count once).  The family says whose rules the
runtime follows for the variables it reads:

==========  ===================================  ==========================
family      library                              who ships it
==========  ===================================  ==========================
``gnu``     ``libgomp.so.1``, ``libgomp-<hash>``  GCC; PyTorch's wheel bundles one
``intel``   ``libiomp5.so``                      Intel oneAPI, MKL
``llvm``    ``libomp.so``, ``libomp-<hash>``     LLVM/clang; scikit-learn wheels
==========  ===================================  ==========================

Two runtimes in one process (PyTorch's libgomp beside an Intel MKL's libiomp5,
or two copies of libgomp from two wheels) each keep a team of their own: together
they start more threads than there are CPUs, and the variables each reads mean
different things to each (pytorch#98836: 3x slower).  :func:`census` returns them;
:meth:`Census.warning` says so in one line.
The values are read here (:func:`census`) and judged by the planner
(:func:`affinity.planning.decide.meaning_notes`).
"""

from __future__ import annotations

import re

from ..record import record

__all__ = ["Census", "LoadedRuntime", "census", "family_of", "parse_maps"]


#: library name pattern -> (kind, family); the one table of OpenMP runtimes' file names
_LIBRARIES = (
    (re.compile(r"/libiomp5[^/]*\.so[^/]*$"), "libiomp5", "intel"),
    (re.compile(r"/libomp(-[0-9a-f]+)?\.so[^/]*$"), "libomp", "llvm"),
    (re.compile(r"/libgomp(-[0-9a-f]+)?\.so[^/]*$"), "libgomp", "gnu"),
)


def family_of(path: str) -> tuple[str, str] | None:
    """``(kind, family)`` of a shared object's path, or ``None`` for a file that is
    not an OpenMP runtime: ``("libgomp", "gnu")``, ``("libiomp5", "intel")``,
    ``("libomp", "llvm")``."""
    for pat, kind, family in _LIBRARIES:
        if pat.search(path):
            return kind, family
    return None


@record
class LoadedRuntime:
    """One OpenMP runtime file mapped into a process."""

    path: str  #: as the process mapped it
    kind: str  #: "libgomp", "libiomp5" or "libomp"
    family: str  #: "gnu", "intel" or "llvm": whose rules it follows
    inode: tuple[str, int]  #: (device, inode) of the file: one entry per file

    @property
    def bundled_by(self) -> str | None:
        """The Python package whose wheel ships this copy (``torch``, ``sklearn``...),
        from its path (``.../site-packages/torch/lib/...``), or ``None``."""
        m = re.search(r"/(?:site|dist)-packages/([^/]+?)(?:\.libs)?/", self.path)
        return m.group(1) if m else None

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "kind": self.kind, "family": self.family, "bundled_by": self.bundled_by}


@record
class Census:
    """The OpenMP runtimes of one process, in address order."""

    pid: int | None
    runtimes: tuple[LoadedRuntime, ...]

    def copies(self, family: str | None = None) -> int:
        """How many runtime files are loaded (of ``family``, when given)."""
        return sum(1 for r in self.runtimes if family is None or r.family == family)

    @property
    def families(self) -> tuple[str, ...]:
        out: list[str] = []
        for r in self.runtimes:
            if r.family not in out:
                out.append(r.family)
        return tuple(out)

    def warning(self) -> str | None:
        """One line when more than one runtime is loaded, else ``None``."""
        if len(self.runtimes) < 2:
            return None
        what = ", ".join(f"{r.path} ({r.family})" for r in self.runtimes)
        return (f"{len(self.runtimes)} OpenMP runtimes are loaded in one process: {what}; each starts "
                f"its own team (together more threads than CPUs) and reads the OMP_/KMP_/GOMP_ "
                f"variables by its own rules -- load one (pytorch#98836)")

    def text(self, prefix: str = "") -> str:
        """One line per runtime (``affinity show``, the bind map), then the warning;
        empty when none is loaded."""
        lines = []
        for r in self.runtimes:
            by = f", bundled by {r.bundled_by}" if r.bundled_by else ""
            lines.append(f"{prefix}OpenMP runtime {r.family} ({r.kind}) {r.path}{by}")
        w = self.warning()
        if w:
            lines.append(f"{prefix}WARNING: {w}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {"runtimes": [r.to_dict() for r in self.runtimes],
                "copies": {f: self.copies(f) for f in self.families}, "warning": self.warning()}


def parse_maps(text: str) -> list[LoadedRuntime]:
    """The OpenMP runtimes named in the text of a ``/proc/PID/maps`` file, one per
    file (device and inode), in address order."""
    seen: dict[tuple[str, int], LoadedRuntime] = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].strip()
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        found = family_of(path)
        if found is None:
            continue
        try:
            key = (parts[3], int(parts[4]))
        except ValueError:
            continue
        if key not in seen:
            seen[key] = LoadedRuntime(path, found[0], found[1], key)
    return list(seen.values())


def census(pid: int | None = None) -> Census:
    """The OpenMP runtimes loaded in process ``pid`` (default: this one).

    Raises ``FileNotFoundError`` for a process that does not exist and
    ``PermissionError`` for one whose maps this user may not read.
    """
    with open(f"/proc/{'self' if pid is None else int(pid)}/maps") as fh:
        text = fh.read()
    return Census(pid, tuple(parse_maps(text)))
