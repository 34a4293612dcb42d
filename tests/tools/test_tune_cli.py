"""``affinity tune`` for real on this machine: the TensorFlow workload of ``affinity
bench`` (slow), a fake workload whose throughput follows its placement (fast),
copies and split work, the study's key, Ctrl-C and resume, signals and concurrent
tuners, and every bad input with its exit status (2 usage, 1 failure)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from affinity.tools.tune_runner import ran_out_of_memory

TUNE = [sys.executable, "-m", "affinity", "tune"]
FAKE = Path(__file__).with_name("tune_fake_workload.py")


@pytest.fixture
def fake_cmd():
    """The command line of the fake workload, with extra arguments."""
    return lambda *args: [sys.executable, str(FAKE), *args]


def _env(tmp_path, **more):
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "TF_CPP_MIN_LOG_LEVEL": "3", **more}


def tune(args, tmp_path, *, timeout=240, env=None, **kw):
    return subprocess.run(TUNE + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env or _env(tmp_path), **kw)


@pytest.mark.slow
@pytest.mark.tf
def test_the_tuned_pool_sizes_reach_the_tensorflow_workload(tmp_path):
    """Each trial's ``intra`` reaches TensorFlow: the metric is the intra-op pool size the
    workload reports, so each trial's value must be its own configuration's count."""
    r = tune(["--budget", "2", "--repeats", "1", "--top", "1", "--json", "--storage", "none",
              "--param", "intra=1,2", "--param", "inter=1", "--metric", r'"intra_op_threads": (\d+)', "--",
              sys.executable, "-m", "affinity", "bench", "--model", "matmul", "--num-batches", "2", "--json"],
             tmp_path, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert {t["config"]["intra"]: t["value"] for t in out["trials"]} == {1: 1.0, 2: 2.0}
    assert out["best"] == {"intra": 2, "inter": 1} and out["remeasured"][1]["values"] == [2.0]
    assert "TF_NUM_INTRAOP_THREADS=2" in out["run_line"] and out["environment"]["TF_NUM_INTEROP_THREADS"] == "1"


def test_the_whole_flow_on_a_fake_workload(tmp_path, fake_cmd):
    plot = tmp_path / "trials.svg"
    r = tune(["--budget", "4", "--repeats", "2", "--top", "1", "--plot", str(plot), "--"] + fake_cmd(), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    for words in ("defaults (CMD as it is)", "#1 ", "best vs defaults:", "best as an affinity run line:",
                  "affinity run ", "environment:", "export OMP_NUM_THREADS=", "in Python:", "affinity.apply(",
                  f"plot: {plot}"):
        assert words in out, (words, out)
    assert "4/4" in r.stderr and "re-measuring, round 2 (at most 2)" in r.stderr
    assert plot.read_text().startswith("<svg") and "<circle" in plot.read_text()
    assert (tmp_path / "cache" / "affinity" / "tune.db").exists()  # the default storage


def test_instances_are_copies_measured_per_copy_unless_the_work_splits(tmp_path, fake_cmd):
    """Two instances of 1 thread print 100 each: as copies the value is one copy's (100),
    labelled as such; with --split it is their sum (200).  ``rate`` is a placeholder."""
    base = ["--budget", "2", "--repeats", "1", "--top", "2", "--storage", "none",
            "--param", "instances=2", "--param", "threads=1", "--param", "rate=1,3", "--"]
    r = tune(["--json"] + base + fake_cmd("--rate", "{rate}"), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert {t["config"]["rate"]: t["value"] for t in out["trials"]} == {1: pytest.approx(100.0), 3: pytest.approx(300.0)}
    assert out["split"] is False and any("copies" in n for n in out["notes"])
    assert out["best"]["rate"] == 3 and "rate" not in out["environment"]  # a placeholder, not a variable
    assert "--rate 3" in out["run_line"] and "--instances 2" in out["run_line"]
    assert out["remeasured"][1]["per_instance"] == [[pytest.approx(300.0), pytest.approx(300.0)]]
    r = tune(["--split", "--json"] + base + fake_cmd("--rate", "{rate}"), tmp_path)
    out = json.loads(r.stdout)
    assert {t["config"]["rate"]: t["value"] for t in out["trials"]} == {1: pytest.approx(200.0), 3: pytest.approx(600.0)}
    r = tune(base + fake_cmd("--rate", "{rate}"), tmp_path)  # the text labels the copies
    assert "(2 copies: 2 x 300.0, the value is one copy's)" in r.stdout, r.stdout


def test_copies_of_sleep_are_no_speed_up(tmp_path):
    """The issue's own case: two copies of 'sleep 1' are not twice as fast."""
    r = tune(["--time", "--storage", "none", "--budget", "2", "--repeats", "2", "--top", "1",
              "--param", "instances=1,2", "--json", "--", "sleep", "1"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert "faster" not in out["verdict"] and out["speedup"] < 1.2, out["verdict"]  # was "1.68x faster"
    assert [t["value"] > 0.8 for t in out["trials"]] == [True, True]  # the time of a job, not time / copies


def test_a_command_that_takes_its_share_splits_the_work(tmp_path):
    script = tmp_path / "share.py"
    script.write_text("import os\nk = int(os.environ.get('AFFINITY_NUM_INSTANCES', '1'))\n"
                      "print(f'{100 / k} images/sec')\n")
    r = tune(["--storage", "none", "--budget", "2", "--repeats", "1", "--top", "1", "--param", "instances=1,2",
              "--param", "threads=1", "--json", "--", sys.executable, str(script)], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["split"] is True and any("share.py reads AFFINITY_NUM_INSTANCES" in n for n in out["notes"])
    assert [t["value"] for t in out["trials"]] == [pytest.approx(100.0)] * 2  # 100 or 50 + 50


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


def test_minimize_a_printed_metric_where_lower_is_better(tmp_path):
    """A latency is better lower: with --minimize the best is the lowest, and the table
    says so (the audit saw 50 ms reported as "5.00x faster" than 10 ms)."""
    lat = tmp_path / "lat.py"
    lat.write_text('import os; print("latency: %s ms" % ("50.0" if os.environ.get("OMP_NUM_THREADS") == "1" '
                   'else "10.0"))\n')
    base = ["--storage", "none", "--metric", r"latency: ([\d.]+) ms", "--param", "threads=1,2", "--repeats", "3",
            "-q", "--minimize", "--", sys.executable, str(lat)]
    r = tune(base, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    slower = next(ln for ln in r.stdout.splitlines() if "5.00x slower" in ln)
    assert "lower is better" in r.stdout and "threads=1" in slower
    r = tune(base[:-3] + ["--json", "--", sys.executable, str(lat)], tmp_path)
    out = json.loads(r.stdout)
    assert out["direction"] == "minimize" and out["best"]["threads"] == 2 and out["best_value"] == 10.0


def test_ctrl_c_keeps_the_finished_trials_and_the_same_command_resumes(tmp_path, fake_cmd):
    db = tmp_path / "study.db"
    args = ["--budget", "40", "--repeats", "1", "--top", "1", "--storage", f"sqlite:///{db}", "--"] + \
        fake_cmd("--sleep", "0.15")
    p = subprocess.Popen(TUNE + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _finished(db) < 2:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err[-2000:]
    assert "interrupted" in err and f"kept in sqlite:///{db}" in err
    kept = _finished(db)
    assert kept >= 2
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0] == 0  # told, never left
    con.close()
    r = tune(["--budget", str(kept + 1)] + args[2:], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"resuming, {kept} of {kept + 1} trials already done (study " in r.stderr
    assert "the same command, files, environment and machine" in r.stderr
    assert _finished(db) == kept + 1
    assert r.stdout.startswith(f"affinity tune: {kept + 1} trials of ")  # the interrupted one is not counted


def test_a_study_is_keyed_by_the_commands_files_and_environment(tmp_path):
    """The same words with another script content or another N do not resume (and say why)."""
    script = tmp_path / "mm.py"
    script.write_text("import os\nprint(int(os.environ['N']) * 1.0, 'images/sec')\n")
    args = ["--budget", "2", "--repeats", "1", "--top", "1", "--param", "threads=1,2", "--storage",
            f"sqlite:///{tmp_path / 's.db'}", "--", sys.executable, str(script)]
    r = tune(args, tmp_path, env=_env(tmp_path, N="100"))
    assert r.returncode == 0 and "resuming" not in r.stderr, r.stderr
    r = tune(args, tmp_path, env=_env(tmp_path, N="100"))
    assert "resuming, 2 of 2 trials already done" in r.stderr
    r = tune(args, tmp_path, env=_env(tmp_path, N="1200"))
    assert "resuming," not in r.stderr and "(variables changed: N): a new study" in r.stderr, r.stderr
    assert "1,200" in r.stdout  # readable values, not 1.2e+03
    script.write_text(script.read_text() + "# changed\n")
    r = tune(args, tmp_path, env=_env(tmp_path, N="100"))
    assert "resuming," not in r.stderr and "(mm.py changed): a new study" in r.stderr, r.stderr


def test_an_exhausted_space_and_infeasible_trials_are_said(tmp_path, fake_cmd):
    r = tune(["--budget", "20", "--repeats", "1", "--top", "1", "--storage", "none", "--param", "threads=1",
              "--param", "env:FAIL=0,1", "--"] + fake_cmd("--fail-if-env", "FAIL"), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "affinity tune: 2 trials of" in r.stdout
    assert "the space has 2 configurations: all tried, before the budget of 20" in r.stdout
    assert "infeasible trials (1):" in r.stdout and "threads=1 env:FAIL=1: RuntimeError: exit status 5" in r.stdout


def test_a_run_killed_for_memory_is_said_and_raised_as_memory_error(tmp_path, fake_cmd):
    """A command killed by SIGKILL (the out-of-memory killer's signal) fails its trial as a
    MemoryError, which the sampler reads (the next trials need less memory)."""
    r = tune(["--budget", "2", "--repeats", "1", "--top", "1", "--storage", "none", "--param", "threads=1",
              "--param", "env:BIG=0,1", "--"] + fake_cmd("--oom-if-env", "BIG"), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "threads=1 env:BIG=1: MemoryError: exit status -9, out of memory" in r.stdout, r.stdout


@pytest.mark.parametrize("status, output, oom", [
    (-9, "", True), (137, "--- instance 0 ---\n", True), (1, "Traceback ...\nMemoryError\n", True),
    (1, "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
    (134, "terminate called after throwing an instance of 'std::bad_alloc'", True),
    (1, "ValueError: bad shape", False), (-15, "", False), (0, "out of memory, but it ran", False)])
def test_what_counts_as_out_of_memory(status, output, oom):
    assert ran_out_of_memory(status, output) is oom


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
    (["--param", "threadz=1,2"], "unknown parameter 'threadz'; did you mean 'threads'?"),
    (["--param", "MY_VAR=1,2"], "an environment variable is --param env:MY_VAR=..."),
    (["--param", "env:1X=1"], "is not an environment variable name"),
    (["--timeout", "-5"], "--timeout must be a number of seconds > 0"),
    (["--minimize"], "--minimize: the default metric is a throughput"),
    (["--plot", str(Path("/no/such/dir/p.svg"))], "does not exist or is not writable"),
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
    (["--fail"], "fails as it is (exit status 3: failing as asked)"),
    (["--fail-placed"], "every trial failed (2): first"),
])
def test_failures_exit_1_naming_the_problem(tmp_path, fake_cmd, extra, words):
    r = tune(["--budget", "2", "--storage", "none", "--"] + fake_cmd(*extra), tmp_path)
    assert r.returncode == 1, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr


def test_a_failed_run_is_said_by_its_reason_on_one_line(tmp_path):
    """The audit saw "output ends: Traceback (most recent call last):" where the reason
    belonged, a multi-line "every trial failed", and "Its output ends:" over nothing."""
    f2 = tmp_path / "f2.py"
    f2.write_text('import os\nif os.environ.get("OMP_NUM_THREADS") == "1":\n'
                  '    raise ValueError("this config is unsupported")\nprint("50 images/sec")\n')
    r = tune(["--storage", "none", "--param", "threads=1,2", "--repeats", "1", "-q", "--", sys.executable, str(f2)],
             tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "  threads=1: RuntimeError: exit status 1: ValueError: this config is unsupported\n" in r.stdout
    r = tune(["--storage", "none", "-q", "--param", "threads=1", "--param", "env:X=1,2", "--", sys.executable, str(f2)],
             tmp_path)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.rstrip().endswith("exit status 1: ValueError: this config is unsupported")
    r = tune(["--storage", "none", "--", "no-such-command-here"], tmp_path)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "; no output)" in r.stderr, r.stderr


def test_a_study_with_more_trials_than_the_budget_says_nothing_new_runs(tmp_path, fake_cmd):
    """The audit saw "resuming, 6 of 2 trials already done"."""
    args = ["--repeats", "1", "--top", "1", "-q", "--storage", f"sqlite:///{tmp_path / 'b.db'}",
            "--param", "threads=1,2", "--param", "blocktime=0,1", "--"] + fake_cmd()
    assert tune(["--budget", "3"] + args, tmp_path).returncode == 0
    r = tune(["--budget", "2"] + args, tmp_path)
    assert r.returncode == 0 and "resuming, 3 trials already done, more than the budget of 2: nothing new to try " \
        "(study" in r.stderr, r.stderr


def test_the_help_lists_every_known_parameter(tmp_path):
    from affinity.tuning.space import KNOWN

    r = tune(["--help"], tmp_path)
    assert r.returncode == 0 and all(name in " ".join(r.stdout.split()) for name in KNOWN)


def test_another_seed_on_a_stored_study_names_the_option(tmp_path, fake_cmd):
    args = ["--budget", "1", "--repeats", "1", "--top", "1", "-q", "--storage", f"sqlite:///{tmp_path / 's.db'}",
            "--param", "threads=1,2", "--seed", "5", "--"] + fake_cmd()
    assert tune(args, tmp_path).returncode == 0
    args[args.index("5")] = "6"
    r = tune(args, tmp_path)
    assert r.returncode == 2 and "resume it with --seed 5 (or no --seed)" in r.stderr, r.stderr


MARKS = "import sys\nopen(sys.argv[1], 'a').write('ran\\n')\nprint('50 images/sec')\n"


def test_what_needs_no_run_is_refused_before_cmd_runs(tmp_path):
    """The audit saw --from nosuch, another --seed and another space refused only after
    the defaults' run, and instances=PUs+1 fail as 'every trial failed' (exit 1)."""
    script, marks = tmp_path / "m.py", tmp_path / "ran.txt"
    script.write_text(MARKS)
    base = ["--budget", "1", "--repeats", "1", "--top", "1", "-q", "--storage", f"sqlite:///{tmp_path / 'p.db'}",
            "--study", "x"]
    cmd = ["--", sys.executable, str(script), str(marks)]
    assert tune(base + ["--seed", "5", "--param", "threads=1,2"] + cmd, tmp_path).returncode == 0
    marks.unlink()
    k = len(os.sched_getaffinity(0)) + 1
    for extra, words in [(["--from", "nosuch", "--param", "threads=1,2"], "--from nosuch: no study 'nosuch'"),
                         (["--seed", "6", "--param", "threads=1,2"], "--seed 6: study x was started with seed 5"),
                         (["--param", "threads=1"], "study 'x' in sqlite"),
                         (["--study", "y", "--param", f"instances=1,{k}"], f"--param instances={k}: cannot give")]:
        r = tune(base + extra + cmd, tmp_path)
        assert r.returncode == 2 and words in r.stderr and not marks.exists(), (extra, r.stderr)


def test_an_explicit_from_always_says_what_it_did(tmp_path):
    """The audit saw --from ignored without a word: none of its configurations in the
    space, or the study resumed."""
    script = tmp_path / "w.py"
    script.write_text("print('50 images/sec')\n")
    base = ["--repeats", "1", "--top", "1", "--json", "--storage", f"sqlite:///{tmp_path / 'f.db'}"]
    cmd = ["--", sys.executable, str(script)]
    assert tune(base + ["--study", "a", "--budget", "2", "--param", "threads=1,2"] + cmd, tmp_path).returncode == 0
    r = tune(base + ["--study", "b", "--budget", "1", "--param", "blocktime=0", "--from", "a"] + cmd, tmp_path)
    assert json.loads(r.stdout)["warm_start"] == \
        "--from a: nothing used: study a has no completed configuration in this space", r.stderr
    r = tune(base + ["--study", "a", "--budget", "2", "--param", "threads=1,2", "--from", "b"] + cmd, tmp_path)
    assert json.loads(r.stdout)["warm_start"] == \
        "--from b: nothing used: the study resumes (a warm start only begins a new study)", r.stderr


def test_a_storage_that_is_not_a_study_is_an_error_and_left_untouched(tmp_path, fake_cmd):
    f = tmp_path / "results.txt"
    f.write_text("precious\n")
    r = tune(["--budget", "2", "--storage", f"sqlite:///{f}", "--"] + fake_cmd(), tmp_path)
    assert r.returncode == 1 and "is not a study" in r.stderr
    assert f.read_text() == "precious\n"


def test_a_png_plot_without_pillow_is_refused_before_the_search(tmp_path):
    ran = tmp_path / "ran"
    code = ("import sys; sys.modules['PIL'] = None; sys.modules['PIL.Image'] = None\n"
            "from affinity.tools.cli import main\n"
            f"sys.exit(main(['tune', '--plot', {str(tmp_path / 'p.png')!r}, '--storage', 'none', '--', "
            f"'touch', {str(ran)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env(tmp_path))
    assert r.returncode == 2 and "a PNG needs Pillow" in r.stderr and "kmp-affinity[picture]" in r.stderr, r.stderr
    assert not ran.exists()  # the command never ran


def test_pruned_trials_are_never_finalists_and_the_final_table_is_full_length(tmp_path, fake_cmd):
    """Multi-fidelity: a trial whose values as it goes are worse than the median of the
    completed ones stops early (pruned); the finalists are completed trials only, re-run
    to the end."""
    r = tune(["--budget", "6", "--seed", "0", "--repeats", "1", "--top", "3", "--json", "--storage", "none",
              "--param", "threads=1", "--param", "rate=1,2,3,4,5,6", "--"]
             + fake_cmd("--rate", "{rate}", "--steps", "6", "--step-sleep", "0.1"), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    pruned = [t for t in out["trials"] if t["state"] == "pruned"]
    done = [t for t in out["trials"] if t["state"] == "complete"]
    assert pruned and len(pruned) + len(done) == 6, out["trials"]
    assert all(t["error"].startswith("pruned at step") for t in pruned)
    best_done = max(t["value"] for t in done)
    assert all(t["config"]["rate"] * 100 < best_done for t in pruned)  # only ones that could not win
    finalists = [row["config"] for row in out["remeasured"][1:]]
    assert not any(t["config"] in finalists for t in pruned)
    assert all(row["values"] == [pytest.approx(100.0 * row["config"]["rate"])] for row in out["remeasured"][1:])
    r = tune(["--no-prune", "--budget", "6", "--seed", "0", "--repeats", "1", "--top", "1", "--json",
              "--storage", "none", "--param", "threads=1", "--param", "rate=1,2,3,4,5,6", "--"]
             + fake_cmd("--rate", "{rate}", "--steps", "6", "--step-sleep", "0.1"), tmp_path)
    again = json.loads(r.stdout)
    assert all(t["state"] == "complete" for t in again["trials"]) and again["best"] == out["best"]


def test_a_warm_start_uses_only_this_machines_studies_of_the_command(tmp_path):
    """Study A (this machine) found rate=2 best, study B (marked as another machine's)
    rate=3: a new study of the same command (another BEST) starts from A's best, says so,
    and never from B's; --from B is refused."""
    import optuna

    script = tmp_path / "peak.py"
    script.write_text("import os, sys\nr, b = int(sys.argv[1]), int(os.environ['BEST'])\n"
                      "print(1000 - 100 * abs(r - b), 'images/sec')\n")
    url = f"sqlite:///{tmp_path / 'w.db'}"
    args = ["--budget", "4", "--repeats", "1", "--top", "1", "--json", "--param", "threads=1", "--param",
            "rate=1,2,3,4", "--storage", url, "--", sys.executable, str(script), "{rate}"]  # all 4: best known
    a = json.loads(tune(args, tmp_path, env=_env(tmp_path, BEST="2")).stdout)
    b = json.loads(tune(args, tmp_path, env=_env(tmp_path, BEST="3")).stdout)
    assert a["best"]["rate"] == 2 and b["best"]["rate"] == 3 and a["study_name"] != b["study_name"]
    optuna.load_study(study_name=b["study_name"], storage=url).set_user_attr("affinity.machine_id", "elsewhere")
    r = tune(args, tmp_path, env=_env(tmp_path, BEST="4"))
    out = json.loads(r.stdout)
    assert out["warm_start"].startswith(f"warm start from study {a['study_name']} (this machine, 4 trials; "
                                        f"variables changed: BEST)"), out["warm_start"]
    assert out["trials"][0]["config"]["rate"] == 2  # A's best first; B's (3) never came from B
    assert f"warm start from study {b['study_name']}" not in r.stderr + out["warm_start"]  # "not resuming" may name it
    r = tune(["--from", b["study_name"]] + args, tmp_path, env=_env(tmp_path, BEST="1"))
    assert r.returncode == 2 and "made on another machine" in r.stderr, r.stderr


SLOW_UNDER_LAUNCHER = """import os, sys, time
pids = sys.argv[1]
if "KMP_AFFINITY" not in os.environ:  # the defaults' run: quick
    print("100 images/sec")
    sys.exit(0)
open(os.path.join(pids, str(os.getpid())), "w").close()
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL])
def test_killing_the_tuner_leaves_no_process_and_no_folder(tmp_path, sig):
    """The running trial's launcher and both its instances go with the tuner, whatever
    the signal (kill -9: by the parent-death signal); its folder is removed (kill -9: by
    the next tuner)."""
    script, pids = tmp_path / "slow.py", tmp_path / "pids"
    script.write_text(SLOW_UNDER_LAUNCHER)
    pids.mkdir()
    args = ["--budget", "1", "--storage", "none", "--param", "instances=2", "--param", "threads=1", "--",
            sys.executable, str(script), str(pids)]
    p = subprocess.Popen(TUNE + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(list(pids.iterdir())) < 2:
        time.sleep(0.1)
    started = [int(f.name) for f in pids.iterdir()]
    assert len(started) == 2, p.communicate(timeout=30)
    folders = list(Path(tempfile.gettempdir()).glob(f"affinity-tune-{p.pid}-*"))
    assert folders  # the trial's log folder is there while it runs
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert p.returncode == {signal.SIGKILL: -9, signal.SIGINT: 130}.get(sig, 128 + sig), err
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(pid) for pid in started):
        time.sleep(0.1)
    assert not [pid for pid in started if _alive(pid)]
    if sig == signal.SIGKILL:
        assert all(f.exists() for f in folders)  # nobody could remove it ...
        tune(["--budget", "1", "--storage", "none", "--param", "threads=1", "--", "true", "1 images/sec"],
             tmp_path)  # ... until the next tuner starts (it fails: 'true' prints no metric)
    assert not any(f.exists() for f in folders)


def test_two_tuners_on_one_study_finish_within_the_budget(tmp_path, fake_cmd):
    db = tmp_path / "shared.db"
    args = ["--budget", "6", "--repeats", "1", "--top", "1", "--storage", f"sqlite:///{db}", "--study", "shared",
            "--param", "threads=1,2", "--param", "rate=1,2,3,4", "--"] + fake_cmd("--rate", "{rate}", "--sleep", "0.3")
    procs = [subprocess.Popen(TUNE + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env(tmp_path)) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and "Traceback" not in err and "Error" not in err, err[-3000:]
    con = sqlite3.connect(db)
    states = dict(con.execute("SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall())
    con.close()
    assert states.get("COMPLETE") == 6 and states.get("RUNNING", 0) == 0, states


def test_pruning_reads_every_instances_log_as_it_grows(tmp_path, fake_cmd):
    """Two copies write to log files: a step counts once both printed it, and a trial
    that cannot win stops there too."""
    r = tune(["--budget", "4", "--seed", "0", "--repeats", "1", "--top", "1", "--json", "--storage", "none",
              "--param", "instances=2", "--param", "threads=1", "--param", "rate=1,2,3,4", "--"]
             + fake_cmd("--rate", "{rate}", "--steps", "6", "--step-sleep", "0.1"), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    done = {t["config"]["rate"]: t["value"] for t in out["trials"] if t["state"] == "complete"}
    assert all(v == pytest.approx(100.0 * rate) for rate, v in done.items())  # one copy's, not the sum
    pruned = [t for t in out["trials"] if t["state"] == "pruned"]
    assert all(t["config"]["rate"] * 100 < max(done.values()) for t in pruned)
    assert out["best"]["rate"] == max(done)


def test_with_time_a_trial_running_twice_the_best_stops(tmp_path):
    args = ["--time", "--budget", "3", "--seed", "0", "--repeats", "1", "--top", "1", "--json", "--storage",
            "none", "--param", "threads=1", "--param", "s=0.2,0.3,6", "--", "sleep", "{s}"]
    r = tune(args, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    states = {t["config"]["s"]: (t["number"], t["state"]) for t in out["trials"]}
    first_done = min(n for n, st in states.values() if st == "complete")
    if states[6][0] > first_done:  # 6 s after a 0.2 or 0.3 s trial: it cannot win
        assert states[6][1] == "pruned" and out["trials"][states[6][0]]["error"].startswith("pruned: still running")
    assert states[0.2][1] == "complete" and out["best"]["s"] == 0.2
    r = tune([a for a in args if a != "--json"], tmp_path)  # the text says why, as --time stops a trial
    if any(st == "pruned" for _, st in states.values()):
        assert "stopped early (multi-fidelity: still running at twice the best time so far)" in r.stdout, r.stdout


def test_a_resume_reports_the_speed_up_within_the_first_runs_interval(tmp_path, fake_cmd):
    """The defaults and the finalists are measured again, side by side, on every run: a
    resumed study's speed-up falls within the interval the first run gave (the issue saw
    3.82x, then 7.63x on a resume)."""
    args = ["--budget", "4", "--repeats", "3", "--top", "1", "--json", "--storage", f"sqlite:///{tmp_path / 'r.db'}",
            "--param", "threads=1,2", "--param", "blocktime=0,1", "--"] + fake_cmd()
    first = json.loads(tune(args, tmp_path).stdout)
    second = json.loads(tune(args, tmp_path).stdout)
    assert second["study_name"] == first["study_name"] and len(second["trials"]) == 4  # resumed, nothing new
    lo, hi = first["speedup_interval"]
    assert lo - 1e-9 <= second["speedup"] <= hi + 1e-9 and second["best"] == first["best"]
    assert [row["values"] != [] for row in second["remeasured"]] == [True, True]  # measured again, not stored


def _study_args(tmp_path, script, *more):
    return ["--budget", "2", "--repeats", "1", "--top", "1", "--param", "threads=1,2", "--storage",
            f"sqlite:///{tmp_path / 's.db'}", *more, "--", sys.executable, str(script)]


def test_a_resume_is_said_with_quiet_and_in_json(tmp_path):
    """-q removes only the progress line; --json says what was resumed (the audit: both silent)."""
    script = tmp_path / "w.py"
    script.write_text("import os\nprint(int(os.environ['N']) * 1.0, 'images/sec')\n")
    r = tune(_study_args(tmp_path, script, "--json"), tmp_path, env=_env(tmp_path, N="100"))
    assert r.returncode == 0 and json.loads(r.stdout)["resumed"] is None, r.stderr[-2000:]
    r = tune(_study_args(tmp_path, script, "-q"), tmp_path, env=_env(tmp_path, N="100"))
    assert "resuming, 2 of 2 trials already done (study " in r.stderr, r.stderr
    r = tune(_study_args(tmp_path, script, "--json"), tmp_path, env=_env(tmp_path, N="100"))
    out = json.loads(r.stdout)
    assert out["resumed"] == {"study": out["study_name"], "trials": 2} and "resuming, 2 of 2" in r.stderr
    r = tune(_study_args(tmp_path, script, "-q"), tmp_path, env=_env(tmp_path, N="200"))
    assert "(variables changed: N): a new study" in r.stderr, r.stderr



def test_a_named_study_of_another_command_is_refused(tmp_path):
    """--study NAME resumed another command's trials, saying "the same command, files ..."."""
    w, e = tmp_path / "w.py", tmp_path / "e.py"
    w.write_text("print('20 images/sec')\n")
    e.write_text("print('11 images/sec')\n")
    r = tune(_study_args(tmp_path, w, "--study", "mine"), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    r = tune(_study_args(tmp_path, w, "--study", "mine"), tmp_path)
    assert "resuming, 2 of 2 trials already done (study mine: the same command, files" in r.stderr, r.stderr
    r = tune(_study_args(tmp_path, e, "--study", "mine"), tmp_path)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "study 'mine'" in err[0], r.stderr
    assert f"command was '{sys.executable} {w}'" in err[0] and "e.py is new" in err[0], err
    w.write_text("print('21 images/sec')\n")
    r = tune(_study_args(tmp_path, w, "--study", "mine"), tmp_path)
    assert r.returncode == 2 and "w.py changed" in r.stderr, r.stderr


def test_a_module_run_with_dash_m_is_keyed_by_its_file(tmp_path):
    """python -m wmod resumed after wmod.py changed, claiming the same files."""
    (tmp_path / "wmod.py").write_text("print('20 images/sec')\n")
    args = ["--budget", "1", "--repeats", "1", "--top", "1", "-q", "--storage", f"sqlite:///{tmp_path / 's.db'}",
            "--", sys.executable, "-m", "wmod"]
    env = _env(tmp_path, PYTHONPATH=str(Path(__file__).parents[2]))  # this checkout's affinity, from tmp_path
    r = tune(args, tmp_path, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    r = tune(args, tmp_path, cwd=tmp_path, env=env)
    assert "resuming, 1 of 1 trials already done" in r.stderr, r.stderr
    (tmp_path / "wmod.py").write_text("print('30 images/sec')\n")
    r = tune(args, tmp_path, cwd=tmp_path, env=env)
    assert "resuming," not in r.stderr and "(wmod.py changed): a new study" in r.stderr, r.stderr


def test_copies_says_the_instances_are_copies_and_excludes_split(tmp_path, fake_cmd):
    script = tmp_path / "share.py"
    script.write_text("import os\nk = int(os.environ.get('AFFINITY_NUM_INSTANCES', '1'))\n"
                      "print(f'{100 / k} images/sec')\n")
    r = tune(["--storage", "none", "--budget", "2", "--repeats", "1", "--top", "1", "--param", "instances=1,2",
              "--param", "threads=1", "--copies", "--json", "--", sys.executable, str(script)], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert out["split"] is False and not any("reads AFFINITY" in n for n in out["notes"])
    assert sorted(t["value"] for t in out["trials"]) == [pytest.approx(50.0), pytest.approx(100.0)]
    r = tune(["--storage", "none", "--split", "--copies", "--"] + fake_cmd(), tmp_path)
    assert r.returncode == 2 and "--copies" in r.stderr and "--split" in r.stderr, r.stderr


def _running(db) -> int:
    try:
        con = sqlite3.connect(db)
        try:
            return con.execute("SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def test_a_tuner_killed_mid_trial_and_resumed_at_once(tmp_path, fake_cmd):
    """Issue 42, point 11: SIGKILL 0.5 s into a trial, the same command again at once.  The
    killed trial was left RUNNING (failed by its stale heartbeat 20 s later at best, never
    when its tuner died before the first heartbeat: the study ended one trial short).  Its
    tuner recorded who runs it: the resumed tuner sees that process gone, fails the trial
    as interrupted and runs its configuration again first."""
    db = tmp_path / "k.db"
    args = ["--budget", "3", "--repeats", "1", "--top", "1", "--storage", f"sqlite:///{db}",
            "--param", "threads=1,2", "--param", "blocktime=0,1", "--"] + fake_cmd("--sleep", "1")
    p = subprocess.Popen(TUNE + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _running(db):
        time.sleep(0.05)
    time.sleep(0.5)
    p.kill()
    p.communicate(timeout=60)
    r = tune(args, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    con = sqlite3.connect(db)
    try:
        states = dict(con.execute("SELECT number, state FROM trials"))
        attrs = {(tid, key): json.loads(v) for tid, key, v in
                 con.execute("SELECT trial_id, key, value_json FROM trial_user_attributes")}
        params = {}
        for tid, name, value in con.execute("SELECT trial_id, param_name, param_value FROM trial_params"):
            params.setdefault(tid, {})[name] = value
        ids = dict(con.execute("SELECT number, trial_id FROM trials"))
    finally:
        con.close()
    assert "RUNNING" not in states.values()
    assert list(states.values()).count("COMPLETE") == 3  # the whole budget
    killed = ids[0]
    assert states[0] == "FAIL" and attrs.get((killed, "interrupted")) is True, attrs
    again = [n for n, tid in ids.items() if n > 0 and params.get(tid) == params[killed]]
    assert again and states[again[0]] == "COMPLETE"  # its configuration ran again
