"""``affinity run`` in the time Python takes to start: a launch remembered from an
earlier run with the same inputs.

Planning a launch loads the topology (hwloc), the planner and the cgroup limits:
tens of milliseconds of imports and work in a fresh interpreter, for an answer
that changes only when one of its inputs does.  After a launch that only sets
the process mask and the environment (one instance; no memory policy, log file
or verbose output; no warning to print), the full path remembers it here, keyed
by every input the answer depends on:

* the command line (every word after ``run``) and the variables of the
  environment a launch reads (:data:`READ_PREFIXES`, :data:`READ_NAMES`): the
  runtimes' and TensorFlow's, affinity's own, hwloc's, the dynamic loader's and
  Python's, ``PATH`` and where the cache lives.  Any other variable may change
  from run to run (hyperfine varies one, Slurm and MPI set per-job ones, a tuner
  its trial's) and the launch is still the remembered one;
* this process's CPU mask and ``Mems_allowed_list``;
* the machine: the boot (``boot_id``: a new boot may renumber everything), the
  online and present CPUs and the online NUMA nodes (hotplug);
* the cgroups: ``/proc/self/cgroup`` and the cgroup mounts of
  ``/proc/self/mountinfo``, and the content (or absence) of every CPU-limit file
  (``cpu.max``, ``cpu.cfs_quota_us``, ``cpu.cfs_period_us``, ``cpuset.cpus``,
  ``cpuset.cpus.effective``, ``cpuset.effective_cpus``) in the process's
  ``cpu``/``cpuset``/unified cgroup directories and their ancestors, read again
  at every use;
* the code: size and modification time of every file of the package, and the
  Python version (the file's format).

Launches with ``--pin-threads`` (they export ``LD_PRELOAD``) or ``--ranks`` (per-job
variables) are never remembered: the file holds only the plan's own variables.

A later run with equal inputs sets the same mask (and reads it back) and
executes the same command with the same variables, importing nothing of the
planner, the topology or the compiled core.  Anything else -- another option, a
changed limit, no entry, a mask the kernel narrows, a command that is not
there -- takes the full path, which gives the same result it always does and
remembers it.

The file is ``$XDG_CACHE_HOME/affinity/launches-<python>`` (default
``~/.cache``).  It holds variables that will be exported, so it is used only
when the directory and the file belong to the user, nobody else may write them,
and the folders above are the user's or root's (:mod:`affinity.machine.userfiles`: no symlink followed,
a FIFO never waited on, the descriptor checked after the open); it is written
atomically (a new file renamed over the old one) and keeps the 32 newest
launches, each with a checksum: a malformed or damaged entry is a miss, replaced
by the next full run (docs/hardening.md).  ``AFFINITY_LAUNCH_CACHE=0`` turns it off.

Only the standard library's built-in modules and :mod:`affinity.machine.userfiles`
(``os``, ``stat``, ``errno``) are imported here: this module is the whole of
``affinity run``'s start-up when the launch is remembered.
"""

from __future__ import annotations

import marshal
import os
import sys

from ..machine import userfiles  # os, stat and errno only: the fast path stays light

__all__ = ["exec_remembered", "inputs", "remember", "start", "which"]

#: the format of an entry; a change makes every stored launch a miss (3: checksummed)
FORMAT = 3
#: the largest launch file read (32 entries are a few hundred kB)
_MAX_FILE = 16 << 20
#: launches kept (the oldest goes first)
KEEP = 32
#: the environment variables a remembered launch depends on: those starting so...
READ_PREFIXES = ("OMP_", "KMP_", "GOMP_", "TF_", "AFFINITY_", "HWLOC_", "LD_", "PYTHON")
#: ... and these (``tests/launcher/test_startup.py`` checks that every variable the
#: launcher, the planner and the machine layer name is covered)
READ_NAMES = ("PATH", "HOME", "XDG_CACHE_HOME",
              #: a launcher's local rank and size and its binding: without --ranks, a process that
              #: is one of several local ranks planning on shared CPUs is warned (never remembered);
              #: the names of affinity.planning.launchers (tests/launcher/test_launch_ranks.py)
              "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
              "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE",
              "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID",
              "OMPI_MCA_orte_bound_at_launch", "HYDRA_USER_PROVIDED_BINDING", "SLURM_CPU_BIND_TYPE",
              "SLURM_CPU_BIND_LIST")
