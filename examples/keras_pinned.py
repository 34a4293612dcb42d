"""Train a small Keras model on synthetic data with its threads pinned, then
print the bind map.

    python examples/keras_pinned.py ["granularity=fine,compact,1,0" [THREADS]]

``pinned()`` is entered before TensorFlow's runtime starts, so it sizes the
intra-op/inter-op pools from the plan and pins each worker by TID; threads that
Keras starts during ``fit`` are pinned by ``refresh()``.  On exit every thread
goes back to where it was.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import affinity  # noqa: E402


def main() -> int:
    spec = sys.argv[1] if len(sys.argv) > 1 else "granularity=fine,compact,1,0"
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else None
    rng = np.random.default_rng(0)
    x = rng.random((2048, 32), dtype=np.float32)
    y = (x.sum(axis=1) > 16).astype(np.int32)
    with affinity.pinned(spec, threads=threads) as b:
        model = tf.keras.Sequential([
            tf.keras.layers.Input((32,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(2),
        ])
        model.compile(optimizer="adam",
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        hist = model.fit(x, y, epochs=3, batch_size=128, verbose=0)
        b.refresh()  # pin threads Keras started during fit
        print(f"plan: {spec} -> {b.plan.threads} slots, intra_op={b.intra_op_threads}, "
              f"inter_op={b.inter_op_threads}")
        print(f"final accuracy: {hist.history['accuracy'][-1]:.3f}")
        bmap = b.report()
        print(bmap.text())
        if bmap.mismatches:
            print(f"{len(bmap.mismatches)} thread(s) not where they were asked to be", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
