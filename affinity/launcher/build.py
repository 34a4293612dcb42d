"""The pure half of ``affinity run``: options, a :class:`~affinity.machine.topology.Topology`
and a :class:`Context` in, a :class:`Launch` out (:func:`build_launch`).

Per instance the launch holds the process CPU mask, the memory policy, the plan
(one CPU set per thread) and the environment that exports it.  Nothing here
touches the system but :meth:`Context.of_this_process`, which reads it once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..cpulist import IdList, format_list, parse_list
from ..errors import PlanError
from ..machine.cgroup import CpuQuota, cpu_quota, cpuset_cpus, default_thread_count
from ..machine.topology import Topology
from ..planning import precedence
from ..planning.envvars import export
from ..planning.gnu.exports import check_inherited
from ..planning.launchers import started_by_a_launcher
from ..planning.memory import check_nodes
from ..planning.planner import plan, plan_env, unread
from ..planning.spec import DEFAULT_SPEC, PLACEMENT_VARIABLES
from ..record import field, record
from .options import RunOptions
from .preload import leave_binding_to_the_library, pin_environment
from .torch_env import torch_environment

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (affinity run's start-up)
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any
    from ..planning.ranks import LocalRank, Share

__all__ = ["MEM_OPTION", "Context", "Instance", "Launch", "build_launch"]

#: memory policy -> the numactl option that asks for it
MEM_OPTION = {"bind": "membind", "interleave": "interleave", "preferred": "preferred", "local": "localalloc"}


# --------------------------------------------------------------------- values

@record
class Context:
    """What the process runs in, read once (:meth:`of_this_process`) so that
    :func:`build_launch` stays pure.

    Parameters
    ----------
    environ : mapping of str to str
        The launcher's environment (``OMP_NUM_THREADS``, placement variables, rank variables).
    quota : CpuQuota or None
        The CFS quota (most restrictive ancestor); None: no quota.
    cgroup_cpus : frozenset of int or None
        The cgroup cpuset, for ``--norespect``.
    mems_allowed : frozenset of int or None
        ``Mems_allowed_list``; None: every node.
    """

    environ: Mapping[str, str] = field(default_factory=dict)
    quota: CpuQuota | None = None  #: the CFS quota (most restrictive ancestor)
    cgroup_cpus: frozenset[int] | None = None  #: the cgroup cpuset, for ``--norespect``
    mems_allowed: frozenset[int] | None = None  #: ``Mems_allowed_list``; None: every node

    @classmethod
    def of_this_process(cls) -> Context:
        """This process's environment, cgroup limits and allowed memory nodes.

        Returns
        -------
        Context
        """
        mems = None
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("Mems_allowed_list:"):
                        mems = parse_list(line.split(":", 1)[1])
        except OSError:
            pass
        return cls(dict(os.environ), cpu_quota(), cpuset_cpus(), mems)


@record
class Instance:
    """One process to start: where it runs, where its memory goes, what it is told.

    Parameters
    ----------
    index : int
        Its number, from 0.
    argv : tuple of str
        The command.
    cpus : frozenset of int
        The process mask.
    mempolicy : str or None
        ``"bind"``, ``"interleave"``, ``"preferred"``, ``"local"``; None: inherit the launcher's.
    mem_nodes : frozenset of int
        The policy's nodes.
    mem_required : bool
        Asked for explicitly (a refusal is an error, not a warning).
    threads : int
        The thread count.
    slots : tuple of frozenset of int
        One CPU set per worker thread, in order.
    env : mapping of str to str
        Set on top of the launcher's environment.
    log : str or None
        Where its stdout and stderr go; None: the launcher's.
    share : Share or None
        Its share of the node (``--instances``, ``--ranks``).
    """

    index: int
    argv: tuple[str, ...]
    cpus: frozenset[int]  #: the process mask
    mempolicy: str | None  #: None: inherit the launcher's
    mem_nodes: frozenset[int]
    mem_required: bool  #: asked for explicitly (a refusal is an error, not a warning)
    threads: int
    slots: tuple[frozenset[int], ...]  #: one CPU set per worker thread, in order
    env: Mapping[str, str]  #: set on top of the launcher's environment
    log: str | None = None
    share: Share | None = None

    def describe(self) -> str:
        """One line: the instance's CPUs, memory policy and thread count.

        Returns
        -------
        str
        """
        mem = (f"memory {self.mempolicy}" + (f" {format_list(self.mem_nodes)}" if self.mem_nodes else "")
               if self.mempolicy else "memory as inherited")
        return (f"instance {self.index}: cpus {format_list(self.cpus)}, {mem}, {self.threads} "
                f"thread{'s' if self.threads != 1 else ''}")


@record
class Launch:
    """Everything ``affinity run`` will do (see :func:`build_launch`).

    Parameters
    ----------
    instances : tuple of Instance
        The processes to start.
    warnings : tuple of str
        To print before anything starts.
    notes : tuple of str
        How defaults were chosen (printed with ``--verbose``).
    rank : LocalRank or None
        This process's local rank (``--ranks``).
    membind_optional : bool
        A refused memory policy is a warning.
    verbose : bool
        Say what is applied.
    notices : tuple of str
        Always said, though nothing is wrong: a launcher's own binding that the
        rank's share follows.
    """

    instances: tuple[Instance, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  #: how defaults were chosen (printed with --verbose)
    rank: LocalRank | None = None
    membind_optional: bool = False
    verbose: bool = False
    notices: tuple[str, ...] = ()  #: always said (a launcher's binding followed)

    @property
    def spawn(self) -> bool:
        """Several instances are started and waited for; one is exec'd."""
        return len(self.instances) > 1

    def to_dict(self) -> dict[str, Any]:
        """The launch as JSON-ready data (what ``--dry-run --json`` prints).

        Returns
        -------
        dict
            ``mode``, ``rank``, ``warnings``, ``notes`` and one dict per instance.
        """
        return {
            "mode": "spawn" if self.spawn else "exec",
            "rank": None if self.rank is None else {"rank": self.rank.rank, "size": self.rank.size,
                                                     "source": self.rank.source},
            "warnings": list(self.warnings),
            "notices": list(self.notices),
            "notes": list(self.notes),
            "instances": [{
                "index": i.index, "argv": list(i.argv), "cpus": format_list(i.cpus),
                "mempolicy": i.mempolicy, "mem_nodes": format_list(i.mem_nodes),
                "threads": i.threads, "slots": [format_list(s) for s in i.slots],
                "env": dict(i.env), "log": i.log,
            } for i in self.instances],
        }


