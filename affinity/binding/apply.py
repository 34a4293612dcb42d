"""Apply a plan to this process: ``apply()``, ``pinned()`` and :class:`Binding`.

``apply(spec)`` computes the plan on this machine (respecting the current mask),
exports the matching environment for child processes and runtimes not yet
loaded, sizes and pins TensorFlow's pools, pins the teams of OpenMP runtimes
already loaded, limits BLAS pools, optionally binds memory, and returns a
:class:`Binding` that knows how to undo all of it.  ``pinned(spec)`` is the same
as a context manager and a decorator; on exit it restores every pre-existing
thread's mask, the memory policy and the environment, and moves threads created
inside the block back to the process's original mask.

Roles and where their threads go (``slot i`` = the plan's i-th CPU set):

=============  ===============================================================
tf-intra       intra-op worker i -> slot i
tf-inter       inter-op workers -> the union of the plan (``inter_placement="package"``:
               worker j -> the plan's CPUs in the j-th package used)
openmp         team member i of each loaded OpenMP runtime -> slot i
torch-intra    PyTorch's OpenMP team: member i -> slot i, member 0 (the main
               thread) -> the union of the plan (:mod:`affinity.binding.torch`)
torch-inter    PyTorch's inter-op pool -> as tf-inter
ort-intra      an ONNX Runtime session's intra-op thread j -> slot j (the caller is
               member 0) (:mod:`affinity.binding.ort`)
ort-inter      its inter-op pool (``ORT_PARALLEL``) -> as tf-inter
ov             OpenVINO's threads: on the plan's CPUs, pinned by OpenVINO itself
               (:mod:`affinity.binding.ov`)
main           unchanged (TensorFlow never pins it; children inherit its mask),
               except that an OpenMP team pins it as member 0, as the runtime
               itself would
other          threads started inside the block -> the union of the plan
=============  ===============================================================
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from ..errors import AffinityWarning, BindError, UsageError
from ..machine import _native
from ..machine.loaded import census
from ..machine.topology import Topology
from ..planning.decide import Decision, Placement, Request, decide
from ..planning.envvars import BLOCKTIME_DEFAULT, worker_slots
from ..planning.launchers import LocalRank
from ..planning.planner import DEFAULT_RUNTIME
from ..record import field, record, replace
from . import blas as _blas
from . import numa, publication, registry
from . import openmp as _omp
from . import ort as _ort
from . import ov as _ov
from . import tf as _tf
from . import threads as _threads
from . import torch as _torch
from .bindmap import BindMap, report
from .importwatch import ImportWatch
from .launchvars import parse_rank
from .situation import this_process
from .which import resolve_runtime

__all__ = ["Binding", "Pin", "apply", "pinned", "request_of"]

F = TypeVar("F", bound=Callable[..., Any])


@record
class Pin:
    """What a thread was asked to do."""

    tid: int
    role: str  #: main, tf-intra, tf-inter, tf-other, openmp, blas, other
    cpus: frozenset[int]
    index: int | None = None  #: slot / team member number, where it has one
    note: str | None = None  #: why it was placed so, for the bind map


@record(frozen=False)
class _Snapshot:
    """What :meth:`Binding.restore` puts back: every thread's mask, the process mask
    (for threads created since), the calling thread's memory policy, the value of
    every environment variable changed (``None``: was unset), OpenMP team sizes, and
    what a framework adapter changed (``held``)."""

    masks: dict[int, frozenset[int]]
    process_mask: frozenset[int]
    mempolicy: Any
    env: dict[str, str | None] = field(default_factory=dict)
    omp_threads: dict[str, int] = field(default_factory=dict)
    #: what a framework adapter changed, by name (:func:`.registry.hold`): its value before
    held: dict[str, Any] = field(default_factory=dict)
    omp_known: frozenset[str] = frozenset()  #: OpenMP runtimes loaded at apply()
    #: when each thread of ``masks`` started (:func:`~.threads.task_starts`): a TID
    #: the kernel gave to a new thread since is not the thread whose mask was saved
    starts: dict[int, int] = field(default_factory=dict)

    def mask(self, tid: int, start: int | None, default: frozenset[int] | None = None) -> frozenset[int]:
        """The mask to put back on thread ``tid`` that started at ``start``: its own
        at apply(), or for a thread born since (a reused TID included) ``default``
        (the process's mask at apply())."""
        if tid in self.masks and self.starts.get(tid) == start:
            return self.masks[tid]
        return self.process_mask if default is None else default


@record(frozen=False)
class Binding:
    """The result of :func:`apply`: what was planned, pinned and exported, and how
    to undo it (:meth:`restore`, or leave a ``with`` block).

    Attributes
    ----------
    plan : Plan
        What the runtime would do; the per-thread sets pinned come from it.
    pins : dict of int to Pin
        What each thread (by TID) was asked to do, with its role.
    env_set : dict of str to str
        The variables exported.
    env_kept : dict of str to str
        Values the user had set and that were kept (``export="keep"``).
    notes : list of str
        What was applied differently from the plan, and why (also warned).
    active : bool
        False once restored.
    """

    plan: Any
    pins: dict[int, Pin] = field(default_factory=dict)
    env_set: dict[str, str] = field(default_factory=dict)
    env_kept: dict[str, str] = field(default_factory=dict)  #: user values not overwritten
    notes: list[str] = field(default_factory=list)
    tf_state: Any = None
    openmp: list[Any] = field(default_factory=list)
    membind: Any = None
    inter: str = "union"
    active: bool = True
    decision: Decision | None = field(default=None, repr=False, compare=False)  #: what was decided
    # private state, set by apply() (never passed to the constructor)
    _snapshot: _Snapshot | None = field(default=None, init=False, repr=False, compare=False)
    _blas: Any = field(default=None, init=False, repr=False, compare=False)
    _hooks: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)
    _seen: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    #: threads pinned while a newer binding held them: pinned when it is restored
    _deferred: set[int] = field(default_factory=set, init=False, repr=False, compare=False)

    # ------------------------------------------------------------ derived
    @property
    def slots(self) -> list[frozenset[int]]:
        """One CPU set per intra-op/OpenMP worker (:func:`affinity.planning.envvars.worker_slots`)."""
        return worker_slots(self.plan)

    @property
    def union(self) -> frozenset[int]:
        return frozenset().union(*self.plan.cpusets)

    @property
    def intra_op_threads(self) -> int:
        return int(self.plan.intra_op_threads)

    @property
    def inter_op_threads(self) -> int:
        return int(self.plan.inter_op_threads)

    def config_proto(self, *, per_session: bool = True) -> Any:
        """A ``tf.compat.v1.ConfigProto`` sized by the plan (TF1 sessions).  Sessions
        created while this binding is active get their pools pinned on creation."""
        return _tf.config_proto(self.intra_op_threads, self.inter_op_threads, per_session=per_session)

    # ----------------------------------------------------------- reapply
    def reapply(self) -> list[int]:
        """Pin again every thread this binding pinned that something has moved since
        (NCCL pins the thread that initialises it to its GPU's NUMA node for the init,
        and 2.29.2-2.29.7 leave it there, NVIDIA/nccl#2033: call this after
        ``torch.distributed.init_process_group``); return their TIDs.  Threads that
        ended are skipped; the bind map's MISMATCH rows are what this mends."""
        if not self.active:
            raise RuntimeError("this binding was restored; apply a new one")
        alive = _threads.task_starts(tids=list(self.pins))
        now = _threads.get_process_affinity()
        moved = {}
        for tid, start in alive.items():
            if self._seen.get(tid, start) != start or tid not in now:
                continue  # a new thread under a TID we pinned once (refresh() places it), or one gone
            if now[tid] != self.pins[tid].cpus:
                moved[tid] = self.pins[tid].cpus
        self._pin(moved)
        return sorted(moved)

    # ----------------------------------------------------------- refresh
    def refresh(self) -> list[int]:
        """Pin threads that appeared since the last look (tf.data, Keras ``fit``,
        TF1 sessions, ...), and -- when no newer binding is active -- put back on
        their sets the threads this binding pinned whose mask changed since (an inner
        binding's restore, a library resetting masks); return the TIDs pinned.  A
        thread is its TID and its start time: one that holds the TID of a thread that
        ended is new.  Under a newer active binding, a new thread it pinned keeps that
        binding's set until it is restored (this binding's pin is recorded)."""
        if not self.active:
            raise RuntimeError("this binding was restored; apply a new one")
        stats = _threads.task_stats()
        # not seen, or seen under another start: a TID the kernel gave to a new thread
        new = {t: n for t, (n, start) in stats.items() if self._seen.get(t) != start}
        self._seen.update((t, stats[t][1]) for t in new)
        masks = self._classify(new, stats.get(os.getpid(), ("", 0))[0]) if new else {}
        masks.update(self._drifted(stats, new))
        return self._pin(masks)

    def _classify(self, new: Mapping[int, str], pname: str) -> dict[int, frozenset[int]]:
        """Roles and sets of threads new to :meth:`refresh` (recorded in ``pins``)."""
        pyth = {t.native_id for t in threading.enumerate() if t.native_id}
        masks: dict[int, frozenset[int]] = {}
        slots = self.slots
        n_intra = sum(1 for p in self.pins.values() if p.role == "tf-intra")
        n_inter = sum(1 for p in self.pins.values() if p.role == "tf-inter")
        tf_started = self.tf_state is not None
        for tid in sorted(new):
            name = new[tid]
            if tf_started and name == _tf.INTER_NAME:
                cpus = self._inter_set(n_inter)
                self.pins[tid] = Pin(tid, "tf-inter", cpus, n_inter)
                n_inter += 1
            elif tf_started and name == pname and tid not in pyth and n_intra < self.intra_op_threads:
                cpus = slots[n_intra % len(slots)]
                self.pins[tid] = Pin(tid, "tf-intra", cpus, n_intra)
                n_intra += 1
            else:
                cpus = self.union
                self.pins[tid] = Pin(tid, "tf-other" if name.startswith("tf_") else "other", cpus)
            masks[tid] = cpus
        return masks

    def _drifted(self, stats: Mapping[int, tuple[str, int]], new: Iterable[int]) -> dict[int, frozenset[int]]:
        """Threads this binding pinned (the same threads: TID and start) whose kernel
        mask is no longer their pin's set; none while a newer binding is active."""
        if self._newer():
            return {}
        new = set(new)
        mine = [t for t, p in self.pins.items()
                if t not in new and t in stats and self._seen.get(t) == stats[t][1]]
        now = _threads.get_process_affinity()
        return {t: self.pins[t].cpus for t in mine if t in now and now[t] != self.pins[t].cpus}

    def _newer(self) -> list[Any]:
        """The active bindings applied after this one (none while it is applied)."""
        stack = registry.active()
        idx = next((i for i, b in enumerate(stack) if b is self), None)
        return [] if idx is None else stack[idx + 1:]

    # ----------------------------------------------------------- restore
    @registry.critical  # serialized, to its end even on Ctrl-C
    def restore(self) -> None:
        """Undo everything: thread masks, threads created since (back to the
        process's original mask), OpenMP team sizes, BLAS limits, memory policy
        of the calling thread, and the environment.  Idempotent."""
        if not self.active:
            return
        assert self._snapshot is not None
        snap, own_masks = registry.release(self)  # what is ours to put back; the rest is a newer binding's
        errors: list[str] = []
        # in the reverse order of apply(): the BLAS limiter recorded the counts after the
        # adapters had set them, and the adapters (torch.set_num_threads) put back the user's
        if self._blas is not None:
            with contextlib.suppress(Exception):
                self._blas.restore_original_limits()
        for rt in self.openmp:
            if rt.path in snap.omp_threads:
                with contextlib.suppress(Exception):
                    rt.set_num_threads(snap.omp_threads[rt.path])
        for hook in reversed(self._hooks):
            if getattr(hook, "holds", False):
                hook.remove(snap.held)  # it puts back only what ``held`` says is its own
            else:
                hook.remove()
        self._hooks.clear()
        for k, v in snap.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if own_masks:
            errors.extend(_restore_masks(snap))
        if snap.mempolicy is not None:
            try:
                pol = snap.mempolicy
                numa.set_membind(pol.nodes, "local" if pol.policy in ("default", "local") else pol.policy)
            except Exception as e:  # noqa: BLE001
                errors.append(f"memory policy: {e}")
        self.active = False
        errors.extend(_repin_enclosing_teams())
        errors.extend(_repin_enclosing_pins(snap))
        publication.sync()  # publish: the bind map without this binding (the file removed with the last)
        if errors:
            warnings.warn("affinity: restore was incomplete: " + "; ".join(errors), AffinityWarning,
                          stacklevel=2)

    def __enter__(self) -> Binding:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def report(self) -> BindMap:
        """The bind map of this process, with what this binding requested."""
        return report(binding=self)

    @property
    def main_mask(self) -> frozenset[int]:
        """The mask the main thread keeps (the process's at :func:`apply`), unless an
        OpenMP team pinned it as member 0."""
        assert self._snapshot is not None
        return self._snapshot.process_mask

    def late_openmp(self) -> list[Any]:
        """OpenMP runtimes loaded after :func:`apply` (``import torch`` later...).

        Such a runtime binds its primary thread -- the thread that loads it (libgomp,
        at load) or starts its first region (libiomp5/libomp) -- to the first place
        of the exported ``OMP_PLACES``/``KMP_AFFINITY``; every thread that thread
        creates afterwards inherits that one-place mask (tensorflow#24172).  The
        bind map says so on the rows concerned.
        """
        known = self._snapshot.omp_known if self._snapshot is not None else frozenset()
        return [rt for rt in _omp.loaded_runtimes() if rt.path not in known]

    # ----------------------------------------------------------- helpers
    def _inter_set(self, j: int) -> frozenset[int]:
        if self.inter == "package":
            pkgs = _packages_used(self.plan)
            if pkgs:
                return pkgs[j % len(pkgs)]
        return self.union

    def _pin(self, masks: Mapping[int, frozenset[int]]) -> list[int]:
        """Set ``masks`` (TID -> CPUs), but on a thread that a newer active binding
        has pinned: that binding's set stands while it is active, and this binding's
        is put back when it is restored (``_deferred``); returns the TIDs set."""
        newer = self._newer()
        held = {t for o in newer for t in o.pins if t in masks}
        if held:  # (by TID and start: a TID reused since is another thread)
            starts = _threads.task_starts(tids=list(held))
            held = {t for t in held if any(o._seen.get(t) == starts.get(t) for o in newer if t in o.pins)}
            self._deferred |= held
        todo = {t: m for t, m in masks.items() if t not in held}
        if todo:
            _threads.set_threads_affinity(todo, listed=True)
            publication.changed(self)  # publish: pins added after apply() (pools found later)
        return sorted(todo)

    def _see(self, tids: Iterable[int]) -> None:
        """Record threads this binding pinned, by TID and start (:meth:`refresh`
        pins a thread it has not seen, a new one under a reused TID included)."""
        self._seen.update(_threads.task_starts(tids=list(tids)))

    def __repr__(self) -> str:
        roles: dict[str, int] = {}
        for p in self.pins.values():
            roles[p.role] = roles.get(p.role, 0) + 1
        state = "active" if self.active else "restored"
        return (f"<Binding {state}: {self.plan.threads} slots, intra={self.intra_op_threads} "
                f"inter={self.inter_op_threads}, pinned {roles}>")


