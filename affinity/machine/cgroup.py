"""What the container lets this process use: the cgroup cpuset and the CFS quota.

Two limits shape how many threads a program should start:

* the **cpuset** (``cpuset.cpus.effective`` in cgroup v2, ``cpuset.effective_cpus``
  in v1): CPUs the process may run on at all -- already part of
  ``Topology.from_system().allowed``, read here for ``affinity run --norespect``,
  which starts from the cgroup's CPUs instead of the inherited mask;
* the **CFS bandwidth quota** (``cpu.max`` in v2, ``cpu.cfs_quota_us`` /
  ``cpu.cfs_period_us`` in v1): CPU time per period, i.e. ``quota / period``
  CPUs' worth of time spread over however many CPUs the cpuset has.  Docker's
  ``--cpus=2`` on a 64-core host gives 64 CPUs in the mask but 2 CPUs of time:
  64 busy threads would be throttled.  The quota of every ancestor cgroup
  applies; the smallest wins.

Readers take a ``root`` directory (default ``/``) under which ``proc/self/cgroup``,
``proc/self/mountinfo`` and the cgroup mounts are looked up, so canned trees can
stand in for real machines in tests.  Nothing is read at import.
"""

from __future__ import annotations

import os

from ..cpulist import parse_list
from ..errors import SpecError, TopologyError
from ..record import record

__all__ = ["CpuQuota", "Mount", "cpu_quota", "cpuset_cpus", "default_thread_count", "mems_allowed",
           "parse_cgroup_file", "parse_mountinfo", "throttling"]


@record
class CpuQuota:
    """A CFS bandwidth limit: ``quota_us`` of CPU time every ``period_us``."""

    quota_us: int
    period_us: int
    path: str  #: the cgroup directory whose file set it (the most restrictive one)
    version: int  #: 1 or 2

    @property
    def cpus(self) -> float:
        """CPUs' worth of time: ``quota / period`` (``cpu.max "150000 100000"`` -> 1.5)."""
        return self.quota_us / self.period_us

    def __str__(self) -> str:
        return f"{self.cpus:g} CPUs ({self.quota_us}/{self.period_us} us, {self.path})"


@record
class Mount:
    """One line of ``/proc/self/mountinfo`` that mounts a cgroup hierarchy."""

    root: str  #: the path inside the hierarchy that is mounted (``/`` with a cgroup namespace)
    mount_point: str
    version: int  #: 1 or 2
    controllers: frozenset[str]  #: v1 only: ``cpu``, ``cpuacct``, ``cpuset``, ...


