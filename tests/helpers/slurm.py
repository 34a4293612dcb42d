"""The one-node Slurm of the engine tests: ``tools/slurm_node.py``, the script users
start by hand (``make slurm``), loaded from the checkout -- one implementation for
both (its docstring says what it configures and how)."""

from __future__ import annotations

import importlib.util
import sys

from . import ROOT

_spec = importlib.util.spec_from_file_location("slurm_node", ROOT / "tools" / "slurm_node.py")
_mod = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("slurm_node", _mod)  # (its dataclasses look their module up by name)
_spec.loader.exec_module(_mod)

EMULATED = _mod.EMULATED
GPUS = _mod.GPUS
Slurm = _mod.Slurm
cgroup_v1_cpuset = _mod.cgroup_v1_cpuset
missing_tools = _mod.missing_tools
node_line = _mod.node_line
start = _mod.start

__all__ = ["EMULATED", "GPUS", "Slurm", "cgroup_v1_cpuset", "missing_tools", "node_line", "start"]