def _packages_used(plan: Any) -> list[frozenset[int]]:
    topo: Topology = plan.topology
    union = frozenset().union(*plan.cpusets)
    out = []
    for p in topo.packages:
        part = p.cpuset & union
        if part:
            out.append(part)
    return out


def _restore_masks(snap: _Snapshot, rounds: int = 100) -> list[str]:
    """Every thread back to its mask at apply() (threads born since: the process's
    mask then), listing the threads again until no new one appears: a thread started
    by another thread during the restore would otherwise keep the block's mask."""
    done: set[int] = set()
    errors: list[str] = []
    for _ in range(rounds):
        fresh = [t for t in _threads.task_ids() if t not in done]
        if not fresh:
            break
        # (a thread the snapshot has no mask of needs no start: it gets the process's)
        todo = {t: snap.process_mask for t in fresh if t not in snap.masks}
        saved = _threads.task_starts(tids=[t for t in fresh if t in snap.masks])
        todo.update((t, snap.mask(t, start)) for t, start in saved.items())
        try:
            _threads.set_threads_affinity(todo, listed=True)
        except BindError as e:  # keep going: restore what can be restored
            errors.append(str(e))
        done.update(fresh)
    return errors


def _repin_enclosing_teams() -> list[str]:
    """After an inner block, the enclosing binding's OpenMP teams get their size and
    pins back: an inner team of another size makes a runtime (libgomp) end or start
    workers, and a new worker would run on its creator's mask instead of its slot."""
    enclosing = registry.active()
    if enclosing:
        _torch.repin(enclosing[-1])
    if not enclosing or not enclosing[-1].openmp:
        return []
    outer = enclosing[-1]
    try:
        _pin_openmp(outer, outer.openmp)
    except Exception as e:  # noqa: BLE001 - the restore itself is done
        return [f"the enclosing binding's OpenMP team could not be pinned again: {e}"]
    return []


