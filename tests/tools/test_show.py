"""``affinity show PID`` of another process: TensorFlow's pools found by the rule that
finds them in this process, and the last-run CPU labelled as what it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CHILD = r"""
import json, os, sys, warnings
import tensorflow as tf
x = tf.random.uniform((128, 128))
for _ in range(3):
    (x @ x).numpy()          # TensorFlow's default pools are running
import affinity
warnings.simplefilter("ignore")
b = affinity.apply(tensorflow=True)   # finds them in this process and pins them
print(json.dumps({"pid": os.getpid(), "intra": list(b.tf_state.intra),
                  "inter": list(b.tf_state.inter)}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.tf
def test_show_pid_finds_tensorflows_pools_as_the_process_itself_does():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "TF_NUM_"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        mine = json.loads(child.stdout.readline())
        assert mine["intra"], "TensorFlow started no intra-op worker"
        r = subprocess.run([sys.executable, "-m", "affinity", "show", str(mine["pid"]), "--json"],
                           capture_output=True, text=True, timeout=60)
        text = subprocess.run([sys.executable, "-m", "affinity", "show", str(mine["pid"])],
                              capture_output=True, text=True, timeout=60).stdout
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    rows = json.loads(r.stdout)["threads"]
    intra = [(row["tid"], row["index"]) for row in rows if row["role"] == "tf-intra"]
    assert intra == [(tid, i) for i, tid in enumerate(mine["intra"])]
    assert sorted(row["tid"] for row in rows if row["role"] == "tf-inter") == sorted(mine["inter"])
    lines = [line for line in text.splitlines() if line.startswith(f"affinity: pid {mine['pid']} tid ")]
    assert lines and all(" last ran on cpu " in line for line in lines)
    # bound by affinity.apply(), the process published its roles: shown as said, not inferred
    assert text.startswith(f"affinity: pid {mine['pid']} roles as it published them (")
    assert not any(row["inferred"] for row in rows if row["role"].startswith("tf-"))


@pytest.mark.parametrize("pid", [1.9, True, -1, 0, "1"])
def test_report_refuses_what_is_no_process_id(pid):
    """report(1.9) and report(True) used to show process 1 (int() of them)."""
    import affinity
    from affinity.errors import SpecError

    with pytest.raises(SpecError, match=r"report\(pid="):
        affinity.report(pid)


def test_a_thread_id_is_refused_naming_its_process():
    """``affinity show TID`` of a thread that is not its process's first printed
    'pid TID' and marked the wrong thread [main]; it now names the process."""
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        tid = t.native_id
        r = subprocess.run([sys.executable, "-m", "affinity", "show", str(tid)], capture_output=True, text=True,
                           timeout=60)
    finally:
        stop.set()
        t.join()
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.strip() == (f"affinity show: error: report(pid={tid}): {tid} is a thread of process "
                                f"{os.getpid()}, not a process: give {os.getpid()}")
