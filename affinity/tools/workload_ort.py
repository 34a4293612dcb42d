"""A small inference workload for ONNX Runtime and OpenVINO, built here (no download).

:func:`mlp_model` writes the bytes of an ONNX model -- ``layers`` MatMul+Relu
layers of ``width`` x ``width`` float weights -- with the protobuf wire format
written by hand (the few fields ONNX needs), so neither ``onnx`` nor a model file
is needed; ONNX Runtime loads the bytes as they are, and OpenVINO reads them too.
:func:`time_runs` times ``run`` calls of a session (for the demo's row and
``bench/bench_engines.py``).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import Any

__all__ = ["mlp_model", "time_runs"]


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