def _repin_enclosing_pins(snap: _Snapshot) -> list[str]:
    """Threads born inside an inner block that the enclosing binding pinned too (its
    hooks fire as well: TensorFlow's pools, started inside both blocks) go back to the
    enclosing binding's sets: the restore gave them the process's mask, as threads born
    inside, and the enclosing binding's refresh() counts them as seen."""
    enclosing = registry.active()
    if not enclosing or not isinstance(enclosing[-1], Binding):
        return []
    outer = enclosing[-1]
    mine = {t: p.cpus for t, p in outer.pins.items()
            if (t not in snap.masks or t in outer._deferred) and t in outer._seen}
    outer._deferred.clear()
    alive = _threads.task_starts(tids=list(mine))
    todo = {t: mine[t] for t, start in alive.items() if outer._seen[t] == start}
    try:
        _threads.set_threads_affinity(todo, listed=True)
    except BindError as e:
        return [f"the enclosing binding's threads could not be pinned again: {e}"]
    return []


def _user_environ() -> dict[str, str]:
    """The environment but for values an enclosing binding exported (ours, not the user's)."""
    ours = registry.exported()
    return {k: v for k, v in os.environ.items() if ours.get(k) != v}


def _set_env(values: Mapping[str, str], b: Binding, snap_env: dict[str, str | None]) -> None:
    """Export the decision's ``values`` (the user's values it replaces were said by
    the decision; those it keeps are not in ``values``)."""
    for k, v in values.items():
        snap_env.setdefault(k, os.environ.get(k))
        os.environ[k] = v
        b.env_set[k] = v


