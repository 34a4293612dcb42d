"""``affinity.doctor()`` on live processes: each pathology reproduced for real on this
machine (2 CPUs, 1 NUMA node), detected with its evidence, and the same job without
it found clean.  What one node cannot show (memory on another node) is diagnosed
on the live snapshot with a described 2-node machine; PyTorch's collapse is in
``test_doctor_torch.py``; overlapping processes and the command line in
``tests/tools/test_doctor_cli.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers.doctorjob import allowed_cpus, job, quota_cgroup, torch_libgomp
from helpers.ompprog import iomp5_dir

from affinity import doctor
from affinity.binding.doctor import observe
from affinity.machine.topology import Topology
from affinity.planning.doctor import diagnose
from affinity.planning.doctor.values import cpus_text
from affinity.record import replace

INTERVAL = 0.3  #: seconds sampled
MINE = frozenset(os.sched_getaffinity(0))  #: the mask the jobs inherit


def _only(found, kind):
    matching = [f for f in found.findings if f.kind == kind]
    assert len(matching) == 1, found.text()
    return matching[0]


def test_threads_over_a_cfs_quota_are_oversubscribed():
    """3 busy threads in a cgroup with a 0.5-CPU quota (made here; where no cgroup can
    be made, under taskset on one CPU: the quota is then tested on a described
    snapshot, tests/planning/test_doctor.py)."""
    made = quota_cgroup(50000)
    prefix = made[1] if made is not None else ["taskset", "-c", "0"]
    try:
        with job(prefix, busy=3) as j:
            found = doctor(j["pid"], interval=INTERVAL)
    finally:
        if made is not None:
            made[0].rmdir()
    f = _only(found, "oversubscribed")
    facts = dict(f.facts)
    assert f.severity == "error" and not found.ok and f.pids == (j["pid"],)
    assert set(facts["tids"]) == set(j["busy"]) and facts["capacity"] == 1
    text = " ".join(f.evidence)
    if made is not None:
        assert f"CFS quota of 0.5 CPUs (50000/100000 us, {made[0]})" in text
        assert "throttled in" in text
        assert f.summary.startswith(f"3 runnable threads on 1 CPU's worth ({cpus_text(MINE)}, quota 0.5)")
    else:
        assert f.summary.startswith("3 runnable threads on 1 CPU's worth ({0})")
    assert f.fix.startswith("affinity run --threads 1 -- ")


def test_a_mask_reset_after_binding_is_found_against_what_the_process_published():
    """apply() pins the OpenMP team (the main thread is member 0, on CPU 0); then
    something puts the whole mask back on the main thread (NCCL's init does)."""
    lib = torch_libgomp()
    with job(load=[lib], apply={"threads": 2}, reset_main=sorted(MINE)) as j:
        found = doctor(j["pid"], interval=INTERVAL)
        shown = json.loads(subprocess.run([sys.executable, "-m", "affinity", "show", str(j["pid"]), "--json"],
                                          capture_output=True, text=True, timeout=60).stdout)
    f = _only(found, "binding-undone")
    assert f.severity == "error" and f.pids == (j["pid"],)
    whole = " (the whole of what the process may use: a mask put back)" if MINE == allowed_cpus() else ""
    assert f.evidence == (f"{j['pid']} [main 0 python] was bound to {{{min(MINE)}}} by affinity, now on "
                          f"{cpus_text(MINE)}{whole}",)
    assert "affinity.apply('granularity=fine,compact,1,0', threads=2) again" in f.fix
    # `affinity show PID` shows the roles the process published, and the mismatch
    assert shown["published"] and shown["published"].endswith(f"/{j['pid']}-{found.snapshot.processes[0].start}.json")
    main = next(t for t in shown["threads"] if t["tid"] == j["pid"])
    assert (main["role"], main["inferred"], main["requested"], main["mismatch"]) == ("main", False, [min(MINE)], True)
    assert [t["role"] for t in shown["threads"] if t["role"] == "openmp" and not t["inferred"]] == ["openmp"]
    with job(load=[lib], apply={"threads": 2}) as j:
        clean = doctor(j["pid"], interval=INTERVAL)
    assert clean.findings == () and clean.snapshot.processes[0].publication is not None


def test_two_openmp_runtimes_loaded_in_one_process():
    """Intel's libiomp5 (intel-openmp) beside PyTorch's libgomp, as MKL beside torch."""
    gomp, iomp = torch_libgomp(), str(iomp5_dir() / "libiomp5.so")
    with job(load=[gomp, iomp]) as j:
        found = doctor(j["pid"], interval=INTERVAL)
    f = _only(found, "two-openmp-runtimes")
    assert f.severity == "error" and f.summary.startswith(f"pid {j['pid']}: 2 OpenMP runtimes loaded (")
    assert f.summary.endswith("); each runs a team of its own")  # (in the order they are mapped)
    gnu, intel = sorted(f.evidence)
    assert gnu.startswith("libgomp (gnu) ") and gnu.endswith("/torch/lib/libgomp.so.1, bundled by torch")
    assert intel == f"libiomp5 (intel) {iomp}"
    assert "MKL_THREADING_LAYER=GNU" in f.fix
    with job(load=[gomp]) as j:
        assert doctor(j["pid"], interval=INTERVAL).findings == ()


@pytest.mark.skipif(not {0, 1} <= MINE, reason="needs CPUs 0 and 1 (the described machine puts them on two nodes)")
def test_memory_bound_to_a_node_then_threads_moved():
    """Memory bound to node 0 (64 MiB allocated), then every thread moved to CPU 1.
    One node here: the live reading shows the policy and where the pages are, and
    nothing is remote; the same snapshot on a described machine whose CPU 1 is on
    node 1 is the finding."""
    with job(membind=0, mib=64, move_to=[1]) as j:
        snap = observe([j["pid"]], interval=INTERVAL)
    p = snap.process(j["pid"])
    assert dict(p.memory.by_policy).get("bind:0", 0) >= 64 << 20  # read from its numa_maps
    assert dict(p.memory.by_node)[0] == p.memory.total
    assert {t.cpus for t in p.threads} == {frozenset({1})}
    assert diagnose(snap).findings == ()
    two_nodes = replace(snap, topology=Topology.from_synthetic("pack:2 [numa] core:1 pu:1"))  # CPU 1 on node 1
    f = _only(diagnose(two_nodes), "remote-memory")
    assert f.severity == "error" and f.summary == f"pid {j['pid']}: 100% of its memory is on node 0, its threads on node 1"
    assert any(e.startswith("memory policy bind:0: ") for e in f.evidence)
    assert f"migratepages {j['pid']} 0 1" in f.fix


def test_a_clean_job_says_what_was_checked():
    with job(busy=1, idle=2) as j:
        found = doctor(j["pid"], interval=INTERVAL)
    assert found.findings == () and found.ok
    p = found.snapshot.processes[0]
    assert {t.tid for t in p.runnable} == set(j["busy"])  # the busy thread, not the idle ones
    last = found.text().splitlines()[-1]
    assert last.startswith("no finding: checked 1 process (4 threads, 1 runnable over ")
    assert "runnable threads against CPUs" in last and "OpenMP runtimes (0 loaded)" in last


def test_in_process_during_a_call_counts_the_threads_that_call_runs():
    """``affinity.doctor(during=work)``: this process sampled while ``work()`` runs
    (``len(mask) + 1`` threads hashing: one more than the CPUs), not before or after."""
    import hashlib
    import threading

    n = len(MINE) + 1
    data, stop, tids, busy = b"x" * (1 << 20), threading.Event(), [], []

    def spin():
        tids.append(threading.get_native_id())
        while not stop.is_set():
            hashlib.sha256(data).digest()

    def work():
        busy.extend(threading.Thread(target=spin) for _ in range(n))
        for t in busy:
            t.start()
        stop.wait(0.4)

    try:
        found = doctor(during=work)
        assert found.snapshot.roots == (os.getpid(),) and found.snapshot.interval >= 0.4
        f = _only(found, "oversubscribed")
        assert set(tids) <= set(dict(f.facts)["tids"]), f.text()
    finally:
        stop.set()
        for t in busy:
            t.join()
    assert "affinity-doctor" not in [t.name for t in threading.enumerate()]
