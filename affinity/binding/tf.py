"""TensorFlow adapter.  TensorFlow is imported lazily, only when asked for.

Stock TensorFlow never pins its threads, and runs oneDNN on its own Eigen pool
(not OpenMP), so ``KMP_AFFINITY`` alone does nothing to it.  What TensorFlow
2.x does, measured on 2.21:

* the first op (eager context creation) starts the **intra-op** pool as N
  unnamed threads (their ``comm`` is the process name, e.g. ``python``), the
  **inter-op** pool as M threads named ``tf_Compute``, and one
  ``tf_graph_runner``;
* ``tf.config.threading.set_*_parallelism_threads`` raises ``RuntimeError``
  once that has happened: counts can only be chosen before;
* a TF1 ``Session`` with ``use_per_session_threads`` starts its own
  ``tf_Compute`` pool when it is constructed; the intra-op pool is per process,
  started by whichever comes first: the eager context, or -- in graph mode, which
  never starts the eager runtime -- the first ``Session`` (sized by its
  ``ConfigProto``).

This module finds those threads by diffing ``/proc/self/task`` around start-up
(and by name and creation order when TensorFlow was already running), so
:mod:`affinity.binding.apply` can pin them by TID.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from ..record import record
from . import registry
from .threads import task_names

__all__ = ["PoolSizes", "SessionHook", "TFState", "classify_new_threads", "config_proto",
           "find_running_pools", "is_running", "merged", "on_runtime_start", "pools_started", "set_pool_sizes",
           "start_runtime"]

INTER_NAME = "tf_Compute"
GRAPH_RUNNER = "tf_graph_runner"


def _tf() -> Any:
    import tensorflow as tf  # noqa: PLC0415  (lazy on purpose)

    return tf


def imported() -> bool:
    return "tensorflow" in sys.modules


def _process_name() -> str:
    with open(f"/proc/self/task/{os.getpid()}/comm") as fh:
        return fh.read().strip()


def is_running() -> bool:
    """Whether TensorFlow's runtime (eager context, thread pools) has started."""
    if not imported():
        return False
    tf = _tf()
    try:
        from tensorflow.python.eager import context  # noqa: PLC0415

        ctx = context.context()
        return bool(getattr(ctx, "_initialized", False) or getattr(ctx, "_context_handle", None))
    except Exception:  # noqa: BLE001 - private API moved: probe the public one
        try:
            v = tf.config.threading.get_intra_op_parallelism_threads()
            tf.config.threading.set_intra_op_parallelism_threads(v)
            return False
        except RuntimeError:
            return True


@record
class TFState:
    """TensorFlow's pools as found: TIDs in creation order."""

    intra: tuple[int, ...]
    inter: tuple[int, ...]
    other: tuple[int, ...]  #: tf_graph_runner and friends
    intra_size: int
    inter_size: int
    counts_set: bool  #: False when the runtime was already running


def classify_new_threads(new: Mapping[int, str], process_name: str | None = None
                         ) -> tuple[list[int], list[int], list[int]]:
    """Split threads that appeared during TensorFlow start-up into
    (intra-op, inter-op, other), each in creation (TID) order."""
    pname = process_name or _process_name()
    intra, inter, other = [], [], []
    for tid in sorted(new):
        name = new[tid]
        if name == INTER_NAME:
            inter.append(tid)
        elif name == pname:
            intra.append(tid)
        else:
            other.append(tid)
    return intra, inter, other


def set_pool_sizes(intra: int | None, inter: int | None) -> Any:
    """Size the pools TensorFlow's runtime will start (before it started); returns
    the ``tensorflow`` module."""
    tf = _tf()
    if intra is not None:
        tf.config.threading.set_intra_op_parallelism_threads(int(intra))
    if inter is not None:
        tf.config.threading.set_inter_op_parallelism_threads(int(inter))
    return tf


#: the pool sizes a binding set before TensorFlow's runtime started, held by name
POOL_SIZES_KEY = "tensorflow.config.threading"


