"""The one decision behind every face: given what was asked (:class:`Request`) and
what the process runs in (:class:`Situation`), what goes where and what is said
(:class:`Decision`).  Pure: no system call, no reading of the machine.

``affinity.apply()`` asks it once and then only snapshots, performs and restores;
``affinity run`` asks it once and starts each instance (or rank) as it says;
``affinity plan --ranks`` shows it.  A warning two faces should both give comes from
here, so it cannot diverge between them (``tests/planning/test_decide_faces.py``
feeds the same inputs through both faces).

The steps, in order (each a function below):

1. **CPUs** (:func:`_select`): the inherited mask, or the cgroup's cpuset
   (``norespect``), narrowed by an explicit CPU or node choice;
2. **the rank's share** (:func:`_rank_share`): a launcher that bound the rank is
   followed, else the CPUs are cut between the ranks
   (:func:`~affinity.planning.partition.place_rank`);
3. **instances** (:func:`_instance_shares`): disjoint shares of the rank's CPUs;
4. per instance: **the team size** (:func:`_team_size`: asked, else
   ``OMP_NUM_THREADS``, else one thread per core within the CFS quota's share),
   **the plan** (the spec, else the environment's placement variables, else
   :data:`~affinity.planning.spec.DEFAULT_SPEC`), **the exports** and who is
   replaced, **the memory policy**, **the DataLoader workers' layout**;
5. what is said: the runtime's own warnings, settings it never reads, a team larger
   than its CPUs, values of the user's that the plan replaces, OpenMP runtimes
   loaded in the process that read the plan otherwise (:func:`meaning_notes`).

A serving engine (``Request.serving``, ``affinity run --for``) takes steps 2-4 from
its layout instead (:func:`_serve`): the CPUs selected are laid out as the engine's
ranks or instances, and each process is told the engine's own words, not a plan's
OpenMP variables.

What this cannot know: the process itself (the faces read it into a
:class:`Situation`), and what a runtime not yet loaded will be (``runtime="auto"``
is resolved by the face, from the process or the command's executable).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..cpulist import IdList, format_list
from ..errors import PlanError, UsageError
from ..machine.cgroup import CpuQuota, default_thread_count
from ..machine.loaded import Census, LoadedRuntime
from ..machine.topology import Topology
from ..record import field, record
from . import precedence
from .envvars import BLOCKTIME_DEFAULT, blocktime_for, check_inherited, export, leave_binding_to_the_library
from .gnu import GOMP_VARIABLES, plan_gomp
from .gpus import GpuBinding, gpu_binding
from .launchers import LAUNCHER_DEFAULTS, LAUNCHER_VARIABLES, Job, LocalRank
from .memory import MemorySpec, check_nodes, membind_spec
from .partition import (Share, crowded_hint, kinds_note, partition, place_rank, rank_kinds_note,
                        replaced_binding, unranked_warning)
from .planner import DEFAULT_RUNTIME, Plan, hinted, plan, plan_env, unread
from .serving import Serving
from .spec import DEFAULT_SPEC, PLACEMENT_VARIABLES
from .workers import WorkerLayout, worker_layout

if TYPE_CHECKING:  # the annotation only: a serving engine's launch loads the engines' rules (see _serve)
    from .engines.serve import ServingPlan

__all__ = ["Decision", "Placement", "Request", "Situation", "decide", "meaning_notes", "team_environ"]

#: memory policy -> the numactl option that asks for it (how ``affinity run`` names it)
MEM_OPTION = {"bind": "membind", "interleave": "interleave", "preferred": "preferred", "local": "localalloc"}


# --------------------------------------------------------------------- values

@record
class Request:
    """What a face was asked, in one vocabulary.

    Parameters
    ----------
    spec : str, spec value or None
        The settings to plan; None: the environment's placement variables, else
        :data:`~affinity.planning.spec.DEFAULT_SPEC`.
    threads : int or None
        The team size; None: ``OMP_NUM_THREADS``, else one thread per core within the
        CFS quota's share.
    runtime : str
        Whose rules (a name of :data:`~affinity.planning.planner.RUNTIMES`; ``"auto"``
        is the face's to resolve).
    strict : bool
        Refuse a malformed spec (:class:`~affinity.errors.SpecError`) instead of
        reading it as the runtime would.
    blocktime : str or None
        ``KMP_BLOCKTIME`` to export; None exports none; ``"default"``: the user's
        ``KMP_BLOCKTIME``, else :data:`~affinity.planning.envvars.DEFAULT_BLOCKTIME`.
    cpus : IdList or None
        Explicit CPUs (``--physcpubind``); at most one of ``cpus`` and ``nodes``.
    nodes : IdList or None
        The CPUs of these NUMA nodes (``--cpunodebind``).
    norespect : bool
        Start from the cgroup's cpuset instead of the inherited mask.
    memory : object
        The memory policy asked for: None (the share's nodes for an instance or rank,
        else memory is left alone), ``(policy, IdList)`` as ``affinity run`` reads its
        options, or any form of ``apply(membind=...)``
        (:func:`~affinity.planning.memory.membind_spec`).
    memory_optional : bool
        A memory policy the kernel refuses is a warning, not an error.
    ranks : None, "auto" or LocalRank
        Plan inside this local rank's share: ``"auto"`` is the launcher's rank
        (``Situation.job``).
    instances : int
        Disjoint shares to start copies on.
    cores_per_instance : int or None
        Exactly this many cores per instance.
    dataloader_workers : int or None
        Place that many DataLoader workers beside each instance's team.
    export : {"replace", "keep", "none"}
        The user's values of variables the plan exports are replaced (each said), kept
        (``apply(export="keep")``), or nothing is exported but the DataLoader workers'
        layout (``apply(export=False)``).
    library_binds : bool
        The preloaded library binds every thread (``--pin-threads``): the runtimes
        are told to bind nothing.
    gpu_bind : str or None
        Place the rank next to its GPU as ``torchrun --numa-binding=MODE`` does
        (``node``, ``socket``, ``exclusive``, ``core-complex``:
        :func:`affinity.planning.gpus.gpu_binding`), memory on the GPU's node(s).
    gpu : None, "auto", int or str
        The rank's GPU: ``"auto"`` (its local rank's visible device, as torchrun's
        ``cuda:LOCAL_RANK``), a device ordinal, a bus id or a UUID prefix; with
        ``gpu_bind`` None, mode ``node``.
    reserve_cores : int
        With a GPU: cores of the rank's set kept for data loading (its DataLoader
        workers go there), the pools sized to the rest.
    serving : Serving or None
        Start a serving engine (``affinity run --for``): its layout on the CPUs
        selected and its own words (:func:`~affinity.planning.engines.serve.plan_serving`)
        instead of a plan and the OpenMP variables; the engine binds its threads.
    command : tuple of str
        The command to start (``affinity run``), read for what a serving engine's
        own flags already say.
    """

    spec: Any = None
    threads: int | None = None
    runtime: str = DEFAULT_RUNTIME
    strict: bool = True
    blocktime: str | None = BLOCKTIME_DEFAULT
    cpus: IdList | None = None
    nodes: IdList | None = None
    norespect: bool = False
    memory: Any = None
    memory_optional: bool = False
    ranks: Any = None
    instances: int = 1
    cores_per_instance: int | None = None
    dataloader_workers: int | None = None
    export: str = "replace"
    library_binds: bool = False
    gpu_bind: str | None = None
    gpu: Any = None
    reserve_cores: int = 0
    serving: Serving | None = None
    command: tuple[str, ...] = ()


@record
class Situation:
    """What the process runs in, read by the face (this process for ``apply()``, the
    launcher's for ``affinity run``; described for a preview or a test).

    Parameters
    ----------
    topology : Topology
        The machine; its ``allowed`` set is the inherited mask.
    environ : mapping of str to str
        The user's environment (``apply()``: without what an enclosing binding exported).
    cgroup_cpus : frozenset of int or None
        The cgroup's cpuset; None: the machine's CPUs.
    quota : CpuQuota or None
        The CFS quota (most restrictive ancestor); None: no quota.
    mems_allowed : frozenset of int or None
        ``Mems_allowed_list``; None: every node.
    job : Job
        What the launcher variables say (:func:`affinity.binding.launchvars.read_job`).
    loaded : Census or None
        The OpenMP runtimes loaded in the process that will read the exports
        (``apply()``: this one); None: not known (a command not started yet).
    """

    topology: Topology
    environ: Mapping[str, str] = field(default_factory=dict)
    cgroup_cpus: frozenset[int] | None = None
    quota: CpuQuota | None = None
    mems_allowed: frozenset[int] | None = None
    job: Job = field(default_factory=Job)
    loaded: Census | None = None

    @property
    def whole(self) -> frozenset[int]:
        """The CPUs the job's processes start from: the cgroup's cpuset within the machine."""
        return (self.cgroup_cpus or self.topology.cpuset) & self.topology.cpuset


@record
class Placement:
    """One process's part of a :class:`Decision` (an instance, or the process itself).

    Parameters
    ----------
    index : int
        Its number, from 0.
    who : str
        How messages name it: ``""`` (the only one), ``"instance 1"``, ``"rank 3"``...
    cpus : frozenset of int
        The process mask.
    plan : Plan
        Where the runtime binds each thread of its team.
    exports : mapping of str to str
        The variables to set (the plan's, the instance's number, the workers' layout).
    memory : MemorySpec or None
        The memory policy; None: left as it is.
    memory_required : bool
        Asked for explicitly: a refusal is an error, not a warning.
    share : Share or None
        Its share of the node (instances, ranks).
    workers : WorkerLayout or None
        Where its DataLoader workers go.
    gpu : GpuBinding or None
        Its GPU and why its CPUs are those (``gpu_bind``).
    flags : tuple of str
        A serving engine's own flags, to follow the command (llama.cpp's).
    """

    index: int
    who: str
    cpus: frozenset[int]
    plan: Plan
    exports: Mapping[str, str]
    memory: MemorySpec | None = None
    memory_required: bool = False
    share: Share | None = None
    workers: WorkerLayout | None = None
    gpu: GpuBinding | None = None
    flags: tuple[str, ...] = ()

    @property
    def threads(self) -> int:
        """The team size (the plan's: what ``OMP_NUM_THREADS`` exports, PyTorch's intra-op count)."""
        return self.plan.threads

    @property
    def slots(self) -> tuple[frozenset[int], ...]:
        """Thread i of the team on ``slots[i]``."""
        return tuple(self.plan.cpusets)


@record
class Decision:
    """What goes where and what is said (:func:`decide`).

    Parameters
    ----------
    placements : tuple of Placement
        One per process to place (instances; one for ``apply()``).
    rank : LocalRank or None
        The local rank planned for.
    warnings : tuple of str
        Said by every face, always (``apply()``: an ``AffinityWarning`` each).
    notices : tuple of str
        Said always though nothing is wrong (a launcher's binding followed).
    notes : tuple of str
        How defaults were chosen (``affinity run -v``; ``Binding.notes``).
    kept : mapping of str to str
        The user's values kept in place of the plan's (``export="keep"``).
    serving : ServingPlan or None
        A serving engine's layout and words (``Request.serving``).
    """

    placements: tuple[Placement, ...]
    rank: LocalRank | None = None
    warnings: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    kept: Mapping[str, str] = field(default_factory=dict)
    serving: ServingPlan | None = None


@record(frozen=False)
class _Said:
    """What the steps say, as they go."""

    warnings: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------- the decision

def decide(request: Request, situation: Situation) -> Decision:
    """What ``request`` means in ``situation``: per process its CPUs, plan, exports,
    memory policy and workers, and every sentence the faces say.

    Parameters
    ----------
    request : Request
        What was asked.
    situation : Situation
        What the process runs in.

    Returns
    -------
    Decision

    Raises
    ------
    PlanError
        What cannot be done, naming the input.
    SpecError
        A malformed spec with ``strict``.
    """
    said = _Said()
    selected = _select(request, situation, said)
    if request.serving is not None:
        return _serve(request, situation, selected, said)
    rank, shares, gpu, cpus = _shares(request, situation, selected, said)
    team_env, dropped = team_environ(situation.environ, rank)
    said.notes.extend(dropped)  # torchrun's OMP_NUM_THREADS=1 is no team size for a share
    env_threads, bad = precedence.team_size(None, team_env)
    said.warnings.extend(bad)
    said.warnings.extend(_unread(request, situation.environ))
    each = _Each(request=request, situation=situation, said=said, rank=rank, count=len(shares), gpu=gpu, cpus=cpus,
                 env_threads=env_threads, explicit_memory=_explicit_memory(request, situation),
                 sharing=request.instances * (rank.size if rank is not None else 1))
    placements, kept = [], {}
    for i, share in enumerate(shares):
        pl, user_kept = _place(i, share, each)
        placements.append(pl)
        kept.update(user_kept)
    if situation.loaded is not None:
        said.warnings.extend(_loaded_warnings(situation.loaded, placements[0].plan))
    return Decision(placements=tuple(placements), rank=rank, warnings=tuple(said.warnings),
                    notices=tuple(said.notices), notes=tuple(said.notes), kept=kept)


@record
class _Each:
    """What every instance's placement is decided from (:func:`_place`)."""

    request: Request
    situation: Situation
    said: _Said
    rank: LocalRank | None
    count: int
    gpu: GpuBinding | None
    cpus: frozenset[int]  #: the CPUs of the process a share None stands for (the selection, or the rank's share)
    env_threads: int | None
    explicit_memory: MemorySpec | None
    sharing: int


def _shares(request: Request, situation: Situation, selected: frozenset[int],
            said: _Said) -> tuple[LocalRank | None, list[Share | None], GpuBinding | None, frozenset[int]]:
    """The rank, the shares of the processes to place (one None: all of the last
    value, the CPUs selected or the rank's share), the rank's GPU binding: a GPU decides the rank's CPUs (:func:`_gpu`), else the
    rank's share of the node (:func:`_rank_share`), then instances cut it."""
    topo = situation.topology
    if request.gpu_bind is not None or request.gpu is not None:
        rank = _rank(request, situation.job) if request.ranks is not None else situation.job.rank
        gpu = _gpu(request, situation, selected, rank, said)
        if request.instances != 1 or request.cores_per_instance is not None:
            raise PlanError("--gpu-bind places one process per GPU rank: it does not go with --instances")
        return rank, [Share(index=0, cpus=gpu.cpus, cores=(), numa_nodes=gpu.mem_nodes)], gpu, gpu.cpus
    rank, rank_share = _rank_share(request, situation, selected, said)
    if request.ranks is None and request.cpus is None and request.nodes is None:
        said.warnings.extend(w for w in [unranked_warning(topo.with_allowed(selected), situation.job,
                                                          situation.whole, request.norespect)] if w)
    work = topo.with_allowed(rank_share.cpus if rank_share is not None else selected)
    shares = _instance_shares(request, work, rank_share)
    if len(shares) > 1:
        said.notices.extend(n for n in [kinds_note(work, [s for s in shares if s is not None],
                                                   request.cores_per_instance, "instance")] if n)
    return rank, shares, None, work.allowed


def _place(i: int, share: Share | None, each: _Each) -> tuple[Placement, dict[str, str]]:
    """Instance ``i`` on ``share``: its team, plan, exports, memory and workers."""
    request, situation, said = each.request, each.situation, each.said
    who = _who(i, each.count, each.rank)
    cpus = share.cpus if share is not None else each.cpus
    compute = each.gpu.compute_cpus if each.gpu is not None else cpus  # a GPU rank's loader cores apart
    threads, source = _team_size(who, compute, request, situation, each.env_threads, each.sharing, said)
    if each.gpu is not None and request.threads is None and each.env_threads is None:
        threads, source = each.gpu.threads, "the default team"  # one per core of the GPU's compute CPUs
    p = _plan(request, threads, compute, situation)
    exports, kept = _exports(i, each.count, p, request, situation, who, source, said)
    memory, required = _memory(who, share, request, each.explicit_memory, p, situation, said, each.gpu)
    workers = _workers(who, p, request, said, cpus)
    if workers is not None:
        exports[WORKERS_VARIABLE] = workers.to_env_value()
    return Placement(index=i, who=who, cpus=cpus, plan=p, exports=exports, memory=memory, memory_required=required,
                     share=share, workers=workers, gpu=each.gpu), kept


#: the DataLoader workers' CPU sets, ``;`` between workers (read in the worker processes)
WORKERS_VARIABLE = "AFFINITY_DATALOADER_CPUS"


def _prefixed(who: str, text: str) -> str:
    return f"{who}: {text}" if who else text


def _who(i: int, instances: int, rank: LocalRank | None) -> str:
    """How messages name instance ``i`` of ``instances``: nothing for the only
    process, ``instance 1``, under a rank ``rank 3`` or ``rank 3, instance 1``."""
    if rank is None:
        return f"instance {i}" if instances > 1 else ""
    return f"rank {rank.rank}" + (f", instance {i}" if instances > 1 else "")


# 1. the CPUs to work with

def _select(request: Request, situation: Situation, said: _Said) -> frozenset[int]:
    """The inherited mask (respect) or the cgroup's cpuset (``norespect``), narrowed
    by explicit CPUs or nodes."""
    topo = situation.topology
    if request.norespect:
        base = situation.whole
        said.notes.append(f"--norespect: starting from the cgroup cpuset {format_list(base)} instead of "
                          f"the inherited mask {format_list(topo.allowed)}")
    else:
        base = topo.allowed
    if request.cpus is not None:
        return _physcpubind(request.cpus, topo, base)
    if request.nodes is not None:
        return _cpunodebind(request.nodes, topo, base, _allowed_nodes(situation))
    return base


def _physcpubind(ids: IdList, topology: Topology, base: frozenset[int]) -> frozenset[int]:
    sel = topology.check_cpus(ids.resolve(base, "--physcpubind"), f"--physcpubind {ids.text}")
    outside = sel - base
    if outside:
        raise PlanError(f"--physcpubind {ids.text}: {'CPU' if len(outside) == 1 else 'CPUs'} "
                        f"{format_list(outside)} {'is' if len(outside) == 1 else 'are'} not "
                        f"allowed to this process (allowed: {format_list(base)})")
    return sel


def _cpunodebind(ids: IdList, topology: Topology, base: frozenset[int], nodes: frozenset[int]) -> frozenset[int]:
    chosen = check_nodes(ids.resolve(nodes, "--cpunodebind"), topology, f"--cpunodebind {ids.text}")
    sel = frozenset().union(*(n.cpuset for n in topology.numa_nodes if n.os_index in chosen)) & base
    if not sel:
        raise PlanError(f"--cpunodebind {ids.text}: none of the CPUs of node "
                        f"{format_list(chosen)} is allowed (allowed: {format_list(base)})")
    return sel


def _allowed_nodes(situation: Situation) -> frozenset[int]:
    known = frozenset(n.os_index for n in situation.topology.numa_nodes)
    return situation.mems_allowed & known if situation.mems_allowed is not None else known


# 2. the rank's share of the node

def _rank(request: Request, job: Job) -> LocalRank | None:
    """The rank asked for: ``"auto"`` is the launcher's (:class:`Job`), refused with
    the reason where there is none."""
    if request.ranks is None or isinstance(request.ranks, LocalRank):
        return request.ranks
    if request.ranks != "auto":
        raise PlanError(f"ranks: expected None, 'auto' or a LocalRank, got {request.ranks!r}")
    if job.error:
        raise PlanError(job.error)
    if job.rank is None:
        if job.not_a_rank:
            raise PlanError(f"--ranks auto: not a launcher's rank here: {'; '.join(job.not_a_rank)}; {job.todo}")
        names = ", ".join(v for _, v, _ in LAUNCHER_VARIABLES)
        raise PlanError(f"--ranks auto: no launcher variables found (looked for {names}); "
                        f"start under mpirun/srun/torchrun or give --ranks RANK/SIZE")
    return job.rank


def _rank_share(request: Request, situation: Situation, selected: frozenset[int],
                said: _Said) -> tuple[LocalRank | None, Share | None]:
    """This rank's share (:func:`~affinity.planning.partition.place_rank`): a launcher
    that bound the rank itself is followed, and that is said (a notice); under
    ``norespect`` its binding is replaced by the cgroup's cpuset, cut as if unbound."""
    rank = _rank(request, situation.job)
    if rank is None:
        return None, None
    topo = situation.topology
    binding = situation.job.binding if request.ranks == "auto" else None
    replaced = ""
    if binding is not None and request.norespect:  # --norespect replaces the launcher's binding
        replaced, binding = replaced_binding(binding, rank, topo.allowed, situation.whole) + ": ", None
    try:
        share, how = place_rank(topo.with_allowed(selected), rank, binding, situation.whole)
    except PlanError as e:
        hint = ""
        cg = situation.cgroup_cpus
        if cg and selected < (cg & topo.cpuset):
            hint = crowded_hint(situation.job, rank, binding, selected, cg & topo.cpuset)
        raise PlanError(f"--ranks: {rank.size} ranks on this node ({rank.source}): {e}{hint}") from e
    (said.notices if binding is not None or replaced else said.notes).append(replaced + how)
    said.notices.extend(n for n in [rank_kinds_note(topo.with_allowed(selected), rank, share)] if n)
    return rank, share


def _gpu(request: Request, situation: Situation, selected: frozenset[int], rank: LocalRank | None,
         said: _Said) -> GpuBinding:
    """The rank next to its GPU (:func:`affinity.planning.gpus.gpu_binding`): the GPU
    its visibility variables give its local rank (or ``gpu``), the CPUs torchrun's
    mode gives it within the CPUs it may use, memory on their node(s) unless a
    policy was asked for; said as a notice, with where torchrun would differ."""
    mode = request.gpu_bind or "node"
    r = rank if rank is not None else LocalRank(rank=0, size=1, source="this process")
    gb = gpu_binding(situation.topology.with_allowed(selected), mode, environ=situation.environ,
                     local_rank=r.rank, local_size=r.size, gpu=None if request.gpu in (None, "auto") else request.gpu,
                     allowed=selected, memory="none" if request.memory is not None else "bind",
                     mems_allowed=situation.mems_allowed, reserve_cores=request.reserve_cores)
    said.notices.append(gb.describe())
    said.notes.extend(gb.notes)
    if gb.differs_from_torch:
        said.notices.append(f"rank {gb.rank}: torchrun --numa-binding={mode} differs: {gb.differs_from_torch}")
    return gb


def team_environ(environ: Mapping[str, str], rank: LocalRank | None) -> tuple[dict[str, str], list[str]]:
    """``environ`` without the values ``rank``'s launcher set by itself
    (:data:`~affinity.planning.launchers.LAUNCHER_DEFAULTS`: torchrun's
    ``OMP_NUM_THREADS=1`` is no team size for a share), and a sentence for each:
    the environment the team size is read from."""
    out, said = dict(environ), []
    if rank is None:
        return out, said
    for launcher, var, value in LAUNCHER_DEFAULTS:
        if rank.launcher == launcher and rank.size > 1 and environ.get(var, "").strip() == value:
            del out[var]
            said.append(f"{var}={value} is what {launcher} sets for every worker when nothing is set, not a "
                        f"team size: the team is sized from this rank's share (give a thread count to choose one)")
    return out, said


# 3. instances

def _instance_shares(request: Request, work: Topology, rank_share: Share | None) -> list[Share | None]:
    if request.instances < 1:
        raise PlanError(f"--instances must be >= 1, got {request.instances}")
    if request.instances == 1 and request.cores_per_instance is None:
        return [rank_share]
    try:
        return list(partition(work, request.instances, request.cores_per_instance))
    except PlanError as e:
        what = f"--instances {request.instances}" + (f" --cores-per-instance {request.cores_per_instance}"
                                                      if request.cores_per_instance else "")
        raise PlanError(f"{what}: {e}") from e


# 4. per instance: team, plan, exports, memory, workers

def _team_size(who: str, cpus: frozenset[int], request: Request, situation: Situation, env_threads: int | None,
               sharing: int, said: _Said) -> tuple[int, str]:
    """(size, where it came from): asked, else ``OMP_NUM_THREADS``
    (:func:`~affinity.planning.precedence.team_size`), else one per core of ``cpus``
    within the CFS quota's share (``sharing`` processes)."""
    if request.threads is not None:
        return request.threads, "threads"
    if env_threads is not None:
        return env_threads, "OMP_NUM_THREADS"
    cores = sum(1 for c in situation.topology.cores if c.cpuset & cpus)
    threads = default_thread_count(cores, situation.quota, share=sharing)
    if threads < cores:
        said.notes.append(_prefixed(who, f"{threads} threads for {cores} cores: CFS quota {situation.quota}"
                                         + (f" shared by {sharing} processes" if sharing > 1 else "")))
    return threads, "the default team"


def _plan(request: Request, threads: int, cpus: frozenset[int], situation: Situation) -> Plan:
    """The spec, else the environment's placement variables, else the default spec,
    for a process whose mask is ``cpus`` inside the cgroup's cpuset (what
    ``norespect`` may reach: beyond it the runtime aborts)."""
    topo, whole = situation.topology, situation.whole
    machine = topo.with_allowed(whole if cpus <= whole else cpus)
    if request.spec is None and any(v in situation.environ for v in PLACEMENT_VARIABLES):
        env = {k: v for k, v in situation.environ.items() if k.startswith(("KMP_", "OMP_"))}
        env["OMP_NUM_THREADS"] = str(threads)
        return plan_env(env, topology=machine, initial_mask=cpus, runtime=request.runtime)
    spec = DEFAULT_SPEC if request.spec is None else request.spec
    return plan(spec, threads, machine, strict=request.strict, initial_mask=cpus, runtime=request.runtime)


def _unread(request: Request, environ: Mapping[str, str]) -> list[str]:
    """What the spec (or the default spec) sets that the plan's runtime never reads:
    ``compact`` under libgomp's rules binds nothing (the environment's own placement
    variables are the environment's business)."""
    if request.spec is not None:
        return [f"planner: {w}" for w in unread(request.spec, request.runtime)]
    if any(v in environ for v in PLACEMENT_VARIABLES):
        return []
    return [f"planner: {w} (the default spec: give SPEC in the runtime's own variables)"
            for w in unread(DEFAULT_SPEC, request.runtime)]


def _exports(i: int, count: int, p: Plan, request: Request, situation: Situation, who: str, source: str,
             said: _Said) -> tuple[dict[str, str], dict[str, str]]:
    """The plan's variables (and the instance's number), what is said about them --
    the runtime's warnings, a team larger than its CPUs, a runtime that cannot be
    told the plan, user values replaced -- and the user values kept."""
    said.warnings.extend(f"planner: {w}" for w in hinted(request.spec, p.warnings))  # a typo's did-you-mean
    said.warnings.extend(_prefixed(who, w) for w in precedence.oversubscription(p.threads, p.union, source))
    if request.export == "none":
        return {}, {}
    env, problems = export(p, blocktime=blocktime_for(request.blocktime, situation.environ))
    check_inherited(situation.environ, env)  # a libgomp variable of the user's that would defeat the plan
    if request.library_binds:  # the preloaded library binds every thread: the runtimes bind none
        env, problems = leave_binding_to_the_library(env), []
    said.warnings.extend(_prefixed(who, w) for w in problems)
    kept = {k: situation.environ[k] for k, v in env.items()
            if request.export == "keep" and situation.environ.get(k, v) != v}
    env = {k: v for k, v in env.items() if k not in kept}
    said.warnings.extend(_prefixed(who, n) for n in precedence.replaced(env, situation.environ))
    if count > 1:
        env["AFFINITY_INSTANCE"] = str(i)
        env["AFFINITY_NUM_INSTANCES"] = str(count)
    return env, kept


def _explicit_memory(request: Request, situation: Situation) -> MemorySpec | None:
    """An explicit ``(policy, IdList)`` of ``affinity run``'s options, resolved and
    checked against the nodes this process may use; other forms need the plan
    (:func:`_memory`)."""
    asked = request.memory
    if not (isinstance(asked, tuple) and len(asked) == 2 and isinstance(asked[1], IdList | None)):
        return None
    policy, ids = asked
    if policy == "local" or ids is None:
        return MemorySpec(policy="local", nodes=frozenset())
    allowed = _allowed_nodes(situation)
    option = f"--{MEM_OPTION[policy]}"
    chosen = ids.resolve(allowed, option)
    return MemorySpec(policy=policy, nodes=check_nodes(chosen, situation.topology, f"{option} {ids.text}",
                                                       allowed=allowed, policy=policy))


def _memory(who: str, share: Share | None, request: Request, explicit: MemorySpec | None, p: Plan,
            situation: Situation, said: _Said, gpu: GpuBinding | None = None) -> tuple[MemorySpec | None, bool]:
    """(policy, required): the one asked for, else the GPU's or the share's node(s) (a
    refusal only warned), else none."""
    if gpu is not None and request.memory is None:
        return (MemorySpec(policy=gpu.mempolicy, nodes=gpu.mem_nodes) if gpu.mempolicy else None), False
    if explicit is not None:
        return explicit, not request.memory_optional
    if request.memory is not None:
        spec = membind_spec(request.memory, situation.topology, p.union)
        if spec is not None and situation.mems_allowed is not None:
            check_nodes(spec.nodes, situation.topology, f"membind={request.memory!r}",
                        allowed=_allowed_nodes(situation), policy=spec.policy)
        return spec, spec is not None and not request.memory_optional
    if share is not None and share.numa_nodes:
        nodes = share.numa_nodes & _allowed_nodes(situation) or share.numa_nodes
        return MemorySpec(policy="bind", nodes=nodes), False
    if share is not None:
        said.warnings.append(_prefixed(who, "the topology knows no NUMA node: memory is not bound"))
    return None, False


def _workers(who: str, p: Plan, request: Request, said: _Said, cpus: frozenset[int]) -> WorkerLayout | None:
    """Where the DataLoader workers go beside the plan's team, within the process's
    CPUs ``cpus`` (a GPU rank's loader cores among them)."""
    if request.dataloader_workers is None:
        return None
    layout = worker_layout(p, request.dataloader_workers, allowed=cpus)
    said.warnings.extend(_prefixed(who, n) for n in [layout.shared_note()] if n)
    return layout


# 4'. a serving engine (affinity run --for)

#: what a serving engine's launch does not take: the engine binds its own threads
_NOT_WITH_SERVING = (
    ("SPEC", lambda r: r.spec is not None), ("--threads", lambda r: r.threads is not None),
    ("--ranks", lambda r: r.ranks is not None), ("--instances", lambda r: r.instances != 1),
    ("--cores-per-instance", lambda r: r.cores_per_instance is not None),
    ("--dataloader-workers", lambda r: r.dataloader_workers is not None),
    ("--pin-threads", lambda r: r.library_binds), ("--gpu-bind/--gpu", lambda r: r.gpu_bind or r.gpu),
    ("--reserve-cores", lambda r: r.reserve_cores), ("export", lambda r: r.export != "replace"))


def _serve(request: Request, situation: Situation, selected: frozenset[int], said: _Said) -> Decision:
    """A serving engine on the CPUs selected: its layout and words
    (:func:`~affinity.planning.engines.serve.plan_serving`), one placement per
    process that starts it (:meth:`~affinity.planning.engines.serve.ServingPlan.processes`):
    the engine's words exported (or its flags to follow the command), no OpenMP
    variable (the engine binds its threads itself), memory bound where the engine
    binds none, and the layout said."""
    from .engines.llamacpp import command_flags  # lazy: only a serving engine's launch loads the engines' rules
    from .engines.serve import plan_serving  # lazy: as above

    serving = request.serving
    other = [name for name, given in _NOT_WITH_SERVING if given(request)]
    if other:
        raise UsageError(f"--for {serving.engine}: the engine binds its own threads, one per core of each "
                         f"{serving.unit}'s share (--tp, --reserve, --smt choose them); it does not go with "
                         f"{', '.join(other)}")
    sp = plan_serving(situation.topology.with_allowed(selected), serving)
    if serving.engine == "llama.cpp":
        refused, replaced = command_flags(request.command)
        if refused:
            raise UsageError(f"--for llama.cpp: the command's own {', '.join(refused)}: llama.cpp ORs every CPU "
                             f"mask it is given into one, which would widen each instance's; leave them out")
        said.warnings.extend(replaced)
    procs = sp.processes()
    explicit = _explicit_memory(request, situation)
    placements = []
    for proc in procs:
        who = _who(proc.index, len(procs), None)
        exports = dict(proc.env)
        said.warnings.extend(_prefixed(who, n) for n in precedence.replaced(exports, situation.environ))
        if len(procs) > 1:
            exports.update(AFFINITY_INSTANCE=str(proc.index), AFFINITY_NUM_INSTANCES=str(len(procs)))
        if request.memory is not None:
            memory, required = _memory(who, None, request, explicit, proc.plan, situation, said)
        elif proc.memory:
            memory, required = MemorySpec(policy="bind", nodes=proc.memory & _allowed_nodes(situation)
                                          or proc.memory), False
        else:
            memory, required = None, False
        placements.append(Placement(index=proc.index, who=who, cpus=proc.cpus, plan=proc.plan, exports=exports,
                                    memory=memory, memory_required=required, flags=proc.flags))
    said.notices.extend(sp.layout.notes)
    asked = placements[0].memory
    said.notices.append(sp.memory_text(None if request.memory is None else "local" if asked is None or
                                       asked.policy == "local" else
                                       f"--{MEM_OPTION[asked.policy]} {format_list(asked.nodes)}"))
    said.notes.extend(f"{serving.engine}: {line}" for line in sp.lines())
    said.notes.extend(f"{serving.engine}: {n}" for n in sp.words.notes)
    return Decision(placements=tuple(placements), warnings=tuple(said.warnings), notices=tuple(said.notices),
                    notes=tuple(said.notes), serving=sp)


# 5. runtimes already loaded in the process

def _loaded_warnings(loaded: Census, p: Plan) -> list[str]:
    """Two OpenMP runtimes in one process, and each loaded runtime that reads the
    plan's settings into another placement (:func:`meaning_notes`)."""
    out = [w for w in [loaded.warning()] if w]
    if loaded.runtimes:
        out.extend(meaning_notes(p, loaded))
    return out


#: the variables libgomp places its threads by (it ignores KMP_AFFINITY): what it
#: reads (planning.gnu.GOMP_VARIABLES) but its thread counts
GNU_PLACEMENT = tuple(v for v in GOMP_VARIABLES if v not in ("OMP_THREAD_LIMIT", "OMP_NUM_THREADS"))


def _sets(cpusets: Any) -> str:
    return " ".join(f"{{{format_list(c)}}}" for c in cpusets)


def _placement_by(rt: LoadedRuntime, env: dict[str, str], p: Plan) -> tuple[str, Any]:
    """(the rules' name, the team's CPU sets) of ``env`` read by loaded runtime ``rt``."""
    if rt.family == "gnu":
        build = "torch" if rt.bundled_by == "torch" else "gcc12"
        g = plan_gomp(env, p.topology, p.initial_mask, build=build)
        return f"{build} build", g.cpusets
    other = plan_env(env, topology=p.topology, initial_mask=p.initial_mask, runtime=rt.family)
    return f"{rt.family}'s rules", other.cpusets


def meaning_notes(p: Plan, loaded: Census) -> list[str]:
    """One line for each OpenMP runtime of ``loaded`` that reads the plan's settings
    into another placement than the rules the plan followed (Intel's by default):
    what ``apply()`` pins is the plan's, what that runtime does alone is not.  A GNU
    libgomp is compared only for settings it reads (``OMP_PLACES``/``OMP_PROC_BIND``/
    ``GOMP_CPU_AFFINITY``; it ignores ``KMP_AFFINITY``, and ``apply()`` pins its team
    itself)."""
    env = {k: v for k, v in p.env}
    env.setdefault("OMP_NUM_THREADS", str(p.threads))
    notes = []
    for rt in loaded.runtimes:
        if rt.family == p.runtime or (rt.family == "gnu" and not any(k in env for k in GNU_PLACEMENT)):
            continue
        words = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k != "OMP_NUM_THREADS")
        try:
            rules, cpusets = _placement_by(rt, env, p)
        except PlanError as e:
            notes.append(f"{words} is refused by the {rt.kind} loaded here ({rt.path}): {e}")
            continue
        if tuple(cpusets) != tuple(p.cpusets):
            notes.append(f"{words} means something else to the {rt.kind} loaded here ({rt.path}, {rules}): "
                         f"it places {len(cpusets)} threads on {_sets(cpusets)}, where {p.runtime}'s rules, "
                         f"followed and pinned here, give {_sets(p.cpusets)}")
    return notes
