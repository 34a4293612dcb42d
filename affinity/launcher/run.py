"""``affinity run``: place a command's threads and memory, then exec it.

What numactl, taskset, likwid-pin and torch's ``run_cpu`` do, in one command
that speaks ``KMP_AFFINITY``::

    affinity run [SPEC] [options] -- CMD [ARGS...]

The work is split the house way:

1. :func:`build_launch` (pure): options, a :class:`~affinity.machine.topology.Topology`
   and a :class:`Context` (environment, cgroup limits, allowed memory nodes) in;
   a :class:`Launch` out -- per instance the process CPU mask, the memory
   policy, the plan (one CPU set per thread) and the environment that exports it;
2. :func:`execute`: validate everything that can fail (the command exists, the
   mask and memory policy can be set -- tried on this process and read back)
   *before* anything starts, then ``exec`` the command (one instance) or start
   every instance and wait for them (several); the exit status is the command's,
   or the worst instance's.

The process mask is the selected CPU set (numactl's meaning), the thread
placement inside it travels in the environment (``KMP_AFFINITY`` with an
explicit proclist, ``OMP_PLACES``/``OMP_PROC_BIND``, ``GOMP_CPU_AFFINITY``,
``OMP_NUM_THREADS``, ``KMP_BLOCKTIME``, ``KMP_WARNINGS``, ``TF_NUM_INTRAOP_THREADS``/
``TF_NUM_INTEROP_THREADS``) and, with ``--pin-threads``, in a preloaded library
that pins threads as they are created (``csrc/pinthreads.c``).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..machine.cgroup import CpuQuota, default_thread_count
from ..cpulist import format_list, parse_list
from ..planning.envvars import plan_environment, worker_slots
from ..errors import (BindError, NativeUnavailableError, PlanError, TopologyError,
                     UnsupportedError)
from ..planning.ranks import LocalRank, Share, parse_rank, partition
from ..machine.topology import Topology
from ..planning.spec import DEFAULT_SPEC, PLACEMENT_VARIABLES

__all__ = ["Context", "IdList", "Instance", "Launch", "RunOptions", "add_run_parser",
           "build_launch", "cmd_run", "execute", "hardware_text", "pin_library", "show_text"]

PIN_LIBRARY = "libaffinity_pin.so"


def pin_library() -> Path:
    """The preload library built with the package (``affinity/libaffinity_pin.so``)."""
    path = Path(__file__).resolve().parent / PIN_LIBRARY
    if not path.is_file():
        raise NativeUnavailableError(
            f"{path} is missing: the thread-pinning library is built with the package "
            f"(reinstall with 'pip install .', or 'make' in a checkout)")
    return path


# ---------------------------------------------------------------- numactl lists

@dataclass(frozen=True)
class IdList:
    """A numactl CPU or node list (``0-3,8``, ``all``, ``+0-1`` relative to the
    allowed set, ``!1`` for all but): parsed from the command line first, resolved
    against what is allowed when the machine is known."""

    text: str
    what: str  #: "CPU" or "node"
    ids: frozenset[int] = frozenset()
    everything: bool = False
    relative: bool = False
    inverted: bool = False

    @classmethod
    def parse(cls, text: str, what: str) -> IdList:
        t = text.strip()
        inverted = t.startswith("!")
        t = t[1:] if inverted else t
        relative = t.startswith("+")
        t = t[1:] if relative else t
        if t == "all":
            if relative:
                raise ValueError(f"'+all' is not a {what} list")
            return cls(text, what, frozenset(), True, False, inverted)
        try:
            ids = parse_list(t)
        except ValueError as e:
            raise ValueError(f"bad {what} list {text!r}: {e}") from None
        if not ids:
            raise ValueError(f"empty {what} list {text!r}")
        return cls(text, what, ids, False, relative, inverted)

    def resolve(self, allowed: frozenset[int], option: str) -> frozenset[int]:
        """The OS indexes this list means for a process allowed ``allowed``."""
        order = sorted(allowed)
        if self.everything:
            ids = frozenset(allowed)
        elif self.relative:
            bad = sorted(i for i in self.ids if i >= len(order))
            if bad:
                raise PlanError(f"{option} {self.text}: relative {self.what} index "
                                f"{format_list(bad)} is out of range: {len(order)} {self.what}s are "
                                f"allowed ({format_list(allowed)})")
            ids = frozenset(order[i] for i in self.ids)
        else:
            ids = self.ids
        return frozenset(allowed) - ids if self.inverted else ids


# --------------------------------------------------------------------- values

@dataclass(frozen=True)
class RunOptions:
    """What the command line asked for (see :func:`add_run_parser`)."""

    command: tuple[str, ...] = ()
    spec: str | None = None
    threads: int | None = None
    physcpubind: IdList | None = None
    cpunodebind: IdList | None = None
    norespect: bool = False
    mempolicy: str | None = None  #: "bind", "interleave", "preferred", "local"
    mem_nodes: IdList | None = None
    membind_optional: bool = False
    pin_threads: bool = False
    pin_skip: int = 0
    pin_main: bool = True
    instances: int = 1
    cores_per_instance: int | None = None
    log_dir: str | None = None
    ranks: str | None = None
    verbose: bool = False
    blocktime: str | None = None  #: None: the plan environment's default (or the user's KMP_BLOCKTIME)


@dataclass(frozen=True)
class Context:
    """What the process runs in, read once (:meth:`of_this_process`) so that
    :func:`build_launch` stays pure."""

    environ: Mapping[str, str] = field(default_factory=dict)
    quota: CpuQuota | None = None  #: the CFS quota (most restrictive ancestor)
    cgroup_cpus: frozenset[int] | None = None  #: the cgroup cpuset, for ``--norespect``
    mems_allowed: frozenset[int] | None = None  #: ``Mems_allowed_list``; None: every node

    @classmethod
    def of_this_process(cls) -> Context:
        from ..machine import cgroup

        mems = None
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("Mems_allowed_list:"):
                        mems = parse_list(line.split(":", 1)[1])
        except OSError:
            pass
        return cls(dict(os.environ), cgroup.cpu_quota(), cgroup.cpuset_cpus(), mems)


@dataclass(frozen=True)
class Instance:
    """One process to start: where it runs, where its memory goes, what it is told."""

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
        mem = (f"memory {self.mempolicy}" + (f" {format_list(self.mem_nodes)}" if self.mem_nodes else "")
               if self.mempolicy else "memory as inherited")
        return (f"instance {self.index}: cpus {format_list(self.cpus)}, {mem}, {self.threads} "
                f"thread{'s' if self.threads != 1 else ''}")


@dataclass(frozen=True)
class Launch:
    instances: tuple[Instance, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  #: how defaults were chosen (printed with --verbose)
    rank: LocalRank | None = None
    membind_optional: bool = False
    verbose: bool = False

    @property
    def spawn(self) -> bool:
        """Several instances are started and waited for; one is exec'd."""
        return len(self.instances) > 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": "spawn" if self.spawn else "exec",
            "rank": None if self.rank is None else {"rank": self.rank.rank, "size": self.rank.size,
                                                     "source": self.rank.source},
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "instances": [{
                "index": i.index, "argv": list(i.argv), "cpus": format_list(i.cpus),
                "mempolicy": i.mempolicy, "mem_nodes": format_list(i.mem_nodes),
                "threads": i.threads, "slots": [format_list(s) for s in i.slots],
                "env": dict(i.env), "log": i.log,
            } for i in self.instances],
        }


