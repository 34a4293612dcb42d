"""Every numactl option of ``affinity run`` against the same option of the real
numactl on this machine: the started process's CPU mask, allowed memory nodes
and memory policy (read by a probe from inside), ``--show`` and ``--hardware``
output -- in a plain process and under a restricted parent mask (taskset).

Where the two differ on purpose the test says so and checks both sides."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from helpers.launch import affinity_run, clean_env, probe_result, write_probe

NUMACTL = shutil.which("numactl")
pytestmark = pytest.mark.skipif(NUMACTL is None,
                                reason="numactl is not installed (make sysdeps installs it as root)")
CPUS = sorted(os.sched_getaffinity(0))
TWO = pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
A, B = (CPUS[0], CPUS[1]) if len(CPUS) > 1 else (CPUS[0], CPUS[0])
NODE = 0


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> list[str]:
    return write_probe(tmp_path_factory.mktemp("probe"))


def numactl(*args: str, pre: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*pre, NUMACTL, *args], capture_output=True, text=True, timeout=60, env=clean_env())


OPTIONS = [
    ["--membind", str(NODE)], ["-m", str(NODE)], [f"--membind={NODE}"], ["-m", "all"], ["-m", "+0"],
    ["--interleave", str(NODE)], ["-i", "all"], ["--preferred", str(NODE)], ["-p", str(NODE)],
    ["--localalloc"], ["-l"],
    ["--cpunodebind", str(NODE)], ["-N", "all"], ["-N", "+0"],
    ["--physcpubind", str(B)], ["-C", f"{A},{B}"], ["-C", f"{A}-{B}"], ["-C", "+1"], ["-C", "all"],
    ["-C", f"!{A}"], ["-C", str(B), "-i", "all"], ["-N", str(NODE), "-m", str(NODE)],
]


@TWO
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: " ".join(o))
def test_same_mask_and_memory_policy_as_numactl(opts, probe):
    theirs = probe_result(numactl(*opts, "--", *probe))
    ours = probe_result(affinity_run(*opts, "--", *probe))
    assert (ours["cpus"], ours["mems"], ours["policy"]) == (theirs["cpus"], theirs["mems"], theirs["policy"])


RESTRICTED = [["-C", "+0"], ["-m", str(NODE)], ["-i", "all"], ["-l"], ["-C", "all"], ["-C", str(B)]]


@TWO
@pytest.mark.parametrize("opts", RESTRICTED, ids=lambda o: " ".join(o))
def test_same_as_numactl_under_a_restricted_parent_mask(opts, probe):
    pre = ("taskset", "-c", str(B))
    theirs = probe_result(numactl(*opts, "--", *probe, pre=pre))
    ours = probe_result(affinity_run(*opts, "--", *probe, pre=pre))
    assert ours["cpus"] == theirs["cpus"] == {B}
    assert (ours["mems"], ours["policy"]) == (theirs["mems"], theirs["policy"])


@TWO
def test_both_refuse_cpus_outside_the_parent_mask(probe):
    pre = ("taskset", "-c", str(B))
    for opts in (["-C", str(A)], ["-C", "+1"]):
        theirs = numactl(*opts, "--", *probe, pre=pre)
        ours = affinity_run(*opts, "--", *probe, pre=pre)
        assert theirs.returncode != 0 and ours.returncode == 1
        # neither started the command (numactl prints its usage on stdout)
        assert not [line for line in theirs.stdout.splitlines() + ours.stdout.splitlines()
                    if line.startswith("{")]
    assert "is not allowed to this process" in affinity_run("-C", str(A), "--", "true", pre=pre).stderr


@TWO
def test_cpunodebind_under_a_restricted_mask_differs_on_purpose(probe):
    # numactl widens the mask to the whole node; affinity run stays inside the
    # inherited mask (KMP_AFFINITY's "respect"), as every other option does
    pre = ("taskset", "-c", str(B))
    theirs = probe_result(numactl("-N", str(NODE), "--", *probe, pre=pre))
    ours = probe_result(affinity_run("-N", str(NODE), "--", *probe, pre=pre))
    assert theirs["cpus"] > {B} and ours["cpus"] == {B}
    # --norespect gives numactl's answer
    assert probe_result(affinity_run("--norespect", "-N", str(NODE), "--", *probe, pre=pre))["cpus"] == \
        theirs["cpus"]


def parse_show(text: str) -> dict[str, str]:
    # numactl forgets a newline after "preferred node: " for the local policy
    text = re.sub(r"(?<=\S)(?<!\n)\s*(?=physcpubind:)", "\n", text)
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


SHOW = [[], ["-m", str(NODE)], ["-i", str(NODE)], ["-i", "all"], ["-p", str(NODE)], ["-l"],
        ["-C", str(B)], ["-N", str(NODE)], ["-C", str(B), "-m", str(NODE)]]


# (numactl --cpunodebind under a restricted mask widens it: compared above, not here)
SHOW_CASES = [(o, ()) for o in SHOW] + [(o, ("taskset", "-c", str(B))) for o in SHOW if o[:1] != ["-N"]]


@pytest.mark.parametrize("opts,pre", SHOW_CASES,
                         ids=lambda v: (" ".join(v) or "-") if isinstance(v, list) else ("taskset" if v else "plain"))
def test_show_matches_numactl(opts, pre):
    theirs = numactl(*opts, "--show", pre=pre)
    ours = affinity_run(*opts, "--show", pre=pre)
    assert theirs.returncode == 0 and ours.returncode == 0, ours.stderr
    t, o = parse_show(theirs.stdout), parse_show(ours.stdout)
    if opts == ["-l"]:
        # numactl prints nothing after "preferred node: " for MPOL_LOCAL; we say "current"
        assert t.pop("preferred node") == "" and o.pop("preferred node") == "current"
    assert o == t


def test_hardware_matches_numactl():
    theirs = numactl("--hardware").stdout.splitlines()
    ours = affinity_run("--hardware").stdout.splitlines()
    assert len(ours) == len(theirs)
    for t, o in zip(theirs, ours):
        m = re.match(r"node (\d+) (size|free): (\d+) MB", t)
        if m:
            # memory moves between the two reads: the same line, numbers close
            m2 = re.match(r"node (\d+) (size|free): (\d+) MB", o)
            assert m2 and m2.group(1, 2) == m.group(1, 2)
            assert abs(int(m2.group(3)) - int(m.group(3))) <= max(64, int(m.group(3)) // 20)
        else:
            assert o == t
