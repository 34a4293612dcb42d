"""Two TensorFlow bindings restored out of order (issue 19, item 5; issue 24, item 1).

Before: ``b1 = apply(); b2 = apply(); b1.restore(); b2.restore()`` left b1's
``Session`` hook installed for good (``SessionHook.remove`` put back what it had
seen, unchecked), and every later ``tf.compat.v1.Session()`` called the restored
b1's ``refresh``, which raises.  Real TensorFlow, in a fresh process per order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.tf,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs"),
]

SCRIPT = r"""
import json, os, sys, warnings
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
warnings.simplefilter("ignore")
import tensorflow as tf
from tensorflow.python.client import session
from tensorflow.python.eager import context
import affinity
from affinity.binding import registry

order = [int(c) for c in sys.argv[1]]
init0, ens0 = session.BaseSession.__dict__["__init__"], context.Context.__dict__["ensure_initialized"]
env0 = dict(os.environ)
masks0 = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
bs = [affinity.apply("compact", threads=1, tensorflow=True),
      affinity.apply("scatter", threads=2, tensorflow=True),
      affinity.apply("compact", threads=2, tensorflow=True)]
inside = session.BaseSession.__dict__["__init__"] is not init0
for i in order:
    bs[i].restore()
g = tf.Graph()
with g.as_default():
    y = tf.reduce_sum(tf.ones((4, 4)))
with tf.compat.v1.Session(graph=g) as s:  # raised RuntimeError from a restored binding's refresh
    value = float(s.run(y))
masks1 = {int(t): sorted(os.sched_getaffinity(int(t))) for t in masks0 if os.path.exists(f"/proc/self/task/{t}")}
print(json.dumps({
    "inside": inside,
    "session_init_restored": session.BaseSession.__dict__["__init__"] is init0,
    "ensure_initialized_restored": context.Context.__dict__["ensure_initialized"] is ens0,
    "value": value,
    "env_changed": sorted(k for k in set(env0) | set(os.environ) if env0.get(k) != os.environ.get(k)),
    "masks_changed": sorted(t for t in masks1 if masks1[t] != masks0[t]),
    "active": len(registry.active()),
}))
"""


@pytest.mark.parametrize("order", ["012", "102", "201", "210"])  # in order, and out of order three ways
def test_tf_bindings_restored_in_any_order(order):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "TF_NUM_", "GOMP_"))}
    r = subprocess.run([sys.executable, "-c", SCRIPT, order], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["inside"]  # the hooks were installed while the bindings were active
    assert out["session_init_restored"] and out["ensure_initialized_restored"], out
    assert out["value"] == 16.0
    assert out["env_changed"] == [] and out["masks_changed"] == [] and out["active"] == 0, out


POOL_SIZES = r"""
import json, os, warnings
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
warnings.simplefilter("ignore")
import affinity
b1 = affinity.apply("compact", threads=1)  # TensorFlow not imported yet: each sizes its pools at the import
b2 = affinity.apply("scatter", threads=2)
import tensorflow as tf
t = tf.config.threading
before = t.get_intra_op_parallelism_threads()
b1.restore()
inside_b2 = t.get_intra_op_parallelism_threads()
b2.restore()
print(json.dumps({"b2": b2.intra_op_threads, "inside_b2": inside_b2,
                  "after": [t.get_intra_op_parallelism_threads(), t.get_inter_op_parallelism_threads()]}))
"""


def test_tf_pool_sizes_restored_out_of_order():
    """Two bindings made before ``import tensorflow`` size its pools at the import (the
    runtime not started); b1 restored first put TensorFlow's defaults back under the
    active b2, and b2 then put b1's sizes back for good (issue 42: every piece of state
    an adapter changes is held as the environment is)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "TF_NUM_", "GOMP_"))}
    r = subprocess.run([sys.executable, "-c", POOL_SIZES], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["inside_b2"] == out["b2"]  # b2 is active: its size stands
    assert out["after"] == [0, 0]  # TensorFlow's own "not set"