def parse_cgroup_file(text: str) -> dict[str, str]:
    """``/proc/PID/cgroup`` -> ``{controller: path}``; the v2 entry (``0::/path``)
    is under the key ``""``.  ``"4:cpu,cpuacct:/a"`` gives ``cpu`` and ``cpuacct``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, path = parts
        if not ctrls:
            out[""] = path
            continue
        for c in ctrls.split(","):
            out[c.removeprefix("name=")] = path
    return out


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup (v1) and cgroup2 mounts of ``/proc/PID/mountinfo``."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 3 or len(fields) < 5:
            continue
        fstype, super_opts = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
        root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            out.append(Mount(root, mount_point, 2, frozenset()))
        elif fstype == "cgroup":
            ctrls = frozenset(o for o in super_opts.split(",") if o not in ("rw", "ro")
                              and "=" not in o)
            out.append(Mount(root, mount_point, 1, ctrls))
    return out


def _unescape(s: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes
    return (s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _join(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _cgroup_dirs(root: str, pid: str, controller: str) -> list[tuple[str, int]]:
    """The process's cgroup directory for ``controller`` and its ancestors up to the
    mount point, as ``(directory, version)``, innermost first; v1 hierarchies come
    before the v2 one (a hybrid system uses v1 for a controller it mounts)."""
    groups = _read(_join(root, f"proc/{pid}/cgroup"))
    mounts = _read(_join(root, f"proc/{pid}/mountinfo"))
    if groups is None or mounts is None:
        return []
    paths = parse_cgroup_file(groups)
    candidates = [m for m in parse_mountinfo(mounts) if m.version == 1 and controller in m.controllers]
    candidates += [m for m in parse_mountinfo(mounts) if m.version == 2]
    for m in candidates:
        path = paths.get(controller if m.version == 1 else "")
        if path is None:
            continue
        # without a cgroup namespace the mount's root is a prefix of our path
        rel = path
        if m.root != "/" and (path == m.root or path.startswith(m.root.rstrip("/") + "/")):
            rel = path[len(m.root.rstrip("/")):]
        elif m.root != "/":
            rel = "/"  # our group is not below the mounted part: the mount's own root is the best guess
        top = _join(root, m.mount_point)
        d = os.path.normpath(_join(top, rel))
        if m.version == 2 and not os.path.exists(os.path.join(top, "cgroup.controllers")):
            continue
        out = []
        while True:
            out.append((d, m.version))
            if os.path.normpath(d) == os.path.normpath(top) or len(d) <= len(top):
                break
            d = os.path.dirname(d)
        if any(os.path.isdir(x) for x, _ in out):
            return out
    return []


def cpu_quota(root: str = "/", pid: str = "self") -> CpuQuota | None:
    """The most restrictive CFS quota over the process's cgroup and its ancestors,
    ``None`` when there is none (``max`` / ``-1``) or no cgroup file can be read."""
    best: CpuQuota | None = None
    for d, version in _cgroup_dirs(root, pid, "cpu"):
        q = _quota_at(d, version)
        if q is not None and (best is None or q.cpus < best.cpus):
            best = q
    return best


def _quota_at(d: str, version: int) -> CpuQuota | None:
    if version == 2:
        text = _read(os.path.join(d, "cpu.max"))
        if text is None:
            return None
        parts = text.split()
        if not parts or parts[0] == "max":
            return None
        period = _number(parts[1], d, "cpu.max") if len(parts) > 1 else 100000
        quota = _number(parts[0], d, "cpu.max")
    else:
        qt, pt = _read(os.path.join(d, "cpu.cfs_quota_us")), _read(os.path.join(d, "cpu.cfs_period_us"))
        if qt is None or pt is None:
            return None
        quota, period = _number(qt.strip(), d, "cpu.cfs_quota_us"), _number(pt.strip(), d, "cpu.cfs_period_us")
        if quota < 0:
            return None
    if quota <= 0 or period <= 0:
        return None
    return CpuQuota(quota, period, d, version)


def throttling(directory: str) -> tuple[int, int] | None:
    """``(nr_periods, nr_throttled)`` of the cgroup ``directory`` whose quota applies
    (``CpuQuota.path``), from its ``cpu.stat`` (v1 and v2 write both): how many CFS
    periods have gone by and in how many the group ran out of quota.  ``None`` when
    the file cannot be read."""
    text = _read(os.path.join(directory, "cpu.stat"))
    if text is None:
        return None
    found: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("nr_periods", "nr_throttled") and value.strip().isdigit():
            found[key] = int(value)
    if len(found) != 2:
        return None
    return found["nr_periods"], found["nr_throttled"]


def _number(text: str, d: str, name: str) -> int:
    """A number of a cgroup file as the kernel writes it (``-1`` allowed), or a
    one-line TopologyError naming the file (a crafted tree under ``root``)."""
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
        raise TopologyError(f"not a number: {text[:40]!r}", os.path.join(d, name))
    return int(text)


def cpuset_cpus(root: str = "/", pid: str = "self") -> frozenset[int] | None:
    """The CPUs of the process's cpuset cgroup (effective list), ``None`` if unknown."""
    for d, version in _cgroup_dirs(root, pid, "cpuset"):
        names = (("cpuset.cpus.effective", "cpuset.cpus") if version == 2
                 else ("cpuset.effective_cpus", "cpuset.cpus"))
        for name in names:
            text = _read(os.path.join(d, name))
            if text is not None and text.strip():
                try:
                    return parse_list(text)  # bounded: ids below 8,192
                except SpecError as e:
                    raise TopologyError(str(e), os.path.join(d, name)) from None
        if version == 2:
            continue  # v2: an empty file means "inherit": ask the parent
        break
    return None


def mems_allowed(pid: str = "self") -> frozenset[int] | None:
    """The NUMA nodes process ``pid`` may allocate on (``Mems_allowed_list`` of
    ``/proc/PID/status``); None where it cannot be read (no such line, no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Mems_allowed_list:"):
                    return parse_list(line.split(":", 1)[1])
    except OSError:
        pass
    return None


def default_thread_count(cores: int, quota: CpuQuota | float | None, *, share: int = 1) -> int:
    """Threads to start by default on ``cores`` cores when a CFS quota of ``quota``
    CPUs (or :class:`CpuQuota`) is divided among ``share`` processes: one thread per
    core, but no more than the quota's CPUs rounded up (what loky's ``cpu_count``
    does), and at least one."""
    if cores < 1:
        raise ValueError(f"default_thread_count: need at least one core, got {cores}")
    if share < 1:
        raise ValueError(f"default_thread_count: share must be >= 1, got {share}")
    if quota is None:
        return cores
    cpus = quota.cpus if isinstance(quota, CpuQuota) else float(quota)
    return max(1, min(cores, int(-(-(cpus / share) // 1))))  # ceil(cpus / share), without loading math

