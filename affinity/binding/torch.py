"""PyTorch adapter (``affinity.torch``).  PyTorch is imported lazily, only when asked for.

What the CPU build of PyTorch does, measured on 2.13.0 (its wheel bundles GNU
libgomp as ``torch/lib/libgomp.so.1``):

* **intra-op**: an OpenMP team of that libgomp, ``torch.set_num_threads(n)``
  threads (the calling thread is member 0).  The team threads are created at the
  first parallel region and kept (a hot team) while the size stays the same.
* **inter-op**: a pool of ``torch.get_num_interop_threads()`` threads named
  ``PTThreadPool``, created all at once the first time work is launched on it
  (``at::launch``: ``torch.jit.fork`` in TorchScript, among others).
  ``torch.set_num_interop_threads`` is accepted once, and only before that pool
  exists; afterwards it raises ``RuntimeError`` ("cannot set number of interop
  threads after parallel work has started or set_num_interop_threads called").
* **libgomp at load**: when ``OMP_PLACES``/``OMP_PROC_BIND``/``GOMP_CPU_AFFINITY``
  are set, libgomp binds the thread that loads it -- the main thread, during
  ``import torch`` -- to its first place; every thread and process started from
  it afterwards inherits that one place (tensorflow#24172 for TensorFlow;
  DataLoader workers all on one CPU for PyTorch, pytorch#149422).

This module sizes both pools from the plan, finds their threads (the intra-op
team as the members of a region of the very libgomp torch resolves its
``omp_*`` calls to; the inter-op pool as the threads that appear while the pool
is created, or -- when it existed before -- its ``PTThreadPool`` threads checked
against the pool size torch reports), pins them by TID, prevents or undoes
libgomp's load-time pin of the main thread, places DataLoader workers, and
restores all of it.  :mod:`affinity.binding.apply` calls :func:`attach`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..cpulist import format_list, parse_list
from ..errors import AffinityWarning, PlanError
from ..planning.workers import WorkerLayout, worker_layout
from ..record import field, record
from . import publication, registry
from . import threads as _threads
from .importwatch import ImportWatch
from .openmp import OpenMPRuntime
from ..machine.loaded import census, family_of
from ..planning.decide import GNU_PLACEMENT, WORKERS_VARIABLE, meaning_notes

__all__ = ["INTER_NAME", "LoadPin", "TorchAdapter", "attach", "imported", "interop_pool", "load_pin",
           "torch_runtime", "worker_init_fn"]

INTER_NAME = "PTThreadPool"  #: the name (comm) torch gives its inter-op threads
#: the variables with which libgomp pins the thread that loads it (its placement variables)
LOAD_PIN_VARIABLES = GNU_PLACEMENT
#: what a DataLoader worker is told about itself
WORKER_VARIABLES = ("AFFINITY_WORKER_ID", "AFFINITY_WORKER_CPUS", "AFFINITY_DATALOADER_WORKERS")
#: the layout of the workers, exported by ``pinned(..., dataloader_workers=K)`` for workers started by spawn
LAYOUT_VARIABLE = WORKERS_VARIABLE  # the one name: planning.decide
REFUSED = "cannot set number of interop threads"
#: the pieces of state the adapter changes, held by name (:func:`.registry.hold`)
THREADS_KEY, LOADER_KEY = "torch.set_num_threads", "torch.DataLoader.__init__"
_NOT_HELD = object()


def _torch() -> Any:
    import torch  # noqa: PLC0415  (lazy on purpose: never at `import affinity`)

    return torch


def imported() -> bool:
    return "torch" in sys.modules


# ------------------------------------------------------------------ the runtime
def torch_runtime() -> OpenMPRuntime | None:
    """The OpenMP runtime PyTorch really calls: the file that holds the
    ``omp_get_max_threads`` which ``libtorch_cpu`` resolves (``None`` for a build
    without OpenMP)."""
    lib_dir = os.path.join(os.path.dirname(_torch().__file__), "lib")
    try:
        lib = ctypes.CDLL(os.path.join(lib_dir, "libtorch_cpu.so"), mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
        addr = ctypes.cast(lib.omp_get_max_threads, ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return None
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split(None, 5)
            lo, _, hi = parts[0].partition("-")
            if len(parts) == 6 and int(lo, 16) <= addr < int(hi, 16):
                found = family_of(parts[5].strip())
                return OpenMPRuntime(os.path.realpath(parts[5].strip()), found[0]) if found else None
    return None


@record
class LoadPin:
    """libgomp's binding of the main thread to its first place, at load."""

    place: frozenset[int]  #: the one place the main thread was narrowed to
    places: frozenset[int]  #: every CPU of libgomp's place list (at least what the thread had)