# ----------------------------------------------------------- plan and env glue

def _planner() -> tuple[Callable[..., Any], Callable[..., Any]]:
    try:
        from ..planning.planner import plan, plan_env
    except ImportError as e:  # pragma: no cover - the planner ships with the package
        raise NativeUnavailableError(f"the planner (affinity.planning.planner) cannot be imported: {e}") from e
    return plan, plan_env


def _plan_environment(plan: Any, blocktime: str | None) -> dict[str, str]:
    """The plan's variables; ``blocktime=None`` keeps the default KMP_BLOCKTIME."""
    return plan_environment(plan) if blocktime is None else plan_environment(plan, blocktime=blocktime)


def _make_plan(spec: str | None, threads: int, topology: Topology, environ: Mapping[str, str]) -> Any:
    plan, plan_env = _planner()
    if spec is not None:
        return plan(spec, threads, topology, strict=True)
    if any(v in environ for v in PLACEMENT_VARIABLES):
        env = {k: v for k, v in environ.items() if k.startswith(("KMP_", "OMP_"))}
        env["OMP_NUM_THREADS"] = str(threads)
        return plan_env(env, topology=topology, initial_mask=topology.allowed)
    return plan(DEFAULT_SPEC, threads, topology, strict=True)


# ------------------------------------------------------------------- planning

def _cores_in(topology: Topology, cpus: frozenset[int]) -> int:
    return sum(1 for c in topology.cores if c.cpuset & cpus)


def _env_threads(environ: Mapping[str, str], warnings: list[str]) -> int | None:
    text = environ.get("OMP_NUM_THREADS")
    if text is None:
        return None
    first = text.split(",")[0].strip()
    if first.isdigit() and int(first) > 0:
        return int(first)
    warnings.append(f"ignoring OMP_NUM_THREADS={text!r}: not a positive thread count")
    return None