_TF_MODES = ("auto", True, False)
_OTHER_MODES = ("auto", True, False)


def _check_modes(modes: _Modes, export: Any) -> None:
    for name, value, allowed in (("tensorflow", modes.tensorflow, _TF_MODES), ("openmp", modes.openmp, _OTHER_MODES),
                                 ("torch", modes.torch, _OTHER_MODES), ("blas", modes.blas, _OTHER_MODES),
                                 ("inter_placement", modes.inter, ("union", "package")),
                                 ("export", export, (True, False, "override", "keep"))):
        if not any(value is a or (isinstance(a, str) and value == a) for a in allowed):
            raise UsageError(f"apply({name}={value!r}): {name} must be one of {', '.join(map(repr, allowed))}")


@registry.applying  # serialized, all or nothing even on Ctrl-C
def apply(spec: Any = None, *, threads: int | None = None,
          topology: Topology | None = None, tensorflow: str | bool = "auto",
          openmp: str | bool = "auto", blas: str | bool = "auto", membind: Any = None,
          export: bool | str = True, inter_placement: str = "union", blocktime: str | None = BLOCKTIME_DEFAULT,
          rank: Any = None, strict: bool = False, torch: str | bool = "auto",
          dataloader_workers: int | None = None, runtime: str = DEFAULT_RUNTIME, gpu: Any = None,
          gpu_bind: str | None = None, reserve_cores: int = 0) -> Binding:
    """Plan ``spec`` on this machine and apply it to this process.

    Parameters
    ----------
    spec : str, spec value or None
        A ``KMP_AFFINITY`` string, ``KEY=VALUE`` settings or a spec value (what
        :func:`affinity.plan` takes); None (the default): the placement variables
        the user set in the environment (``KMP_AFFINITY``, ``OMP_PLACES``...), as
        the runtime would read them, else :data:`~affinity.planning.spec.DEFAULT_SPEC`
        -- what ``affinity run`` without SPEC does.
    threads : int, optional
        The team size (default: ``OMP_NUM_THREADS``, else one thread per core of the
        CPUs planned on, within the CFS quota; as ``affinity run``).  PyTorch's
        intra-op team is this team (``torch.set_num_threads``), TensorFlow's intra-op
        pool the plan's distinct CPU sets (``Binding.intra_op_threads``).
    topology : Topology, optional
        Must describe this machine (default: :meth:`Topology.from_system`).
    tensorflow : {"auto", True, False}
        ``"auto"``: handle TensorFlow if it is imported (start its runtime with the
        planned pool sizes if it has not started, else pin its existing pools), and
        if it is imported later, while the binding is active: size its pools right
        after the import and pin them when its runtime starts (first op);
        ``True``: import it now; ``False``: leave it alone (its ``TF_NUM_*``
        variables are still exported).
    openmp : {"auto", True, False}
        Size and pin the team of every OpenMP runtime already loaded.
    blas : {"auto", True, False}
        Limit BLAS pools to the intra-op count (threadpoolctl) and pin OpenBLAS's
        worker threads; what cannot be done is a note (:mod:`affinity.binding.blas`).
    membind : None, "auto", str or (policy, nodes)
        ``None`` leaves memory alone (with ``rank``: binds it to the NUMA nodes of
        the rank's share where the kernel allows, as ``affinity run --ranks`` does;
        a refusal is a note); ``"auto"`` binds to the NUMA nodes of the plan's CPUs;
        ``"interleave:all"``, ``"bind:0-1"``, ``("preferred", {0})``...
        Set on the calling thread before pools start, so they inherit it.
    export : {True, "override", "keep", False}
        ``True`` (or ``"override"``): export the plan's variables, replacing values
        the user set, each replacement a note (as ``affinity run`` does:
        :mod:`affinity.planning.precedence`); ``"keep"``: keep the user's values
        (listed in ``Binding.env_kept``); ``False``:
        export nothing.
    inter_placement : {"union", "package"}
        Where inter-op workers go: anywhere in the plan, or worker ``j`` on the
        ``j``-th package used.
    blocktime : str or None
        ``KMP_BLOCKTIME`` to export; ``None`` exports none; default: the user's
        ``KMP_BLOCKTIME``, else :data:`~affinity.planning.envvars.DEFAULT_BLOCKTIME`
        (as ``affinity run``).
    rank : None, "auto", "R/N" or LocalRank
        Plan inside this local rank's disjoint share of the node, as ``affinity run
        --ranks`` does (:func:`affinity.planning.partition.place_rank`: a launcher
        that bound the rank is followed); ``"auto"`` reads the MPI/Slurm/torchrun
        variables.  The calling thread is narrowed to the whole share (role
        ``main``), so what it starts later stays in it; memory goes to the share's
        NUMA nodes unless ``membind`` says otherwise.
    strict : bool
        Parse the spec strictly (:class:`SpecError`) instead of like the runtime,
        which warns and ignores what it cannot read: each such warning of the
        runtime is an :class:`AffinityWarning` here (a typo binds nothing).
    torch : {"auto", True, False}
        PyTorch (:mod:`affinity.binding.torch`), imported before, inside or after:
        ``torch.set_num_threads``/``set_num_interop_threads`` from the plan, its
        intra-op team and inter-op pool pinned by TID, the main thread kept on the
        plan's CPUs (libgomp's load-time pin prevented or undone); ``True``:
        import it now; ``False``: leave it alone.
    dataloader_workers : int, optional
        Place that many DataLoader workers (:func:`affinity.planning.workers.worker_layout`):
        each on CPUs of its own, one intra-op thread each.
    runtime : str
        Whose rules the plan follows: ``"intel"`` (default: what apply() has
        always planned, and what it pins each thread to whatever runtime runs it),
        ``"llvm"``, ``"gnu"``, ``"gnu-torch"``, or ``"auto"``: the rules of the
        OpenMP runtime loaded in this process (PyTorch's libgomp -> ``"gnu-torch"``;
        none -> ``"intel"``; runtimes of different rules together -> PlanError).
        ``Binding.plan.runtime`` and the bind map name the rules followed.
    gpu : None, "auto", int or str
        Place this process (this local rank) next to its GPU: ``"auto"`` (the local
        rank's visible device, as torchrun's ``cuda:LOCAL_RANK``), an ordinal, a bus
        id or a UUID prefix, found in sysfs (no driver, CUDA or ``torch.cuda``
        needed; docs/gpu.md).  The calling thread goes into the GPU's CPUs, memory on
        their node(s), the pools sized to their cores.
    gpu_bind : {"node", "socket", "exclusive", "core-complex"} or None
        Which of the GPU's CPUs, as ``torchrun --numa-binding=MODE`` gives them
        (default ``node`` when ``gpu`` is given; ``gpu="auto"`` when only this is).
    reserve_cores : int
        With a GPU: cores of its set kept for data loading (DataLoader workers),
        the pools sized to the rest.

    Returns
    -------
    Binding
        What was planned, pinned and exported; :meth:`Binding.restore` undoes it.

    Raises
    ------
    SpecError
        A malformed spec with ``strict=True``.
    PlanError
        A plan the runtime itself would refuse, or ``membind`` naming NUMA nodes
        this machine does not have.
    BindError
        A system call failed (its subclasses name how); everything already
        changed is restored first: apply() is all or nothing.

    Warns
    -----
    AffinityWarning
        For each warning the OpenMP runtime would print for ``spec``, for a thread
        count that oversubscribes the CPUs, and for what was applied differently
        from the plan (``Binding.notes``).
    """
    modes = _Modes(tensorflow=tensorflow, openmp=openmp, blas=blas, torch=torch, inter=inter_placement)
    _check_modes(modes, export)
    request = replace(request_of(spec, threads=threads, runtime=resolve_runtime(runtime, caller="apply"),
                                 strict=strict, blocktime=blocktime, membind=membind, rank=rank,
                                 dataloader_workers=dataloader_workers, export=export),
                      gpu=gpu, gpu_bind=gpu_bind, reserve_cores=reserve_cores)
    return _apply(request, topology, modes)


