"""Where the ranks of a job land: ``affinity plan --ranks N|auto`` (before anything
runs) and ``affinity show --ranks [PID]`` (where every thread of every rank of a job
on this node really is).

``plan --ranks`` computes each local rank's launch exactly as ``affinity run --ranks``
does in that rank (:func:`~affinity.launcher.build.build_launch`, pure): the share,
the thread count, the memory policy and every thread's CPUs.  ``--ranks auto`` takes
the rank count from the launcher variables of this process (inside a rank: the
shares follow the launcher's own binding where it lists every rank's mask, as srun
does), or from a Slurm allocation (a batch script, an ``salloc`` shell: the ranks
``srun --cpu-bind=none`` would start).

``show --ranks`` finds the processes of a job on this node by their launcher
variables (:func:`~affinity.binding.launchvars.job_of`) and reads every thread's mask
and last CPU from the kernel (:func:`~affinity.binding.bindmap.report`); on a machine
with GPUs, each rank's GPU: the one its binding published (``apply(gpu=...)``), else
the device its environment gives its local rank (:func:`~affinity.planning.gpus.rank_device`,
the decision's own rules), and which of its threads are not next to it.  What it
cannot know: a device the program chose otherwise (``torch.cuda.set_device(3)``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..cpulist import format_list
from ..errors import PlanError
from ..launcher.build import Context, Instance, build_launch
from ..launcher.options import RunOptions
from ..machine.topology import Topology
from ..binding.launchvars import batch_script, job_of, launcher_binding, local_rank, not_a_rank, slurm_allocation
from ..planning.gpus import GPU_BIND_MODES, GpuBinding, far_from_gpu, rank_device
from ..planning.launchers import LAUNCHER_VARIABLES, LocalRank
from ..record import record

if TYPE_CHECKING:  # pragma: no cover
    from ..binding.bindmap import ThreadRow

__all__ = ["RankGpu", "RankPlan", "RankThreads", "add_plan_args", "add_show_args", "cmd_plan_ranks", "cmd_show_ranks",
           "find_jobs", "gpu_plan", "plan_ranks"]


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """``--ranks`` on ``affinity plan``."""
    p.add_argument("--ranks", metavar="N|auto", default=None, type=_rank_count,
                   help="plan every local rank of a job of N ranks on this node (auto: as many as the "
                        "launcher variables or the Slurm allocation say), each on its share, as "
                        "'affinity run --ranks' will place them")
    p.add_argument("--gpu-bind", metavar="MODE", default=None, choices=GPU_BIND_MODES,
                   help="with --ranks: each rank next to its GPU, as torchrun --numa-binding=MODE places it "
                        f"({', '.join(GPU_BIND_MODES)}), with its memory on the node of its CPUs; the GPUs and "
                        "their NUMA nodes are read from sysfs (or --topology fsroot:DIR / an hwloc XML with PCI "
                        "objects), the rank's GPU from CUDA_VISIBLE_DEVICES, ROCR/HIP_VISIBLE_DEVICES, "
                        "ZE_AFFINITY_MASK and Slurm's GPU variables")
    p.add_argument("--reserve-cores", metavar="K", default=0, type=_count,
                   help="with --gpu-bind: set K cores of each rank's CPUs aside for data loading (DataLoader "
                        "workers); its pools are sized to the rest")


def add_show_args(p: argparse.ArgumentParser) -> None:
    """``--ranks`` on ``affinity show``."""
    p.add_argument("--ranks", action="store_true",
                   help="show every rank of the job of PID (default: of every job) on this node: each "
                        "thread's mask, CPU and node, read from the kernel, and each rank's GPU (the one its "
                        "binding published, else the one its visibility variables give its local rank) with "
                        "the threads that are not next to it")


# ------------------------------------------------------------------ plan --ranks

def _count(text: str) -> int:
    """``--reserve-cores``'s value: a count, 0 or more."""
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected a count of cores (0 or more), got {text!r}")


