"""A small real TensorFlow workload for recording surfaces on this machine
(``record.py``): inference of the ``matmul`` model of ``affinity bench`` (two dense
1024x1024 layers and a dense 10, pure GEMM) on random batches, timed after a
warm-up; prints ``images/sec: X``.

    python bench/surfaces/tf_workload.py --batch 64 --images 24576

One job of ``--images`` rows is split between the instances ``affinity run``
starts: instance ``AFFINITY_INSTANCE`` of ``AFFINITY_NUM_INSTANCES`` (0 of 1 when
run alone) infers its share (the remainder goes to the first ones), so more
instances do the same work, not more of it.  What a job costs is the wall time of
all of them (``affinity tune --time``, ``record.py --time``), TensorFlow's import
included, as a user pays it; the rate printed is this instance's own, over its
share.  TensorFlow sizes its pools from ``TF_NUM_INTRAOP_THREADS`` /
``TF_NUM_INTEROP_THREADS``, which ``affinity run`` sets.
"""

from __future__ import annotations

import argparse
import os
import time


def share(images: int) -> int:
    """This instance's part of ``images`` (from ``AFFINITY_INSTANCE`` / ``AFFINITY_NUM_INSTANCES``)."""
    n = max(1, int(os.environ.get("AFFINITY_NUM_INSTANCES", "1")))
    i = int(os.environ.get("AFFINITY_INSTANCE", "0"))
    return images // n + (1 if i < images % n else 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--images", type=int, required=True, help="the whole job, split between the instances")
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    layers = tf.keras.layers
    net = tf.keras.Sequential([layers.Input((1024,)), layers.Dense(1024), layers.Dense(1024), layers.Dense(10)])
    x = tf.random.Generator.from_seed(1234).uniform((a.batch, 1024))

    @tf.function
    def infer(inp):
        return net(inp, training=False)

    mine = share(a.images)
    sizes = [a.batch] * (mine // a.batch) + ([mine % a.batch] if mine % a.batch else [])
    for _ in range(a.warmup):
        infer(x).numpy()
    t0 = time.perf_counter()
    for b in sizes:
        infer(x[:b]).numpy()
    dt = max(time.perf_counter() - t0, 1e-9)
    print(f"images: {mine}  images/sec: {mine / dt:.2f}", flush=True)


if __name__ == "__main__":
    main()
