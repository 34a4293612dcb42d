"""Reading the launcher variables of an environment: which local rank of how many a
process is (:func:`local_rank`), how its launcher bound it (:func:`launcher_binding`),
Slurm's step and allocation as srun writes them (:func:`slurm_step`), and all of it
for one process as a :class:`~affinity.planning.launchers.Job` (:func:`read_job`),
the value :func:`affinity.planning.decide.decide` takes.

The faces (``apply(rank=...)``, ``affinity run --ranks``, ``affinity plan --ranks``,
``affinity show --ranks``) read the environment they run in here; the tables of what
each launcher sets are :mod:`affinity.planning.launchers`.  Functions of a mapping:
nothing here reads ``os.environ`` itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import PlanError
from ..machine.topology import Topology
from ..planning.launchers import (BINDING_VARIABLES, LAUNCHER_VARIABLES, Job, LauncherBinding, LocalRank)
from ..record import record

__all__ = ["JOB_VARIABLES", "SlurmStep", "batch_script", "job_of", "launcher_binding", "local_rank", "not_a_rank",
           "parse_rank", "read_job", "slurm_allocation", "slurm_domain_cpus", "slurm_step"]


def read_job(environ: Mapping[str, str], topology: Topology | None = None) -> Job:
    """What the launcher variables of ``environ`` say about the process: its local
    rank, how the launcher bound it (srun's locality domains' CPUs from ``topology``),
    or why they make no rank.  Malformed variables are not raised here: they are the
    :class:`~affinity.planning.launchers.Job`'s ``error``, raised by the decision
    only where a rank is needed (``--ranks auto``)."""
    why, todo = not_a_rank(environ)
    try:
        rank = local_rank(environ)
        binding = launcher_binding(environ, rank, topology) if rank is not None else None
    except PlanError as e:
        return Job(error=str(e), not_a_rank=tuple(why), todo=todo)
    return Job(rank=rank, binding=binding, not_a_rank=tuple(why), todo=todo)


def local_rank(environ: Mapping[str, str]) -> LocalRank | None:
    """The local rank and size from the launcher variables in ``environ``, ``None``
    when no launcher set them.  Variables that are present but malformed raise
    :class:`PlanError` naming them.  A launcher's rank variable without its size
    variable makes no rank (:func:`not_a_rank` says why, for the messages)."""
    for name, rank_var, size_var in LAUNCHER_VARIABLES:
        if not _is_rank(environ, rank_var, size_var):
            continue
        if size_var == "SLURM_STEP_TASKS_PER_NODE":
            step = slurm_step(environ)
            assert step is not None
            rank, size = step.local_id, step.tasks_on_node
        else:
            rank, size = _int(environ, rank_var), _int(environ, size_var)
        return LocalRank(rank, size, f"{name} ({rank_var}={environ[rank_var]}, "
                                     f"{size_var}={environ[size_var]})", name)
    return None


def _is_rank(environ: Mapping[str, str], rank_var: str, size_var: str) -> bool:
    """The one rule: a launcher's rank variable counts only with its size variable.
    Every launcher of :data:`LAUNCHER_VARIABLES` sets both in each rank it starts
    (torchrun always; srun in the tasks of a step); a Slurm batch script or
    allocation shell has ``SLURM_LOCALID`` but no step: one process, not a rank."""
    return rank_var in environ and size_var in environ


def batch_script(environ: Mapping[str, str]) -> str | None:
    """The sentence saying that ``environ`` is a Slurm batch script or allocation
    shell (inside a job, outside any step: one process, not a rank, by
    :func:`_is_rank`), with the tasks the allocation runs on this node; ``None``
    elsewhere.  ``affinity run --ranks auto`` refuses there and ``affinity plan
    --ranks auto`` previews the tasks ``srun`` will start: both say it with this."""
    if _is_rank(environ, "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"):
        return None
    alloc = slurm_allocation(environ)
    if alloc is None and "SLURM_LOCALID" not in environ:
        return None
    found = (f" (SLURM_LOCALID={environ['SLURM_LOCALID']} is set without SLURM_STEP_TASKS_PER_NODE)"
             if "SLURM_LOCALID" in environ else "")
    where = "outside any step of srun: one process, not a rank"
    if alloc is None:
        return f"this process is a Slurm batch script or allocation shell{found}, {where}"
    n = f"{alloc[0]} task{'' if alloc[0] == 1 else 's'}"
    return f"{alloc[1]}: {n} on this node; this process is its batch script or allocation shell{found}, {where}"


def not_a_rank(environ: Mapping[str, str]) -> tuple[list[str], str]:
    """Why the launcher variables set in ``environ`` make no rank (one sentence per
    launcher whose rank variable is set without its size variable, by the rule of
    :func:`local_rank`), and what to do instead; ``([], "")`` when none is set."""
    why: list[str] = []
    todo = ""
    for name, rank_var, size_var in LAUNCHER_VARIABLES:
        if rank_var not in environ or _is_rank(environ, rank_var, size_var) or size_var == "SLURM_STEP_TASKS_PER_NODE":
            continue
        why.append(f"{rank_var}={environ[rank_var]} is set without {size_var}: {name} sets both in every "
                   f"rank it starts, so this process is not one of them")
        todo = todo or f"set {size_var} as well, or give --ranks RANK/SIZE"
    batch = batch_script(environ)
    if batch is not None:
        why.append(batch)
        todo = ("run the command under srun in the script ('srun affinity run --ranks auto -- CMD'; "
                "'affinity plan --ranks auto' here previews those tasks), or give --ranks RANK/SIZE")
    return why, todo


def parse_rank(text: str, environ: Mapping[str, str]) -> LocalRank:
    """``"auto"`` (from the launcher variables) or an explicit ``"RANK/SIZE"``."""
    if text == "auto":
        r = local_rank(environ)
        if r is None:
            why, todo = not_a_rank(environ)
            if why:
                raise PlanError(f"--ranks auto: not a launcher's rank here: {'; '.join(why)}; {todo}")
            names = ", ".join(v for _, v, _ in LAUNCHER_VARIABLES)
            raise PlanError(f"--ranks auto: no launcher variables found (looked for {names}); "
                            f"start under mpirun/srun/torchrun or give --ranks RANK/SIZE")
        return r
    rank_s, sep, size_s = text.partition("/")
    if not sep or not rank_s.strip().isdigit() or not size_s.strip().isdigit():
        raise PlanError(f"--ranks: expected 'auto' or RANK/SIZE such as '1/4', got {text!r}")
    return LocalRank(int(rank_s), int(size_s), f"--ranks {text}")


def _int(environ: Mapping[str, str], var: str) -> int:
    v = environ[var].strip()
    if not v.isdigit():
        raise PlanError(f"{var}={environ[var]!r} is not a non-negative integer")
    return int(v)


#: the variables that name a rank's job, by launcher; the others (Hydra, MVAPICH2, PALS,
#: Cray PMI) start a job's local ranks from one proxy: their parent process names the job
JOB_VARIABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Open MPI", ("OMPI_MCA_ess_base_jobid",)),
    ("torchrun", ("TORCHELASTIC_RUN_ID",)),
    ("Slurm srun", ("SLURM_JOB_ID", "SLURM_STEP_ID")),
)


def job_of(environ: Mapping[str, str], parent: int) -> tuple[LocalRank, str] | None:
    """(local rank, job) of a process with environment ``environ`` and parent PID
    ``parent``: the job names the launcher and its job variables (:data:`JOB_VARIABLES`),
    else the parent.  ``None`` for a process that is no launcher's rank."""
    r = local_rank(environ)
    if r is None:
        return None
    names = dict(JOB_VARIABLES).get(r.launcher, ())
    if names and all(v in environ for v in names):
        return r, f"{r.launcher} " + ", ".join(f"{v}={environ[v]}" for v in names)
    return r, f"{r.launcher} ranks of parent process {parent}"


