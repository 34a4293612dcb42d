"""One TensorFlow scenario, run as ``python tfscenario.py SPEC THREADS [late|late-apply]``
in a fresh process (TensorFlow's runtime can start only once per process).  Prints
JSON with what the kernel and /proc say at each stage; tests/binding/test_tf.py judges it.

``late``: TensorFlow is imported inside ``pinned()`` (the natural order of
``import affinity; affinity.apply(...); import tensorflow``); ``late-apply`` the same
with ``apply()`` and ``restore()``.  Otherwise TensorFlow is imported first:

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


def hooks_left() -> dict:
    """What a binding may have installed into TensorFlow and the import system."""
    out = {"meta_path": [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("affinity")]}
    if "tensorflow" in sys.modules:
        from tensorflow.python.client import session
        from tensorflow.python.eager import context

        out["patched"] = [name for name, f in (("ensure_initialized", context.Context.ensure_initialized),
                                               ("session", session.BaseSession.__init__))
                          if hasattr(f, "__wrapped__")]
    return out


def late(spec: str, threads: int, use_apply: bool) -> dict:
    import affinity

    out: dict = {"pid": os.getpid(), "initial": masks(), "initial_environ": dict(os.environ),
                 "hooks_before": hooks_left()}
    b = affinity.apply(spec, threads=threads) if use_apply else affinity.pinned(spec, threads=threads).__enter__()
    before_import = dict(os.environ)
    import tensorflow as tf

    # what TensorFlow's own import sets (TF2_BEHAVIOR, ...): the user's doing, kept
    out["set_by_tf_import"] = {k: v for k, v in os.environ.items() if before_import.get(k) != v}

    out["sizes_after_import"] = [tf.config.threading.get_intra_op_parallelism_threads(),
                                 tf.config.threading.get_inter_op_parallelism_threads()]
    x = tf.random.normal([512, 512])
    tf.linalg.matmul(x, x).numpy()
    out["late"] = stage(b)
    b.restore()
    out["restored"] = {"masks": masks(), "environ": dict(os.environ), "hooks": hooks_left()}
    return out


def main() -> None:
    spec, threads = sys.argv[1], int(sys.argv[2])
    warnings.simplefilter("ignore")
    if len(sys.argv) > 3:
        print(json.dumps(late(spec, threads, use_apply=sys.argv[3] == "late-apply")))
        return
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
