"""This process as the decision sees it: a :class:`~affinity.planning.decide.Situation`
read once (:func:`this_process`) by the faces that place this process or start others
(``apply()``, ``affinity run``, ``affinity plan --ranks auto``)."""

from __future__ import annotations

from collections.abc import Mapping

from ..machine.cgroup import cpu_quota, cpuset_cpus, mems_allowed
from ..machine.loaded import Census
from ..machine.topology import Topology
from ..planning.decide import Situation
from .launchvars import read_job

__all__ = ["this_process"]


def this_process(topology: Topology, environ: Mapping[str, str], *, loaded: Census | None = None) -> Situation:
    """What this process runs in: ``topology`` (its ``allowed`` set the process's
    mask), the environment ``environ`` the user set, the cgroup's cpuset and CFS
    quota, ``Mems_allowed_list``, what the launcher variables say, and the OpenMP
    runtimes ``loaded`` here (None: not known)."""
    return Situation(topology=topology, environ=dict(environ), cgroup_cpus=cpuset_cpus(), quota=cpu_quota(),
                     mems_allowed=mems_allowed(), job=read_job(environ, topology), loaded=loaded)
