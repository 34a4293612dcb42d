"""A small inference workload for ONNX Runtime and OpenVINO, built here (no download).

:func:`mlp_model` writes the bytes of an ONNX model -- ``layers`` MatMul+Relu
layers of ``width`` x ``width`` float weights -- with the protobuf wire format
written by hand (the few fields ONNX needs), so neither ``onnx`` nor a model file
is needed; ONNX Runtime loads the bytes as they are, and OpenVINO reads them too.

``python -m affinity.tools.workload_ort --json [--engine ort|ov] [--pin SPEC
--threads N]`` runs it in this process -- with the engine's own defaults, or
inside ``affinity.pinned(SPEC)`` -- and prints inferences per second;
:func:`demo_rows` is ``make demo``'s ONNX Runtime row (defaults against pinned,
each run a fresh process, interleaved), ``bench/bench_engines.py`` the bench.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from .rows import measure_row, row_text

__all__ = ["demo_rows", "main", "mlp_model", "run_fresh", "run_workload", "time_runs", "workload_cmd"]

CLEAN_PREFIXES = ("OMP_", "KMP_", "GOMP_", "TF_NUM_", "MKL_", "AFFINITY_", "ORT_")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire) + payload


def _int(number: int, value: int) -> bytes:
    return _field(number, 0, _varint(value))


def _bytes(number: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return _field(number, 2, _varint(len(data)) + data)


def _value_info(name: str, dims: tuple[int | str, ...]) -> bytes:
    """ValueInfoProto: a float tensor of ``dims`` (a str is a symbolic dimension)."""
    shape = b"".join(_bytes(1, _bytes(2, d) if isinstance(d, str) else _int(1, d)) for d in dims)
    tensor_type = _int(1, 1) + _bytes(2, shape)  # elem_type FLOAT, shape
    return _bytes(1, name) + _bytes(2, _bytes(1, tensor_type))


def _tensor(name: str, rows: int, cols: int, seed: int) -> bytes:
    """TensorProto: float weights in raw_data, small values from a fixed sequence."""
    vals = [((i * 2654435761 + seed) % 1000) / 1000.0 - 0.5 for i in range(rows * cols)]
    scale = 1.0 / rows
    raw = struct.pack(f"<{rows * cols}f", *(v * scale for v in vals))
    return _int(1, rows) + _int(1, cols) + _int(2, 1) + _bytes(8, name) + _bytes(9, raw)


def _node(op: str, inputs: tuple[str, ...], output: str, name: str) -> bytes:
    return b"".join(_bytes(1, i) for i in inputs) + _bytes(2, output) + _bytes(3, name) + _bytes(4, op)


def mlp_model(width: int = 256, layers: int = 4, batch: int | str = "batch") -> bytes:
    """The serialized ModelProto (IR 8, opset 17) of ``x -> (MatMul W_i, Relu) x layers``,
    ``x`` of shape ``(batch, width)``."""
    nodes, inits = [], []
    prev = "x"
    for i in range(layers):
        inits.append(_bytes(5, _tensor(f"w{i}", width, width, seed=i)))
        nodes.append(_bytes(1, _node("MatMul", (prev, f"w{i}"), f"m{i}", f"matmul{i}")))
        out = "y" if i == layers - 1 else f"r{i}"
        nodes.append(_bytes(1, _node("Relu", (f"m{i}",), out, f"relu{i}")))
        prev = out
    graph = (b"".join(nodes) + _bytes(2, "mlp") + b"".join(inits)
             + _bytes(11, _value_info("x", (batch, width))) + _bytes(12, _value_info("y", (batch, width))))
    opset = _bytes(1, "") + _int(2, 17)
    return _int(1, 8) + _bytes(7, graph) + _bytes(8, opset)


def time_runs(run: Callable[[], Any], repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``run`` (after one untimed call)."""
    run()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        out.append(time.perf_counter() - t0)
    return out


def _ort_session(model: bytes) -> tuple[Any, Callable[[Any], Any], dict[str, Any]]:
    import onnxruntime as ort  # noqa: PLC0415  (inside pinned() when pinned: the user's order)

    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    opts = sess.get_session_options()
    return sess, lambda x: sess.run(None, {"x": x}), {"engine": f"onnxruntime {ort.__version__}",
                                                      "intra_op_threads": opts.intra_op_num_threads}


