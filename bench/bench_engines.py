"""ONNX Runtime and OpenVINO on this machine: sessions made inside ``affinity.pinned()``
against the engine's own default binding, in one run, interleaved round by round.

The workload is :mod:`affinity.tools.workload_ort` (an MLP of 4 x 1024x1024
MatMul+Relu, batch 32, built in the process; 30 timed runs, their median), each
run a fresh process:

* ``ort defaults``: ``InferenceSession(model)`` -- ONNX Runtime sizes its pool from
  the machine's physical cores and pins it (or not) as it does;
* ``ort pinned``: the session made inside ``affinity.pinned(SPEC)`` (the plan's pool
  size and ``session.intra_op_thread_affinities``);
* ``ov defaults`` / ``ov pinned``: the same for OpenVINO's ``compile_model``.

Each round runs every variant once, the order rotated by one each round.
``python bench/bench_engines.py --rounds 5`` writes ``bench/engines.json``;
:func:`section` is the "Inference engines" section of ``bench/RESULTS.md``.  Under
pytest (``make bench``) it runs 3 rounds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "engines.json"


def variants(spec: str, threads: int) -> list[tuple[str, list[str]]]:
    from affinity.tools.workload_ort import workload_cmd

    pin = ["--pin", spec, "--threads", str(threads)]
    return [("ort defaults", workload_cmd("--engine", "ort")), ("ort pinned", workload_cmd("--engine", "ort", *pin)),
            ("ov defaults", workload_cmd("--engine", "ov")), ("ov pinned", workload_cmd("--engine", "ov", *pin))]


def measure(rounds: int) -> dict[str, Any]:
    from affinity.machine.topology import Topology
    from affinity.tools.workload import recommend
    from affinity.tools.workload_ort import run_fresh

    spec, threads = recommend(Topology.from_system())
    vs = variants(spec, threads)
    load_before = os.getloadavg()[0]
    values: dict[str, list[float]] = {label: [] for label, _ in vs}
    engines: dict[str, str] = {}
    for r in range(rounds):
        for label, cmd in vs[r % len(vs):] + vs[:r % len(vs)]:
            got = run_fresh(cmd)
            values[label].append(got["inferences_per_sec"])
            engines[label.split()[0]] = got["engine"]
    return {"machine": {"cpus": len(os.sched_getaffinity(0)), "cpu": platform.processor() or platform.machine(),
                        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                        "load": [round(load_before, 1), round(os.getloadavg()[0], 1)], "engines": engines},
            "spec": spec, "threads": threads, "rounds": rounds, "unit": "inferences/sec",
            "rows": [{"label": k, "values": v} for k, v in values.items()]}


def _overlap(a: list[float], b: list[float]) -> bool:
    return min(a) <= max(b) and min(b) <= max(a)


def _ratio_line(by: dict[str, list[float]], engine: str) -> str:
    a, b = by[f"{engine} pinned"], by[f"{engine} defaults"]
    ratio = statistics.median(a) / statistics.median(b)
    lo, hi = min(a) / max(b), max(a) / min(b)
    verdict = ("the spreads overlap: no difference beyond the noise" if _overlap(a, b)
               else "the spreads do not overlap")
    return f"`{engine} pinned` against `{engine} defaults`: {ratio:.3f}x (spread {lo:.2f}x - {hi:.2f}x); {verdict}."


def section(doc: dict[str, Any] | None = None) -> list[str]:
    """The inference engines' section of RESULTS.md, from ``bench/engines.json``."""
    if doc is None:
        try:
            doc = json.loads(OUT.read_text())
        except (OSError, ValueError):
            return ["## Inference engines", "", "Not measured yet: `python bench/bench_engines.py --rounds 5`.", ""]
    m = doc["machine"]
    by = {r["label"]: r["values"] for r in doc["rows"]}
    rows = ["| variant | median inferences/s | spread (min – max) | rounds |", "|---|---:|---:|---:|"]
    rows += [f"| `{k}` | {statistics.median(v):.1f} | {min(v):.1f} – {max(v):.1f} | {len(v)} |"
             for k, v in by.items()]
    return ["## Inference engines (issue 38)", "",
            f"{', '.join(m['engines'].values())}; {m['cpus']} CPUs, {m['date']} (load average between "
            f"{m['load'][0]} and {m['load'][1]}); plan `{doc['spec']}` with {doc['threads']} threads; "
            f"{doc['rounds']} rounds, variants interleaved (order rotated each round), each run a fresh process "
            "(`bench/bench_engines.py`). Higher is better.", "", *rows, "",
            _ratio_line(by, "ort"), _ratio_line(by, "ov"), ""]


def test_engines_interleaved():
    """``make bench``: 3 interleaved rounds, written to bench/engines.json."""
    import pytest

    pytest.importorskip("onnxruntime")
    pytest.importorskip("openvino")
    doc = measure(int(os.environ.get("AFFINITY_BENCH_ENGINES_ROUNDS", "3")))
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    assert all(len(r["values"]) == doc["rounds"] and min(r["values"]) > 0 for r in doc["rows"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--print", action="store_true", help="print the section of the existing bench/engines.json")
    a = ap.parse_args(argv)
    if not a.print:
        OUT.write_text(json.dumps(measure(a.rounds), indent=1) + "\n")
    print("\n".join(section()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
