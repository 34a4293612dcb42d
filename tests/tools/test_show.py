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
    lines = [line for line in text.splitlines() if line.startswith("affinity: pid")]
    assert lines and all(" last ran on cpu " in line for line in lines)