def load_pin(rt: OpenMPRuntime | None) -> LoadPin | None:
    """Whether libgomp ``rt`` pinned the main thread to its first place when it
    loaded (binding on, places listed, the main thread's mask exactly place 0,
    the place list wider than it); ``None`` otherwise."""
    if rt is None or rt.kind != "libgomp":
        return None
    lib = ctypes.CDLL(rt.path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
    if lib.omp_get_proc_bind() == 0 or lib.omp_get_num_places() < 1:
        return None
    places: list[frozenset[int]] = []
    for p in range(lib.omp_get_num_places()):
        n = lib.omp_get_place_num_procs(p)
        ids = (ctypes.c_int * max(n, 1))()
        lib.omp_get_place_proc_ids(p, ids)
        places.append(frozenset(ids[i] for i in range(n)))
    main = _threads.get_affinity(os.getpid())
    union = frozenset().union(*places)
    if main != places[0] or union <= main:
        return None
    return LoadPin(places[0], union)


def mask_before_load_pin(mask: frozenset[int]) -> frozenset[int]:
    """The main thread's mask as it was before PyTorch's libgomp narrowed it at load
    (the CPUs of its place list), or ``mask`` when nothing narrowed it."""
    if not imported():
        return mask
    pin = load_pin(torch_runtime())
    return mask | pin.places if pin is not None and mask == pin.place else mask


# ---------------------------------------------------------------- the inter-op pool
@functools.lru_cache(maxsize=1)
def _launcher() -> Any:
    """A TorchScript function whose ``fork`` goes through ``at::launch``, which
    creates the inter-op pool when it does not exist yet."""
    torch = _torch()

    def _noop(x: torch.Tensor) -> torch.Tensor:
        return x

    noop = torch.jit.script(_noop)

    def _launch(x: torch.Tensor) -> torch.Tensor:
        return torch.jit.wait(torch.jit.fork(noop, x))

    return torch.jit.script(_launch)


def interop_pool(known: Iterable[int] = ()) -> tuple[tuple[int, ...], bool]:
    """The inter-op pool's threads, creating the pool if it does not exist:
    ``(tids, created_now)``.  Created now: the ``PTThreadPool`` threads that
    appeared while it was created.  Existing: the ``PTThreadPool`` threads not in
    ``known``.  Either way as many as torch says the pool has (else none: not
    identified)."""
    torch = _torch()
    before = _threads.task_names()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice
        _launcher()(torch.zeros(1))
    skip = set(known)
    existed = any(n == INTER_NAME and t not in skip for t, n in before.items())
    if existed:
        return _named_pool(lambda t: t in before and t not in skip, torch.get_num_interop_threads()), False
    return _named_pool(lambda t: t not in before, torch.get_num_interop_threads()), True


#: how long a pool's threads may take to name themselves (each names itself when it
#: first runs, which may be after the pool was created and ``at::launch`` returned)
NAMING_WAIT_S = 2.0


def _named_pool(candidate: Callable[[int], bool], size: int) -> tuple[int, ...]:
    """The ``size`` candidate threads named ``PTThreadPool``.  A pool thread that has
    not run yet still carries its creator's name, so the count is polled (bounded by
    :data:`NAMING_WAIT_S`) until it is whole; a pool still short after that is not
    identified (empty)."""
    deadline = time.monotonic() + NAMING_WAIT_S
    while True:
        found = tuple(sorted(t for t, n in _threads.task_names().items() if n == INTER_NAME and candidate(t)))
        if len(found) == size:
            return found
        if time.monotonic() >= deadline:
            return ()
        time.sleep(0.005)


def size_interop(n: int) -> str | None:
    """``torch.set_num_interop_threads(n)``; the one-line reason when torch refuses
    and its pool has another size."""
    torch = _torch()
    try:
        torch.set_num_interop_threads(int(n))
    except RuntimeError as e:
        if REFUSED not in str(e):
            raise
        if torch.get_num_interop_threads() == int(n):
            return None  # set before (an earlier binding): already the size wanted
        return (f"PyTorch's inter-op pool keeps {torch.get_num_interop_threads()} threads "
                f"(set_num_interop_threads({n}) refused: parallel work already started, or it was set "
                f"before); its existing threads were pinned")
    return None




# ---------------------------------------------------------------- the adapter
@record(frozen=False)
class TorchAdapter:
    """PyTorch's side of one :class:`~affinity.binding.apply.Binding`: what was
    sized, pinned and how the main thread was kept off libgomp's first place.
    Installed in ``binding._hooks``: :meth:`remove` (at restore) puts torch's
    thread count back and stops watching."""

    binding: Any
    pin_cls: Any  #: the Pin record of the binding
    workers: int | None = None
    layout: WorkerLayout | None = None
    runtime: OpenMPRuntime | None = None
    intra: tuple[int, ...] = ()
    inter: tuple[int, ...] = ()
    main_note: str = ""
    prevented: tuple[str, ...] = ()  #: our variables hidden from libgomp while torch loaded
    _watch: Any = field(default=None, repr=False)
    _loader_patch: Any = field(default=None, repr=False)
    holds = True  #: its :meth:`remove` takes the pieces its binding still holds (a class constant)

    # ---- lifecycle
    def owns(self, rt: Any) -> bool:
        """Whether ``rt`` is PyTorch's runtime (pinned here, not as a plain OpenMP team)."""
        return self.runtime is not None and rt.path == self.runtime.path

    def remove(self, held: Mapping[str, Any] | None = None) -> None:
        """Stop watching and patching; put back what ``held`` (the part of the
        binding's snapshot that is still its own, :func:`.registry.release`) names:
        torch's thread count, the DataLoader iterator's ``__init__``.  A piece a newer
        binding also holds is left to it (the patch turns into a pass-through)."""
        held = held or {}
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
        if self._loader_patch is not None:
            self._loader_patch.remove(held.get(LOADER_KEY, _NOT_HELD))
            self._loader_patch = None
        if THREADS_KEY in held and imported():
            with contextlib.suppress(Exception):
                _torch().set_num_threads(held[THREADS_KEY])

    # ---- torch imported inside the binding
    def hide_load_pin_variables(self) -> dict[str, str]:
        """Before ``import torch``: take our ``OMP_PLACES``/``OMP_PROC_BIND``/
        ``GOMP_CPU_AFFINITY`` out of the environment so that libgomp does not pin
        the importing thread; returns them, to put back byte for byte."""
        ours = {**registry.exported(), **self.binding.env_set}
        hidden = {k: os.environ[k] for k in LOAD_PIN_VARIABLES
                  if k in os.environ and ours.get(k) == os.environ[k]}
        for k in hidden:
            del os.environ[k]
        return hidden

    def imported_now(self, hidden: dict[str, str], ok: bool = True) -> None:
        """After ``import torch`` (inside the binding): put the variables back, then
        size and pin (``ok``: the import did not raise)."""
        os.environ.update(hidden)
        self.prevented = tuple(sorted(hidden))
        if not (ok and self.binding.active and imported() and hasattr(sys.modules["torch"], "set_num_threads")):
            return
        try:
            for n in self.attach_now() + meaning_notes(self.binding.plan, census()):
                warnings.warn(f"affinity: {n}", AffinityWarning, stacklevel=3)
        except Exception as e:  # noqa: BLE001 - never break the user's import
            warnings.warn(f"affinity: PyTorch was imported inside the binding but its threads could not be "
                          f"pinned ({e})", AffinityWarning, stacklevel=3)

    # ---- the work
    def attach_now(self) -> list[str]:
        """Size torch's pools from the plan, pin every thread of both by TID, keep
        the main thread on the plan's CPUs; returns the notes (what differed)."""
        b, torch = self.binding, _torch()
        notes: list[str] = []
        self.runtime = torch_runtime()
        undone = load_pin(self.runtime)  # undone below: the main thread goes back to the plan's CPUs
        registry.hold(b, THREADS_KEY, torch.get_num_threads())  # (the first time: as the user left it)
        torch.set_num_threads(b.plan.threads)  # the team OMP_NUM_THREADS exports: one story
        refused = size_interop(b.inter_op_threads)
        if refused:
            notes.append(refused)
        self.inter, _ = interop_pool(known=b.pins)
        if not self.inter:
            notes.append(f"PyTorch's inter-op pool ({torch.get_num_interop_threads()} threads) could not be told "
                         f"apart from other {INTER_NAME} threads: not pinned")
        self.pin_pools()
        self.main_note = self._explain_main(undone)
        self._place_workers()
        b.refresh()  # threads torch started meanwhile (TorchScript's, the import's): inside the plan
        return notes

    def pin_pools(self) -> None:
        """Pin the intra-op team (from inside a region of torch's runtime) and the
        inter-op pool; the main thread, team member 0, keeps the plan's CPUs."""
        b = self.binding
        slots, main = list(b.plan.cpusets), os.getpid()  # member i on the plan's set i
        masks: dict[int, frozenset[int]] = {}
        if self.runtime is not None:
            self.runtime.set_num_threads(len(slots))
            members = self.runtime.pin_team(slots)
            self.intra = tuple(t for t, _ in members)
            for i, (tid, got) in enumerate(members):
                cpus = b.union if tid == main else got
                masks[tid] = cpus
                b.pins[tid] = self.pin_cls(tid, "torch-intra", cpus, i)
        for j, tid in enumerate(self.inter):
            masks[tid] = b._inter_set(j)
            b.pins[tid] = self.pin_cls(tid, "torch-inter", masks[tid], j)
        b._see(masks)
        b._pin(masks)
        if main in masks and self.main_note:
            b.pins[main] = self.pin_cls(main, "torch-intra", b.union, 0, self.main_note)

    def _explain_main(self, undone: LoadPin | None) -> str:
        b = self.binding
        why = ""
        if self.prevented:
            why += (f"; libgomp's load-time pin prevented: {', '.join(self.prevented)} were hidden from it "
                    f"while torch loaded")
        if undone is not None:
            why += f"; libgomp's load-time pin to {{{format_list(undone.place)}}} undone"
        note = (f"PyTorch intra-op thread 0, kept on the plan's CPUs {{{format_list(b.union)}}} (not one slot) "
                f"so that threads and processes it starts get them{why}")
        main = os.getpid()
        if main in b.pins:
            b.pins[main] = self.pin_cls(main, "torch-intra", b.union, 0, note)
        return note

    # ---- DataLoader workers
    def _place_workers(self) -> None:
        """Patch the DataLoader's iterator: with ``dataloader_workers=K`` every
        multi-process loader's workers are placed; without, a loader given
        :func:`worker_init_fn` is handed its layout (a spawned worker has no binding)."""
        if self._loader_patch is not None:
            return
        self._loader_patch = _LoaderPatch(self.binding, automatic=bool(self.workers))


def attach(b: Any, mode: Any, layout: WorkerLayout | None, pin_cls: Any) -> TorchAdapter | None:
    """PyTorch's part of :func:`affinity.apply`: now if torch is imported, else when
    it is; ``mode`` False leaves torch alone; ``layout``: where the DataLoader workers
    go (decided, and exported, with the plan).  Returns the adapter (in ``b._hooks``)."""
    if mode is False:
        return None
    ad = TorchAdapter(b, pin_cls, layout.workers if layout is not None else None, layout)
    b._hooks.append(ad)
    if mode is True or imported():
        b.notes.extend(ad.attach_now())
    else:
        ad._watch = ImportWatch("torch", ad.imported_now, before=ad.hide_load_pin_variables)
    return ad


def adapter_of(b: Any) -> TorchAdapter | None:
    return next((h for h in b._hooks if isinstance(h, TorchAdapter)), None)


def repin(b: Any) -> None:
    """After an inner binding's restore: the enclosing binding's torch pools again."""
    ad = adapter_of(b)
    if ad is not None and ad.runtime is not None and imported():
        _torch().set_num_threads(b.plan.threads)
        ad.pin_pools()


# ---------------------------------------------------------------- DataLoader workers
@record
class WorkerPin:
    """A worker's own record of its place (the bind map reads it like a Pin)."""

    tid: int
    role: str
    cpus: frozenset[int]
    index: int | None = None
    note: str | None = None


@record(frozen=False)
class WorkerBinding:
    """What a DataLoader worker's bind map shows: its threads on its own CPUs."""

    cpus: frozenset[int]
    worker: int
    pins: dict[int, Any]
    env_set: dict[str, str]
    active: bool = True

    @property
    def main_mask(self) -> frozenset[int]:
        return self.cpus

    def late_openmp(self) -> list[Any]:
        return []


def _layout_of(workers: int, given: str | None = None) -> list[frozenset[int]]:
    """The workers' CPU sets: ``given`` (planned by the parent for a spawned worker),
    the exported layout, else (or where the DataLoader has more workers than it
    holds) the active binding's plan."""
    if given:
        return [parse_list(part) for part in given.split(";")]
    text = os.environ.get(LAYOUT_VARIABLE, "")
    active = registry.active()
    if text:
        sets = [parse_list(part) for part in text.split(";")]
        if len(sets) >= workers or not active:
            return sets
        return list(worker_layout(active[-1].plan, workers).cpusets)
    if not active:
        raise PlanError("affinity.torch.worker_init_fn: no layout (run the DataLoader inside "
                        "affinity.pinned(..., dataloader_workers=K) or after apply())")
    return list(worker_layout(active[-1].plan, workers).cpusets)


def _place_this_worker(worker_id: int, workers: int, given: str | None = None) -> WorkerBinding:
    planned = (len(os.environ.get(LAYOUT_VARIABLE, "").split(";"))
               if os.environ.get(LAYOUT_VARIABLE) and not given else None)
    layout = _layout_of(workers, given)
    cpus = layout[worker_id % len(layout)]
    if planned is not None and worker_id >= planned:  # more workers than pinned(dataloader_workers=K)
        how = (f"planned again for {workers}" if len(layout) >= workers  # forked: the binding is here
               else f"it shares the CPUs of worker {worker_id % len(layout)}")  # spawned: it is not
        warnings.warn(f"affinity: DataLoader worker {worker_id} of {workers}, where dataloader_workers="
                      f"{planned} planned {planned}: {how}, on {{{format_list(cpus)}}}", AffinityWarning,
                      stacklevel=2)
    _threads.set_process_affinity(cpus)
    env = {"AFFINITY_WORKER_ID": str(worker_id), "AFFINITY_WORKER_CPUS": format_list(cpus),
           "AFFINITY_DATALOADER_WORKERS": str(workers), "OMP_NUM_THREADS": "1"}
    os.environ.update(env)
    if imported():
        _torch().set_num_threads(1)
    for inherited in registry.active():  # the parent's bindings: their TIDs are not ours
        registry.remove(inherited)
    pins = {t: WorkerPin(t, "dataloader-worker", cpus, worker_id) for t in _threads.task_ids()}
    wb = WorkerBinding(cpus, worker_id, pins, env)
    registry.add(wb)
    publication.sync()  # publish: this worker's place, for `affinity show/doctor` of its job
    return wb


def worker_init_fn(worker_id: int, user_fn: Callable[[int], Any] | None = None,
                   layout: str | None = None) -> None:
    """A DataLoader ``worker_init_fn``: this worker on its own CPUs per the plan's
    worker layout (every thread of the worker process), one intra-op thread, and
    ``AFFINITY_WORKER_ID``/``AFFINITY_WORKER_CPUS``/``AFFINITY_DATALOADER_WORKERS``
    telling it where it is; then ``user_fn(worker_id)``.

    The layout comes from ``layout`` (the sets separated by ``;``: what an active
    binding's DataLoader patch passes to a worker started by ``spawn``, which has no
    binding of its own), ``AFFINITY_DATALOADER_CPUS`` (``pinned(...,
    dataloader_workers=K)``), or the active binding (a forked worker inherits it).
    Without any of them -- no binding, or one made with ``torch=False`` -- it
    raises :class:`~affinity.errors.PlanError`.

    Examples
    --------
    >>> with affinity.pinned("compact", dataloader_workers=2):          # doctest: +SKIP
    ...     loader = DataLoader(ds, num_workers=2)                         # placed automatically
    >>> DataLoader(ds, num_workers=2, worker_init_fn=affinity.torch.worker_init_fn)  # doctest: +SKIP
    """
    info = _torch().utils.data.get_worker_info()
    workers = info.num_workers if info is not None else 1
    _place_this_worker(worker_id, workers, layout)
    if user_fn is not None:
        user_fn(worker_id)


class _LoaderPatch:
    """While live, the DataLoader's multi-process iterator gives its workers
    :func:`worker_init_fn`: every loader's (before the user's own) when
    ``automatic`` (``dataloader_workers=K``); otherwise only a loader whose
    ``worker_init_fn`` is :func:`worker_init_fn` itself, which is handed the layout
    planned here, for workers started by ``spawn``.

    The class's ``__init__`` as found is held by the binding (:func:`.registry.hold`):
    bindings restored in any order, each patch turns into a pass-through when its
    binding ends, and the binding that owns the piece last puts the original back."""

    def __init__(self, binding: Any, automatic: bool):
        from torch.utils.data import dataloader  # noqa: PLC0415  (torch is imported: we are called from it)

        cls = dataloader._MultiProcessingDataLoaderIter
        orig = cls.__init__
        registry.hold(binding, LOADER_KEY, orig)
        patch = self

        def __init__(self_: Any, loader: Any) -> None:
            user = loader.worker_init_fn
            if not patch.live or getattr(user, "func", None) is worker_init_fn:
                return orig(self_, loader)
            if automatic:
                wrapped = functools.partial(worker_init_fn, user_fn=None if user is worker_init_fn else user)
            elif user is worker_init_fn:  # planned here: a spawned worker has no binding to ask
                wrapped = functools.partial(worker_init_fn, layout=";".join(
                    format_list(s) for s in _layout_of(int(loader.num_workers))))
            else:
                return orig(self_, loader)
            loader.worker_init_fn = wrapped
            try:
                orig(self_, loader)
            finally:
                loader.worker_init_fn = user

        __init__.__wrapped__ = orig  # type: ignore[attr-defined]
        __init__._affinity_patch = self  # type: ignore[attr-defined]
        self.cls, self.live = cls, True
        cls.__init__ = __init__

    def remove(self, held: Any = _NOT_HELD) -> None:
        """Turn into a pass-through; with ``held`` (the ``__init__`` this binding found,
        its own to put back) put it back, unless someone else's patch is on top."""
        self.live = False
        if self.cls is not None and held is not _NOT_HELD \
                and getattr(self.cls.__init__, "_affinity_patch", None) is not None:
            self.cls.__init__ = held
        self.cls = None