@record
class _Modes:
    """How :func:`apply` performs the decision: which frameworks and pools it handles."""

    tensorflow: Any = "auto"
    openmp: Any = "auto"
    blas: Any = "auto"
    torch: Any = "auto"
    inter: str = "union"


def _apply(request: Request, topology: Topology | None, modes: _Modes) -> Binding:
    """:func:`apply` without its docstring: read this process, ask the decision
    (:func:`affinity.planning.decide.decide`, the one ``affinity run`` asks too),
    snapshot, then perform every step or none."""
    topo = Topology.load(topology)  # the forms plan, apply and tune all take
    _threads.require_system(topo)
    # (a mask PyTorch's libgomp narrowed to its first place at load is widened back)
    process_mask = _torch.mask_before_load_pin(_native.get_thread_cpubind(os.getpid()))
    d = decide(request, this_process(topo.with_allowed(process_mask), _user_environ(), loaded=census()))
    pl = d.placements[0]
    masks = _threads.get_process_affinity()
    snap = _Snapshot(masks, process_mask, numa.get_membind() if pl.memory is not None else None,
                     omp_known=frozenset(rt.path for rt in _omp.loaded_runtimes()),
                     starts=_threads.task_starts(tids=masks))
    b = Binding(plan=pl.plan, inter=modes.inter, env_kept=dict(d.kept), decision=d)
    b._snapshot = snap
    b._seen = dict(snap.starts)  # (a thread gone before its start was read is left out)
    b.notes.extend(d.warnings)  # the runtime's own warnings first, hinted: a typo binds nothing
    env_before = dict(os.environ)
    try:
        if pl.gpu is not None:  # the calling thread on its GPU's CPUs
            _keep_in_share(b, pl.gpu.cpus, f"next to GPU {pl.gpu.device.name}")
        elif pl.share is not None and d.rank is not None:  # the calling thread in the rank's share
            _keep_in_share(b, pl.share.cpus, f"local rank {d.rank.rank} of {d.rank.size}")
        _apply_steps(b, pl, modes)
    except BaseException:
        _note_env_changes(snap, env_before)
        b.restore()
        raise
    _note_env_changes(snap, env_before)
    registry.add(b)
    publication.sync()  # publish: this process's bind map, for `affinity show/doctor PID` elsewhere
    for n in b.notes:  # the decision's warnings first: what the runtime itself would print (a typo binds nothing)
        warnings.warn(f"affinity: {n}", AffinityWarning, stacklevel=_caller_level())
    b.notes.extend(d.notices)  # notes, no warning: a launcher's binding followed, torchrun's default
    b.notes.extend(d.notes)
    return b