def _rank_count(text: str) -> str:
    """``plan --ranks``'s value: ``N`` (a positive rank count) or ``auto``."""
    if text == "auto" or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"expected a positive rank count or 'auto', got {text!r}")


@record
class RankPlan:
    rank: int
    size: int
    instance: Instance  #: what ``affinity run --ranks`` does in that rank
    said: tuple[str, ...]  #: its notices (a launcher's binding followed)

    def to_dict(self) -> dict[str, Any]:
        i = self.instance
        return {"rank": self.rank, "size": self.size, "cpus": format_list(i.cpus),
                "cores": len(i.share.cores) if i.share else None, "threads": i.threads,
                "mempolicy": i.mempolicy, "mem_nodes": format_list(i.mem_nodes),
                "slots": [format_list(s) for s in i.slots], "notices": list(self.said)}


def _rank_environments(environ: Mapping[str, str], topology: Topology, count: str,
                       cgroup: frozenset[int] | None = None) -> tuple[list[tuple[dict[str, str], Topology, str]], str]:
    """One (environment, topology, --ranks value) per local rank to plan, and the header
    (``cgroup``: the cgroup's cpuset, which a launcher's listed domain is cut to)."""
    if count != "auto":
        try:
            _rank_count(count)
        except argparse.ArgumentTypeError as e:
            raise PlanError(f"--ranks: {e}") from None
        n = int(count)
        return [(dict(environ), topology, f"{i}/{n}") for i in range(n)], f"--ranks {n}"
    me = local_rank(environ)
    if me is not None:
        var = next(rv for name, rv, _ in LAUNCHER_VARIABLES if name == me.launcher)
        binding = launcher_binding(environ, me, topology)
        if binding is not None and not binding.masks:
            return ([(dict(environ), topology, "auto")],
                    f"{me.source}; {binding.launcher} bound this rank and lists no other rank's mask: "
                    f"this rank only")
        out = []
        for i in range(me.size):
            mask = binding.mask_of(i) if binding is not None else None
            mask = (mask & cgroup or mask) if mask and cgroup else mask  # a domain's CPUs, in the allocation
            out.append(({**environ, var: str(i)}, topology.with_allowed(mask) if mask else topology, "auto"))
        return out, me.source
    alloc = slurm_allocation(environ)
    if alloc is None:
        why, _ = not_a_rank(environ)
        raise PlanError("--ranks auto: neither launcher variables nor a Slurm allocation in this environment"
                        + "".join(f"; {w}" for w in why) + "; give the rank count (--ranks 4)")
    n, _ = alloc
    base = {k: v for k, v in environ.items() if not k.startswith("SLURM_CPU_BIND")}
    return ([({**base, "SLURM_LOCALID": str(i), "SLURM_STEP_TASKS_PER_NODE": str(n), "SLURM_NODEID": "0"},
              topology, "auto") for i in range(n)],
            f"{batch_script(environ)} ('affinity run --ranks auto' refuses here); the tasks "
            f"'srun --cpu-bind=none affinity run --ranks auto' will start (with Slurm's binding, each plans "
            f"inside its mask)")


def plan_ranks(topology: Topology, count: str, spec: str | None = None, threads: int | None = None,
               ctx: Context | None = None, runtime: str = "intel") -> tuple[list[RankPlan], str]:
    """Every local rank's launch, and a header saying where the rank count came from.

    Parameters
    ----------
    topology : Topology
        The machine, ``allowed`` being what the ranks start from.
    count : str
        ``"N"`` or ``"auto"`` (read from ``ctx.environ``).
    spec, threads, runtime
        As ``affinity run [SPEC] --threads --runtime`` (a runtime's name, not ``auto``).
    ctx : Context, optional
        The environment and cgroup limits (default: none).

    Raises
    ------
    PlanError
        No rank count, or a share that cannot be cut.
    """
    ctx = ctx or Context()
    envs, header = _rank_environments(ctx.environ, topology, count, ctx.cgroup_cpus)
    plans = []
    for env, topo, ranks in envs:
        opts = RunOptions(command=("-",), spec=spec, threads=threads, ranks=ranks, runtime=runtime)
        launch = build_launch(opts, topo, Context(env, ctx.quota, ctx.cgroup_cpus, ctx.mems_allowed))
        assert launch.rank is not None
        plans.append(RankPlan(launch.rank.rank, launch.rank.size, launch.instances[0], launch.notices))
    return plans, header


