"""ONNX Runtime adapter (``affinity.onnxruntime``).  onnxruntime is imported lazily.

* :func:`session_options` -- for explicit use: a ``SessionOptions`` with the
  plan's intra-op and inter-op pool sizes and the intra-op threads' CPUs in ONNX
  Runtime's own ``session.intra_op_thread_affinities`` syntax
  (:mod:`affinity.planning.engines.ort`): ONNX Runtime pins its threads itself.
* Inside ``apply()``/``pinned()``: every ``InferenceSession`` created while the
  binding is active gets them too.  ``InferenceSession.__init__`` is wrapped while
  the binding is active (installed at ``apply()`` when onnxruntime is imported,
  else right after its import) and put back at restore.  After each session is
  made, its new pool threads are found (the threads that appeared while it was
  made, in creation order: the intra-op pool's ``n - 1`` first, then the
  inter-op pool's), pinned by TID as well (the same sets ONNX Runtime gives
  them: no race with its own pinning, which runs when each thread starts) and
  entered in the bind map as ``ort-intra`` (started thread ``j`` -> slot ``j``; the
  caller, member 0, keeps the plan's CPUs) and ``ort-inter`` (the inter-op set).

A session made with the user's own ``SessionOptions``: its intra-op count, if the
user set one, is kept (threads pinned by TID over the plan's slots, a note when it
differs from the plan's); left at 0 it is set to the plan's for that session only
(and put back on the user's object); the user's own affinity string is kept.
The user's object is never left changed: a config entry cannot be removed from a
``SessionOptions``, so the plan's affinities are only given to options made here.

What it cannot do: pin ONNX Runtime's global thread pools (an environment made
with ``global_*`` pools); tell apart pool threads from threads another Python
thread starts while the session is being made; restore the wrapper's place when
bindings are restored out of order (the outer one's wrapper then stays, inert).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable
from typing import Any

from ..errors import AffinityWarning
from ..machine import cgroup
from ..planning.engines.ort import AFFINITY_KEY, OrtThreading, ort_threading, overridden, parse_affinities
from . import threads as _threads
from .importwatch import ImportWatch

__all__ = ["OrtAdapter", "attach", "creation_order", "imported", "session_options"]

INTRA, INTER = "ort-intra", "ort-inter"


def _ort() -> Any:
    import onnxruntime  # noqa: PLC0415  (lazy on purpose: never at `import affinity`)

    return onnxruntime


def imported() -> bool:
    return "onnxruntime" in sys.modules


def _plan_of(plan_or_binding: Any) -> Any:
    return getattr(plan_or_binding, "plan", plan_or_binding)


def session_options(plan: Any, options: Any = None) -> Any:
    """An ``onnxruntime.SessionOptions`` for ``plan`` (a Plan, or a Binding: its plan):
    ``intra_op_num_threads`` = the plan's intra-op slots, ``inter_op_num_threads``
    its inter-op count, and ``session.intra_op_thread_affinities`` giving started
    thread ``j`` slot ``j`` (the caller, member 0, gets none: it runs where the
    calling thread may).  ``options``: set these on that object instead of a new
    one (its config entries cannot be taken back).

    Examples
    --------
    >>> p = affinity.plan("granularity=fine,compact", threads=4)       # doctest: +SKIP
    >>> sess = onnxruntime.InferenceSession(model, affinity.onnxruntime.session_options(p))  # doctest: +SKIP
    """
    t = ort_threading(_plan_of(plan))  # decision: ONNX Runtime's pools from the plan
    so = _ort().SessionOptions() if options is None else options
    _give(so, t)
    return so


def _give(so: Any, t: OrtThreading) -> None:
    so.intra_op_num_threads = t.intra_op_num_threads
    so.inter_op_num_threads = t.inter_op_num_threads
    for k, v in t.config().items():
        so.add_session_config_entry(k, v)


def _user_affinities(so: Any) -> str | None:
    try:
        return str(so.get_session_config_entry(AFFINITY_KEY))
    except RuntimeError:  # "SessionOptions does not have configuration with key ..."
        return None


def creation_order(tids: Iterable[int], pid_max: int = 4194304) -> list[int]:
    """TIDs in the order the kernel handed them out: increasing, but where the ids
    wrapped past ``pid_max`` during the creation, the ones after the widest gap
    first (the kernel allocates ids cyclically)."""
    ids = sorted(tids)
    if len(ids) < 2:
        return ids
    gaps = [(ids[i + 1] - ids[i], i + 1) for i in range(len(ids) - 1)]
    gaps.append((ids[0] + pid_max - ids[-1], 0))
    _, start = max(gaps)
    return ids[start:] + ids[:start]


class OrtAdapter:
    """ONNX Runtime's side of one binding: the ``InferenceSession.__init__`` wrapper
    and the sessions' threads.  In ``binding._hooks``: :meth:`remove` at restore."""

    def __init__(self, binding: Any, pin_cls: Any):
        self.binding, self.pin_cls = binding, pin_cls
        self.cls: Any = None
        self.orig: Any = None
        self.new: Any = None
        self.watch: ImportWatch | None = None
        self.sessions = 0
        self.said_default = False
        self.threading = ort_threading(binding.plan)  # decision: ONNX Runtime's pools from the plan

    # ---- lifecycle
    def install(self) -> None:
        """Wrap ``InferenceSession.__init__`` (onnxruntime is imported)."""
        if self.cls is not None or not self.binding.active:
            return
        from onnxruntime.capi import onnxruntime_inference_collection as coll  # noqa: PLC0415  (imported already)

        cls = coll.InferenceSession
        orig, adapter = cls.__init__, self

        def __init__(sess: Any, path_or_bytes: Any, sess_options: Any = None, providers: Any = None,
                     provider_options: Any = None, **kwargs: Any) -> None:
            if not adapter.binding.active or adapter.cls is None:
                return orig(sess, path_or_bytes, sess_options, providers, provider_options, **kwargs)
            return adapter.make(orig, sess, path_or_bytes, sess_options, providers, provider_options, kwargs)

        __init__.__wrapped__ = orig  # type: ignore[attr-defined]
        self.cls, self.orig, self.new = cls, orig, __init__
        cls.__init__ = __init__

    def imported_now(self, _token: Any, ok: bool) -> None:
        self.watch = None
        if ok and self.binding.active:
            self.install()

    def remove(self) -> None:
        if self.watch is not None:
            self.watch.remove()
            self.watch = None
        if self.cls is not None and self.cls.__dict__.get("__init__") is self.new:
            self.cls.__init__ = self.orig
        self.cls = None

    # ---- one session
    def make(self, orig: Any, sess: Any, path_or_bytes: Any, so: Any, providers: Any, provider_options: Any,
             kwargs: dict[str, Any]) -> None:
        """Create the session with the plan's options (or the user's, completed),
        then find and pin its pool threads."""
        mode, so, undo = self._options(so)
        count = so.intra_op_num_threads  # the pool's size, before the user's object is put back
        before = _threads.task_starts()
        try:
            orig(sess, path_or_bytes, so, providers, provider_options, **kwargs)
        finally:
            undo()
        after = _threads.task_starts()
        new = creation_order(t for t, start in after.items() if before.get(t) != start)
        try:
            self._pin_new(new, mode, so, count)
        except Exception as e:  # noqa: BLE001 - never break the user's session
            warnings.warn(f"affinity: ONNX Runtime's threads could not be pinned ({e})", AffinityWarning,
                          stacklevel=3)
        self.sessions += 1

    def _options(self, so: Any) -> tuple[str, Any, Any]:
        """(mode, the options to create with, how to put the user's object back)."""
        t = self.threading
        if so is None:
            made = _ort().SessionOptions()
            _give(made, t)
            self._say_default()
            return "ours", made, lambda: None
        if _user_affinities(so) is not None:
            return "theirs", so, lambda: None
        if so.intra_op_num_threads > 0:
            return "count", so, lambda: None
        old_inter = so.inter_op_num_threads

        def undo() -> None:
            so.intra_op_num_threads = 0
            so.inter_op_num_threads = old_inter

        so.intra_op_num_threads = t.intra_op_num_threads
        if old_inter <= 0:
            so.inter_op_num_threads = t.inter_op_num_threads
        self._say_default()
        return "count", so, undo

    def _say_default(self) -> None:
        if self.said_default:
            return
        self.said_default = True
        b = self.binding
        quota = cgroup.cpu_quota()
        said = overridden(b.plan.topology, self.threading, quota.cpus if quota else None)  # decision: ORT overridden
        for n in said:
            b.notes.append(n)
            warnings.warn(f"affinity: {n}", AffinityWarning, stacklevel=5)

    def _pin_new(self, new: list[int], mode: str, so: Any, count: int) -> None:
        b, t = self.binding, self.threading
        intra_n = max(count, 1) - 1
        slots = b.slots
        if mode == "theirs":
            sets = parse_affinities(_user_affinities(so) or "")
        elif mode == "ours":
            sets = t.workers
        else:
            sets = tuple(slots[(j + 1) % len(slots)] for j in range(intra_n))
        intra, inter = new[:intra_n], new[intra_n:]
        masks: dict[int, frozenset[int]] = {}
        for j, tid in enumerate(intra):
            cpus = sets[j] if j < len(sets) else b.union
            b.pins[tid] = self.pin_cls(tid, INTRA, cpus, j + 1, self._why(mode, so))
            if mode != "theirs":
                masks[tid] = cpus
        for j, tid in enumerate(inter):
            masks[tid] = b._inter_set(j)
            b.pins[tid] = self.pin_cls(tid, INTER, masks[tid], j)
        b._see(new)
        b._pin(masks)
        if mode == "count" and count != t.intra_op_num_threads:
            b.notes.append(f"an ONNX Runtime session keeps its own intra_op_num_threads={count} "
                           f"(the plan has {t.intra_op_num_threads} slots): its threads were pinned over the slots")
        if len(intra) < intra_n:
            b.notes.append(f"an ONNX Runtime session started {len(intra)} of its {intra_n} intra-op threads "
                           f"where they could be seen")

    @staticmethod
    def _why(mode: str, so: Any) -> str | None:
        if mode == "theirs":
            return f"the session's own {AFFINITY_KEY}={_user_affinities(so)}"
        return None


def attach(b: Any, pin_cls: Any) -> OrtAdapter:
    """ONNX Runtime's part of :func:`affinity.apply`: wrap sessions now if onnxruntime
    is imported, else right after it is.  Returns the adapter (in ``b._hooks``)."""
    ad = OrtAdapter(b, pin_cls)
    b._hooks.append(ad)
    if imported():
        ad.install()
    else:
        ad.watch = ImportWatch("onnxruntime", ad.imported_now)
    return ad


def adapter_of(b: Any) -> OrtAdapter | None:
    return next((h for h in b._hooks if isinstance(h, OrtAdapter)), None)

