"""Container limits: parsers on canned /proc and cgroup trees (v1, v2, hybrid,
with and without a cgroup namespace), and the real thing in cgroups this test
creates when it may (root with a writable cgroup v1 or v2 hierarchy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from affinity.machine import cgroup
from affinity.machine.cgroup import CpuQuota, default_thread_count
from helpers.cgroups import run_in

V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 {root} /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 {root} /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V2_MOUNTS = "30 23 0:27 {root} /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"


def tree(tmp_path: Path, cgroup_file: str, mountinfo: str, files: dict[str, str]) -> str:
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup_file)
    (root / "proc/self/mountinfo").write_text(mountinfo)
    for path, text in files.items():
        f = root / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return str(root)


def test_parsers():
    groups = cgroup.parse_cgroup_file("12:cpu,cpuacct:/a/b\n3:cpuset:/c\n1:name=systemd:/s\n0::/u\n")
    assert groups == {"cpu": "/a/b", "cpuacct": "/a/b", "cpuset": "/c", "systemd": "/s", "": "/u"}
    mounts = cgroup.parse_mountinfo(V1_MOUNTS.format(root="/"))
    assert [(m.mount_point, m.version) for m in mounts] == [
        ("/sys/fs/cgroup/cpu,cpuacct", 1), ("/sys/fs/cgroup/cpuset", 1), ("/sys/fs/cgroup/systemd", 1),
        ("/sys/fs/cgroup/unified", 2)]
    assert mounts[0].controllers == {"cpu", "cpuacct"}
    assert cgroup.parse_mountinfo(r"1 2 0:3 / /a\040b rw - cgroup2 x rw")[0].mount_point == "/a b"


def test_v2_quota_of_the_most_restrictive_ancestor(tmp_path):
    root = tree(tmp_path, "0::/kube/pod1/ctr\n", V2_MOUNTS.format(root="/"), {
        "/sys/fs/cgroup/cgroup.controllers": "cpuset cpu memory\n",
        "/sys/fs/cgroup/kube/cpu.max": "max 100000\n",
        "/sys/fs/cgroup/kube/pod1/cpu.max": "150000 100000\n",  # 1.5 CPUs: the limit
        "/sys/fs/cgroup/kube/pod1/ctr/cpu.max": "400000 100000\n",  # 4 CPUs, but the parent says 1.5
        "/sys/fs/cgroup/kube/pod1/ctr/cpuset.cpus.effective": "2-5\n",
    })
    q = cgroup.cpu_quota(root)
    assert q == CpuQuota(150000, 100000, os.path.join(root, "sys/fs/cgroup/kube/pod1"), 2)
    assert q.cpus == 1.5 and str(q).startswith("1.5 CPUs (150000/100000 us, ")
    assert cgroup.cpuset_cpus(root) == {2, 3, 4, 5}


def test_v2_unlimited_and_inherited_cpuset(tmp_path):
    root = tree(tmp_path, "0::/a/b\n", V2_MOUNTS.format(root="/"), {
        "/sys/fs/cgroup/cgroup.controllers": "cpuset cpu\n",
        "/sys/fs/cgroup/a/b/cpu.max": "max 100000\n",
        "/sys/fs/cgroup/a/b/cpuset.cpus.effective": "\n",  # empty: ask the parent
        "/sys/fs/cgroup/a/cpuset.cpus.effective": "0-1\n",
    })
    assert cgroup.cpu_quota(root) is None
    assert cgroup.cpuset_cpus(root) == {0, 1}


def test_v1_without_a_cgroup_namespace(tmp_path):
    # Docker without cgroupns: the mount shows the container's own group as root,
    # and /proc/self/cgroup names the same path from the hierarchy's root
    path = "/docker/0123abcd"
    root = tree(tmp_path, f"4:cpu,cpuacct:{path}\n3:cpuset:{path}\n0::/\n",
                V1_MOUNTS.format(root=path), {
                    "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
                    "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
                    "/sys/fs/cgroup/cpuset/cpuset.effective_cpus": "0,2\n",
                    "/sys/fs/cgroup/unified/cgroup.controllers": "\n",
                })
    q = cgroup.cpu_quota(root)
    assert (q.quota_us, q.period_us, q.version, q.cpus) == (50000, 100000, 1, 0.5)
    assert cgroup.cpuset_cpus(root) == {0, 2}


def test_v1_nested_and_no_limit(tmp_path):
    root = tree(tmp_path, "2:cpu,cpuacct:/slice/job\n3:cpuset:/\n", V1_MOUNTS.format(root="/"), {
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "/sys/fs/cgroup/cpu,cpuacct/slice/cpu.cfs_quota_us": "300000\n",
        "/sys/fs/cgroup/cpu,cpuacct/slice/cpu.cfs_period_us": "100000\n",
        "/sys/fs/cgroup/cpu,cpuacct/slice/job/cpu.cfs_quota_us": "-1\n",
        "/sys/fs/cgroup/cpu,cpuacct/slice/job/cpu.cfs_period_us": "100000\n",
        "/sys/fs/cgroup/cpuset/cpuset.effective_cpus": "0-7\n",
    })
    assert cgroup.cpu_quota(root).cpus == 3.0
    assert cgroup.cpuset_cpus(root) == frozenset(range(8))


def test_nothing_readable_means_no_limit(tmp_path):
    root = tree(tmp_path, "", "", {})
    assert cgroup.cpu_quota(root) is None and cgroup.cpuset_cpus(root) is None
    assert cgroup.cpu_quota(str(tmp_path / "absent")) is None


def test_default_thread_count_rounds_the_quota_up_like_loky():
    assert default_thread_count(8, None) == 8
    assert default_thread_count(8, 1.5) == 2
    assert default_thread_count(8, CpuQuota(50000, 100000, "/x", 2)) == 1
    assert default_thread_count(2, 16.0) == 2  # the cores still bound it
    assert default_thread_count(28, 8.0, share=4) == 2  # four instances share the quota
    assert default_thread_count(28, 0.5, share=4) == 1
    import math

    for cpus in (0.01, 0.5, 1.0, 1.0000001, 2.5, 3.999, 7.0, 9.5, 27.2):
        for share in (1, 2, 3, 4, 7):
            assert default_thread_count(64, cpus, share=share) == max(1, math.ceil(cpus / share)), (cpus, share)
    with pytest.raises(ValueError, match="at least one core"):
        default_thread_count(0, None)
    with pytest.raises(ValueError, match="share must be"):
        default_thread_count(4, None, share=0)


# ----------------------------------------------------------- the real system

PROBE = ("import json; from affinity.machine import cgroup; q = cgroup.cpu_quota(); "
         "c = cgroup.cpuset_cpus(); print(json.dumps({'quota': q and q.cpus, "
         "'cpuset': sorted(c) if c is not None else None}))")


@pytest.mark.parametrize("scratch_cgroup", ["cpu"], indirect=True)
def test_real_cfs_quota_is_read_in_a_child(scratch_cgroup):
    (scratch_cgroup / "cpu.cfs_period_us").write_text("100000")
    (scratch_cgroup / "cpu.cfs_quota_us").write_text("50000")
    r = run_in(scratch_cgroup, sys.executable, "-c", PROBE)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["quota"] == 0.5
    # outside the group there is none (this test process sits higher up)
    assert cgroup.cpu_quota() is None or cgroup.cpu_quota().cpus != 0.5


@pytest.mark.parametrize("scratch_cgroup", ["cpuset"], indirect=True)
def test_real_cpuset_is_read_in_a_child(scratch_cgroup):
    cpus = sorted(os.sched_getaffinity(0))
    (scratch_cgroup / "cpuset.mems").write_text((Path(scratch_cgroup).parent / "cpuset.mems").read_text())
    (scratch_cgroup / "cpuset.cpus").write_text(str(cpus[-1]))
    r = run_in(scratch_cgroup, sys.executable, "-c", PROBE)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cpuset"] == [cpus[-1]]