@record
class _Nodes:
    """The NUMA nodes the topology knows, and those this process may allocate on."""

    known: frozenset[int]
    allowed: frozenset[int]

    @classmethod
    def of(cls, topology: Topology, ctx: Context) -> _Nodes:
        known = frozenset(n.os_index for n in topology.numa_nodes)
        return cls(known, ctx.mems_allowed & known if ctx.mems_allowed is not None else known)



# ------------------------------------------------------------------- the build

def build_launch(opts: RunOptions, topology: Topology, ctx: Context) -> Launch:
    """Everything ``affinity run`` will do, computed without touching the system.

    Parameters
    ----------
    opts : RunOptions
        What was asked.
    topology : Topology
        The machine, its ``allowed`` set being the inherited mask.
    ctx : Context
        The environment, cgroup limits and allowed memory nodes.

    Returns
    -------
    Launch

    Raises
    ------
    PlanError
        What cannot be done, naming the option and the value.
    SpecError
        A bad SPEC or placement variable (from the planner).
    """
    warnings: list[str] = []
    notes: list[str] = []
    notices: list[str] = []
    nodes = _Nodes.of(topology, ctx)
    selected = _select_cpus(opts, topology, ctx, nodes, notes)
    rank, rank_share = _rank_share(opts, topology, ctx, selected, notes, notices)
    warnings.extend(_unranked(opts, topology, ctx, selected))
    work = topology.with_allowed(rank_share.cpus if rank_share is not None else selected)
    shares = _instance_shares(opts, work, rank_share)
    notices.extend(_kinds_said(opts, work, shares))
    mem_nodes = _explicit_mem_nodes(opts, topology, nodes)
    sharing = opts.instances * (rank.size if rank else 1)
    team_env, said = _team_environ(ctx.environ, rank)
    notes.extend(said)  # torchrun's OMP_NUM_THREADS=1 is no team size for a share
    env_threads = _env_threads(team_env, warnings)
    warnings.extend(_unread(opts, ctx))
    instances = []
    for i, share in enumerate(shares):
        who = _who(i, len(shares), rank)
        cpus = share.cpus if share is not None else work.allowed
        threads = _thread_count(who, _cores_in(topology, cpus), opts, ctx, env_threads, sharing, notes)
        p = _make_plan(opts.spec, threads, topology, cpus, ctx, opts.runtime)
        warnings.extend(f"planner: {w}" for w in getattr(p, "warnings", ()))
        slots = tuple(p.cpusets)  # thread i of the team on the plan's set i
        warnings.extend(f"{who}: {w}" for w in precedence.oversubscription(  # the CPUs the threads get
            threads, cpus | p.union, "--threads" if opts.threads is not None else "OMP_NUM_THREADS"))
        env, problems = _instance_env(i, len(shares), p, slots, opts, ctx.environ)
        warnings.extend(f"{who}: {w}" for w in problems)
        notes.extend(f"{who}: {n}" for n in precedence.replaced(env, ctx.environ))
        policy, policy_nodes, required = _memory_policy(who, share, opts, mem_nodes, nodes, warnings)
        log = os.path.join(opts.log_dir, f"instance-{i}.log") if opts.log_dir else None
        instances.append(Instance(i, tuple(opts.command), cpus, policy, frozenset(policy_nodes), required,
                                  threads, slots, env, log, share))
    return Launch(tuple(instances), tuple(warnings), tuple(notes), rank, opts.membind_optional,
                  opts.verbose, tuple(notices))


