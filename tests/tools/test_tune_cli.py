"""``affinity tune`` for real on this machine: the TensorFlow workload of ``affinity
bench``, a fake workload whose throughput follows its placement (fast), Ctrl-C and
resume, and every bad input with its exit status (2 usage, 1 failure)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

TUNE = [sys.executable, "-m", "affinity", "tune"]
FAKE = Path(__file__).with_name("tune_fake_workload.py")


@pytest.fixture
def fake_cmd():
    """The command line of the fake workload, with extra arguments."""
    return lambda *args: [sys.executable, str(FAKE), *args]


def tune(args, tmp_path, *, timeout=240, **kw):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(TUNE + list(args), capture_output=True, text=True, timeout=timeout, env=env, **kw)


@pytest.mark.slow
@pytest.mark.tf
def test_tune_the_tensorflow_workload_of_affinity_bench(tmp_path):
    r = tune(["--budget", "3", "--repeats", "1", "--top", "1", "--json", "--storage", "none", "--",
              sys.executable, "-m", "affinity", "bench", "--model", "matmul", "--num-batches", "3"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert len(out["trials"]) == 3 and all(t["state"] == "complete" for t in out["trials"])
    assert out["baseline"] > 0 and out["best_value"] > 0
    # what it reports holds together: the best is one of the trials, the speed-up is its
    # value over the defaults', and the exported team is the best configuration's
    assert out["best"] in [t["config"] for t in out["trials"]]
    assert out["speedup"] == pytest.approx(out["best_value"] / out["baseline"])
    if "threads" in out["best"]:
        assert out["environment"]["OMP_NUM_THREADS"] == str(out["best"]["threads"])
    assert out["run_line"].startswith("affinity run ") and "affinity bench --model matmul" in out["run_line"]
    assert out["environment"]["OMP_NUM_THREADS"] and out["verdict"]
    assert [row["label"] for row in out["remeasured"]][0].startswith("defaults")


def test_the_whole_flow_on_a_fake_workload(tmp_path, fake_cmd):
    plot = tmp_path / "trials.svg"
    r = tune(["--budget", "4", "--repeats", "2", "--top", "1", "--plot", str(plot), "--"] + fake_cmd(), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    for words in ("defaults (CMD as it is)", "#1 ", "best vs defaults:", "best as an affinity run line:",
                  "affinity run ", "environment:", "export OMP_NUM_THREADS=", "in Python:", "affinity.apply(",
                  f"plot: {plot}"):
        assert words in out, (words, out)
    assert "4/4" in r.stderr and "re-measuring, round 2 of 2" in r.stderr
    assert plot.read_text().startswith("<svg") and "<circle" in plot.read_text()
    assert (tmp_path / "cache" / "affinity" / "tune.db").exists()  # the default storage


def test_instances_are_summed_and_other_names_reach_the_command(tmp_path, fake_cmd):
    """Two instances of 1 thread: 100 + 100; ``rate`` is substituted for {rate}."""
    r = tune(["--budget", "2", "--repeats", "1", "--top", "2", "--json", "--storage", "none",
              "--param", "instances=2", "--param", "threads=1", "--param", "rate=1,3", "--"]
             + fake_cmd("--rate", "{rate}"), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    values = {t["config"]["rate"]: t["value"] for t in out["trials"]}
    assert values == {1: pytest.approx(200.0), 3: pytest.approx(600.0)}
    assert out["best"]["rate"] == 3 and "rate" not in out["environment"]  # a placeholder, not a variable
    assert "--rate 3" in out["run_line"] and "--instances 2" in out["run_line"]


def test_a_json_metric_a_pattern_and_wall_time(tmp_path, fake_cmd):
    base = ["--budget", "1", "--repeats", "1", "--top", "1", "--json", "--storage", "none",
            "--param", "threads=1,2"]
    r = tune(base + ["--"] + fake_cmd("--json"), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["best_value"] == pytest.approx(200.0)
    r = tune(base + ["--metric", r'"team": (\d+)', "--"] + fake_cmd("--json"), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["best_value"] == 2.0
    r = tune(base + ["--time", "--"] + fake_cmd("--no-metric"), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["direction"] == "minimize" and out["best_value"] > 0


def test_ctrl_c_keeps_the_finished_trials_and_the_same_command_resumes(tmp_path, fake_cmd):
    db = tmp_path / "study.db"
    args = ["--budget", "40", "--repeats", "1", "--top", "1", "--storage", f"sqlite:///{db}", "--"] + \
        fake_cmd("--sleep", "0.15")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    p = subprocess.Popen(TUNE + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _finished(db) < 2:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err[-2000:]
    assert "interrupted" in err and f"kept in sqlite:///{db}" in err
    kept = _finished(db)
    assert kept >= 2
    r = tune(["--budget", str(kept + 1)] + args[2:], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming, {kept} of {kept + 1} trials already done" in r.stderr
    assert _finished(db) == kept + 1


def _finished(db) -> int:
    if not db.exists():
        return 0
    try:
        con = sqlite3.connect(db)
        try:
            return con.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return 0


@pytest.mark.parametrize("args, words", [
    (["--budget", "0"], "budget must be a whole number >= 1"),
    (["--param", "threads="], "--param 'threads=': empty choice"),
    (["--param", "threads=1,,2"], "empty choice"),
    (["--param", "threads=0,1"], "'threads' takes positive integers"),
    (["--param", "membind=far"], "'membind' takes none, local, interleave"),
    (["--param", "nothing"], "expected NAME=v1,v2"),
    (["--metric", "(["], "not a regular expression"),
    (["--repeats", "0"], "--repeats and --top must be >= 1"),
    (["--plot", "trials.pdf"], "write .svg or .png"),
    (["--storage", "tune.db"], "expected a URL"),
])
def test_usage_errors_exit_2_naming_the_problem(tmp_path, fake_cmd, args, words):
    r = tune(args + ["--"] + fake_cmd(), tmp_path)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr


def test_more_usage_errors(tmp_path, fake_cmd):
    r = tune(["--budget", "2"], tmp_path)
    assert r.returncode == 2 and "no command" in r.stderr
    r = tune(["--metric", "x", "--time", "--"] + fake_cmd(), tmp_path)
    assert r.returncode == 2 and "not allowed with" in r.stderr
    r = tune(["--storage", f"sqlite:///{tmp_path / 'no' / 'such.db'}", "--"] + fake_cmd(), tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr


@pytest.mark.parametrize("extra, words", [
    (["--no-metric"], "no metric in the output"),
    (["--fail"], "fails as it is (exit status 3)"),
    (["--fail-placed"], "every trial failed (2): first"),
])
def test_failures_exit_1_naming_the_problem(tmp_path, fake_cmd, extra, words):
    r = tune(["--budget", "2", "--storage", "none", "--"] + fake_cmd(*extra), tmp_path)
    assert r.returncode == 1, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr


def test_a_storage_that_is_not_a_study_is_an_error_and_left_untouched(tmp_path, fake_cmd):
    f = tmp_path / "results.txt"
    f.write_text("precious\n")
    r = tune(["--budget", "2", "--storage", f"sqlite:///{f}", "--"] + fake_cmd(), tmp_path)
    assert r.returncode == 1 and "is not a study" in r.stderr
    assert f.read_text() == "precious\n"
