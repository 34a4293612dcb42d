"""A tf_cnn_benchmarks-style workload: synthetic data, no download.

``python -m affinity bench --model resnet50 --batch-size 16 --num-batches 10 --forward-only``
prints per-step throughput and ``total images/sec`` the way tf_cnn_benchmarks
does, so numbers from both can be compared.  ``--pin SPEC`` applies a plan
(:func:`affinity.apply`) before TensorFlow starts; without it TensorFlow runs
with its defaults.  Models:

``resnet50``   Keras ResNet50 (random weights), 224x224x3 images
``small_cnn``  a 4-conv CIFAR-sized network, 32x32x3 images
``matmul``     one dense 1024x1024 layer per "image" row (pure GEMM)
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from typing import Any, TextIO

from ..binding import tf as _tf
from ..binding.apply import apply
from ..binding.bindmap import report
from ..planning.spec import DEFAULT_SPEC
from ..record import asdict, field, record
from .rows import hold_running

MODELS = ("resnet50", "small_cnn", "matmul")


@record(frozen=False)
class BenchResult:
    model: str
    batch_size: int
    num_batches: int
    forward_only: bool
    images_per_sec: float  #: total images / total time of the timed batches
    step_images_per_sec: list[float] = field(default_factory=list)
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    pinned: str | None = None
    bind_map: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _build(tf: Any, model: str, batch: int) -> tuple[Any, Any, Any]:
    """(keras model, input batch, labels) for ``model``."""
    rng = tf.random.Generator.from_seed(1234)
    if model == "resnet50":
        net = tf.keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
        x = rng.uniform((batch, 224, 224, 3))
        classes = 1000
    elif model == "small_cnn":
        layers = tf.keras.layers
        net = tf.keras.Sequential([
            layers.Input((32, 32, 3)),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(256, activation="relu"),
            layers.Dense(10),
        ])
        x = rng.uniform((batch, 32, 32, 3))
        classes = 10
    elif model == "matmul":
        layers = tf.keras.layers
        net = tf.keras.Sequential([layers.Input((1024,)), layers.Dense(1024), layers.Dense(1024),
                                   layers.Dense(10)])
        x = rng.uniform((batch, 1024))
        classes = 10
    else:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    y = tf.cast(rng.uniform((batch,), maxval=classes, dtype=tf.int64), tf.int32)
    return net, x, y


def run(model: str = "small_cnn", *, batch_size: int = 32, num_batches: int = 20, num_warmup: int = 2,
        forward_only: bool = True, pin: str | None = None, threads: int | None = None,
        out: TextIO | None = None, hold: bool = False) -> BenchResult:
    """Run the workload in this process and return its throughput.

    ``pin``: a spec applied with :func:`affinity.apply` *before* TensorFlow starts
    (the pools are then sized and pinned by the plan).  Without it, TensorFlow's
    defaults are used.  TensorFlow can only be configured once per process: run
    each configuration in its own process (``python -m affinity bench ...``).

    ``hold``: after the timed batches, print ``{"holding": PID}`` and keep running
    batches until standard input reaches its end (a live job for ``affinity doctor
    PID`` and ``affinity show PID`` to look at).
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    if batch_size < 1 or num_batches < 1 or num_warmup < 0:
        raise ValueError("batch size and number of batches must be >= 1, warm-up >= 0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    binding = None
    if pin is not None:

        binding = apply(pin, threads=threads, tensorflow=True)
    import tensorflow as tf

    net, x, y = _build(tf, model, batch_size)
    opt = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=model != "resnet50")

    @tf.function
    def infer(inp: Any) -> Any:
        return net(inp, training=False)

    @tf.function
    def train(inp: Any, lab: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = loss_fn(lab, net(inp, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, net.trainable_variables), net.trainable_variables))
        return loss

    def step() -> None:
        if forward_only:
            infer(x).numpy()
        else:
            train(x, y).numpy()

    if binding is not None:
        binding.refresh()  # tf.function tracing may start helper threads
    for _ in range(num_warmup):
        step()
    say = (lambda s: print(s, file=out, flush=True)) if out is not None else (lambda s: None)
    say("Step\tImg/sec")
    rates = []
    t_total = 0.0
    for i in range(1, num_batches + 1):
        t0 = time.perf_counter()
        step()
        dt = time.perf_counter() - t0
        t_total += dt
        rates.append(batch_size / dt)
        if i == 1 or i % 10 == 0 or i == num_batches:
            sd = statistics.pstdev(rates) if len(rates) > 1 else 0.0
            jitter = statistics.median([abs(r - statistics.median(rates)) for r in rates])
            say(f"{i}\timages/sec: {statistics.mean(rates):.1f} +/- {sd:.1f} (jitter = {jitter:.1f})")
    total = batch_size * num_batches / t_total
    say("-" * 64)
    say(f"total images/sec: {total:.2f}")
    say("-" * 64)
    if hold:
        hold_running(step)
    bmap = binding.report() if binding is not None else report()

    pools = binding.tf_state if binding is not None else _tf.find_running_pools()
    res = BenchResult(model=model, batch_size=batch_size, num_batches=num_batches, forward_only=forward_only,
                      images_per_sec=total, step_images_per_sec=rates, intra_op_threads=pools.intra_size,
                      inter_op_threads=pools.inter_size, pinned=pin, bind_map=bmap.text())
    if binding is not None:
        binding.restore()
    return res


def recommend(topology: Any) -> tuple[str, int]:
    """The plan recommended for TensorFlow on ``topology``: one thread per physical
    core of the allowed CPUs, cores filled package by package, hardware siblings
    left free (Intel's and NERSC's guidance for TensorFlow on Xeon)."""
    cores = {pu.core for pu in topology.pus if pu.os_index in topology.allowed}
    return DEFAULT_SPEC, max(1, len(cores))


def main_cli(args: Any) -> int:
    res = run(args.model, batch_size=args.batch_size, num_batches=args.num_batches,
              num_warmup=args.num_warmup_batches, forward_only=args.forward_only, pin=args.pin,
              threads=args.threads, out=None if args.json else sys.stdout, hold=args.hold)
    if args.json:
        print(json.dumps(res.to_dict()))
    else:
        print(f"intra_op_threads: {res.intra_op_threads}  inter_op_threads: {res.inter_op_threads}"
              f"  pinned: {res.pinned or 'no (TensorFlow defaults)'}")
        print(res.bind_map)
    return 0 if math.isfinite(res.images_per_sec) else 1