#: the files that hold a cgroup's CPU limits (cgroup v2 and v1)
_LIMIT_FILES = ("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpuset.cpus", "cpuset.cpus.effective",
                "cpuset.effective_cpus")
_MACHINE_FILES = ("/proc/sys/kernel/random/boot_id", "/sys/devices/system/cpu/online",
                  "/sys/devices/system/cpu/present", "/sys/devices/system/node/online")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _status_line(name: bytes) -> bytes | None:
    text = _read("/proc/self/status") or b""
    start = text.find(b"\n" + name)
    return None if start < 0 else text[start + 1:text.find(b"\n", start + 1)]


def _cgroup_mounts() -> bytes:
    """The cgroup lines of ``/proc/self/mountinfo`` (mount ids and all)."""
    text = _read("/proc/self/mountinfo") or b""
    return b"\n".join(line for line in text.split(b"\n") if b" - cgroup" in line)


def _package_stamp() -> tuple[tuple[str, int, int], ...]:
    """(path, size, mtime) of every file of the package, bytecode caches aside."""
    out = []
    dirs = [_PACKAGE]
    while dirs:
        d = dirs.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if e.name != "__pycache__":
                    dirs.append(e.path)
            else:
                try:
                    st = e.stat()
                except OSError:
                    continue
                out.append((e.path, st.st_size, st.st_mtime_ns))
    return tuple(sorted(out))


def inputs(words: list[str]) -> tuple:
    """Everything the launch of ``affinity run WORDS`` depends on, but for the CPU
    limit files (:func:`_limit_files`, read at every use)."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(READ_PREFIXES) or k in READ_NAMES))
    return (FORMAT, tuple(words), env, tuple(sorted(os.sched_getaffinity(0))), _status_line(b"Mems_allowed_list"),
            tuple(_read(f) for f in _MACHINE_FILES), _read("/proc/self/cgroup"), _cgroup_mounts(),
            _package_stamp())


def _limit_files() -> tuple[str, ...]:
    """Every CPU-limit file a launch could read: in this process's cgroup
    directory for the ``cpu`` and ``cpuset`` controllers (v1) and the unified
    hierarchy (v2), and in each ancestor up to the mount point."""
    groups: dict[str, str] = {}
    for line in (_read("/proc/self/cgroup") or b"").decode(errors="replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for c in parts[1].split(",") if parts[1] else [""]:
                groups[c.removeprefix("name=")] = parts[2]
    out: list[str] = []
    for line in _cgroup_mounts().decode(errors="replace").splitlines():
        f = line.split()
        sep = f.index("-")
        fstype, opts = f[sep + 1], f[sep + 3].split(",") if len(f) > sep + 3 else []
        root, top = f[3].replace("\\040", " "), f[4].replace("\\040", " ")
        ctrls = [""] if fstype == "cgroup2" else [c for c in ("cpu", "cpuset") if c in opts]
        for c in ctrls:
            path = groups.get(c)
            if path is None:
                continue
            rel = path[len(root.rstrip("/")):] if root != "/" and path.startswith(root.rstrip("/") + "/") else (
                "/" if root != "/" else path)
            d = os.path.normpath(os.path.join(top, rel.lstrip("/")))
            while True:
                out.extend(os.path.join(d, name) for name in _LIMIT_FILES)
                if len(d) <= len(top) or d == os.path.normpath(top):
                    break
                d = os.path.dirname(d)
    return tuple(dict.fromkeys(out))


def _enabled() -> bool:
    return os.environ.get("AFFINITY_LAUNCH_CACHE", "1").lower() not in ("0", "off", "no", "false")


def _cache_file(create: bool = False) -> str | None:
    """The user's launch file, or None where it may not be trusted (or written):
    the folder is checked by :func:`~affinity.machine.userfiles.private_dir` (never a
    symlink, this user's, nobody else may write it or a folder above it)."""
    if not _enabled():
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):  # no home directory: no cache rather than one in the working directory
        return None
    try:
        d = userfiles.private_dir(os.path.join(base, "affinity"), create=create)
    except OSError:  # UnsafeFile included: another user's folder, a planted symlink
        return None
    return None if d is None else os.path.join(d, f"launches-{sys.hexversion:x}")


def _load(path: str) -> dict:
    """The stored launches; nothing when the file is not ours to trust (opened by
    :func:`~affinity.machine.userfiles.open_private`: a symlink is not followed, a
    FIFO not waited on) or not a launch file."""
    try:
        fd = userfiles.open_private(path, os.O_RDONLY)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = marshal.loads(fh.read(_MAX_FILE + 1))
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    finally:
        if fd >= 0:
            os.close(fd)
    return data if isinstance(data, dict) else {}


