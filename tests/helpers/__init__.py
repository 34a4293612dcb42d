"""Helpers shared by the tests (not tests themselves).

``ROOT`` is the checkout; :func:`golden_dir` finds the reference results of Intel's
OpenMP runtime: ``AFFINITY_GOLDEN_DIR``, else ``../shared/golden`` beside the checkout,
else the vendored copy ``tests/golden`` (what a clean clone has).
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def golden_dir() -> Path:
    env = os.environ.get("AFFINITY_GOLDEN_DIR")
    if env:
        return Path(env)
    shared = ROOT.parent / "shared" / "golden"
    if (shared / "README.md").exists():
        return shared
    return ROOT / "tests" / "golden"


def torch_package_dir() -> Path:
    """The installed ``torch`` package's folder, found without importing it: importing
    torch in the test process loads its libgomp there (which pins the loading thread when
    binding variables are set) and makes every later in-process ``apply()`` attach to
    PyTorch; tests that need torch run it in a subprocess (``tests/conftest.py`` checks)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("torch is not installed (make installs it: the 'torch' extra)")
    return Path(next(iter(spec.submodule_search_locations)))