# 1. the CPUs to work with

def _select_cpus(opts: RunOptions, topology: Topology, ctx: Context, nodes: _Nodes,
                 notes: list[str]) -> frozenset[int]:
    """The inherited mask (respect) or the cgroup's cpuset (``--norespect``), narrowed
    by ``--physcpubind`` or ``--cpunodebind``."""
    if opts.norespect:
        base = (ctx.cgroup_cpus if ctx.cgroup_cpus else topology.cpuset) & topology.cpuset
        notes.append(f"--norespect: starting from the cgroup cpuset {format_list(base)} instead of "
                     f"the inherited mask {format_list(topology.allowed)}")
    else:
        base = topology.allowed
    if opts.physcpubind is not None:
        return _physcpubind(opts.physcpubind, topology, base)
    if opts.cpunodebind is not None:
        return _cpunodebind(opts.cpunodebind, topology, base, nodes)
    return base


def _physcpubind(ids: IdList, topology: Topology, base: frozenset[int]) -> frozenset[int]:
    sel = topology.check_cpus(ids.resolve(base, "--physcpubind"), f"--physcpubind {ids.text}")
    outside = sel - base
    if outside:
        raise PlanError(f"--physcpubind {ids.text}: {_cpus_word(outside)} {format_list(outside)} "
                        f"{'is' if len(outside) == 1 else 'are'} not "
                        f"allowed to this process (allowed: {format_list(base)})")
    return sel


def _cpus_word(cpus: frozenset[int]) -> str:
    return "CPU" if len(cpus) == 1 else "CPUs"


def _cpunodebind(ids: IdList, topology: Topology, base: frozenset[int], nodes: _Nodes) -> frozenset[int]:
    chosen = check_nodes(ids.resolve(nodes.allowed, "--cpunodebind"), topology, f"--cpunodebind {ids.text}")
    sel = frozenset().union(*(n.cpuset for n in topology.numa_nodes if n.os_index in chosen)) & base
    if not sel:
        raise PlanError(f"--cpunodebind {ids.text}: none of the CPUs of node "
                        f"{format_list(chosen)} is allowed (allowed: {format_list(base)})")
    return sel


# 2. ranks: this process's share of the node

def _rank_share(opts: RunOptions, topology: Topology, ctx: Context, selected: frozenset[int],
                notes: list[str], notices: list[str]) -> tuple[LocalRank | None, Share | None]:
    """This rank's share (:func:`~affinity.planning.ranks.place_rank`): a launcher
    that bound the rank itself is followed, and that is said (``notices``); under
    ``--norespect`` its binding is replaced by the cgroup's cpuset, cut as if unbound."""
    if opts.ranks is None:
        return None, None
    from ..planning import ranks  # lazy: only --ranks pays its import

    rank = ranks.parse_rank(opts.ranks, ctx.environ)
    binding = ranks.launcher_binding(ctx.environ, rank, topology) if opts.ranks == "auto" else None
    whole = (ctx.cgroup_cpus or topology.cpuset) & topology.cpuset
    replaced = ""
    if binding is not None and opts.norespect:  # --norespect replaces the launcher's binding
        replaced, binding = ranks.replaced_binding(binding, rank, topology.allowed, whole) + ": ", None
    try:
        share, how = ranks.place_rank(topology.with_allowed(selected), rank, binding, whole)
    except PlanError as e:
        hint = ""
        if ctx.cgroup_cpus and selected < (ctx.cgroup_cpus & topology.cpuset):
            hint = ranks.crowded_hint(ctx.environ, rank, binding, selected, ctx.cgroup_cpus & topology.cpuset)
        raise PlanError(f"--ranks: {rank.size} ranks on this node ({rank.source}): {e}{hint}") from e
    (notices if binding is not None or replaced else notes).append(replaced + how)
    notices.extend(n for n in [ranks.rank_kinds_note(topology.with_allowed(selected), rank, share)] if n)
    return rank, share


