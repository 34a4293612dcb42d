"""`import affinity` against `import os` (the floor) and `import threadpoolctl`
(a comparable pure-Python library), each in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _fresh_import(module: str) -> None:
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)


@pytest.mark.benchmark(group="import")
@pytest.mark.parametrize("module", ["os", "threadpoolctl", "affinity"])
def test_import(benchmark, module):
    benchmark.pedantic(_fresh_import, args=(module,), rounds=10, iterations=1)
