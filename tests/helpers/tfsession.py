"""A TF1 graph-mode ``Session`` under a binding, as the design card uses it, run as
``python tfsession.py ORDER NESTING`` in a fresh process (TensorFlow's pools start
once per process).  Prints JSON with every thread's name and kernel mask at each
stage; tests/binding/test_tf_session.py judges it.

ORDER    ``apply-import``: ``b = affinity.apply(...)``, then ``import tensorflow``;
         ``import-apply``: ``import tensorflow`` (graph mode switched on), then apply().
NESTING  ``flat``: the session under that binding;
         ``nested``: the session inside ``with affinity.pinned(INNER)`` under it.

Stages: ``session`` (inside the session, after a run and ``refresh()``),
        ``after`` (nested: after the inner block), ``refreshed`` (nested: after
        ``outer.refresh()``).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

OUTER = "explicit,proclist=[1,0],granularity=fine"
INNER = "explicit,proclist=[0,1],granularity=fine"


def threads() -> dict[str, list]:
    """TID -> [name, mask], read from the kernel."""
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as fh:
                out[t] = [fh.read().strip(), sorted(os.sched_getaffinity(int(t)))]
        except OSError:
            pass
    return out


def stage(b) -> dict:
    rep = b.report()
    return {"threads": threads(), "slots": [sorted(s) for s in b.slots],
            "union": sorted(b.union), "intra_op_threads": b.intra_op_threads,
            "pins": {str(t): [p.role, sorted(p.cpus), p.index] for t, p in b.pins.items()},
            "mismatches": [str(m) for m in rep.mismatches]}


def main() -> None:
    order, nesting = sys.argv[1], sys.argv[2]
    warnings.simplefilter("always")
    caught: list[str] = []
    warnings.showwarning = lambda m, *a, **k: caught.append(str(m))
    import affinity

    if order == "apply-import":
        b = affinity.apply(OUTER, threads=2)
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
    else:
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        b = affinity.apply(OUTER, threads=2)
    out: dict = {"pid": os.getpid(), "before_session": threads()}
    g = tf.Graph()
    with g.as_default():
        x = tf.random.uniform((128, 128))
        y = tf.reduce_sum(tf.matmul(x, x))
    if nesting == "flat":
        with tf.compat.v1.Session(graph=g, config=b.config_proto()) as sess:
            sess.run(y)
            out["refreshed_tids"] = b.refresh()
            out["session"] = stage(b)
    else:
        with affinity.pinned(INNER, threads=2) as inner:
            with tf.compat.v1.Session(graph=g, config=inner.config_proto()) as sess:
                sess.run(y)
                out["inner"] = stage(inner)
        out["after"] = stage(b)
        out["refreshed_tids"] = b.refresh()
        out["refreshed"] = stage(b)
    out["warnings"] = caught
    print(json.dumps(out))


if __name__ == "__main__":
    main()