def build_launch(opts: RunOptions, topology: Topology, ctx: Context) -> Launch:
    """Everything ``affinity run`` will do, computed without touching the system.

    Raises :class:`PlanError` (or the planner's :class:`SpecError`) for what
    cannot be done, naming the option and the value.
    """
    warnings: list[str] = []
    notes: list[str] = []
    # 1. the CPUs to work with: the inherited mask (respect), or the cgroup's
    if opts.norespect:
        base = (ctx.cgroup_cpus if ctx.cgroup_cpus else topology.cpuset) & topology.cpuset
        notes.append(f"--norespect: starting from the cgroup cpuset {format_list(base)} instead of "
                     f"the inherited mask {format_list(topology.allowed)}")
    else:
        base = topology.allowed
    node_ids = frozenset(n.os_index for n in topology.numa_nodes)
    mems = ctx.mems_allowed & node_ids if ctx.mems_allowed is not None else node_ids
    if opts.physcpubind is not None:
        sel = opts.physcpubind.resolve(base, "--physcpubind")
        foreign = sel - topology.cpuset
        if foreign:
            raise PlanError(f"--physcpubind {opts.physcpubind.text}: CPU {format_list(foreign)} does not "
                            f"exist on this machine (CPUs {format_list(topology.cpuset)})")
        outside = sel - base
        if outside:
            raise PlanError(f"--physcpubind {opts.physcpubind.text}: CPU {format_list(outside)} is not "
                            f"allowed to this process (allowed: {format_list(base)})")
    elif opts.cpunodebind is not None:
        nodes = opts.cpunodebind.resolve(mems, "--cpunodebind")
        missing = nodes - node_ids
        if missing:
            raise PlanError(f"--cpunodebind {opts.cpunodebind.text}: no NUMA node {format_list(missing)} "
                            f"on this machine (nodes: {format_list(node_ids) or 'none known'})")
        sel = frozenset().union(*(n.cpuset for n in topology.numa_nodes if n.os_index in nodes)) & base
        if not sel:
            raise PlanError(f"--cpunodebind {opts.cpunodebind.text}: none of the CPUs of node "
                            f"{format_list(nodes)} is allowed (allowed: {format_list(base)})")
    else:
        sel = base
    work = topology.with_allowed(sel)

    # 2. ranks: this process's share of the node
    rank = None
    rank_share = None
    if opts.ranks is not None:
        rank = parse_rank(opts.ranks, ctx.environ)
        try:
            rank_share = partition(work, rank.size)[rank.rank]
        except PlanError as e:
            hint = ""
            if ctx.cgroup_cpus and sel < (ctx.cgroup_cpus & topology.cpuset):
                hint = (f"; this process may use only {format_list(sel)} of the cgroup's "
                        f"{format_list(ctx.cgroup_cpus)}: if the launcher bound the ranks itself "
                        f"(Open MPI does by default), start it with --bind-to none "
                        f"(srun: --cpu-bind=none) or pass --norespect")
            raise PlanError(f"--ranks: {rank.size} ranks on this node ({rank.source}): {e}{hint}") from e
        notes.append(f"rank {rank.rank} of {rank.size} on this node ({rank.source}): "
                     f"{rank_share.describe()}")
        work = topology.with_allowed(rank_share.cpus)

    # 3. instances
    if opts.instances < 1:
        raise PlanError(f"--instances must be >= 1, got {opts.instances}")
    if opts.instances > 1 or opts.cores_per_instance is not None:
        try:
            shares: list[Share | None] = list(partition(work, opts.instances, opts.cores_per_instance))
        except PlanError as e:
            what = f"--instances {opts.instances}" + (f" --cores-per-instance {opts.cores_per_instance}"
                                                       if opts.cores_per_instance else "")
            raise PlanError(f"{what}: {e}") from e
    else:
        shares = [rank_share]

    # 4. memory policy
    explicit_nodes: frozenset[int] = frozenset()
    if opts.mempolicy is not None and opts.mempolicy != "local":
        assert opts.mem_nodes is not None
        explicit_nodes = opts.mem_nodes.resolve(mems, f"--{_MEM_OPTION[opts.mempolicy]}")
        missing = explicit_nodes - node_ids
        if missing:
            raise PlanError(f"--{_MEM_OPTION[opts.mempolicy]} {opts.mem_nodes.text}: no NUMA node "
                            f"{format_list(missing)} on this machine (nodes: "
                            f"{format_list(node_ids) or 'none known'})")
        forbidden = explicit_nodes - mems
        if forbidden:
            raise PlanError(f"--{_MEM_OPTION[opts.mempolicy]} {opts.mem_nodes.text}: node "
                            f"{format_list(forbidden)} is not allowed to this process "
                            f"(Mems_allowed: {format_list(mems)})")
        if not explicit_nodes:
            raise PlanError(f"--{_MEM_OPTION[opts.mempolicy]} {opts.mem_nodes.text}: selects no node")

    # 5. threads: one per core, within the CFS quota's share
    sharing = opts.instances * (rank.size if rank else 1)
    env_threads = _env_threads(ctx.environ, warnings)
    blocktime = opts.blocktime
    if blocktime is None and "KMP_BLOCKTIME" in ctx.environ:
        blocktime = ctx.environ["KMP_BLOCKTIME"]

    log_dir = opts.log_dir
    instances = []
    for i, share in enumerate(shares):
        cpus = share.cpus if share is not None else work.allowed
        topo_i = topology.with_allowed(cpus)
        cores = _cores_in(topology, cpus)
        if opts.threads is not None:
            threads = opts.threads
        elif env_threads is not None:
            threads = env_threads
        else:
            threads = default_thread_count(cores, ctx.quota, share=sharing)
            if threads < cores:
                notes.append(f"instance {i}: {threads} threads for {cores} cores: CFS quota "
                             f"{ctx.quota}" + (f" shared by {sharing} processes" if sharing > 1 else ""))
        p = _make_plan(opts.spec, threads, topo_i, ctx.environ)
        warnings.extend(f"planner: {w}" for w in getattr(p, "warnings", ()))
        slots = tuple(worker_slots(p))
        env = _plan_environment(p, blocktime)
        if len(shares) > 1:
            env["AFFINITY_INSTANCE"] = str(i)
            env["AFFINITY_NUM_INSTANCES"] = str(len(shares))
        if opts.pin_threads:
            env.update(_pin_env(slots, opts, ctx.environ))
        if opts.mempolicy is not None:
            policy, nodes, required = opts.mempolicy, explicit_nodes, True
        elif share is not None and share.numa_nodes:
            policy, nodes, required = "bind", share.numa_nodes & mems or share.numa_nodes, False
        else:
            policy, nodes, required = None, frozenset(), False
            if share is not None and not node_ids:
                warnings.append(f"instance {i}: the topology knows no NUMA node: memory is not bound")
        log = os.path.join(log_dir, f"instance-{i}.log") if log_dir else None
        instances.append(Instance(i, tuple(opts.command), cpus, policy, frozenset(nodes), required,
                                  threads, slots, env, log, share))
    return Launch(tuple(instances), tuple(warnings), tuple(notes), rank, opts.membind_optional,
                  opts.verbose)


