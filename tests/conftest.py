"""Shared fixtures.

Golden data: the reference results of Intel's OpenMP runtime.  The canonical
copy lives in ``../shared/golden`` beside the checkout; ``tests/golden`` is a
vendored copy so a clean clone (CI) has it too.  ``AFFINITY_GOLDEN_DIR``
overrides both.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def golden_dir() -> Path:
    env = os.environ.get("AFFINITY_GOLDEN_DIR")
    if env:
        return Path(env)
    shared = ROOT.parent / "shared" / "golden"
    if (shared / "README.md").exists():
        return shared
    return ROOT / "tests" / "golden"


@pytest.fixture(scope="session")
def golden() -> Path:
    return golden_dir()
