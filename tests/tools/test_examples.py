"""The examples run as documented and report no thread out of place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.tf
def test_keras_example_trains_pinned_and_prints_the_bind_map():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "keras_pinned.py")], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("plan: granularity=fine,compact,1,0 -> ")
    assert any(line.startswith("final accuracy: ") for line in lines)
    intra = [line for line in lines if "[tf-intra " in line]
    assert intra and all("bound to OS proc set {" in line for line in intra)
    assert "MISMATCH" not in r.stdout
