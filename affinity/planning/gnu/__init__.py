"""GNU libgomp's placement rules (the ``"gnu"`` runtime of the planner).

:func:`plan_gomp` is the entry point; :mod:`.builds` names the libgomp builds
followed (GCC 12, and PyTorch's bundled GCC 8.5), :mod:`.sysfs` derives what
libgomp reads from ``/sys`` from a :class:`~affinity.machine.topology.Topology`,
:mod:`.places` parses ``OMP_PLACES``/``GOMP_CPU_AFFINITY`` and builds the
abstract place lists, :mod:`.runtime` places the team.  Pure: no system call.
"""

from .builds import BUILDS, DEFAULT_BUILD, Build, build_of
from .runtime import GOMP_VARIABLES, GompPlan, plan_gomp
from .sysfs import SysfsView, sysfs_view, view_from_files

__all__ = ["BUILDS", "DEFAULT_BUILD", "Build", "build_of", "GOMP_VARIABLES", "GompPlan", "plan_gomp",
           "SysfsView", "sysfs_view", "view_from_files"]
