"""The variables launchers set in the processes they start: which local rank of how
many a process is, and whether the launcher bound it to CPUs itself.

Only the tables and a presence test live here, so that ``affinity run`` without
``--ranks`` can tell whether a launcher started it without importing
:mod:`affinity.planning.ranks`, which reads them (:func:`~affinity.planning.ranks.local_rank`,
:func:`~affinity.planning.ranks.launcher_binding`).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BINDING_VARIABLES", "INSTANCES", "LAUNCHER_VARIABLES", "started_by_a_launcher"]

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
    first test of :func:`~affinity.planning.ranks.local_rank`, without reading them)."""
    return any(rank_var in environ and size_var in environ for _, rank_var, size_var in LAUNCHER_VARIABLES)
