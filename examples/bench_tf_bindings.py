"""A TensorFlow model's training step under three bindings, side by side.

    pytest examples/bench_tf_bindings.py
    pytest examples/bench_tf_bindings.py --benchmark-json=steps.json   # plan + topology in extra_info

Needs pytest-benchmark and TensorFlow (``pip install 'kmp-affinity[tf]' pytest-benchmark``).
The ``affinity`` marker runs the test once per spec, inside
``affinity.pinned(spec, threads=THREADS, tensorflow=True)``: the first case starts
TensorFlow's runtime with the pools the plan sizes (so every case gets the same
intra-op/inter-op counts) and each case pins those pools by TID, then restores them.
``none`` (the runtime's own "do not bind") is the baseline the other two are read
against.  pytest-benchmark prints the three in one table (group
``bench_tf_bindings.py::test_train_step``); ``pytest-benchmark compare`` does the same
with saved runs (``--benchmark-autosave``).

On a machine with several packages or SMT, try ``granularity=fine,compact,1,0``
(fill the second hardware thread of a core last) or ``granularity=core,scatter``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

#: the team size every binding gets: at most 4, at most what this process may use
THREADS = min(4, len(os.sched_getaffinity(0)))
BINDINGS = ("none", "granularity=fine,compact", "granularity=fine,scatter")


def _model_and_step():
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((256, 64), dtype=np.float32))
    y = tf.constant((rng.random(256) > 0.5).astype(np.int32))
    model = tf.keras.Sequential([
        tf.keras.layers.Input((64,)),
        tf.keras.layers.Dense(256, activation="relu"),
        tf.keras.layers.Dense(256, activation="relu"),
        tf.keras.layers.Dense(2),
    ])
    optimizer = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return loss

    return step


@pytest.mark.affinity(*BINDINGS, threads=THREADS, tensorflow=True)
def test_train_step(benchmark, affinity_binding):
    step = _model_and_step()
    step()                       # trace the graph outside the measurement
    affinity_binding.refresh()   # pin threads TensorFlow started meanwhile
    loss = benchmark(lambda: step().numpy())
    assert np.isfinite(loss)
    # every thread the binding placed is still where it was asked to be
    assert not affinity_binding.report().mismatches