def _checksum(value: tuple) -> int:
    """A check of an entry's value (its ``repr``, which is canonical for the str,
    bytes, int and tuple it holds, read as one number modulo the prime 2**61 - 1):
    a flipped bit in the file makes the entry a miss, never a launch."""
    return int.from_bytes(repr(value).encode(), "little") % ((1 << 61) - 1)


def _entry(stored: object) -> tuple | None:
    """The launch an entry holds, or None for a malformed one or a failed checksum
    (a miss: the full path runs and :func:`remember` replaces it)."""
    if not (isinstance(stored, tuple) and len(stored) == 2 and isinstance(stored[0], tuple)
            and len(stored[0]) == 4 and stored[1] == _checksum(stored[0])):
        return None
    cpus, env_items, argv, limits = stored[0]
    ok = (_all(cpus, lambda c: type(c) is int and 0 <= c < 8192)
          and _all(env_items, lambda p: _pair(p) and isinstance(p[1], str))
          and _all(argv, lambda w: isinstance(w, str))
          and _all(limits, lambda p: _pair(p) and (p[1] is None or isinstance(p[1], bytes))))
    return stored[0] if ok else None


def _all(items: object, test: object) -> bool:
    return isinstance(items, tuple) and all(test(i) for i in items)  # type: ignore[operator]


def _pair(p: object) -> bool:
    return isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)


def remember(key: tuple, cpus: frozenset[int], env: dict[str, str], argv: tuple[str, ...]) -> None:
    """Store a launch under ``key`` (:func:`inputs` taken before anything ran).
    Best effort: a cache that cannot be written is no error."""
    path = _cache_file(create=True)
    if path is None:
        return
    limits = tuple((f, _read(f)) for f in _limit_files())
    entries = _load(path)
    entries.pop(key, None)
    value = (tuple(sorted(cpus)), tuple(env.items()), tuple(argv), limits)
    entries[key] = (value, _checksum(value))
    while len(entries) > KEEP:
        entries.pop(next(iter(entries)))
    tmp = f"{path}.{os.getpid()}"
    try:
        fd = userfiles.open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(marshal.dumps(entries))
        os.replace(tmp, path)
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def which(cmd: str, path: str) -> str | None:
    """``shutil.which(cmd, path=path)`` on POSIX, without importing :mod:`shutil`
    (which loads bz2, lzma and zlib): the launcher's command lookup, here and in
    :mod:`~affinity.launcher.execute`.  None: not found (the fast path then takes the
    full path, which says what is wrong)."""
    def runnable(f: str) -> bool:
        return os.path.exists(f) and os.access(f, os.F_OK | os.X_OK) and not os.path.isdir(f)

    if "/" in cmd:
        return cmd if runnable(cmd) else None
    if not path:
        return None
    seen = set()
    for d in path.split(os.pathsep):
        if d not in seen:
            seen.add(d)
            f = os.path.join(d, cmd)
            if runnable(f):
                return f
    return None


_started: dict[str, tuple | None] = {}


def start(words: list[str]) -> tuple | None:
    """The program's ``affinity run WORDS``: :func:`exec_remembered`, once per
    process (``python -m affinity`` tries it before the command line is
    parsed); returns the inputs to :func:`remember` the launch under."""
    if "key" not in _started:
        _started["key"] = exec_remembered(words)
    return _started["key"]


def exec_remembered(words: list[str]) -> tuple | None:
    """Execute the launch remembered for ``affinity run WORDS`` if every input is
    as it was; no return then.  Otherwise return the inputs (for
    :func:`remember` after the full path), or None when there is no cache."""
    if not _enabled():
        return None
    key = inputs(words)
    path = _cache_file()
    entry = _entry(_load(path).get(key)) if path is not None else None
    if entry is None:
        return key
    cpus, env_items, argv, limits = entry
    if any(_read(f) != content for f, content in limits) or not argv:
        return key
    env = dict(os.environ)
    env.update(env_items)
    exe = which(argv[0], env.get("PATH", os.defpath))
    if exe is None:
        return key
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
        if os.sched_getaffinity(0) == set(cpus):
            sys.stdout.flush()
            sys.stderr.flush()
            os.execve(exe, list(argv), env)
    except OSError:
        pass
    os.sched_setaffinity(0, before)  # the full path starts from the mask this process had
    return key