def _headline(what: str, header: str, width: int = 100) -> list[str]:
    """``WHAT (HEADER):`` on one line when it fits in ``width`` columns; else ``WHAT:``
    and the header below it, a line per clause (``; ``), each wrapped between words
    and indented (inside a Slurm batch script the header is several sentences: one
    line of ~450 characters)."""
    import textwrap  # lazy: only for a long header

    one = f"{what} ({header}):"
    if len(one) <= width:
        return [one]
    lines = [f"{what}:"]
    for clause in header.split("; "):
        lines += textwrap.wrap(clause, width, initial_indent="  ", subsequent_indent="    ",
                               break_on_hyphens=False, break_long_words=False)
    return lines


def _plan_table(plans: list[RankPlan], header: str, topology: Topology) -> str:
    rows = []
    for p in plans:
        i = p.instance
        mem = f"{i.mempolicy} {format_list(i.mem_nodes)}".strip() if i.mempolicy else "inherited"
        slots = " ".join(f"{{{format_list(s)}}}" for s in i.slots)
        rows.append((p.rank, format_list(i.cpus), len(i.share.cores) if i.share else 0, i.threads, mem, slots))
    wc = max([16] + [len(r[1]) for r in rows])  # columns as wide as their longest entry (a KNL's
    wm = max([12] + [len(r[4]) for r in rows])  # 0-16,68-84,136-152,204-220 shifted the rest)
    lines = _headline(f"{len(plans)} local rank{'s' if len(plans) != 1 else ''} on {topology.describe()}", header)
    lines += [f"{'rank':>4}  {'cpus':<{wc}} {'cores':>5} {'threads':>7}  {'memory':<{wm}} thread -> CPUs"]
    lines += [f"{r:>4}  {cpus:<{wc}} {cores:>5} {threads:>7}  {mem:<{wm}} {slots}"
              for r, cpus, cores, threads, mem, slots in rows]
    lines += [f"rank {p.rank}: {n}" for p in plans for n in p.said]
    return "\n".join(lines)


def cmd_plan_ranks(args: argparse.Namespace, topology: Topology, write_picture: Any) -> int:
    """``affinity plan [SPEC] --ranks N|auto``: the table (or JSON), and the picture; 2
    with options that do not apply to ranks (``--mask``, ``--env``, ...)."""
    import json  # lazy: only --json prints JSON (this module is loaded with every command's parser)

    other = [name for name, given in (("--mask", args.mask is not None), ("--env", bool(args.env)),
                                      ("--lenient", args.lenient), ("--translate", args.translate),
                                      ("-v", args.verbose), ("--compare", bool(args.compare)),
                                      ("--dataloader-workers", args.dataloader_workers is not None)) if given]
    if other:  # each rank's mask and settings come from its share, as affinity run's
        print(f"affinity plan: error: --ranks does not go with {', '.join(other)} (see 'affinity plan --help')",
              file=sys.stderr)
        return 2
    ctx = Context.of_this_process() if topology.is_this_system else Context(dict(os.environ))
    if getattr(args, "gpu_bind", None):
        return _gpu_plan(args, topology, ctx, write_picture)
    if getattr(args, "reserve_cores", 0):
        print("affinity plan: error: --reserve-cores goes with --gpu-bind (see 'affinity plan --help')",
              file=sys.stderr)
        return 2
    runtime = args.runtime
    if runtime == "auto":  # this process's loaded runtime, as affinity plan without --ranks
        from ..binding.which import resolve_runtime  # lazy: only for --runtime auto

        runtime = resolve_runtime("auto", caller="affinity plan --runtime")
    plans, header = plan_ranks(topology, args.ranks, args.spec, args.threads, ctx, runtime)
    if args.json:
        print(json.dumps({"source": header, "ranks": [p.to_dict() for p in plans]}, indent=2))
    else:
        print(_plan_table(plans, header, topology))
    if args.picture:
        write_picture(args.picture, topology, [p.instance.cpus for p in plans],
                      title=f"{len(plans)} ranks: each number is a rank's share", unit="rank")
    return 0


