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
