"""The pure half of ``affinity run``: options, a :class:`~affinity.machine.topology.Topology`
and a :class:`Context` in, a :class:`Launch` out (:func:`build_launch`).

The decision is :func:`affinity.planning.decide.decide`'s, the one ``apply()`` asks
too: this module only translates the command line into its request, and adds what
the launcher needs to perform it.  Per instance the launch holds the process CPU
mask, the memory policy, the plan (one CPU set per thread) and the environment that
exports it.  Nothing here touches the system but :meth:`Context.of_this_process`,
which reads it once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from typing import TYPE_CHECKING, Any

from ..binding.launchvars import parse_rank, read_job
from ..cpulist import format_list
from ..machine.cgroup import CpuQuota, cpu_quota, cpuset_cpus, mems_allowed
from ..machine.topology import Topology
from ..planning.decide import MEM_OPTION, Request, Situation, decide
from ..planning.gpus import GpuBinding
from ..planning.launchers import LocalRank
from ..planning.partition import Share
from ..record import field, record
from .options import RunOptions
from .preload import pin_environment
from .torch_env import torch_environment

if TYPE_CHECKING:  # the annotation only: a serving engine's launch loads the engines' rules
    from ..planning.engines.serve import ServingPlan

__all__ = ["MEM_OPTION", "Context", "Instance", "Launch", "build_launch", "request_of", "situation_of"]


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
        return cls(environ=dict(os.environ), quota=cpu_quota(), cgroup_cpus=cpuset_cpus(),
                   mems_allowed=mems_allowed())


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
    gpu : GpuBinding or None
        Its GPU and why its CPUs are those (``--gpu-bind``).
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
    gpu: GpuBinding | None = None

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
    serving : ServingPlan or None
        A serving engine's layout and words (``--for``).
    """

    instances: tuple[Instance, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  #: how defaults were chosen (printed with --verbose)
    rank: LocalRank | None = None
    membind_optional: bool = False
    verbose: bool = False
    notices: tuple[str, ...] = ()  #: always said (a launcher's binding followed)
    serving: ServingPlan | None = None

    @property
    def spawn(self) -> bool:
        """Several instances are started and waited for; one is exec'd."""
        return len(self.instances) > 1

    def to_dict(self) -> dict[str, Any]:
        """The launch as JSON-ready data (what ``--dry-run --json`` prints).

        Returns
        -------
        dict
            ``mode``, ``rank``, ``warnings``, ``notes``, one dict per instance, and
            with ``--for`` the engine's layout and words (``serving``).
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
                "env": dict(i.env), "log": i.log, "gpu": i.gpu.to_dict() if i.gpu is not None else None,
            } for i in self.instances],
            **({"serving": self.serving.to_dict()} if self.serving is not None else {}),
        }


# ------------------------------------------------------------------- the build

def build_launch(opts: RunOptions, topology: Topology, ctx: Context) -> Launch:
    """Everything ``affinity run`` will do, computed without touching the system:
    the decision (:func:`affinity.planning.decide.decide`, the one ``apply()`` asks
    too), and what the launcher adds to it to perform it (PyTorch's start-up hook,
    the pinning library's variables, the log files).

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
    d = decide(request_of(opts), situation_of(topology, ctx))
    instances = []
    for pl in d.placements:
        env = dict(pl.exports)
        if d.serving is None:  # a serving engine sizes and binds its own PyTorch threads
            env.update(torch_environment(pl.plan, ctx.environ))  # PyTorch: inter-op size, libgomp's pin undone
        if opts.pin_threads:  # the library binds every thread (the runtimes were told to bind none)
            env.update(pin_environment(pl.slots, ctx.environ, skip=opts.pin_skip, main=opts.pin_main,
                                       children=opts.pin_children, verbose=opts.verbose))
        log = os.path.join(opts.log_dir, f"instance-{pl.index}.log") if opts.log_dir else None
        instances.append(Instance(
            index=pl.index, argv=(*opts.command, *pl.flags), cpus=pl.cpus,
            mempolicy=pl.memory.policy if pl.memory is not None else None,
            mem_nodes=pl.memory.nodes if pl.memory is not None else frozenset(),
            mem_required=pl.memory_required, threads=pl.threads, slots=pl.slots, env=env, log=log,
            share=pl.share, gpu=pl.gpu))
    return Launch(instances=tuple(instances), warnings=d.warnings, notes=d.notes, rank=d.rank,
                  membind_optional=opts.membind_optional, verbose=opts.verbose, notices=d.notices,
                  serving=d.serving)


def request_of(opts: RunOptions) -> Request:
    """``affinity run``'s options as the decision's :class:`~affinity.planning.decide.Request`."""
    memory = (opts.mempolicy, opts.mem_nodes) if opts.mempolicy is not None else None
    return Request(spec=opts.spec, threads=opts.threads, runtime=opts.runtime, strict=True,
                   blocktime=opts.blocktime, cpus=opts.physcpubind, nodes=opts.cpunodebind,
                   norespect=opts.norespect, memory=memory, memory_optional=opts.membind_optional,
                   ranks=_ranks(opts.ranks), instances=opts.instances,
                   cores_per_instance=opts.cores_per_instance, dataloader_workers=opts.dataloader_workers,
                   library_binds=opts.pin_threads, gpu_bind=opts.gpu_bind, gpu=opts.gpu,
                   reserve_cores=opts.reserve_cores, serving=opts.serving,
                   command=tuple(opts.command))


def _ranks(text: str | None) -> Any:
    """``--ranks``: None, ``"auto"``, or ``R/N`` read into a :class:`~affinity.planning.launchers.LocalRank`."""
    return text if text is None or text == "auto" else parse_rank(text, {})


def situation_of(topology: Topology, ctx: Context) -> Situation:
    """What the launcher runs in, as the decision's :class:`~affinity.planning.decide.Situation`
    (the launcher variables read from ``ctx.environ``)."""
    return Situation(topology=topology, environ=ctx.environ, cgroup_cpus=ctx.cgroup_cpus, quota=ctx.quota,
                     mems_allowed=ctx.mems_allowed, job=read_job(ctx.environ, topology))