def gpu_plan(topology: Topology, count: str, mode: str, ctx: Context | None = None,
             reserve_cores: int = 0) -> tuple[list[GpuBinding], str]:
    """Every local rank next to its GPU (``affinity plan --ranks N|auto --gpu-bind
    MODE``), and the header saying where the rank count came from: each rank's
    launch as ``affinity run --ranks --gpu-bind`` decides it (the one decision),
    from its environment and the mask its launcher gave it (:func:`_rank_environments`).

    Raises
    ------
    PlanError
        No rank count, or a rank that cannot be placed (no GPU for it, its GPU's
        node outside its CPUs, ...): the plan is whole or refused.
    """
    ctx = ctx or Context()
    envs, header = _rank_environments(ctx.environ, topology, count, ctx.cgroup_cpus)
    plans = []
    for env, topo, ranks in envs:
        opts = RunOptions(command=("-",), ranks=ranks, gpu_bind=mode, reserve_cores=reserve_cores)
        launch = build_launch(opts, topo, Context(environ=env, quota=ctx.quota, cgroup_cpus=ctx.cgroup_cpus,
                                                  mems_allowed=ctx.mems_allowed))
        gpu = launch.instances[0].gpu
        assert gpu is not None
        plans.append(gpu)
    return plans, header


def _gpu_table(plans: list[GpuBinding], header: str, topology: Topology) -> str:
    rows = [(str(b.rank), b.device.name, str(b.ordinal), str(b.device.gpu.numa_node), format_list(b.cpus),
             format_list(b.loader_cpus) or "-", str(b.threads),
             f"{b.mempolicy} {format_list(b.mem_nodes)}" if b.mempolicy else "as it is") for b in plans]
    head = ("rank", "gpu", "device", "gpu node", "cpus", "loader cpus", "threads", "memory")
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]
    mode = plans[0].mode
    lines = [f"{len(plans)} local rank{'s' if len(plans) != 1 else ''} on {topology.describe()} ({header}), "
             f"each next to its GPU as torchrun --numa-binding={mode} binds it:",
             "  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    seen: set[str] = set()
    for b in plans:
        for n in (*b.notes, *([f"torchrun differs: {b.differs_from_torch}"] if b.differs_from_torch else [])):
            if n not in seen:
                seen.add(n)
                lines.append(f"rank {b.rank}: {n}" if n.startswith("torchrun") else f"note: {n}")
    return "\n".join(lines)


def _gpu_plan(args: argparse.Namespace, topology: Topology, ctx: Context, write_picture: Any) -> int:
    """``affinity plan --ranks N --gpu-bind MODE``: each rank's GPU, CPUs and memory."""
    import json  # lazy: only --json prints JSON (this module is loaded with every command's parser)

    if args.spec or args.threads is not None:
        print("affinity plan: error: --gpu-bind places each rank's CPUs by its GPU: no SPEC or --threads "
              "(see 'affinity plan --help')", file=sys.stderr)
        return 2
    plans, header = gpu_plan(topology, args.ranks, args.gpu_bind, ctx, args.reserve_cores)
    if args.json:
        print(json.dumps({"source": header, "gpu_bind": args.gpu_bind, "topology": topology.describe(),
                          "ranks": [b.to_dict() for b in plans]}, indent=2))
    else:
        print(_gpu_table(plans, header, topology))
    if args.picture:
        labels: dict[str, list[str]] = {}
        for b in plans:
            labels.setdefault(b.device.gpu.bus_id, []).append(str(b.rank))
        write_picture(args.picture, topology, [b.cpus for b in plans], unit="rank",
                      title=f"{len(plans)} ranks next to their GPUs ({args.gpu_bind}): each number is a rank",
                      gpu_labels={bus: f"rank{'s' if len(r) > 1 else ''} {','.join(r)}" for bus, r in labels.items()})
    return 0


# ------------------------------------------------------------------ show --ranks

@record
class RankGpu:
    """A rank's GPU as ``show --ranks`` finds it."""

    name: str  #: ``0000:17:00.0`` (``... tile 1``)
    numa_node: int  #: the GPU's ``numa_node`` (``-1``: not given)
    how: str  #: where it was read: its published binding, or its visibility variables and local rank
    far: str | None = None  #: the rank's threads not next to it, said (:func:`~affinity.planning.gpus.far_from_gpu`)

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.name, "gpu_numa_node": self.numa_node, "how": self.how, "far": self.far}