# ---------------------------------------------------------------- Slurm

@record
class SlurmStep:
    """A task of a Slurm job step, from the variables srun sets, read as Slurm
    writes them (:func:`slurm_step`)."""

    local_id: int  #: ``SLURM_LOCALID``: the task's rank on this node
    node_id: int  #: ``SLURM_NODEID`` (0 when absent)
    tasks_per_node: tuple[int, ...]  #: ``SLURM_STEP_TASKS_PER_NODE``, ``"2(x3),1"`` -> (2, 2, 2, 1)
    cpus_per_task: int | None  #: ``SLURM_CPUS_PER_TASK`` (set only with ``-c``/``--cpus-per-task``)
    cpu_bind_type: str  #: ``SLURM_CPU_BIND_TYPE``: ``"none"``, ``"mask_cpu:"``, ``"map_cpu:"``, ... ("" absent)
    cpu_bind_list: tuple[frozenset[int], ...]  #: ``SLURM_CPU_BIND_LIST``: each local task's CPUs (mask_cpu/map_cpu)
    #: ``SLURM_CPU_BIND_LIST`` of ``map_ldom:``/``mask_ldom:``: each local task's locality
    #: domain ids (:func:`slurm_domain_cpus` turns them into CPUs)
    cpu_bind_domains: tuple[frozenset[int], ...] = ()

    @property
    def tasks_on_node(self) -> int:
        return self.tasks_per_node[self.node_id]

    @property
    def bound(self) -> bool:
        """srun bound the task to CPUs itself (``--cpu-bind`` other than ``none``, or
        Slurm's automatic binding)."""
        return self.cpu_bind_type not in ("", "none") and not self.cpu_bind_type.startswith("none")


