"""What ``affinity run`` adds for PyTorch in the processes it starts.

PyTorch reads ``OMP_NUM_THREADS`` for its intra-op team (the plan exports it,
per instance), but no variable for its inter-op pool; and its libgomp, reading the
exported ``OMP_PLACES``, binds the main thread to the first place while
``import torch`` runs, which every DataLoader worker forked later inherits.
:func:`torch_environment` exports the inter-op size
(``AFFINITY_TORCH_INTEROP_THREADS``) and puts :mod:`affinity.launcher.torchboot`
first on ``PYTHONPATH``: its ``sitecustomize`` sizes the pool and gives the
importing thread its mask back right after ``import torch`` (and does nothing in a
program that never imports torch).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


__all__ = ["BOOT_DIR", "torch_environment"]

#: the directory whose ``sitecustomize`` prepares PyTorch in launched Python processes
BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchboot")


def torch_environment(plan: Any, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that size PyTorch's inter-op pool from ``plan`` and undo
    libgomp's load-time pin in a Python process started with ``environ``."""
    path = environ.get("PYTHONPATH", "")
    parts = [p for p in path.split(os.pathsep) if p]
    return {"AFFINITY_TORCH_INTEROP_THREADS": str(int(plan.inter_op_threads)),
            "PYTHONPATH": os.pathsep.join([BOOT_DIR, *(p for p in parts if p != BOOT_DIR)])}
