"""One TensorFlow scenario, run as ``python tfscenario.py SPEC THREADS`` in a fresh
process (TensorFlow's runtime can start only once per process).  Prints JSON
with what the kernel and /proc say at each stage; tests/test_tf.py judges it.

Stages: ``before``   apply() before TensorFlow's runtime started (it sizes the pools)
        ``restored`` after leaving that pinned() block
        ``after``    pinned() again, now that the runtime runs (pins by TID only)
        ``restored2`` after leaving that block
        ``session``  a TF1 Session created inside pinned(): its pools get pinned
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def masks() -> dict[int, list[int]]:
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            out[int(t)] = sorted(os.sched_getaffinity(int(t)))
        except OSError:
            pass
    return out


def stage(b) -> dict:
    from affinity.binding.bindmap import report

    rep = report(binding=b)
    return {
        "pins": [[p.tid, p.role, sorted(p.cpus), p.index] for p in b.pins.values()],
        "slots": [sorted(s) for s in b.slots],
        "intra_op_threads": b.intra_op_threads,
        "inter_op_threads": b.inter_op_threads,
        "tf_state": None if b.tf_state is None else {
            "intra": list(b.tf_state.intra), "inter": list(b.tf_state.inter),
            "counts_set": b.tf_state.counts_set},
        "masks": masks(),
        "report": rep.to_dict(),
        "report_text": rep.text(),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "KMP_AFFINITY", "TF_NUM_INTRAOP_THREADS")},
        "notes": list(b.notes),
    }


def main() -> None:
    spec, threads = sys.argv[1], int(sys.argv[2])
    warnings.simplefilter("ignore")
    import tensorflow as tf

    import affinity

    out: dict = {"pid": os.getpid(), "initial": masks(),
                 "initial_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "KMP_AFFINITY")}}
    with affinity.pinned(spec, threads=threads) as b:
        x = tf.random.uniform((128, 128))
        tf.matmul(x, x).numpy()
        out["before"] = stage(b)
        out["tf_sizes"] = [tf.config.threading.get_intra_op_parallelism_threads(),
                           tf.config.threading.get_inter_op_parallelism_threads()]
    out["restored"] = {"masks": masks(), "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "KMP_AFFINITY")}}
    with affinity.pinned(spec, threads=threads) as b:
        tf.matmul(x, x).numpy()
        out["after"] = stage(b)
    out["restored2"] = {"masks": masks()}
    with affinity.pinned(spec, threads=threads) as b:
        g = tf.Graph()
        with g.as_default():
            y = tf.reduce_sum(tf.ones((8, 8)))
        known = set(masks())
        with tf.compat.v1.Session(graph=g, config=b.config_proto()) as sess:
            sess.run(y)
            new = sorted(set(masks()) - known)
            out["session"] = {"new": new, "stage": stage(b)}
    out["restored3"] = {"masks": masks()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