def _unranked(opts: RunOptions, topology: Topology, ctx: Context, selected: frozenset[int]) -> list[str]:
    """Without ``--ranks`` (and without a CPU choice of the user's), in a process a
    launcher started as one of several local ranks that would all plan on the same
    CPUs: the warning (:func:`~affinity.planning.ranks.unranked_warning`)."""
    if (opts.ranks is not None or opts.physcpubind is not None or opts.cpunodebind is not None
            or not started_by_a_launcher(ctx.environ)):
        return []
    from ..planning.ranks import unranked_warning  # lazy: only under a launcher

    whole = (ctx.cgroup_cpus or topology.cpuset) & topology.cpuset
    said = unranked_warning(topology.with_allowed(selected), ctx.environ, whole, opts.norespect)
    return [said] if said else []


def _team_environ(environ: Mapping[str, str], rank: LocalRank | None) -> tuple[Mapping[str, str], list[str]]:
    """The environment the team size is read from: a rank's
    (:func:`~affinity.planning.ranks.team_environ`), else the launcher's as is."""
    if rank is None:
        return environ, []
    from ..planning.ranks import team_environ  # lazy: only --ranks pays its import

    return team_environ(environ, rank)


# 3. instances

def _instance_shares(opts: RunOptions, work: Topology, rank_share: Share | None) -> list[Share | None]:
    if opts.instances < 1:
        raise PlanError(f"--instances must be >= 1, got {opts.instances}")
    if opts.instances == 1 and opts.cores_per_instance is None:
        return [rank_share]
    from ..planning.ranks import partition  # lazy: only several instances pay its import

    try:
        return list(partition(work, opts.instances, opts.cores_per_instance))
    except PlanError as e:
        what = f"--instances {opts.instances}" + (f" --cores-per-instance {opts.cores_per_instance}"
                                                   if opts.cores_per_instance else "")
        raise PlanError(f"{what}: {e}") from e


def _kinds_said(opts: RunOptions, work: Topology, shares: list[Share | None]) -> list[str]:
    """On a hybrid machine, which instances' shares mix core kinds or differ in speed."""
    if len(shares) < 2:
        return []
    from ..planning.ranks import kinds_note  # lazy: only several instances pay its import

    note = kinds_note(work, [s for s in shares if s is not None], opts.cores_per_instance, "instance")
    return [note] if note else []


# 4. memory policy

def _explicit_mem_nodes(opts: RunOptions, topology: Topology, nodes: _Nodes) -> frozenset[int]:
    """The nodes of ``--membind``/``--interleave``/``--preferred``, checked
    (:func:`affinity.planning.memory.check_nodes`, as ``apply(membind=...)`` is)."""
    if opts.mempolicy is None or opts.mempolicy == "local":
        return frozenset()
    assert opts.mem_nodes is not None
    option = f"--{MEM_OPTION[opts.mempolicy]}"
    chosen = opts.mem_nodes.resolve(nodes.allowed, option)
    return check_nodes(chosen, topology, f"{option} {opts.mem_nodes.text}", allowed=nodes.allowed,
                       policy=opts.mempolicy)


def _memory_policy(who: str, share: Share | None, opts: RunOptions, explicit: frozenset[int], nodes: _Nodes,
                   warnings: list[str]) -> tuple[str | None, frozenset[int], bool]:
    """(policy, nodes, required) of the instance ``who`` names (:func:`_who`): the one
    asked for, else its share's node(s), else none."""
    if opts.mempolicy is not None:
        return opts.mempolicy, explicit, True
    if share is not None and share.numa_nodes:
        return "bind", share.numa_nodes & nodes.allowed or share.numa_nodes, False
    if share is not None and not nodes.known:
        warnings.append(f"{who}: the topology knows no NUMA node: memory is not bound")
    return None, frozenset(), False


