"""``python -m affinity demo`` (what ``make demo`` runs): the main job end to end.

1. the topology of this machine (and, for scale, of a 2 x 28 x 2 Xeon);
2. the plan recommended for TensorFlow here, as Intel's runtime would bind it;
3. a bind + read-back of the calling thread on every allowed CPU;
4. the tf_cnn_benchmarks-style workload, each run in a fresh process (TensorFlow
   configures its pools once per process), with TensorFlow's defaults and under the
   recommended plan, **interleaved** round by round (defaults and pinned
   alternate, so both see the same load) until the interval of pinned/defaults
   excludes 1 or ``rounds`` are done; each side's figure (the geometric mean of its
   runs) and spread, the ratio of the figures and the verdict -- the statistic
   every face shares, :mod:`affinity.tuning.verdict`; then the thread counts and
   the last pinned run's bind map;
5. PyTorch's row beside it (:func:`~affinity.tools.workload_torch.demo_rows`).

Each row of that comparison is :func:`affinity.tools.rows.measure_row` (any
workload: a callable that runs it once, defaults or pinned) and
:func:`~affinity.tools.rows.row_text`: TensorFlow's and PyTorch's rows share them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from typing import TextIO

from ..binding.threads import get_affinity, set_affinity
from ..cpulist import format_list
from ..machine.topology import Topology
from ..planning.planner import plan
from .rows import DEMO_ROUNDS, measure_row, row_text
from .workload import recommend
from .workload_ort import demo_rows as ort_rows
from .workload_torch import demo_rows

XEON_2S28C2T = "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"


def _bench(args: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "KMP_", "GOMP_", "TF_NUM_"))}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    r = subprocess.run([sys.executable, "-m", "affinity", "bench", "--json", *args],
                       capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"workload failed ({' '.join(args)}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _require_tensorflow() -> None:
    """Fail before any output when TensorFlow is not installed, or is and fails to
    import (tried in a child process, as the workload runs it): the workload needs it,
    and the command line says so in one line (a ``ModuleNotFoundError``, or an
    ``ImportError`` holding the child's traceback, named after it)."""
    if importlib.util.find_spec("tensorflow") is None:
        raise ModuleNotFoundError("No module named 'tensorflow'", name="tensorflow")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    r = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True, text=True, env=env,
                       timeout=600)
    if r.returncode != 0:  # (the command line picks the cause's line out of the traceback)
        raise ImportError(r.stderr.strip() or f"exit status {r.returncode}", name="tensorflow")


def run(out: TextIO, *, model: str = "resnet50", batch_size: int = 16, num_batches: int = 10,
        rounds: int = DEMO_ROUNDS) -> int:
    _require_tensorflow()

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    here = Topology.from_system()
    say("== This machine ==")
    say(here.tree())
    say()
    xeon = Topology.from_synthetic(XEON_2S28C2T)
    spec_x, n_x = recommend(xeon)
    px = plan(spec_x, threads=n_x, topology=xeon)
    say("== For scale: a 2 x 28 x 2 Xeon (siblings i and i+56) ==")
    say(f"{xeon.describe()}; recommended {spec_x!r} with {n_x} threads:")
    say("  " + "  ".join(f"t{i}:{{{format_list(s)}}}" for i, s in enumerate(px.cpusets[:6]))
        + f"  ...  t{n_x - 1}:{{{format_list(px.cpusets[-1])}}}")
    say(f"  TensorFlow: intra_op={px.intra_op_threads} inter_op={px.inter_op_threads}")
    say()

    spec, n = recommend(here)
    p = plan(spec, threads=n, topology=here)
    say(f"== Recommended here: {spec!r}, {n} threads ==")
    say(p.explain())
    say()

    say("== Bind the calling thread to each allowed CPU, read back from the kernel ==")
    tid = threading.get_native_id()
    original = get_affinity()
    try:
        for cpu in sorted(here.allowed):
            got = set_affinity({cpu})
            kernel = os.sched_getaffinity(0)
            ok = "ok" if got == kernel == {cpu} else "MISMATCH"
            say(f"thread {tid} bound to OS proc set {{{format_list(got)}}}  "
                f"(os.sched_getaffinity: {{{format_list(kernel)}}}) {ok}")
            if ok != "ok":
                return 1
    finally:
        set_affinity(original)
    say(f"restored thread {tid} to {{{format_list(get_affinity())}}}")
    say()

    common = ["--model", model, "--batch-size", str(batch_size), "--num-batches", str(num_batches),
              "--forward-only"]
    say(f"== Workload: {model}, batch {batch_size}, {num_batches} batches, forward only, "
        f"synthetic data; defaults and pinned interleaved, until the verdict is settled (at most {rounds} "
        f"round{'s' if rounds != 1 else ''}) ==")
    pin = ["--pin", spec, "--threads", str(n)]
    row = measure_row(f"TensorFlow {model}", lambda pinned: _bench([*common, *pin] if pinned else common),
                      rounds, progress=say)
    for line in row_text(row):
        say(line)
    base, pinned = row.last_defaults, row.last
    say(f"  threads: defaults intra_op={base['intra_op_threads']} inter_op={base['inter_op_threads']} "
        f"(not pinned); pinned intra_op={pinned['intra_op_threads']} inter_op={pinned['inter_op_threads']} "
        f"({spec})")
    say()
    say("== PyTorch beside it: small CNN, batch 32, inference; affinity.apply() before import torch ==")
    torch_pinned = demo_rows(say, spec, n, rounds=rounds)
    say()
    say("== ONNX Runtime beside them: an MLP built in the process, sessions made inside affinity.pinned() ==")
    ort_rows(say, spec, n, rounds=rounds)
    say()
    say("== Bind map of the last pinned run ==")
    say(pinned["bind_map"])
    if torch_pinned is not None:
        say()
        say("== Bind map of the pinned PyTorch run ==")
        say(torch_pinned["bind_map"])
    return 0
