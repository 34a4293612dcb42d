"""Scratch cgroups for the tests that need a real one (root, cgroup v1)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def v1_dir(controller: str) -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        sep = f.index("-")
        if f[sep + 1] == "cgroup" and controller in f[sep + 3].split(",") and f[3] == "/":
            return Path(f[4])
    return None


def run_in(d: Path, *cmd: str) -> subprocess.CompletedProcess:
    script = f'echo $$ > {d}/cgroup.procs && exec "$@"'
    return subprocess.run(["sh", "-c", script, "sh", *cmd], capture_output=True, text=True, timeout=60)