def _ov_session(model: bytes) -> tuple[Any, Callable[[Any], Any], dict[str, Any]]:
    import openvino as ov  # noqa: PLC0415  (inside pinned() when pinned: the user's order)

    core = ov.Core()
    compiled = core.compile_model(core.read_model(model=model), "CPU")
    req = compiled.create_infer_request()
    return compiled, lambda x: req.infer({0: x}), {"engine": f"openvino {ov.__version__}",
                                                   "intra_op_threads": int(compiled.get_property(
                                                       "INFERENCE_NUM_THREADS"))}


def run_workload(*, engine: str = "ort", width: int = 1024, layers: int = 4, batch: int = 32, repeats: int = 30,
                 pin: str | None = None, threads: int | None = None) -> dict[str, Any]:
    """Build the model, make the session (inside ``affinity.pinned(pin)`` when
    ``pin`` is given), time ``repeats`` runs; the median run's inferences per second."""
    import numpy as np  # noqa: PLC0415  (the engines need it anyway)

    model = mlp_model(width, layers)
    x = np.ones((batch, width), np.float32)
    make = _ort_session if engine == "ort" else _ov_session
    bind_map = ""
    if pin is not None:
        from ..binding.apply import pinned  # lazy: only a pinned run loads the binding layer

        with pinned(pin, threads=threads) as b:
            _, run, info = make(model)
            secs = time_runs(lambda: run(x), repeats)
            bind_map = b.report().text()
    else:
        _, run, info = make(model)
        secs = time_runs(lambda: run(x), repeats)
    secs.sort()
    return {"inferences_per_sec": batch / secs[len(secs) // 2], "pinned": pin, "bind_map": bind_map, **info}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m affinity.tools.workload_ort", description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["ort", "ov"], default="ort")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--pin", metavar="SPEC", default=None, help="make the session inside affinity.pinned(SPEC)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = run_workload(engine=a.engine, width=a.width, layers=a.layers, batch=a.batch_size, repeats=a.repeats,
                       pin=a.pin, threads=a.threads)
    print(json.dumps(out) if a.json else f"inferences/sec: {out['inferences_per_sec']:.1f}")
    return 0


def clean_env() -> dict[str, str]:
    """This environment without any thread or placement variable: the engine's defaults."""
    return {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_PREFIXES)}


def workload_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "affinity.tools.workload_ort", "--json", *args]


def run_fresh(cmd: Sequence[str]) -> dict[str, Any]:
    """One run in a fresh process; its JSON result."""
    r = subprocess.run(list(cmd), capture_output=True, text=True, env=clean_env(), timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"inference workload failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])


def demo_rows(say: Callable[[str], None], spec: str, threads: int, *, rounds: int = 3) -> dict[str, Any] | None:
    """``make demo``'s ONNX Runtime row: a session with ONNX Runtime's defaults against
    one made inside ``affinity.pinned(spec)``, each run a fresh process, interleaved
    over ``rounds`` (:func:`affinity.tools.rows.measure_row`); returns the last pinned
    run.  Says so and returns ``None`` when onnxruntime is not installed."""
    if importlib.util.find_spec("onnxruntime") is None:
        say("ONNX Runtime: not installed (pip install 'kmp-affinity[engines]')")
        return None
    pin = ["--pin", spec, "--threads", str(threads)]
    row = measure_row("ONNX Runtime MLP (4 x 1024x1024 MatMul+Relu, batch 32)",
                      lambda pinned: run_fresh(workload_cmd(*(pin if pinned else []))), rounds,
                      key="inferences_per_sec")
    for line in row_text(row, unit="inferences/sec"):
        say(line)
    say(f"  threads: defaults intra_op={row.last_defaults['intra_op_threads']} (ONNX Runtime's choice); "
        f"pinned intra_op={row.last['intra_op_threads']} ({spec})")
    return row.last


if __name__ == "__main__":
    sys.exit(main())