@record
class RankThreads:
    rank: LocalRank
    pid: int
    rows: tuple[ThreadRow, ...]
    gpu: RankGpu | None = None  #: its GPU (None: the machine has none, or it cannot be told: ``gpu_said``)
    gpu_said: str | None = None  #: why its GPU is not known

    @property
    def cpus(self) -> frozenset[int]:
        return frozenset().union(*(r.actual for r in self.rows))


def _environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            items = fh.read().split(b"\0")
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    env = dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)
    env["\0ppid"] = stat[stat.rindex(")") + 2:].split()[1]
    return env


def _gpu_of_rank(topology: Topology, env: dict[str, str], rank: LocalRank, published: Any,
                 cpus: frozenset[int]) -> tuple[RankGpu | None, str | None]:
    """(its GPU, why not known): the GPU its binding published (``apply(gpu=...)``),
    else the device its environment gives its local rank (the one decision's
    :func:`~affinity.planning.gpus.rank_device`), and whether its threads are next to it."""
    by_bus = {g.bus_id: g for g in topology.gpus}
    if published is not None:
        gpu = by_bus.get(published.bus_id)
        name = published.bus_id + ("" if published.tile is None else f" tile {published.tile}")
        far = far_from_gpu(topology, gpu, cpus) if gpu is not None else None
        return RankGpu(name, published.numa_node, f"its binding (apply(gpu=...), device {published.ordinal})",
                       far), None
    try:
        choice, vis = rank_device(topology, env, rank.rank, rank.size)
    except PlanError as e:
        return None, str(e)
    where = ", ".join(vis.variables) or f"every {vis.vendor} GPU visible"
    how = f"{where}: device {choice.ordinal} of local rank {rank.rank}"
    return RankGpu(choice.device.name, choice.device.gpu.numa_node, how,
                   far_from_gpu(topology, choice.device.gpu, cpus)), None


def find_jobs(pid: int | None = None, topology: Topology | None = None) -> dict[str, list[RankThreads]]:
    """The ranks of every job on this node (or of the job of ``pid``), by job, each
    rank's processes with their threads as the kernel reports them, and each rank's
    GPU where the machine (``topology``, default this one) has GPUs."""
    from ..binding.bindmap import report  # lazy: the binding layer only for show --ranks

    jobs: dict[str, list[RankThreads]] = {}
    me = os.getpid()
    pids = sorted(int(d) for d in os.listdir("/proc") if d.isdigit())
    topo: Topology | None = None
    for p in pids:
        env = _environ(p) if p != me else None
        if env is None:
            continue
        try:
            found = job_of(env, int(env.pop("\0ppid")))
        except PlanError:
            continue  # malformed launcher variables: not a rank we can place
        if found is None:
            continue
        rank, job = found
        try:
            bmap = report(p)
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited meanwhile
        ranked = RankThreads(rank, p, bmap.rows)
        topo = topo or topology or Topology.from_system()
        if topo.gpus:
            gpu, said = _gpu_of_rank(topo, env, rank, bmap.gpu, ranked.cpus)
            ranked = RankThreads(rank, p, bmap.rows, gpu, said)
        jobs.setdefault(job, []).append(ranked)
    if pid is not None:
        wanted = [job for job, ranks in jobs.items() if any(r.pid == pid for r in ranks)]
        if not wanted:
            raise PlanError(f"show --ranks {pid}: process {pid} is no rank of a launcher this user can read")
        jobs = {wanted[0]: jobs[wanted[0]]}
    return {job: sorted(ranks, key=lambda r: (r.rank.rank, r.pid)) for job, ranks in jobs.items()}