def slurm_step(environ: Mapping[str, str]) -> SlurmStep | None:
    """The Slurm step task ``environ`` describes; ``None`` without ``SLURM_LOCALID`` and
    ``SLURM_STEP_TASKS_PER_NODE`` (outside a step: a batch script is one process).
    Malformed variables raise :class:`PlanError` naming them."""
    if not _is_rank(environ, "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"):
        return None
    local_id = _int(environ, "SLURM_LOCALID")
    node = _int(environ, "SLURM_NODEID") if "SLURM_NODEID" in environ else 0
    per_node = _slurm_counts(environ["SLURM_STEP_TASKS_PER_NODE"], "SLURM_STEP_TASKS_PER_NODE")
    if not 0 <= node < len(per_node):
        raise PlanError(f"SLURM_NODEID={node} but SLURM_STEP_TASKS_PER_NODE="
                        f"{environ['SLURM_STEP_TASKS_PER_NODE']!r} lists {len(per_node)} nodes")
    cpt = _int(environ, "SLURM_CPUS_PER_TASK") if environ.get("SLURM_CPUS_PER_TASK", "").strip() else None
    bind_type = environ.get("SLURM_CPU_BIND_TYPE", "").strip()
    ids = _slurm_bind_list(bind_type, environ.get("SLURM_CPU_BIND_LIST", ""))
    domains = bind_type.startswith(("map_ldom", "mask_ldom"))
    return SlurmStep(local_id=local_id, node_id=node, tasks_per_node=per_node, cpus_per_task=cpt,
                     cpu_bind_type=bind_type, cpu_bind_list=() if domains else ids,
                     cpu_bind_domains=ids if domains else ())