_MEM_OPTION = {"bind": "membind", "interleave": "interleave", "preferred": "preferred", "local": "localalloc"}


def _pin_env(slots: Sequence[frozenset[int]], opts: RunOptions, environ: Mapping[str, str]) -> dict[str, str]:
    lib = str(pin_library())
    old = environ.get("LD_PRELOAD", "").strip()
    env = {
        "LD_PRELOAD": lib + (":" + old if old else ""),
        "AFFINITY_PIN_SLOTS": ";".join(format_list(s) for s in slots),
        "AFFINITY_PIN_SKIP": f"{opts.pin_skip:#x}",
        "AFFINITY_PIN_MAIN": "1" if opts.pin_main else "0",
    }
    if opts.verbose:
        env["AFFINITY_PIN_VERBOSE"] = "1"
    return env


# ------------------------------------------------------------------ rendering

def shell_text(launch: Launch, environ: Mapping[str, str] | None = None) -> str:
    """The launch as shell lines built from numactl/taskset and env."""
    lines = []
    for inst in launch.instances:
        if inst.mempolicy is not None:
            mem = ("--localalloc" if inst.mempolicy == "local"
                   else f"--{_MEM_OPTION[inst.mempolicy]}={format_list(inst.mem_nodes)}")
            head = ["numactl", f"--physcpubind={format_list(inst.cpus)}", mem, "--"]
        else:
            head = ["taskset", "-c", format_list(inst.cpus)]
        words = head + ["env"] + [f"{k}={v}" for k, v in sorted(inst.env.items())] + list(inst.argv)
        line = " ".join(shlex.quote(w) for w in words)
        if inst.log:
            line += f" > {shlex.quote(inst.log)} 2>&1"
        if launch.spawn:
            line += " &"
        lines.append(line)
    if launch.spawn:
        lines.append("wait")
    return "\n".join(lines)


def _node_meminfo(node: int, root: str = "/") -> tuple[int, int] | None:
    """(MemTotal, MemFree) in kB of a node from sysfs, as numactl reads them."""
    total = free = None
    try:
        with open(os.path.join(root, f"sys/devices/system/node/node{node}/meminfo")) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 4 and parts[2] == "MemTotal:":
                    total = int(parts[3])
                elif len(parts) >= 4 and parts[2] == "MemFree:":
                    free = int(parts[3])
    except (OSError, ValueError):
        return None
    return (total, free) if total is not None and free is not None else None


def _node_distances(node: int, root: str = "/") -> list[int] | None:
    try:
        with open(os.path.join(root, f"sys/devices/system/node/node{node}/distance")) as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return None