def request_of(spec: Any, *, threads: int | None, runtime: str, strict: bool, blocktime: str | None,
               membind: Any, rank: Any, dataloader_workers: int | None, export: Any) -> Request:
    """:func:`apply`'s arguments as the decision's :class:`~affinity.planning.decide.Request`
    (the translation ``affinity run`` has in :func:`affinity.launcher.build.request_of`)."""
    return Request(spec=spec, threads=threads, runtime=runtime, strict=strict, blocktime=blocktime,
                   memory=membind, ranks=_rank_request(rank), dataloader_workers=dataloader_workers,
                   export={True: "replace", "override": "replace", "keep": "keep", False: "none"}[export])


def _rank_request(rank: Any) -> Any:
    """``rank=``: None, ``"auto"``, a :class:`~affinity.planning.launchers.LocalRank`,
    or ``"R/N"`` read into one."""
    if rank is None or rank == "auto" or isinstance(rank, LocalRank):
        return rank
    if not isinstance(rank, str):
        raise TypeError(f"apply(rank={rank!r}): expected None, 'auto', 'R/N' or a LocalRank")
    return parse_rank(rank, {})


def _caller_level() -> int:
    """``stacklevel`` that points a warning at the user's line: past apply() and,
    when it called apply(), pinned's ``__enter__``/decorator wrapper."""
    frame, level = sys._getframe(1), 1
    here = (__file__, registry.__file__)  # apply() runs inside registry.applying
    while frame is not None and frame.f_code.co_filename in here:
        frame, level = frame.f_back, level + 1
    return level


def _note_env_changes(snap: _Snapshot, before: Mapping[str, str]) -> None:
    """Record every variable that changed during :func:`apply` (importing
    threadpoolctl sets ``KMP_DUPLICATE_LIB_OK``, for one) so that restore puts the
    environment back byte for byte."""
    for k in set(before) | set(os.environ):
        if before.get(k) != os.environ.get(k):
            snap.env.setdefault(k, before.get(k))


