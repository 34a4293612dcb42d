"""The variables launchers set in the processes they start (which local rank of how
many a process is, whether the launcher bound it to CPUs itself), and what they say
as values: :class:`LocalRank`, :class:`LauncherBinding`, and :class:`Job`, all of it
for one process.

The tables are facts about the launchers; reading them from an environment is
:mod:`affinity.binding.launchvars` (the faces read the process they run in), and
what a rank is given is decided from the :class:`Job` value by
:func:`affinity.planning.decide.decide`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import PlanError
from ..record import record

__all__ = ["BINDING_VARIABLES", "INSTANCES", "Job", "LAUNCHER_DEFAULTS", "LAUNCHER_VARIABLES", "LauncherBinding",
           "LocalRank", "started_by_a_launcher"]

#: ``affinity run --instances K`` as a launcher: it exports the instance's number and the
#: count, and it always binds each instance to its share before the command starts
INSTANCES = "affinity run --instances"

#: (launcher, local-rank variable, local-size variable), in the order they are
#: tried: MPI launchers first (an mpirun inside a Slurm allocation inherits the
#: allocation's SLURM_* variables), then torchrun, then Slurm's srun.
LAUNCHER_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("Open MPI", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("MPICH/Intel MPI (Hydra)", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("MVAPICH2", "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE"),
    ("HPE Cray PALS", "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
    ("Cray PMI", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"),
    ("torchrun", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("Slurm srun", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"),
    (INSTANCES, "AFFINITY_INSTANCE", "AFFINITY_NUM_INSTANCES"),
)

#: (launcher, variable): the variable a launcher sets in a process it bound to CPUs
#: itself.  Open MPI 4 (ORTE) sets ``OMPI_MCA_orte_bound_at_launch=1`` whenever it
#: bound (its default, ``--bind-to core`` for two ranks or fewer); Hydra (MPICH,
#: Intel MPI) sets ``HYDRA_USER_PROVIDED_BINDING=1`` for ``-bind-to``; srun sets
#: ``SLURM_CPU_BIND_TYPE`` (``none``, or ``mask_cpu:`` with every local task's mask
#: in ``SLURM_CPU_BIND_LIST``, which is how ``--cpu-bind=cores`` and Slurm's
#: automatic binding arrive; ``map_cpu:``, ``map_ldom:``, ``mask_ldom:`` with their
#: own lists); ``affinity run --instances K`` always binds (its count, 2 or more, is
#: the evidence).  torchrun binds nothing itself.
BINDING_VARIABLES: tuple[tuple[str, str], ...] = (
    ("Open MPI", "OMPI_MCA_orte_bound_at_launch"),
    ("MPICH/Intel MPI (Hydra)", "HYDRA_USER_PROVIDED_BINDING"),
    ("Slurm srun", "SLURM_CPU_BIND_TYPE"),
    (INSTANCES, "AFFINITY_NUM_INSTANCES"),
)


def started_by_a_launcher(environ: Mapping[str, str]) -> bool:
    """A launcher's local-rank and local-size variables are both in ``environ`` (the
    first test of :func:`~affinity.binding.launchvars.local_rank`, without reading them)."""
    return any(rank_var in environ and size_var in environ for _, rank_var, size_var in LAUNCHER_VARIABLES)


#: (launcher, variable, value): what a launcher sets in every rank by itself when the
#: user set nothing -- torchrun's ``OMP_NUM_THREADS=1`` for more than one worker per
#: node, its guard against workers crowding each other's CPUs.  On disjoint shares
#: nothing is crowded: the team is sized from the share (a thread count given
#: explicitly still wins; a user's other value is the user's).
LAUNCHER_DEFAULTS: tuple[tuple[str, str, str], ...] = (
    ("torchrun", "OMP_NUM_THREADS", "1"),
)


@record
class LocalRank:
    """This process's place among the processes of its job on this node."""

    rank: int
    size: int
    source: str  #: which launcher's variables said so, e.g. ``"Open MPI (OMPI_COMM_WORLD_LOCAL_RANK=1, ...)"``
    launcher: str = ""  #: the launcher's name in :data:`LAUNCHER_VARIABLES`; "" when given by hand

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise PlanError(f"local rank {self.rank} of {self.size} is not a valid rank ({self.source})")


@record
class LauncherBinding:
    """A launcher bound this process to CPUs itself (:func:`affinity.binding.launchvars.launcher_binding`)."""

    launcher: str
    evidence: str  #: the variables that say so, e.g. ``"SLURM_CPU_BIND=quiet,mask_cpu:0x1,0x2"``
    masks: tuple[frozenset[int], ...] = ()  #: every local rank's CPUs, where the launcher lists them
    #: (srun's CPU masks and ids, or its locality domains' CPUs; the list is reused
    #: cyclically when shorter than the ranks); empty: unknown

    def mask_of(self, rank: int) -> frozenset[int] | None:
        return self.masks[rank % len(self.masks)] if self.masks else None


@record
class Job:
    """What the launcher variables of one process's environment say
    (:func:`affinity.binding.launchvars.read_job`): its local rank, how the launcher
    bound it, or why they make no rank.

    Parameters
    ----------
    rank : LocalRank or None
        The launcher's local rank of this process; None: no launcher set one.
    binding : LauncherBinding or None
        How that launcher bound the process to CPUs itself; None: it did not.
    error : str
        Launcher variables that are present but malformed (the message); empty: none.
    not_a_rank : tuple of str
        Why the launcher variables that are set make no rank (a batch script, a
        rank variable without its size variable).
    todo : str
        What to do instead, for those.
    """

    rank: LocalRank | None = None
    binding: LauncherBinding | None = None
    error: str = ""
    not_a_rank: tuple[str, ...] = ()
    todo: str = ""