def hardware_text(topology: Topology, root: str | None = "/") -> str:
    """``numactl --hardware`` for a topology: nodes, their CPUs, sizes, free memory
    and distances (the last two from sysfs, for this machine only: ``root=None``)."""
    nodes = sorted(topology.numa_nodes, key=lambda n: n.os_index)
    ids = [n.os_index for n in nodes]
    lines = [f"available: {len(nodes)} nodes ({format_list(ids)})"]
    for n in nodes:
        lines.append(f"node {n.os_index} cpus:" + "".join(f" {c}" for c in sorted(n.cpuset)))
        info = _node_meminfo(n.os_index, root) if root is not None else None
        if info is not None:
            lines.append(f"node {n.os_index} size: {info[0] // 1024} MB")
            lines.append(f"node {n.os_index} free: {info[1] // 1024} MB")
        elif n.memory:
            lines.append(f"node {n.os_index} size: {n.memory // (1024 * 1024)} MB")
    dist = {i: _node_distances(i, root) for i in ids} if root is not None else {}
    if dist and all(d is not None and len(d) == len(ids) for d in dist.values()):
        lines.append("node distances:")
        lines.append("node " + "".join(f"{i:3d} " for i in ids))
        for i in ids:
            lines.append(f"{i:3d}: " + "".join(f"{d:3d} " for d in dist[i]))  # type: ignore[union-attr]
    return "\n".join(lines)


def show_text(topology: Topology, mask: frozenset[int], policy: str, pol_nodes: frozenset[int],
              mems_allowed: frozenset[int]) -> str:
    """``numactl --show`` for a mask and memory policy (what this process has now)."""
    cpu_nodes = sorted(n.os_index for n in topology.numa_nodes if n.cpuset & mask)
    lines = [f"policy: {policy}"]
    if policy == "interleave":
        first = min(pol_nodes) if pol_nodes else 0
        lines += [f"preferred node: {first} (interleave next)",
                  "interleavemask: " + "".join(f"{n} " for n in sorted(pol_nodes)),
                  f"interleavenode: {first}"]
    elif policy in ("bind", "preferred"):
        lines.append(f"preferred node: {min(pol_nodes)}")
    else:
        lines.append("preferred node: current")
    membind = pol_nodes if policy == "bind" else mems_allowed
    lines += ["physcpubind: " + "".join(f"{c} " for c in sorted(mask)),
              "cpubind: " + "".join(f"{n} " for n in cpu_nodes),
              "nodebind: " + "".join(f"{n} " for n in cpu_nodes),
              "membind: " + "".join(f"{n} " for n in sorted(membind)),
              "preferred: " + ("".join(f"{n} " for n in sorted(pol_nodes))
                               if policy in ("bind", "preferred", "interleave") else "")]
    return "\n".join(lines)


# ------------------------------------------------------------------ execution

def _mempolicy_arg(policy: str, nodes: frozenset[int]) -> str:
    return policy if policy == "local" else f"{policy}:{format_list(nodes)}"


def apply_instance(inst: Instance, *, membind_optional: bool = False) -> list[str]:
    """Set the calling thread's memory policy and CPU mask to ``inst``'s, each read
    back; a child started (or exec'd) from this thread then has them.  Returns
    warnings (a memory policy the container refused, when that is allowed)."""
    from ..machine import _native
    from ..binding import threads

    warnings = []
    if inst.mempolicy is not None:
        try:
            _native.set_mempolicy(inst.mempolicy, inst.mem_nodes)
        except (BindError, UnsupportedError) as e:
            if e.errno not in (errno.EPERM, errno.ENOSYS):
                raise
            why = ("this container forbids NUMA memory policies (Docker's default seccomp profile "
                   "allows set_mempolicy only with CAP_SYS_NICE)" if e.errno == errno.EPERM
                   else "this kernel has no NUMA memory policies")
            if membind_optional or not inst.mem_required:
                warnings.append(f"memory policy {_mempolicy_arg(inst.mempolicy, inst.mem_nodes)} not "
                                f"applied: {e} ({why}); running without it")
            else:
                raise BindError(e.errno, "set_mempolicy", getattr(e, "argument", None) or
                                _mempolicy_arg(inst.mempolicy, inst.mem_nodes),
                                f"{why}; start the container with --cap-add SYS_NICE, or pass "
                                f"--membind-optional to run without memory binding; nothing was "
                                f"started") from e
        else:
            pol, nodes = _native.get_mempolicy()
            want_nodes = inst.mem_nodes if inst.mempolicy != "local" else frozenset()
            if pol != inst.mempolicy or (want_nodes and nodes != want_nodes):
                raise UnsupportedError(
                    f"set_mempolicy({_mempolicy_arg(inst.mempolicy, inst.mem_nodes)}) read back as "
                    f"{pol}:{format_list(nodes)}", call="set_mempolicy", err=errno.EXDEV)
    threads.set_affinity(inst.cpus, strict=True)
    return warnings