def _keep_in_share(b: Binding, share: frozenset[int], who: str) -> None:
    """Narrow the calling thread to a rank's share (all its CPUs, not one): threads and
    processes it starts later inherit the share, as under ``affinity run --ranks``,
    instead of the whole node the other ranks use too; :meth:`Binding.restore` puts
    its mask back."""
    tid = threading.get_native_id()
    b.pins[tid] = Pin(tid, "main", share, None, f"{who}: the calling thread kept in the rank's share")
    b._pin({tid: share})


def _apply_steps(b: Binding, pl: Placement, modes: _Modes) -> None:
    """The steps of :func:`apply`, in the order that matters."""
    assert b._snapshot is not None
    tensorflow, openmp, blas = modes.tensorflow, modes.openmp, modes.blas
    # 1. memory first: pools created below inherit the calling thread's policy
    if pl.memory is not None:
        _bind_memory(b, pl)
    # 2. environment for children and runtimes not yet loaded (the decision's exports)
    _set_env(pl.exports, b, b._snapshot.env)
    # 3. TensorFlow: now if it is imported, else when it is (and when its runtime starts)
    if tensorflow is True or (tensorflow == "auto" and _tf.imported()):
        _attach_tensorflow(b, start=tensorflow is True)
    elif tensorflow == "auto":
        b._hooks.append(ImportWatch("tensorflow", lambda _, ok: ok and _tensorflow_imported(b)))
    # 3b. PyTorch: likewise (its libgomp team, its inter-op pool, DataLoader workers)
    _torch.attach(b, modes.torch, pl.workers, Pin)
    # 3c. inference engines: ONNX Runtime sessions and OpenVINO models made inside the binding
    _ort.attach(b, Pin)  # engine: onnxruntime (affinity.binding.ort)
    _ov.attach(b, Pin)  # engine: openvino (affinity.binding.ov)
    # 4. OpenMP runtimes already loaded: size and pin from inside a region
    if openmp is True or openmp == "auto":
        _pin_openmp(b)
    # 5. BLAS pools (OpenBLAS, MKL, BLIS): counted and limited
    if blas is True or blas == "auto":
        _limit_blas(b)
    # 6. anything else that started meanwhile goes inside the plan
    b.refresh()


def _bind_memory(b: Binding, pl: Placement) -> None:
    """The placement's memory policy on the calling thread; one the kernel refuses is
    an error where it was asked for, a note where it only follows the rank's share."""
    assert pl.memory is not None
    try:
        b.membind = numa.set_membind(pl.memory.nodes, pl.memory.policy)
    except BindError as e:
        if pl.memory_required:
            raise
        b.notes.append(f"memory policy {pl.memory} of the rank's share not set: {e}")


def _attach_tensorflow(b: Binding, *, start: bool) -> None:
    """TensorFlow is imported: start its runtime with the plan's pool sizes, or
    find the pools of a runtime already running, and pin them."""
    if start:
        _tf._tf()
    if not _tf.pools_started():
        state = _tf.start_runtime(b.intra_op_threads, b.inter_op_threads)
    else:
        state = _tf.find_running_pools(known=(), environ=_environ_before(b))
        if (state.intra_size, state.inter_size) != (b.intra_op_threads, b.inter_op_threads):
            b.notes.append(
                f"TensorFlow was already running: its pools keep {state.intra_size} intra-op and "
                f"{state.inter_size} inter-op threads (the plan wants {b.intra_op_threads} and "
                f"{b.inter_op_threads}); thread counts were not changed, the existing threads "
                f"were pinned")
    _pin_tensorflow(b, state)


def _environ_before(b: Binding) -> dict[str, str]:
    """The environment before this binding exported anything: what a runtime that
    started earlier read (its pool sizes)."""
    assert b._snapshot is not None
    env = dict(os.environ)
    for k, old in b._snapshot.env.items():
        if old is None:
            env.pop(k, None)
        else:
            env[k] = old
    return env


def _pin_tensorflow(b: Binding, state: Any) -> None:
    """Pin TensorFlow's pools as found in ``state``; watch its TF1 sessions."""
    _pin_pools(b, state)
    _watch_sessions(b)


def _pin_pools(b: Binding, state: Any) -> None:
    """Pin the pools of ``state`` (one pool each: intra-op worker i on slot i,
    inter-op worker j on :meth:`Binding._inter_set`), and add them to ``b.tf_state``."""
    b.tf_state = _tf.merged(b.tf_state, state)
    slots = b.slots
    masks: dict[int, frozenset[int]] = {}
    for i, tid in enumerate(state.intra):
        masks[tid] = slots[i % len(slots)]
        b.pins[tid] = Pin(tid, "tf-intra", masks[tid], i)
    for j, tid in enumerate(state.inter):
        masks[tid] = b._inter_set(j)
        b.pins[tid] = Pin(tid, "tf-inter", masks[tid], j)
    for tid in state.other:
        masks[tid] = b.union
        b.pins[tid] = Pin(tid, "tf-other", b.union)
    b._see(state.intra + state.inter + state.other)
    b._pin(masks)


def _watch_sessions(b: Binding) -> None:
    """Pin the pools of every TF1 ``Session`` created while ``b`` is active (once per
    binding): in graph mode a session, not the eager runtime, starts the intra-op pool."""
    if any(isinstance(h, _tf.SessionHook) for h in b._hooks):
        return
    hook = _tf.SessionHook(lambda state: _session_started(b, state))
    hook.install()
    b._hooks.append(hook)