# 5. threads, plan and environment of each instance

def _who(i: int, instances: int, rank: LocalRank | None) -> str:
    """How messages name instance ``i`` of ``instances``: ``instance 1``, or under
    ``--ranks`` ``rank 3`` (one instance per rank) or ``rank 3, instance 1``."""
    if rank is None:
        return f"instance {i}"
    return f"rank {rank.rank}" + (f", instance {i}" if instances > 1 else "")


def _cores_in(topology: Topology, cpus: frozenset[int]) -> int:
    return sum(1 for c in topology.cores if c.cpuset & cpus)


def _env_threads(environ: Mapping[str, str], warnings: list[str]) -> int | None:
    """``OMP_NUM_THREADS`` by the rule :func:`affinity.planning.precedence.team_size`
    (``--threads`` wins: see :func:`_thread_count`)."""
    threads, said = precedence.team_size(None, environ)
    warnings.extend(said)
    return threads


def _thread_count(who: str, cores: int, opts: RunOptions, ctx: Context, env_threads: int | None, sharing: int,
                  notes: list[str]) -> int:
    """``--threads``, else ``OMP_NUM_THREADS``, else one per core within the CFS
    quota's share (``sharing`` processes)."""
    if opts.threads is not None:
        return opts.threads
    if env_threads is not None:
        return env_threads
    threads = default_thread_count(cores, ctx.quota, share=sharing)
    if threads < cores:
        notes.append(f"{who}: {threads} threads for {cores} cores: CFS quota "
                     f"{ctx.quota}" + (f" shared by {sharing} processes" if sharing > 1 else ""))
    return threads


def _unread(opts: RunOptions, ctx: Context) -> list[str]:
    """What SPEC (or the default spec) sets that the plan's runtime never reads:
    ``compact`` under ``--runtime gnu`` binds nothing (the environment's own
    placement variables are the environment's business)."""
    if opts.spec is not None:
        return [f"planner: {w}" for w in unread(opts.spec, opts.runtime)]
    if any(v in ctx.environ for v in PLACEMENT_VARIABLES):
        return []
    return [f"planner: {w} (the default spec: give SPEC in the runtime's own variables)"
            for w in unread(DEFAULT_SPEC, opts.runtime)]


def _make_plan(spec: str | None, threads: int, topology: Topology, cpus: frozenset[int],
               ctx: Context, runtime: str = "intel") -> Any:
    """SPEC, else the environment's placement variables, else the default spec, for a
    process whose mask is ``cpus`` inside the cgroup's cpuset (what ``norespect`` may
    reach: beyond it the runtime aborts)."""
    cgroup = (ctx.cgroup_cpus or topology.cpuset) & topology.cpuset
    machine = topology.with_allowed(cgroup if cpus <= cgroup else cpus)
    if spec is not None:
        return plan(spec, threads, machine, strict=True, initial_mask=cpus, runtime=runtime)
    if any(v in ctx.environ for v in PLACEMENT_VARIABLES):
        env = {k: v for k, v in ctx.environ.items() if k.startswith(("KMP_", "OMP_"))}
        env["OMP_NUM_THREADS"] = str(threads)
        return plan_env(env, topology=machine, initial_mask=cpus, runtime=runtime)
    return plan(DEFAULT_SPEC, threads, machine, strict=True, initial_mask=cpus, runtime=runtime)


def _instance_env(i: int, count: int, p: Any, slots: tuple[frozenset[int], ...], opts: RunOptions,
                  environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The plan's variables, the instance number (several), the preload's (``--pin-threads``);
    and what a runtime will not follow (:func:`~affinity.planning.envvars.export`:
    nothing under ``--pin-threads``, where the runtimes bind nothing)."""
    env, problems = export(p, blocktime=opts.blocktime)
    check_inherited(environ, env)  # a libgomp variable of the caller's that would defeat the plan
    env.update(torch_environment(p, environ))  # PyTorch: inter-op size, libgomp's load-time pin undone
    if count > 1:
        env["AFFINITY_INSTANCE"] = str(i)
        env["AFFINITY_NUM_INSTANCES"] = str(count)
    if opts.pin_threads:  # the library binds every thread: the runtimes bind none
        env = leave_binding_to_the_library(env)
        env.update(pin_environment(slots, environ, skip=opts.pin_skip, main=opts.pin_main,
                                   children=opts.pin_children,
                                   verbose=opts.verbose))
        problems = []
    return env, problems