def _save_state() -> tuple[frozenset[int], tuple[str, frozenset[int]]]:
    from ..machine import _native
    from ..binding import threads

    return threads.get_affinity(), _native.get_mempolicy()


def _restore_state(state: tuple[frozenset[int], tuple[str, frozenset[int]]]) -> None:
    from ..machine import _native
    from ..binding import threads

    mask, (pol, nodes) = state
    threads.set_affinity(mask)
    try:
        _native.set_mempolicy(pol if pol in ("default", "local", "bind", "interleave", "preferred")
                              else "default", nodes)
    except (BindError, UnsupportedError):
        pass  # it could not be changed in the first place


def _resolve_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    if not argv:
        raise PlanError("no command to run (put it after '--')")
    cmd = argv[0]
    if "/" in cmd:
        if not os.path.exists(cmd):
            raise _CommandError(127, f"{cmd}: no such file")
        if os.path.isdir(cmd) or not os.access(cmd, os.X_OK):
            raise _CommandError(126, f"{cmd}: not an executable file")
        return cmd
    found = shutil.which(cmd, path=env.get("PATH", os.defpath))
    if found is None:
        raise _CommandError(127, f"{cmd}: command not found (PATH={env.get('PATH', os.defpath)})")
    return found


class _CommandError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _say(text: str) -> None:
    # one write per line: ranks under one mpirun share its stderr
    sys.stderr.write(f"affinity run: {text}\n")
    sys.stderr.flush()


