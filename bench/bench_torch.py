"""PyTorch on this machine: affinity against what a PyTorch user would otherwise do,
in one run, interleaved round by round.

Inference (the small CNN of :mod:`affinity.tools.workload_torch`, batch 32, 64x64
images), each run a fresh process:

* ``torch defaults``: nothing set;
* ``OMP_PROC_BIND/OMP_PLACES by hand``: ``OMP_PROC_BIND=close OMP_PLACES=cores``
  (libgomp places its own team; it also pins the main thread as it loads);
* ``taskset``: ``taskset -c <the plan's CPUs>`` around the command;
* ``affinity apply()``: ``affinity.apply(SPEC)`` then ``import torch`` (the card's line);
* ``affinity run``: ``affinity run SPEC -- python ...``.

Training, a DataLoader of 2 worker processes feeding SGD steps:

* ``train: torch defaults`` against ``train: affinity layout``
  (``apply(SPEC, dataloader_workers=2)`` before ``import torch``).

Each round runs every variant once, the order rotated by one each round; a
variant's values are its images/sec per round.  ``python bench/bench_torch.py
--rounds 5`` writes ``bench/torch.json`` (``--append`` adds its rounds to
those there); :func:`section` turns it into the
PyTorch section of ``bench/RESULTS.md`` (``bench/report.py`` calls it).  Under
pytest (``make bench``) it runs 3 rounds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "torch.json"
BATCHES = "40"


def _recommended() -> tuple[str, int]:
    from affinity.machine.topology import Topology
    from affinity.tools.workload import recommend

    return recommend(Topology.from_system())


def variants(spec: str, threads: int) -> list[tuple[str, list[str], dict[str, str]]]:
    """(label, command, extra environment) of every variant, in the base order."""
    from affinity.planning.planner import plan
    from affinity.cpulist import format_list
    from affinity.machine.topology import Topology
    from affinity.tools.workload_torch import workload_cmd

    p = plan(spec, threads=threads, topology=Topology.from_system().with_allowed(os.sched_getaffinity(0)))
    infer = ["--num-batches", BATCHES]
    train = ["--train", "--loader-workers", "2", "--num-batches", "20"]
    pin = ["--pin", spec, "--threads", str(threads)]
    return [
        ("torch defaults", workload_cmd(*infer), {}),
        ("OMP_PROC_BIND/OMP_PLACES by hand", workload_cmd(*infer), {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}),
        ("taskset", ["taskset", "-c", format_list(p.union), *workload_cmd(*infer)], {}),
        ("affinity apply()", workload_cmd(*infer, *pin), {}),
        ("affinity run", [sys.executable, "-m", "affinity", "run", spec, "-t", str(threads), "--",
                          *workload_cmd(*infer)], {}),
        ("train: torch defaults", workload_cmd(*train), {}),
        ("train: affinity layout", workload_cmd(*train, *pin), {}),
    ]


def measure(rounds: int) -> dict[str, Any]:
    """Every variant once per round, the order rotated each round."""
    from affinity.tools.workload_torch import clean_env, run_fresh

    spec, threads = _recommended()
    vs = variants(spec, threads)
    load_before = os.getloadavg()[0]
    values: dict[str, list[float]] = {label: [] for label, _, _ in vs}
    for r in range(rounds):
        order = vs[r % len(vs):] + vs[:r % len(vs)]
        for label, cmd, extra in order:
            values[label].append(run_fresh(cmd, clean_env(extra))["images_per_sec"])
    import torch

    return {"machine": {"cpus": len(os.sched_getaffinity(0)), "cpu": platform.processor() or platform.machine(),
                        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                        "torch": torch.__version__,
                        "load": [round(load_before, 1), round(os.getloadavg()[0], 1)]},
            "spec": spec, "threads": threads, "rounds": rounds, "unit": "images/sec",
            "rows": [{"label": k, "values": v} for k, v in values.items()]}


def _versus(rows: list[dict[str, Any]], label: str, ref_label: str) -> Any:
    """Row ``label`` against the reference, round by round (the variants of a round ran
    one after another: paired), as every face of the package says a speed-up
    (:func:`affinity.tuning.verdict.paired`; the rows after the reference share the level)."""
    from affinity.tuning.verdict import paired

    by = {r["label"]: r["values"] for r in rows}
    return paired(by[ref_label], by[label], "maximize", max_rounds=None, family=max(1, len(rows) - 1))


def _table(rows: list[dict[str, Any]], ref_label: str) -> list[str]:
    from affinity.tuning.verdict import geomean

    out = ["| variant | images/s (geometric mean) | spread (min – max) | against ◆ | rounds |", "|---|---:|---:|---|---:|"]
    for r in rows:
        v, ref = r["values"], r["label"] == ref_label
        said = "◆" if ref else _versus(rows, r["label"], ref_label).text
        out.append(f"| `{r['label']}`{' ◆' if ref else ''} | {geomean(v):.1f} | {min(v):.1f} – {max(v):.1f} | "
                   f"{said} | {len(v)} |")
    return out


def _sentence(rows: list[dict[str, Any]], ours: str, ref_label: str) -> str:
    return f"`{ours}` against `{ref_label}`: {_versus(rows, ours, ref_label).text}."


def section(doc: dict[str, Any] | None = None) -> list[str]:
    """The PyTorch section of RESULTS.md, from ``bench/torch.json``."""
    if doc is None:
        try:
            doc = json.loads(OUT.read_text())
        except (OSError, ValueError):
            return ["## PyTorch", "", "Not measured yet: `python bench/bench_torch.py --rounds 5`.", ""]
    m = doc["machine"]
    infer = [r for r in doc["rows"] if not r["label"].startswith("train")]
    train = [r for r in doc["rows"] if r["label"].startswith("train")]
    return ["## PyTorch (issue 20)", "",
            f"torch {m['torch']} (CPU build, its bundled libgomp), {m['cpus']} CPUs, {m['date']}"
            + (f" (load average between {m['load'][0]} and {m['load'][1]}: the machine is shared, "
               "and pinned threads cannot move away from CPUs others keep busy)" if "load" in m else "")
            + "; plan "
            f"`{doc['spec']}` with {doc['threads']} threads; {doc['rounds']} rounds, variants interleaved (order "
            "rotated each round), each run a fresh process (`bench/bench_torch.py`). Higher is better; a figure is "
            "the geometric mean of the rounds, and a speed-up the ratio of two figures with its interval, said "
            "faster or slower only when the interval excludes 1 (`affinity/tuning/verdict.py`, as the demo and "
            "`affinity tune` say it).", "",
            "### Inference, small CNN (batch 32, 64x64)", "", *_table(infer, "torch defaults"), "",
            _sentence(infer, "affinity apply()", "torch defaults") + " " +
            _sentence(infer, "affinity apply()", "OMP_PROC_BIND/OMP_PLACES by hand"), "",
            "### Training with a DataLoader of 2 workers", "", *_table(train, "train: torch defaults"), "",
            _sentence(train, "train: affinity layout", "train: torch defaults"), ""]


def test_torch_interleaved():
    """``make bench``: 3 interleaved rounds, written to bench/torch.json."""
    import pytest

    pytest.importorskip("torch")
    doc = measure(int(os.environ.get("AFFINITY_BENCH_TORCH_ROUNDS", "3")))
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    assert all(len(r["values"]) == doc["rounds"] and min(r["values"]) > 0 for r in doc["rows"])


def _appended(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new``'s rounds after ``old``'s (same plan and variants), the load range of both."""
    if (old["spec"], old["threads"], [r["label"] for r in old["rows"]]) != \
            (new["spec"], new["threads"], [r["label"] for r in new["rows"]]):
        raise SystemExit("bench/torch.json holds another plan or other variants: run without --append")
    for o, n in zip(old["rows"], new["rows"]):
        n["values"] = o["values"] + n["values"]
    loads = old["machine"].get("load", []) + new["machine"]["load"]
    new["machine"]["load"] = [min(loads), max(loads)]
    new["rounds"] = old["rounds"] + new["rounds"]
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--print", action="store_true", help="print the section of the existing bench/torch.json")
    ap.add_argument("--append", action="store_true", help="add the rounds to those of bench/torch.json")
    a = ap.parse_args(argv)
    if not a.print:
        doc = measure(a.rounds)
        if a.append and OUT.exists():
            doc = _appended(json.loads(OUT.read_text()), doc)
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print("\n".join(section()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