class PoolSizes:
    """The pool sizes TensorFlow is set to start with, as they were before
    :func:`set_pool_sizes`, held by ``binding`` (:func:`.registry.hold`, so that
    bindings restored in any order leave what was there before the first);
    :meth:`remove` (a binding's hook, at restore) puts them back when they are its
    own to put back, while the runtime has not started -- once it has, TensorFlow
    keeps its pools."""

    holds = True  #: its :meth:`remove` takes the pieces its binding still holds

    def __init__(self, binding: Any) -> None:
        threading_ = _tf().config.threading
        registry.hold(binding, POOL_SIZES_KEY, (threading_.get_intra_op_parallelism_threads(),
                                                threading_.get_inter_op_parallelism_threads()))

    def remove(self, held: Mapping[str, Any]) -> None:
        if POOL_SIZES_KEY not in held or is_running():
            return
        threading_ = _tf().config.threading
        intra, inter = held[POOL_SIZES_KEY]
        threading_.set_intra_op_parallelism_threads(intra)
        threading_.set_inter_op_parallelism_threads(inter)


def pools_started() -> bool:
    """Whether TensorFlow's pools exist: its eager runtime started
    (:func:`is_running`), or a TF1 ``Session`` started them without it (graph mode
    never starts the eager runtime, but a session's devices create the process's
    intra-op pool and its own ``tf_Compute`` workers)."""
    return is_running() or (imported() and INTER_NAME in task_names().values())


def start_runtime(intra: int | None, inter: int | None) -> TFState:
    """Set the pool sizes and start TensorFlow's runtime, returning its pools.

    Must be called before the pools started (see :func:`pools_started`).  The
    eager context is initialized directly, so that graph mode
    (``tf.compat.v1.disable_eager_execution()``) starts the pools too and the
    user's default graph gets no node of ours; a TensorFlow without
    ``Context.ensure_initialized`` runs one small eager op instead.
    """
    tf = set_pool_sizes(intra, inter)
    before = task_names()
    try:
        from tensorflow.python.eager import context  # noqa: PLC0415

        context.context().ensure_initialized()  # the eager context and its pools
    except (ImportError, AttributeError):  # private API moved
        tf.constant(1.0) + tf.constant(1.0)
    after = task_names()
    new = {t: n for t, n in after.items() if t not in before}
    i, j, o = classify_new_threads(new)
    return TFState(intra=tuple(i), inter=tuple(j), other=tuple(o), intra_size=len(i), inter_size=len(j),
                   counts_set=True)


def merged(known: TFState | None, new: TFState) -> TFState:
    """The pools of ``known`` and ``new`` together (a session's workers added to
    those found before), each TID once, in creation order."""
    if known is None:
        return new

    def both(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(set(a) | set(b)))

    intra, inter = both(known.intra, new.intra), both(known.inter, new.inter)
    return TFState(intra=intra, inter=inter, other=both(known.other, new.other), intra_size=len(intra),
                   inter_size=len(inter), counts_set=known.counts_set or new.counts_set)


def _env_count(name: str, environ: Mapping[str, str] | None = None) -> int:
    """A pool size TensorFlow took from its environment variable (0: none given)."""
    text = (os.environ if environ is None else environ).get(name, "").strip()
    return int(text) if text.isdigit() else 0


def find_running_pools(known: Iterable[int] = (), environ: Mapping[str, str] | None = None) -> TFState:
    """Find the pools of a runtime that started before us.

    Inter-op workers are named ``tf_Compute``.  Intra-op workers are unnamed; the
    runtime creates them just before the inter-op pool, so they are the unnamed
    threads with the highest TIDs below the first ``tf_Compute`` thread, as many
    as the intra-op pool has (the configured size, or the process's CPU count at
    start when it was left to TensorFlow).  ``known`` threads (Python's own,
    already classified) are never taken.  ``environ``: the environment the runtime
    started in (default: this process's now).
    """
    tf = _tf()
    names = task_names()
    pname = _process_name()
    main = os.getpid()
    skip = set(known) | {main}
    skip |= {t.native_id for t in threading.enumerate() if t.native_id}
    size = (tf.config.threading.get_intra_op_parallelism_threads() or _env_count("TF_NUM_INTRAOP_THREADS", environ)
            or len(os.sched_getaffinity(main)))
    return pools_of(names, pname, size, skip)


def pools_of(names: Mapping[int, str], pname: str, size: int, skip: Iterable[int] = ()) -> TFState:
    """The rule :func:`find_running_pools` follows, on any process's threads (TID ->
    name; ``pname``: the process's own name): inter-op workers by name, intra-op
    workers the ``size`` highest unnamed TIDs below the first inter-op worker, not
    in ``skip``.  ``affinity show PID`` applies it to other processes."""
    skip = set(skip)
    inter = sorted(t for t, n in names.items() if n == INTER_NAME)
    other = sorted(t for t, n in names.items() if n == GRAPH_RUNNER)
    intra: list[int] = []
    if inter:
        below = sorted((t for t, n in names.items() if n == pname and t < inter[0] and t not in skip),
                       reverse=True)
        intra = sorted(below[:size])
    return TFState(intra=tuple(intra), inter=tuple(inter), other=tuple(other), intra_size=len(intra),
                   inter_size=len(inter), counts_set=False)


