"""A process bound by affinity publishes its bind map, so that ``affinity show
PID`` and ``affinity doctor PID`` in another process see the roles and the plan
it applied, as the process itself does.

The file: ``/dev/shm/affinity-<uid>/<pid>-<start>.json`` (else
``$XDG_RUNTIME_DIR/affinity/``, else ``$TMPDIR/affinity-<uid>/``), named by the
process's id and its start time (clock ticks since boot), so that a process that
later gets the same PID is not taken for this one.  It holds every thread a
binding pinned (TID, the thread's start, role, index, CPUs) and each active
binding's plan (rules, settings, thread count, CPUs, the main thread's mask, the
memory policy).  :func:`sync` writes it from the bindings active in this process
(:func:`affinity.binding.registry.applied_here`) each time they change -- apply,
pins added later (TensorFlow's pools at the first op, PyTorch's at its import),
restore -- and removes it when none is left, and at exit.

Opened as the project opens a file of its own (:mod:`affinity.machine.userfiles`):
the folder this user's, mode 0700, not a symlink; the file never followed, a
regular file of this user not writable by others, written whole (a temporary file
renamed over it).  A reader takes nothing else.

What it cannot do: a process killed by a signal leaves its file (the next
publication of this user removes the files of processes that are gone); another
user's publication is not read, root's reading included (roles are then
inferred); a failure to write (a full or read-only ``/dev/shm``) leaves the
binding as it is and only the publication missing (:data:`last_error` says why).
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
import threading
import time
from typing import Any

from ..cpulist import format_list, parse_list
from ..errors import SpecError, UnsafeFile
from ..machine.procfs import process_owner
from ..machine.userfiles import open_private, private_dir
from ..planning.doctor.values import Publication, PublishedGpu, PublishedPin, PublishedPlan
from . import registry
from .threads import task_starts

__all__ = ["FORMAT", "changed", "current", "folders", "read", "sync"]

FORMAT = 1  #: the file's format number (a reader refuses another)
MAX_FILE = 16 << 20  #: the most bytes read of a publication
_lock = threading.Lock()
_written: dict[str, Any] = {}  #: this process's file: {"path": str, "pid": int}
_atexit: list[bool] = []
#: why the last publication could not be written (None: it was)
last_error: str | None = None


def folders(uid: int | None = None, environ: dict[str, str] | None = None) -> list[str]:
    """Where publications of user ``uid`` (default: this one) are looked for, in the
    order a writer tries them (``environ``: whose ``XDG_RUNTIME_DIR``)."""
    uid = os.geteuid() if uid is None else uid
    env = os.environ if environ is None else environ
    out = []
    if os.path.isdir("/dev/shm"):
        out.append(f"/dev/shm/affinity-{uid}")
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg.startswith("/"):
        out.append(os.path.join(xdg, "affinity"))
    out.append(os.path.join(tempfile.gettempdir(), f"affinity-{uid}"))
    return out


def _start(pid: int) -> int | None:
    return task_starts(pid, [pid]).get(pid)


def _name(pid: int, start: int) -> str:
    return f"{pid}-{start}.json"


# ------------------------------------------------------------------ this process
def current(bindings: list[Any] | None = None) -> Publication | None:
    """This process's publication as the bindings active in it give it (None: none
    is active)."""
    bindings = registry.applied_here() if bindings is None else bindings
    if not bindings:
        return None
    me = os.getpid()
    pins: dict[int, Any] = {}
    for b in bindings:  # newest wins, as the bind map
        pins.update(b.pins)
    starts = task_starts(tids=list(pins))
    out = tuple(PublishedPin(tid=t, start=starts[t], role=p.role, cpus=frozenset(p.cpus), index=p.index,
                             note=getattr(p, "note", None))
                for t, p in sorted(pins.items()) if t in starts)
    return Publication(me, _start(me) or 0, out, tuple(_plan_of(b) for b in bindings), time.time())


def _plan_of(b: Any) -> PublishedPlan:
    plan = getattr(b, "plan", None)
    if plan is None:  # a DataLoader worker's own binding: its CPUs, one thread
        return PublishedPlan(None, (), 1, frozenset(b.cpus), frozenset(b.main_mask))
    mem = getattr(b, "membind", None)
    membind = f"{mem.policy}:{format_list(mem.nodes)}" if mem is not None and mem.nodes else None
    decision = getattr(b, "decision", None)
    g = decision.placements[0].gpu if decision is not None else None
    gpu = None if g is None else PublishedGpu(bus_id=g.device.gpu.bus_id, tile=g.device.tile,
                                              numa_node=g.device.gpu.numa_node, ordinal=g.ordinal,
                                              cpus=frozenset(g.cpus), text=g.describe())
    return PublishedPlan(rules=plan.runtime, settings=tuple(plan.env), threads=plan.threads,
                         cpus=frozenset().union(*plan.cpusets), main_mask=frozenset(b.main_mask), membind=membind,
                         gpu=gpu)


def _to_json(pub: Publication) -> bytes:
    return json.dumps({
        "format": FORMAT, "pid": pub.pid, "start": pub.start, "written": pub.written,
        "pins": [{"tid": p.tid, "start": p.start, "role": p.role, "index": p.index, "cpus": format_list(p.cpus),
                  "note": p.note} for p in pub.pins],
        "plans": [{"rules": p.rules, "settings": [list(kv) for kv in p.settings], "threads": p.threads,
                   "cpus": format_list(p.cpus), "main_mask": format_list(p.main_mask), "membind": p.membind,
                   "gpu": None if p.gpu is None else p.gpu.to_dict()}
                  for p in pub.plans]}).encode()


def sync() -> None:
    """Write this process's publication from its active bindings, or remove it when
    none is left.  Never raises: a failure is kept in :data:`last_error`."""
    global last_error
    with _lock:
        try:
            pub = current()
            if pub is None:
                _remove()
            else:
                _write(pub)
            last_error = None
        except Exception as e:  # noqa: BLE001 - publishing must never break apply() or restore()
            last_error = f"{type(e).__name__}: {e}"


def changed(binding: Any) -> None:
    """:func:`sync`, when ``binding`` is one of this process's active bindings (its
    pins changed after apply(): pools pinned at TensorFlow's first op, at
    ``import torch``, by ``refresh()``)."""
    if any(b is binding for b in registry.applied_here()):
        sync()


def _write(pub: Publication) -> None:
    data = _to_json(pub)
    path = _written.get("path") if _written.get("pid") == pub.pid else None
    if path is None or not os.path.isdir(os.path.dirname(path)):  # (a folder removed meanwhile: made again)
        path = _first_folder(pub)
    tmp = f"{path}.{threading.get_native_id()}.tmp"
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if _written.get("path") != path:
        _written.update(path=path, pid=pub.pid)
    if not _atexit:
        atexit.register(_at_exit)
        _atexit.append(True)


def _first_folder(pub: Publication) -> str:
    """The file's path in the first folder of ours that can be made; stale files of
    processes that are gone removed from it."""
    why = []
    for d in folders():
        try:
            private_dir(d, create=True)
        except (UnsafeFile, OSError) as e:
            why.append(f"{d}: {e}")
            continue
        _sweep(d)
        return os.path.join(d, _name(pub.pid, pub.start))
    raise OSError(f"no folder to publish in ({'; '.join(why)})")


def _sweep(d: str) -> None:
    """Remove the files of processes that are gone (or whose PID another process holds
    now): ``PID-START.json`` and the temporary ``PID-START.json.TID.tmp``."""
    for name in os.listdir(d):
        pid, _, start = name.partition(".")[0].partition("-")
        if pid.isdigit() and start.isdigit() and _start(int(pid)) != int(start):
            try:
                os.unlink(os.path.join(d, name))
            except OSError:
                pass


def _remove() -> None:
    """This process's file removed (its last binding restored), and the files of
    processes that are gone swept from the folder."""
    path = _written.get("path")
    if path is not None and _written.get("pid") == os.getpid():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        _written.clear()
        _sweep(os.path.dirname(path))


def _at_exit() -> None:
    with _lock:
        try:
            _remove()
        except OSError:
            pass


# ------------------------------------------------------------------ another process
def read(pid: int, environ: dict[str, str] | None = None) -> tuple[Publication | None, str | None]:
    """The publication of process ``pid`` (``environ``: its environment, for its
    ``XDG_RUNTIME_DIR``), and a note when one was found but not taken.  This
    process's own comes from its bindings, not from a file.  ``(None, None)``:
    the process published nothing (not bound by affinity, or by an older one)."""
    if pid == os.getpid():
        return current(), None
    start = _start(pid)
    if start is None:
        return None, None
    try:
        uid = process_owner(pid)
    except OSError:
        return None, None
    if uid != os.geteuid():
        return None, f"pid {pid} is uid {uid}'s: its publication is not read (roles inferred)"
    for d in folders(uid, {**os.environ, **(environ or {})}):
        path = os.path.join(d, _name(pid, start))
        try:
            if private_dir(d, create=False) is None:
                continue
            fd = open_private(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        except (UnsafeFile, OSError) as e:
            return None, f"publication of pid {pid} not read: {e}"
        try:
            raw = os.read(fd, MAX_FILE + 1)
        finally:
            os.close(fd)
        try:
            return _from_json(raw, pid, start, path), None
        except (ValueError, KeyError, TypeError, SpecError) as e:
            return None, f"publication {path} not read: {e}"
    return None, None


def _from_json(raw: bytes, pid: int, start: int, path: str) -> Publication:
    if len(raw) > MAX_FILE:
        raise ValueError(f"larger than {MAX_FILE >> 20} MiB")
    d = json.loads(raw)
    if d.get("format") != FORMAT or d.get("pid") != pid or d.get("start") != start:
        raise ValueError(f"format {d.get('format')!r} for pid {d.get('pid')!r} started at {d.get('start')!r}, "
                         f"not format {FORMAT} of pid {pid} started at {start}")
    pins = tuple(PublishedPin(tid=_int(p["tid"]), start=_opt_int(p.get("start")), role=_str(p["role"]),
                              cpus=parse_list(p["cpus"]), index=_opt_int(p.get("index")),
                              note=_opt_str(p.get("note"))) for p in d["pins"])
    plans = tuple(PublishedPlan(rules=_opt_str(p.get("rules")),
                                settings=tuple((_str(k), _str(v)) for k, v in p["settings"]),
                                threads=_int(p["threads"]), cpus=parse_list(p["cpus"]),
                                main_mask=parse_list(p["main_mask"]), membind=_opt_str(p.get("membind")),
                                gpu=_gpu(p.get("gpu"))) for p in d["plans"])
    return Publication(pid=pid, start=start, pins=pins, plans=plans, written=float(d.get("written", 0.0)),
                       source=path)


def _gpu(d: Any) -> PublishedGpu | None:
    """A published plan's GPU (absent in a file of an affinity without GPUs: None)."""
    if d is None:
        return None
    if not isinstance(d, dict):
        raise TypeError(f"{d!r:.40} is not a GPU")
    return PublishedGpu(bus_id=_str(d["gpu"]), tile=_opt_int(d.get("tile")), numa_node=_int(d["gpu_numa_node"]),
                        ordinal=_int(d["ordinal"]), cpus=parse_list(_str(d["cpus"])), text=_str(d["text"]))


def _int(v: Any) -> int:
    if type(v) is not int:
        raise TypeError(f"{v!r:.40} is not an integer")
    return v


def _opt_int(v: Any) -> int | None:
    return None if v is None else _int(v)


def _str(v: Any) -> str:
    if type(v) is not str or len(v) > 4096:
        raise TypeError(f"{v!r:.40} is not a string")
    return v


def _opt_str(v: Any) -> str | None:
    return None if v is None else _str(v)
