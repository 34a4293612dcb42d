"""``affinity plan --ranks`` previews what ``affinity run --ranks R/N`` does, under the
same runtime's rules: it used to drop ``--runtime`` (and ``--compare``,
``--dataloader-workers``) without a word, so the preview disagreed with the run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

XEON = "synthetic:pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"
SPEC = "OMP_PLACES=cores OMP_PROC_BIND=spread"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_"))}
    return subprocess.run([sys.executable, "-m", "affinity", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("runtime", ["intel", "gnu-torch"])
def test_the_preview_is_the_run(runtime):
    r = _cli("plan", SPEC, "-t", "5", "--ranks", "2", "--runtime", runtime, "--topology", XEON)
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if re.match(r"\s+0\s", line))
    preview = ",".join(re.findall(r"\{[^}]*\}", row))
    run = _cli("run", SPEC, "-t", "5", "--ranks", "0/2", "--runtime", runtime, "--dry-run", "--topology", XEON,
               "--", "true")
    assert run.returncode == 0, run.stderr
    assert f"OMP_PLACES={preview}'" in run.stdout, (preview, run.stdout)
    # the two runtimes place this spread differently: the preview must show which
    assert ("{6,62}" in preview) == (runtime == "gnu-torch")


@pytest.mark.parametrize("extra", [["--compare", "intel"], ["--dataloader-workers", "2"]])
def test_options_that_do_not_apply_to_ranks_are_refused(extra):
    r = _cli("plan", "--ranks", "2", *extra, "--topology", XEON)
    assert r.returncode == 2 and f"--ranks does not go with {extra[0]}" in r.stderr


def test_the_ranks_table_widens_its_columns_to_the_longest_entry():
    """On a KNL a share's CPU list (0-16,68-84,136-152,204-220) is longer than the cpus
    column, and every column after it shifted right, row by row."""
    r = subprocess.run([sys.executable, "-m", "affinity", "plan", "--ranks", "4", "--topology",
                        "synthetic:pack:1 group:4 [numa] [numa] core:17 pu:4(indexes=4*68:1*4)"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    head, *rows = r.stdout.splitlines()[1:5]
    at = head.index("cores")
    assert rows[0].split()[1] == "0-16,68-84,136-152,204-220"
    assert all(row[at:at + 5].strip() == "17" for row in rows), r.stdout  # every row under its heading
    assert len({row.index(" bind ") for row in rows}) == 1
