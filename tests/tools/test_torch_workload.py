"""The PyTorch workload of ``make demo`` and bench/bench_torch.py: it runs, the pinned
run is pinned the card's way (apply() before import torch), and the demo's rows say
defaults, pinned and their ratio."""

from __future__ import annotations

import io
import os
import re

import pytest

from affinity.tools.workload_torch import clean_env, demo_rows, run_fresh, workload_cmd

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")


def test_pinned_inference_and_training_report_the_plan():
    out = run_fresh(workload_cmd("--num-batches", "2", "--pin", "granularity=fine,compact,1,0", "--threads", "2"))
    assert out["images_per_sec"] > 0 and out["intra_op_threads"] == 2 and out["inter_op_threads"] == 1
    assert "[torch-intra python]" in out["bind_map"] and "[torch-inter PTThreadPool]" in out["bind_map"]
    out = run_fresh(workload_cmd("--train", "--num-batches", "2", "--pin", "granularity=fine,compact,1,0",
                                 "--threads", "1"))
    assert out["train"] and out["loader_workers"] == 2 and out["images_per_sec"] > 0


def test_defaults_are_left_alone():
    out = run_fresh(workload_cmd("--num-batches", "2"), clean_env())
    assert out["pinned"] is None and out["bind_map"] == "" and out["images_per_sec"] > 0


def test_demo_rows():
    buf = io.StringIO()
    demo_rows(lambda s: print(s, file=buf), "granularity=fine,compact,1,0", 2, batches=2, rounds=1)
    lines = buf.getvalue().splitlines()
    # the TensorFlow row's format (affinity.tools.rows): figures, spreads, the verdict
    assert lines[0] == "PyTorch small CNN:"
    assert re.fullmatch(r"  defaults: +\d+\.\d images/sec \(one run: spread unknown\)", lines[1]), lines[1]
    assert re.fullmatch(r"  pinned: +\d+\.\d images/sec \(one run: spread unknown\)", lines[2]), lines[2]
    assert lines[3].startswith("  pinned / defaults: ") and lines[3].endswith("(1 round: a verdict needs 3)")
    assert lines[4].startswith("  (figures: geometric means of the runs")
    assert "(not pinned)" in lines[5] and "granularity=fine,compact,1,0" in lines[5]