def _overlaps(ranks: list[RankThreads]) -> list[str]:
    out = []
    for i, a in enumerate(ranks):
        for b in ranks[i + 1:]:
            common = a.cpus & b.cpus
            if common and a.rank.rank != b.rank.rank:
                out.append(f"ranks {a.rank.rank} (pid {a.pid}) and {b.rank.rank} (pid {b.pid}) share cpus "
                           f"{format_list(common)}")
    return out


def _show_table(job: str, ranks: list[RankThreads]) -> str:
    size = max(r.rank.size for r in ranks)
    lines = [f"{job}: {len({r.rank.rank for r in ranks})} of {size} local ranks on this node",
             f"{'rank':>4} {'pid':>8} {'tid':>8}  {'thread':<16} {'mask':<14} {'cpu':>4} {'node':>4}"]
    for r in ranks:
        for t in r.rows:
            node = "" if t.node is None else str(t.node)
            lines.append(f"{r.rank.rank:>4} {r.pid:>8} {t.tid:>8}  {t.name[:16]:<16} "
                         f"{format_list(t.actual):<14} {t.last_cpu:>4} {node:>4}")
    for r in ranks:
        lines.append(f"rank {r.rank.rank} (pid {r.pid}): {len(r.rows)} thread{'s' if len(r.rows) != 1 else ''} "
                     f"on cpus {format_list(r.cpus)}{_gpu_words(r)}")
    overlaps = _overlaps(ranks)
    lines += [f"OVERLAP: {o}" for o in overlaps] or ["the ranks' CPUs are disjoint"]
    return "\n".join(lines)


def _gpu_words(r: RankThreads) -> str:
    """``; GPU 0000:17:00.0 on NUMA node 0 (CUDA_VISIBLE_DEVICES=0: device 0 of local rank 0)``,
    with the threads that are not next to it."""
    if r.gpu is None:
        return f"; GPU not known: {r.gpu_said}" if r.gpu_said else ""
    node = "no NUMA node given" if r.gpu.numa_node < 0 else f"NUMA node {r.gpu.numa_node}"
    far = f"; NOT NEXT TO IT: {r.gpu.far}" if r.gpu.far else ""
    return f"; GPU {r.gpu.name} on {node} ({r.gpu.how}){far}"


def cmd_show_ranks(args: argparse.Namespace, write_picture: Any) -> int:
    """``affinity show --ranks [PID]``: a table per job; exit 1 when ranks overlap
    or none is found."""
    import json  # lazy: only --json prints JSON (this module is loaded with every command's parser)

    jobs = find_jobs(args.pid)
    if not jobs:
        print("affinity show --ranks: no process of this user carries launcher rank variables "
              "(mpirun, srun, torchrun) on this node")
        return 1
    if args.json:
        print(json.dumps({job: [{"rank": r.rank.rank, "size": r.rank.size, "pid": r.pid,
                                 "cpus": format_list(r.cpus), "threads": [t.to_dict() for t in r.rows],
                                 "gpu": None if r.gpu is None else r.gpu.to_dict(), "gpu_not_known": r.gpu_said}
                                for r in ranks] for job, ranks in jobs.items()}, indent=2))
    else:
        print("\n\n".join(_show_table(job, ranks) for job, ranks in jobs.items()))
    if args.picture:
        job, ranks = next(iter(jobs.items()))
        write_picture(args.picture, Topology.from_system(), [r.cpus for r in ranks],
                      title=f"{job}: each number is a rank's threads", unit="rank")
    return 1 if any(_overlaps(r) for r in jobs.values()) else 0