def _session_started(b: Binding, state: Any) -> None:
    """A TF1 ``Session`` was constructed while ``b`` is active: its new pools on the
    plan (by the threads its construction started), then anything else new."""
    if not b.active:
        return
    try:
        _pin_pools(b, state)
        b.refresh()
    except Exception as e:  # noqa: BLE001 - never break the user's session
        warnings.warn(f"affinity: the pools of a TensorFlow Session could not be pinned ({e})",
                      AffinityWarning, stacklevel=3)


def _tensorflow_imported(b: Binding) -> None:
    """``import tensorflow`` completed while ``b`` is active: size its pools before
    its runtime starts, and pin them when they appear."""
    if not b.active:
        return
    try:
        if _tf.pools_started():  # something started them during the import itself
            _attach_tensorflow(b, start=False)
            return
        b._hooks.append(_tf.PoolSizes(b))  # put back at restore if no op started the runtime
        _tf.set_pool_sizes(b.intra_op_threads, b.inter_op_threads)
        b._hooks.append(_tf.on_runtime_start(lambda state: _tensorflow_started(b, state)))
        _watch_sessions(b)  # graph mode: the first Session starts the pools, not the runtime
    except Exception as e:  # noqa: BLE001 - never break the user's import
        warnings.warn(f"affinity: TensorFlow was imported inside the binding but could not be "
                      f"prepared ({e}); its threads are not pinned", AffinityWarning, stacklevel=2)


def _tensorflow_started(b: Binding, state: Any) -> None:
    if not b.active:
        return
    try:
        _pin_tensorflow(b, state)
    except Exception as e:  # noqa: BLE001 - never break the user's first op
        warnings.warn(f"affinity: TensorFlow's pools could not be pinned ({e})", AffinityWarning,
                      stacklevel=2)


def _pin_openmp(b: Binding, runtimes: list[Any] | None = None) -> None:
    """Size and pin the team of every OpenMP runtime loaded in this process (or of
    ``runtimes``, already this binding's, again)."""
    assert b._snapshot is not None
    team = list(b.plan.cpusets)  # an OpenMP team binds thread i to the plan's set i
    again = runtimes is not None
    torch_adapter = _torch.adapter_of(b)
    for rt in (runtimes if again else _omp.loaded_runtimes()):
        if torch_adapter is not None and torch_adapter.owns(rt):
            continue  # PyTorch's team: pinned by its adapter, with torch's sizes
        if not again:
            b._snapshot.omp_threads[rt.path] = rt.max_threads()
        rt.set_num_threads(len(team))
        members = rt.pin_team(team)
        for i, (tid, got) in enumerate(members):
            b.pins[tid] = Pin(tid, "main" if tid == os.getpid() else "openmp", got, i)
        b._see(t for t, _ in members)
        if not again:
            b.openmp.append(rt)
    if not again and b.openmp and any(p_.role == "main" and len(p_.cpus) < len(b.union) for p_ in b.pins.values()):
        b.notes.append("the main thread is OpenMP team member 0 and was pinned to slot 0, as the "
                       "runtime would; child processes started from it inherit that mask")


def _limit_blas(b: Binding) -> None:
    """BLAS pools limited to the intra-op count, OpenBLAS's workers pinned (:mod:`.blas`)."""
    done = _blas.limit_and_pin(b.intra_op_threads, b.slots)
    b._blas = done.limiter
    for tid, (i, cpus) in done.pinned.items():
        b.pins[tid] = Pin(tid, "blas", cpus, i)
    b._see(done.pinned)
    b.notes.extend(done.notes)


class pinned:
    """:func:`apply` as a context manager and a decorator.

    Parameters
    ----------
    spec : str or spec value
        As for :func:`apply`.
    **kwargs
        The keyword arguments of :func:`apply`.

    Notes
    -----
    Restores on exceptions too; nested blocks restore in order; as a decorator
    each call gets a fresh binding.

    Examples
    --------
    >>> with affinity.pinned("compact", threads=8) as b:    # doctest: +SKIP
    ...     model.fit(...)
    >>> @affinity.pinned("scatter")                         # doctest: +SKIP
    ... def infer(batch): ...
    """

    def __init__(self, spec: Any = None, **kwargs: Any):
        self.spec = spec
        self.kwargs = kwargs
        self._local = threading.local()  # each thread's own bindings (a decorator shared by threads)

    @property
    def _bindings(self) -> list[Binding]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack  # type: ignore[no-any-return]

    def __enter__(self) -> Binding:
        b = apply(self.spec, **self.kwargs)
        self._bindings.append(b)
        return b

    def __exit__(self, *exc: object) -> None:
        b = self._bindings[-1]
        try:
            b.restore()
        finally:
            if b.active:  # a Ctrl-C before restore() began: it is idempotent, run it to its end
                b.restore()
            self._bindings.pop()

    def __call__(self, func: F) -> F:  # decorator: a fresh binding per call
        @functools.wraps(func)
        def inner(*a: Any, **k: Any) -> Any:
            with self:
                return func(*a, **k)

        return inner  # type: ignore[return-value]


def active_bindings() -> list[Binding]:
    """Bindings applied and not yet restored, oldest first."""
    return registry.active()