def config_proto(intra: int, inter: int, *, per_session: bool = True) -> Any:
    """A ``tf.compat.v1.ConfigProto`` with the given pool sizes."""
    tf = _tf()
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=int(intra),
                                    inter_op_parallelism_threads=int(inter),
                                    use_per_session_threads=per_session)


class SessionHook:
    """While installed, every new TF1 ``Session`` calls ``callback(state)`` right
    after its construction, ``state`` the :class:`TFState` of the threads the
    construction started (its devices' intra-op pool when it is the first to
    create it -- graph mode never starts the eager runtime --, its ``tf_Compute``
    inter-op workers, ``tf_graph_runner``), told apart as
    :func:`classify_new_threads` does.  Another thread that happens to start
    during the construction is counted as the session's.

    A :class:`_Patch` of ``BaseSession.__init__``: removing hooks in any order
    (two bindings restored out of order) leaves the class's own ``__init__``."""

    def __init__(self, callback: Any):
        self.callback = callback
        self._patch: _Patch | None = None

    def install(self) -> None:
        from tensorflow.python.client import session as s  # noqa: PLC0415

        callback = self.callback

        def make(orig: Any) -> Any:
            def __init__(self_: Any, *a: Any, **k: Any) -> None:
                before = task_names()
                orig(self_, *a, **k)
                new = {t: n for t, n in task_names().items() if t not in before}
                i, j, o = classify_new_threads(new)
                callback(TFState(intra=tuple(i), inter=tuple(j), other=tuple(o), intra_size=len(i), inter_size=len(j),
                                 counts_set=False))

            return __init__

        self._patch = _Patch(s.BaseSession, "__init__", make)

    def remove(self) -> None:
        if self._patch is not None:
            self._patch.remove()
            self._patch = None


_MISSING = object()


class _Patch:
    """A method replaced on a class while installed, put back by :meth:`remove`.

    Patches of one method stack.  Removing one that a newer patch has wrapped
    since (bindings restored out of order) cannot take it out of the middle: it
    turns into a pass-through to what it wrapped, and the removal of the newer
    one unwinds every dead patch under it, so the class ends with its own method
    whatever the order.  A method someone else replaced over ours is left alone.
    """

    def __init__(self, cls: Any, name: str, make: Any):
        self.cls, self.name = cls, name
        self.raw = cls.__dict__.get(name, _MISSING)  #: what the class itself held (maybe inherited)
        self.orig = getattr(cls, name)
        self.live = True
        new = make(self.orig)
        patch = self

        @functools.wraps(self.orig)
        def call(*a: Any, **k: Any) -> Any:
            return (new if patch.live else patch.orig)(*a, **k)

        call._affinity_patch = self  # type: ignore[attr-defined]
        self.new = call
        setattr(cls, name, call)

    def remove(self) -> None:
        if self.cls is None:
            return
        self.live = False
        cls, name = self.cls, self.name
        top = cls.__dict__.get(name, _MISSING)
        while getattr(top, "_affinity_patch", None) is not None and not top._affinity_patch.live:
            dead = top._affinity_patch
            if dead.raw is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, dead.raw)
            dead.cls = None
            top = cls.__dict__.get(name, _MISSING)
        # else: a newer live patch (or someone else's method) is on top: ours stays a pass-through


def on_runtime_start(callback: Any) -> _Patch:
    """While the returned patch is installed, the start of TensorFlow's eager
    runtime (``Context.ensure_initialized``, which creates the pools) is followed
    by ``callback(state)`` with the :class:`TFState` of the threads it created.

    TensorFlow must be imported.  ``remove()`` the patch to stop watching.
    """
    from tensorflow.python.eager import context  # noqa: PLC0415

    def make(orig: Any) -> Any:
        def ensure_initialized(self_: Any) -> Any:
            if getattr(self_, "_initialized", True):
                return orig(self_)
            before = task_names()
            out = orig(self_)
            new = {t: n for t, n in task_names().items() if t not in before}
            i, j, o = classify_new_threads(new)
            callback(TFState(intra=tuple(i), inter=tuple(j), other=tuple(o), intra_size=len(i), inter_size=len(j),
                             counts_set=True))
            return out

        return ensure_initialized

    return _Patch(context.Context, "ensure_initialized", make)