def execute(launch: Launch, environ: Mapping[str, str] | None = None) -> int:
    """Start ``launch``: exec its single instance (no return on success), or start
    every instance and wait; returns the exit status (the worst instance's: a
    signal ``N`` counts as ``128+N``).  Nothing is started unless every instance's
    command exists and its mask and memory policy could be applied."""
    base_env = dict(os.environ if environ is None else environ)
    if not launch.instances:
        raise PlanError("nothing to run")
    envs = [{**base_env, **inst.env} for inst in launch.instances]
    exes = [_resolve_command(inst.argv, env) for inst, env in zip(launch.instances, envs)]
    for d in {os.path.dirname(i.log) for i in launch.instances if i.log}:
        os.makedirs(d or ".", exist_ok=True)
    if not launch.spawn:
        inst, env, exe = launch.instances[0], envs[0], exes[0]
        for w in apply_instance(inst, membind_optional=launch.membind_optional):
            _say(f"warning: {w}")
        if launch.verbose:
            _say(f"pid {os.getpid()}: {inst.describe()}; exec {shlex.join(inst.argv)}")
        if inst.log:
            fd = os.open(inst.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            os.execve(exe, list(inst.argv), env)
        except OSError as e:
            raise _CommandError(126 if e.errno != errno.ENOENT else 127,
                                f"execve({exe}) failed: {e.strerror}") from e
    return _spawn(launch, envs, exes)


_PR_SET_PDEATHSIG = 1


def _die_with_launcher(launcher: int) -> Callable[[], None]:
    """``preexec_fn`` of an instance: the kernel sends it SIGTERM when the launcher
    dies, even by SIGKILL (which cannot be forwarded), so no instance is orphaned.
    Set between fork and exec; a launcher already gone by then is caught by the
    parent-PID check."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def pre() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != launcher:
            os.kill(os.getpid(), signal.SIGTERM)

    return pre


def _spawn(launch: Launch, envs: list[dict[str, str]], exes: list[str]) -> int:
    saved = _save_state()
    said: set[str] = set()
    # every instance is tried first, so a refusal stops the launch before any start
    try:
        for inst in launch.instances:
            for w in apply_instance(inst, membind_optional=launch.membind_optional):
                if w not in said:
                    said.add(w)
                    _say(f"warning: instance {inst.index}: {w}")
            _restore_state(saved)
    finally:
        _restore_state(saved)
    procs: list[subprocess.Popen] = []
    handlers: dict[int, Any] = {}

    def forward(signum: int, _frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    try:
        for inst, env, exe in zip(launch.instances, envs, exes):
            apply_instance(inst, membind_optional=launch.membind_optional)  # warned above
            out = open(inst.log, "wb") if inst.log else None  # noqa: SIM115
            try:
                p = subprocess.Popen(list(inst.argv), executable=exe, env=env, stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT if out else None,
                                     start_new_session=True, preexec_fn=_die_with_launcher(os.getpid()))
            finally:
                if out is not None:
                    out.close()
                _restore_state(saved)
            procs.append(p)
            if launch.verbose:
                _say(f"pid {p.pid}: {inst.describe()}" + (f", log {inst.log}" if inst.log else ""))
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            handlers[s] = signal.signal(s, forward)
    except BaseException:
        for p in procs:  # never leave a partial launch behind
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
        raise
    try:
        codes = [p.wait() for p in procs]
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    statuses = [128 - c if c < 0 else c for c in codes]
    if launch.verbose:
        for inst, p, st in zip(launch.instances, procs, statuses):
            _say(f"instance {inst.index} (pid {p.pid}) exited with status {st}")
    return max(statuses)


# ------------------------------------------------------------- command line

def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``run`` to the ``affinity`` command line (``cmd_run`` is its function)."""
    p = subparsers.add_parser(
        "run", help="run a command with its threads and memory placed (numactl, taskset, likwid-pin, "
                    "multi-instance, MPI ranks)",
        usage="affinity run [SPEC] [options] -- CMD [ARGS...]",
        description="Plan SPEC (a KMP_AFFINITY string; default: KMP_AFFINITY/OMP_PLACES from the "
                    f"environment, else '{DEFAULT_SPEC}', one thread per core) on the selected CPUs, "
                    "set the process mask and memory policy, export the plan's environment "
                    "(KMP_AFFINITY, OMP_PLACES, OMP_PROC_BIND, GOMP_CPU_AFFINITY, OMP_NUM_THREADS, "
                    "KMP_BLOCKTIME, KMP_WARNINGS, TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS) and exec CMD "
                    "(no shell). Exit status: CMD's; 1 for affinity errors; 2 for usage errors; "
                    "126/127 when CMD cannot be executed / is not found.")
    g = p.add_argument_group("threads")
    g.add_argument("-t", "--threads", type=_positive, metavar="N",
                   help="thread count (default: OMP_NUM_THREADS, else one per core of the selected "
                        "CPUs, capped by the cgroup's CFS quota)")
    g.add_argument("--blocktime", metavar="MS", help="KMP_BLOCKTIME to export (default: the user's "
                                                     "KMP_BLOCKTIME, else the plan environment's)")
    g = p.add_argument_group("CPUs (numactl's options; '+' counts within the allowed set)")
    cpu = g.add_mutually_exclusive_group()
    cpu.add_argument("-C", "--physcpubind", type=_cpus, metavar="CPUS",
                     help="run on these OS CPU ids: 0-3,8 | all | +0-1 (relative) | !2 (all but)")
    cpu.add_argument("-N", "--cpunodebind", type=_nodes, metavar="NODES",
                     help="run on the allowed CPUs of these NUMA nodes")
    g.add_argument("--norespect", action="store_true",
                   help="start from the cgroup's cpuset instead of the inherited mask (KMP's "
                        "'norespect'; overrides an MPI launcher's own binding)")
    g = p.add_argument_group("memory (numactl's options; one of)")
    mem = g.add_mutually_exclusive_group()
    mem.add_argument("-m", "--membind", type=_nodes, metavar="NODES", help="allocate only on NODES")
    mem.add_argument("-i", "--interleave", type=_nodes, metavar="NODES", help="interleave pages over NODES")
    mem.add_argument("-p", "--preferred", type=_nodes, metavar="NODES",
                     help="prefer NODES, fall back elsewhere")
    mem.add_argument("-l", "--localalloc", action="store_true", help="allocate on the local node")
    g.add_argument("--membind-optional", action="store_true",
                   help="if the memory policy is refused (EPERM in unprivileged containers), warn and "
                        "run without it instead of failing")
    g = p.add_argument_group("threads created later (likwid-pin's model)")
    g.add_argument("--pin-threads", action="store_true",
                   help="preload a library that pins the main thread to the plan's first slot and "
                        "each new pthread, in creation order, to the next one")
    g.add_argument("--pin-skip", type=_hexmask, default=0, metavar="HEX",
                   help="threads to leave unpinned: bit i = the i-th pthread_create (e.g. 0x1 for "
                        "Intel OpenMP's monitor thread)")
    g.add_argument("--no-pin-main", dest="pin_main", action="store_false",
                   help="leave the main thread alone; created threads start at the first slot")
    g = p.add_argument_group("several processes")
    g.add_argument("--instances", type=_positive, default=1, metavar="K",
                   help="start K copies on disjoint sets of whole cores, spread over NUMA nodes, "
                        "memory bound to each one's node(s); exit status: the worst copy's")
    g.add_argument("--cores-per-instance", type=_positive, metavar="C", help="exactly C cores each")
    g.add_argument("--log-dir", metavar="DIR", help="write each instance's output to DIR/instance-I.log")
    g.add_argument("--ranks", metavar="auto|R/N",
                   help="take local rank R's disjoint share of the node, R and N from Open MPI, "
                        "MPICH/Intel MPI, MVAPICH2, torchrun or Slurm variables ('auto')")
    g = p.add_argument_group("inspection")
    g.add_argument("-s", "--show", action="store_true",
                   help="show the CPU and memory policy the options give (numactl --show) and exit")
    g.add_argument("-H", "--hardware", action="store_true",
                   help="show the NUMA nodes (numactl --hardware) and exit")
    g.add_argument("--dry-run", action="store_true", help="print what would be done and exit")
    g.add_argument("--json", action="store_true", help="with --dry-run: JSON instead of shell lines")
    g.add_argument("--topology", metavar="SRC",
                   help="plan for another machine (hwloc XML, cpuinfo file, 'synthetic:...'); only "
                        "with --dry-run or --hardware")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="say what is applied, and have --pin-threads report every pin")
    p.add_argument("words", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_run, _run_parser=p)
    return p


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _hexmask(text: str) -> int:
    try:
        v = int(text, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a hex mask such as 0x1, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative hex mask, got {text!r}")
    return v


def _cpus(text: str) -> IdList:
    try:
        return IdList.parse(text, "CPU")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _nodes(text: str) -> IdList:
    try:
        return IdList.parse(text, "node")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def options_from_args(args: argparse.Namespace) -> RunOptions:
    """Finish parsing (the SPEC, the command after ``--``) and return the options;
    usage errors exit with status 2 through the parser."""
    parser: argparse.ArgumentParser = args._run_parser
    words = list(args.words or [])
    spec = None
    if words and words[0] != "--":
        spec = words[0]
        # options may follow the SPEC: parse them into the same namespace
        args.words = []
        _, extra = parser.parse_known_args(words[1:], namespace=args)
        words = list(args.words or [])
        if extra or (words and words[0] != "--"):
            rest = " ".join(extra + words)
            parser.error(f"unexpected {rest!r}: the command goes after '--' "
                         f"(affinity run [SPEC] [options] -- CMD [ARGS...])")
    command = tuple(words[1:]) if words and words[0] == "--" else ()
    if not command and not (args.show or args.hardware):
        parser.error("no command: give it after '--' (affinity run [SPEC] [options] -- CMD [ARGS...])")
    if command and (args.show or args.hardware):
        parser.error("--show and --hardware take no command")
    if args.topology and not (args.dry_run or args.hardware):
        parser.error("--topology plans for another machine: use it with --dry-run or --hardware")
    if args.json and not args.dry_run:
        parser.error("--json goes with --dry-run")
    if args.show and (args.instances > 1 or args.cores_per_instance):
        parser.error("--show describes one process: it does not go with --instances")
    mempolicy, mem_nodes = None, None
    for name in ("membind", "interleave", "preferred"):
        if getattr(args, name) is not None:
            mempolicy, mem_nodes = {"membind": "bind"}.get(name, name), getattr(args, name)
    if args.localalloc:
        mempolicy = "local"
    return RunOptions(command=command, spec=spec, threads=args.threads, physcpubind=args.physcpubind,
                      cpunodebind=args.cpunodebind, norespect=args.norespect, mempolicy=mempolicy,
                      mem_nodes=mem_nodes, membind_optional=args.membind_optional,
                      pin_threads=args.pin_threads, pin_skip=args.pin_skip, pin_main=args.pin_main,
                      instances=args.instances, cores_per_instance=args.cores_per_instance,
                      log_dir=args.log_dir, ranks=args.ranks, verbose=args.verbose,
                      blocktime=args.blocktime)


def cmd_run(args: argparse.Namespace) -> int:
    """``affinity run``: see :func:`add_run_parser`."""
    opts = options_from_args(args)
    topology = Topology.load(args.topology) if args.topology else Topology.from_system()
    if args.hardware:
        print(hardware_text(topology, "/" if topology.is_this_system else None))
        return 0
    ctx = Context.of_this_process() if topology.is_this_system else Context(dict(os.environ))
    launch = build_launch(opts, topology, ctx)
    for w in launch.warnings:
        _say(f"warning: {w}")
    if launch.verbose:
        for n in launch.notes:
            _say(n)
    if args.dry_run:
        print(json.dumps(launch.to_dict(), indent=2) if args.json else shell_text(launch))
        return 0
    if not topology.is_this_system:
        raise TopologyError("cannot run on a topology that is not this machine", topology.source)
    if args.show:
        from ..machine import _native
        from ..binding import threads

        inst = launch.instances[0]
        for w in apply_instance(inst, membind_optional=launch.membind_optional):
            _say(f"warning: {w}")
        pol, nodes = _native.get_mempolicy()
        mems = ctx.mems_allowed if ctx.mems_allowed is not None else frozenset(
            n.os_index for n in topology.numa_nodes)
        print(show_text(topology, threads.get_affinity(), pol, nodes, mems))
        return 0
    try:
        return execute(launch)
    except _CommandError as e:
        _say(f"error: {e}")
        return e.status
