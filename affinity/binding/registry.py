"""The bindings applied in this process and not yet restored, oldest first; who
puts back each piece of state they changed; and the critical sections in which
they are applied and restored.

Kept apart from :mod:`affinity.binding.apply` so that the bind map
(:mod:`affinity.binding.bindmap`) can read the active bindings' pins without
importing the module that creates them.

Overlapping bindings (docs/hardening.md)
----------------------------------------
The bindings form a stack in the order they were applied.  Every piece of state a
binding changes -- one environment variable, one OpenMP runtime's team size, the
BLAS limits, the memory policy of the thread that applied it, the thread masks, and
what a framework adapter changes (PyTorch's thread count, the DataLoader patch: the
snapshot's ``held``, by name, through :func:`hold`) -- is saved in its snapshot as it
found it.  :func:`release` decides, piece by piece,
who puts it back when a binding is restored:

* the binding is the newest one holding that piece: it puts its saved value back;
* a newer active binding holds it too (blocks that overlap without nesting: two
  threads, A enters, B enters, A exits, B exits; or ``b1 = apply(); b2 = apply();
  b1.restore(); b2.restore()``): the state is left as it is -- the newer binding is
  active and its values stand -- and the saved value is handed to the next newer
  holder, whose own restore then puts back what was there before both.

After every binding has ended, environment, masks, memory policy, team sizes and
BLAS limits are what they were before the first, whatever the order of the
restores.  Applying and restoring are serialized (one lock), so snapshots and the
stack order agree.  A process forked inside a block inherits the binding but not
its ownership: its restore leaves the child as it is.

Ctrl-C
------
:func:`applying` and :func:`critical` run ``apply()`` and ``restore()`` with SIGINT
deferred (main thread, Python-level handler: the only place ``KeyboardInterrupt``
can be raised).  A SIGINT that arrives meanwhile is recorded and the original
handler called once the state is consistent: during ``apply()`` the binding is then
undone before ``KeyboardInterrupt`` propagates (nothing applied), during
``restore()`` the restore completes first (everything restored).
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..record import replace

__all__ = ["active", "add", "applied_here", "applying", "critical", "exported", "hold", "release", "remove"]

F = TypeVar("F", bound=Callable[..., Any])

_lock = threading.RLock()  #: guards _active
_serial = threading.RLock()  #: one apply()/restore() at a time in the process
_active: list[Any] = []
#: id(binding) -> the mask its restore gives threads it has no snapshot of, when an
#: older binding handed it down (default: its snapshot's ``process_mask``)
_default_mask: dict[int, frozenset[int]] = {}
#: id(binding) -> the native TID of the thread that applied it (its memory policy is that thread's)
_applier: dict[int, int] = {}
#: id(binding) -> the process that applied it: a child forked inside a block is left alone
_process: dict[int, int] = {}


def active() -> list[Any]:
    """The bindings applied and not yet restored, oldest first."""
    with _lock:
        return list(_active)


def applied_here() -> list[Any]:
    """The active bindings applied by this process, oldest first (a child forked inside
    a block lists its parent's as active, but they are not its own)."""
    me = os.getpid()
    with _lock:
        return [b for b in _active if _process.get(id(b)) == me]


def _fresh_locks_in_child() -> None:
    """After fork(): the child's locks are new ones (another thread of the parent may
    have held them at the fork, and that thread does not exist in the child)."""
    global _lock, _serial
    _lock, _serial = threading.RLock(), threading.RLock()


_fork_hook: list[bool] = []  #: registered on first use (nothing is done at import)


def add(binding: Any) -> None:
    if not _fork_hook:
        os.register_at_fork(after_in_child=_fresh_locks_in_child)
        _fork_hook.append(True)
    with _lock:
        _active.append(binding)
        _applier[id(binding)] = threading.get_native_id()
        _process[id(binding)] = os.getpid()


def remove(binding: Any) -> None:
    with _lock:
        if any(b is binding for b in _active):
            _active.remove(binding)


def exported() -> dict[str, str]:
    """The variables the active bindings exported (newest wins): values that are
    ours, not the user's, when a nested binding decides what to keep."""
    with _lock:
        return {k: v for b in _active for k, v in b.env_set.items()}


# ---------------------------------------------------------------- ownership
def hold(binding: Any, key: str, value: Any) -> None:
    """``binding`` changes the piece of state named ``key`` (an adapter's: PyTorch's
    thread count, a patched class method), which was ``value``: saved as found, the
    first time only, and put back by whoever :func:`release` says (the newest active
    binding holding it)."""
    with _lock:
        binding._snapshot.held.setdefault(key, value)


def release(binding: Any) -> tuple[Any, bool]:
    """Take ``binding`` off the stack and hand each piece of state that a newer
    active binding also holds to that binding (see the module's docstring).

    Returns
    -------
    (snapshot, masks)
        A copy of the binding's snapshot holding only what it must put back itself
        (``env``, ``omp_threads``, ``held``, ``mempolicy``; ``process_mask`` is the mask
        for threads it has no snapshot of), and whether the thread masks are its to
        restore.  ``binding._blas`` is set to ``None`` when its limits were handed on.
    """
    with _lock:
        idx = next((i for i, b in enumerate(_active) if b is binding), None)
        above = _active[idx + 1:] if idx is not None else []  # not registered: a failing apply(), the newest
        if idx is not None:
            del _active[idx]
        snap = binding._snapshot
        _process.pop(id(binding), None)
        default = _default_mask.pop(id(binding), snap.process_mask)
        tid = _applier.pop(id(binding), threading.get_native_id())
        env = _hand_down(snap.env, above, lambda o: o._snapshot.env)
        omp = _hand_down(snap.omp_threads, above, lambda o: o._snapshot.omp_threads)
        held = _hand_down(snap.held, above, lambda o: o._snapshot.held)
        mempolicy = snap.mempolicy
        if mempolicy is not None:
            up = next((o for o in above if o._snapshot.mempolicy is not None
                       and _applier.get(id(o)) == tid), None)
            if up is not None:
                up._snapshot.mempolicy, mempolicy = mempolicy, None
        if binding._blas is not None:
            up = next((o for o in above if o._blas is not None), None)
            if up is not None:  # its limiter puts back what was there before both
                up._blas, binding._blas = binding._blas, None
        own_masks = not above
        if above:  # every binding restores every thread: the next newer one inherits ours
            up_snap = above[0]._snapshot
            # (by TID and start: a TID the kernel reused in between is another thread)
            up_snap.masks = {t: snap.mask(t, up_snap.starts.get(t), default) for t in up_snap.masks}
            _default_mask[id(above[0])] = default
        return replace(snap, env=env, omp_threads=omp, held=held, mempolicy=mempolicy,
                       process_mask=default), own_masks


def _hand_down(saved: dict[str, Any], above: list[Any], table: Callable[[Any], dict[str, Any]]
               ) -> dict[str, Any]:
    """The entries of ``saved`` no newer binding holds; the others are given to the
    next newer holder, in place of what it saved (the value this binding had set)."""
    own = {}
    for key, value in saved.items():
        up = next((o for o in above if key in table(o)), None)
        if up is None:
            own[key] = value
        else:
            table(up)[key] = value
    return own


# ------------------------------------------------------------------ Ctrl-C
class _Deferred:
    """SIGINT recorded instead of raised while state is half changed (main thread,
    Python-level handler only; nested sections are one)."""

    depth = 0  #: sections open in the main thread (class-wide)

    def __init__(self) -> None:
        self.pending: tuple[int, Any] | None = None
        self.old: Any = None
        self.undo: Callable[[], Any] | None = None  #: called when the handler raises after a completed apply
        self.counted = False

    def _record(self, signum: int, frame: Any) -> None:
        if self.pending is None:
            self.pending = (signum, frame)

    def __enter__(self) -> _Deferred:
        self.counted = threading.current_thread() is threading.main_thread() and not _Deferred.depth
        if not self.counted:
            return self
        old = signal.getsignal(signal.SIGINT)
        if callable(old):
            signal.signal(signal.SIGINT, self._record)  # a SIGINT already pending runs `old` first
            self.old = old
        _Deferred.depth += 1
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if not self.counted:
            return
        try:
            if self.old is not None:  # signal.signal runs a SIGINT pending here through _record
                signal.signal(signal.SIGINT, self.old)
        finally:
            _Deferred.depth -= 1
        if self.pending is not None:
            try:
                self.old(*self.pending)  # the default handler raises KeyboardInterrupt
            except BaseException:
                if self.undo is not None and et is None:
                    self.undo()
                raise


def critical(fn: F) -> F:
    """Run ``fn(binding)`` (a restore) to its end: serialized, SIGINT deferred until
    it is done, and run again if a SIGINT came before the deferral began (the
    restore is idempotent)."""

    @functools.wraps(fn)
    def inner(binding: Any, *a: Any, **k: Any) -> Any:
        try:
            if _process.get(id(binding), os.getpid()) != os.getpid():  # a child forked inside the block
                binding.active = False  # its masks, policy and environment are its own now: left alone
                return None
            with _serial, _Deferred():
                return fn(binding, *a, **k)
        except BaseException:
            if binding.active and _process.get(id(binding), os.getpid()) == os.getpid():
                # interrupted before it began (or it failed): once more, to its end
                with _serial, _Deferred():
                    fn(binding, *a, **k)
            raise

    return inner  # type: ignore[return-value]


def applying(fn: F) -> F:
    """Run ``fn`` (an apply, returning a binding) all or nothing: serialized, SIGINT
    deferred; a SIGINT during it undoes the binding before ``KeyboardInterrupt``."""

    @functools.wraps(fn)
    def inner(*a: Any, **k: Any) -> Any:
        b = None
        try:
            with _serial, _Deferred() as section:
                b = fn(*a, **k)
                section.undo = b.restore
            return b
        except BaseException:
            if b is not None and b.active:  # a SIGINT right after the handler came back
                b.restore()
            raise

    return inner  # type: ignore[return-value]