def slurm_allocation(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """Inside a Slurm allocation but outside a step (a batch script, an ``salloc``
    shell): how many tasks the allocation runs on this node (``SLURM_TASKS_PER_NODE``
    at ``SLURM_NODEID``) and what said so; ``None`` elsewhere."""
    text = environ.get("SLURM_TASKS_PER_NODE")
    if "SLURM_JOB_ID" not in environ or not text:
        return None
    counts = _slurm_counts(text, "SLURM_TASKS_PER_NODE")
    node = _int(environ, "SLURM_NODEID") if "SLURM_NODEID" in environ else 0
    if not 0 <= node < len(counts):
        raise PlanError(f"SLURM_NODEID={node} but SLURM_TASKS_PER_NODE={text!r} lists {len(counts)} nodes")
    return counts[node], f"Slurm job {environ['SLURM_JOB_ID']} (SLURM_TASKS_PER_NODE={text}, SLURM_NODEID={node})"


def _slurm_counts(text: str, var: str) -> tuple[int, ...]:
    """``"2(x3),1"`` (a count per node, run-length encoded) -> ``(2, 2, 2, 1)``."""
    counts: list[int] = []
    for item in text.split(","):
        item = item.strip()
        n, _, rep = item.partition("(x")
        if not n.isdigit() or (rep and not (rep.endswith(")") and rep[:-1].isdigit())):
            raise PlanError(f"{var}={text!r}: cannot read {item!r}")
        counts.extend([int(n)] * (int(rep[:-1]) if rep else 1))
    return tuple(counts)


def _slurm_bind_list(bind_type: str, text: str) -> tuple[frozenset[int], ...]:
    """``SLURM_CPU_BIND_LIST``, one set per local task, as Slurm's task/affinity reads
    it: hex masks (``mask_cpu:`` CPUs, ``mask_ldom:`` locality domains; ``0x``
    optional) or single ids (``map_cpu:`` CPUs, ``map_ldom:`` domains; decimal unless
    written with ``0x``); empty for other types."""
    kind = bind_type.partition(":")[0]
    if kind not in ("mask_cpu", "map_cpu", "mask_ldom", "map_ldom"):
        return ()
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        try:
            if kind.startswith("mask"):
                bits = int(item, 16)
                out.append(frozenset(i for i in range(bits.bit_length()) if bits >> i & 1))
            else:
                out.append(frozenset({int(item, 16) if item[:2].lower() == "0x" else int(item)}))
        except ValueError:
            raise PlanError(f"SLURM_CPU_BIND_LIST={text!r} ({bind_type}): cannot read {item!r}") from None
    return tuple(out)


def slurm_domain_cpus(topology: Topology, domains: frozenset[int]) -> frozenset[int]:
    """The CPUs of Slurm's locality domains ``domains`` (``map_ldom``, ``mask_ldom``), as
    its task/affinity plugin binds them: domain ``d`` is the NUMA node whose OS index
    is ``d`` modulo (the largest node index + 1) -- every CPU of that node --, or, on
    a machine that knows no NUMA node, package ``d`` modulo the packages."""
    cpus: set[int] = set()
    nodes = topology.numa_nodes
    if nodes:
        top = max(n.os_index for n in nodes) + 1
        for d in domains:
            cpus.update(*(n.cpuset for n in nodes if n.os_index == d % top))
    elif topology.packages:
        for d in domains:
            cpus.update(topology.packages[d % len(topology.packages)].cpuset)
    return frozenset(cpus)




def launcher_binding(environ: Mapping[str, str], rank: LocalRank,
                     topology: Topology | None = None) -> LauncherBinding | None:
    """How ``rank``'s launcher (the one whose variables gave the rank) bound the
    process, from :data:`BINDING_VARIABLES`; ``None`` when it bound nothing, or the
    rank was not given by a launcher.  srun's ``map_ldom``/``mask_ldom`` lists name
    locality domains: their CPUs come from ``topology`` (:func:`slurm_domain_cpus`;
    without it the masks are unknown)."""
    var = dict(BINDING_VARIABLES).get(rank.launcher)
    if var is None or var not in environ:
        return None
    if var == "SLURM_CPU_BIND_TYPE":
        step = slurm_step(environ)
        if step is None or not step.bound:
            return None
        shown = environ.get("SLURM_CPU_BIND") or f"SLURM_CPU_BIND_TYPE={step.cpu_bind_type}"
        masks = step.cpu_bind_list
        if step.cpu_bind_domains and topology is not None:
            masks = tuple(slurm_domain_cpus(topology, d) for d in step.cpu_bind_domains)
        return LauncherBinding(rank.launcher, shown if "=" in shown else f"SLURM_CPU_BIND={shown}", masks)
    if environ[var].strip() in ("", "0"):
        return None
    return LauncherBinding(rank.launcher, f"{var}={environ[var]}")
