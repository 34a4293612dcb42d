"""The pytest plugin (``affinity.tools.pytest_plugin``), as a user meets it: pytest runs in
a temporary directory on a user's test file, with the plugin loaded the way installing
the package loads it (the ``pytest11`` entry point) and pytest-benchmark beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import pytest

from affinity import Topology, plan
from affinity.version import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[2]
MARKED = ("granularity=fine,compact,1,0", "proclist=[1],explicit")  # the marker's specs
OPTION = ("scatter", "compact")  # the --affinity specs
FAST = ["--benchmark-min-rounds=1", "--benchmark-max-time=0.01", "--benchmark-warmup=off"]

USER_TESTS = r'''
import os, threading
import pytest
from affinity.binding import numa
from affinity.binding.apply import active_bindings

ORIGINAL_MASK = os.sched_getaffinity(0)
ORIGINAL_POLICY = numa.get_membind().policy
ORIGINAL_ENV = dict(os.environ)  # (pytest's PYTEST_CURRENT_TEST aside)
PARKED = []  # TIDs of threads started inside a case, alive after it


def park():
    ready, box = threading.Event(), {}
    def body():
        box["tid"] = threading.get_native_id()
        ready.set()
        threading.Event().wait()
    threading.Thread(target=body, daemon=True).start()
    ready.wait()
    PARKED.append(box["tid"])
    return box["tid"]


def environment():
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


def inside(binding):
    # every earlier case was undone: the threads it pinned are back on the original mask
    assert all(os.sched_getaffinity(tid) == ORIGINAL_MASK for tid in PARKED), PARKED
    assert os.sched_getaffinity(0) == ORIGINAL_MASK
    # this case runs inside its own binding, and only that one
    assert active_bindings() == [binding] and binding.active
    assert binding.env_set and all(os.environ[k] == v for k, v in binding.env_set.items())
    tid = park()
    assert tid in binding.refresh()
    assert os.sched_getaffinity(tid) == binding.union


@pytest.mark.affinity(*MARKED, threads=1, membind="auto")
def test_marked(benchmark, affinity_binding):
    inside(affinity_binding)
    assert affinity_binding.plan.threads == 1
    assert numa.get_membind().policy == "bind"
    benchmark(sum, range(100))


def test_option(affinity_binding, benchmark):
    inside(affinity_binding)
    assert numa.get_membind().policy == ORIGINAL_POLICY
    benchmark(sum, range(100))


@pytest.mark.affinity("proclist=[1],explicit", threads=1)
def test_fails_with_its_bind_map(affinity_binding):
    inside(affinity_binding)
    assert False, "deliberate"


def test_unmarked_and_unused():
    assert not active_bindings()
    assert environment() == ORIGINAL_ENV


def test_zz_all_restored():
    assert len(PARKED) == len(MARKED) + len(OPTION) + 1
    assert all(os.sched_getaffinity(tid) == ORIGINAL_MASK for tid in PARKED)
    assert numa.get_membind().policy == ORIGINAL_POLICY
    assert environment() == ORIGINAL_ENV
    assert not active_bindings()
'''


def _pytest(tmp_path: Path, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    """pytest in ``tmp_path``, plugins loaded from the installed entry points."""
    drop = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_CURRENT_TEST")
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith(("KMP_", "OMP_", "GOMP_", "TF_NUM_"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout, env=env)


def _outcomes(junit: Path) -> dict[str, str]:
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        out[case.get("name")] = kinds[0] if kinds else "passed"
    return out


def test_the_plugin_is_registered_by_installing_the_package():
    eps = [ep for ep in metadata.distribution(DISTRIBUTION).entry_points if ep.group == "pytest11"]
    assert [(ep.name, ep.value) for ep in eps] == [("affinity", "affinity.tools.pytest_plugin")]


def test_marker_fixture_and_option_with_pytest_benchmark(tmp_path: Path):
    (tmp_path / "test_user.py").write_text(f"MARKED = {MARKED!r}\nOPTION = {OPTION!r}\n" + USER_TESTS)
    args = [f"--affinity={s}" for s in OPTION]
    r = _pytest(tmp_path, "-q", *args, "--benchmark-json=bench.json", "--junitxml=junit.xml", *FAST)
    outcomes = _outcomes(tmp_path / "junit.xml")
    # one case per binding (the marker's specs for the marked tests, --affinity's for the
    # other user of the fixture), none for the test that uses neither
    want = {**{f"test_marked[{s}]": "passed" for s in MARKED}, **{f"test_option[{s}]": "passed" for s in OPTION},
            "test_fails_with_its_bind_map[proclist=[1],explicit]": "failure",
            "test_unmarked_and_unused": "passed", "test_zz_all_restored": "passed"}
    assert outcomes == want, r.stdout[-4000:] + r.stderr[-2000:]
    assert r.returncode == 1
    # the failing case's report carries the bind map taken inside its binding: the thread
    # it started, pinned to the plan's CPU 1, and the main thread, left where it was
    section = r.stdout.split("affinity bind map (proclist=[1],explicit)", 1)[1].split("short test summary")[0]
    rows = [line for line in section.splitlines() if line.startswith("affinity: pid ")]
    assert any("bound to OS proc set {1}" in row for row in rows), section
    assert any("[main " in row for row in rows), section
    # pytest-benchmark: one benchmark per binding, named after its spec, the bindings of
    # a test in one group; the plan and the machine in extra_info
    data = json.loads((tmp_path / "bench.json").read_text())
    bench = {b["name"]: b for b in data["benchmarks"]}
    assert set(bench) == {f"test_marked[{s}]" for s in MARKED} | {f"test_option[{s}]" for s in OPTION}
    machine = Topology.from_system()
    for name, b in bench.items():
        test, spec = name.split("[", 1)[0], name.split("[", 1)[1][:-1]
        assert b["group"] == f"test_user.py::{test}"
        assert b["params"] == {"affinity_binding": spec}
        info = b["extra_info"]["affinity"]
        assert info["spec"] == spec
        threads = 1 if test == "test_marked" else None
        assert info["keywords"] == ({"threads": 1, "membind": "auto"} if threads else {})
        want_plan = plan(spec, threads=threads, topology=machine.with_allowed(frozenset(os.sched_getaffinity(0))))
        assert info["plan"]["cpusets"] == [sorted(s) for s in want_plan.cpusets]
        assert info["topology"]["summary"] == info["plan"]["topology"] == machine.describe()
        assert len(info["topology"]["pus"]) == len(machine.pus)
    # the summary: each test's bindings against its first, with the verdict every face says
    summary = r.stdout.split("affinity: bindings side by side", 1)[1]
    assert "test_user.py::test_marked: time per round" in summary and "test_user.py::test_option" in summary
    assert f"  {MARKED[0]}  " in summary and "reference" in summary


SLOW_BINDING = r'''
import time
import pytest

@pytest.mark.affinity("compact", "scatter", threads=1)
def test_step(benchmark, affinity_binding, request):
    pause = 0.008 if request.node.callspec.params["affinity_binding"] == "scatter" else 0.002
    benchmark(time.sleep, pause)
'''


def test_the_summary_says_each_binding_with_the_shared_statistic(tmp_path: Path):
    """A test whose ``scatter`` case sleeps four times as long: the summary's figures are
    the geometric means of the rounds pytest-benchmark recorded, and its verdict is
    :func:`affinity.tuning.verdict.unpaired` of those rounds (not asserted to be
    "slower": the rounds are real sleeps on a shared machine)."""
    from affinity.tuning.verdict import geomean, unpaired

    (tmp_path / "test_two.py").write_text(SLOW_BINDING)
    r = _pytest(tmp_path, "-q", "--benchmark-min-rounds=10", "--benchmark-max-time=0.05", "--benchmark-warmup=off",
                "--benchmark-json=b.json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    data = {b["param"]: b["stats"]["data"] for b in json.loads((tmp_path / "b.json").read_text())["benchmarks"]}
    lines = r.stdout.split("affinity: bindings side by side", 1)[1].splitlines()
    ref = next(ln for ln in lines if ln.startswith("  compact "))
    other = next(ln for ln in lines if ln.startswith("  scatter "))
    assert ref.split()[1:] == [f"{geomean(data['compact']) * 1e3:.3f}", "ms", "reference"]
    assert other.split()[1:3] == [f"{geomean(data['scatter']) * 1e3:.3f}", "ms"]
    assert other.endswith(unpaired(data["compact"], data["scatter"], "minimize").text)
    assert "not interleaved" in other


def test_summary_lines_compare_each_binding_with_the_first():
    from affinity.tools.pytest_plugin import summary_lines

    same = [0.0010, 0.0011, 0.0009, 0.0010, 0.0012]
    lines = summary_lines({"t.py::test_a": [("none", same), ("compact", list(reversed(same))),
                                              ("scatter", [v * 3 for v in same])],
                           "t.py::test_alone": [("none", same)]})
    assert len(lines) == 4 and lines[0].startswith("t.py::test_a: time per round") and "against none" in lines[0]
    from affinity.tuning.verdict import geomean

    assert lines[1].split() == ["none", f"{geomean(same) * 1e3:.3f}", "ms", "reference"]
    assert "no significant difference (1.00x" in lines[2] and "3.00x slower" in lines[3]


def test_no_effect_unless_used(tmp_path: Path):
    """Loaded by every pytest run, the plugin loads nothing of affinity's core nor
    TensorFlow and changes nothing for a test that does not use it, --affinity or not."""
    (tmp_path / "test_plain.py").write_text(
        "import os, sys\n"
        "def test_plain(request):\n"
        "    assert request.node.name == 'test_plain'\n"
        "    heavy = [m for m in sys.modules if m.startswith(('tensorflow', 'affinity.machine',\n"
        "             'affinity.planning', 'affinity.binding'))]\n"
        "    assert heavy == [], heavy\n"
        "    assert 'affinity.tools.pytest_plugin' in sys.modules\n"
        "    assert not any(k.startswith(('KMP_', 'OMP_')) for k in os.environ)\n")
    r = _pytest(tmp_path, "-q", "--affinity=scatter", "--markers")
    assert "@pytest.mark.affinity(*specs" in r.stdout, r.stdout[-2000:]
    r = _pytest(tmp_path, "-q", "--affinity=scatter", "--affinity=compact", "-rA")
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-3000:]
    r = _pytest(tmp_path, "-q", "-p", "no:affinity", "--affinity=scatter")
    assert r.returncode == 4 and "unrecognized arguments: --affinity" in r.stderr, r.stderr[-2000:]


@pytest.mark.tf
def test_tf_example_compares_three_bindings(tmp_path: Path):
    example = ROOT / "examples" / "bench_tf_bindings.py"
    r = _pytest(tmp_path, "-q", str(example), "--benchmark-json=tf.json", *FAST, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "tf.json").read_text())
    names = [b["name"] for b in data["benchmarks"]]
    assert sorted(names) == sorted(f"test_train_step[{s}]" for s in ("none", "granularity=fine,compact",
                                                                         "granularity=fine,scatter"))
    assert {b["group"] for b in data["benchmarks"]} == {f"{example.relative_to(ROOT)}::test_train_step"}
    threads = min(4, len(os.sched_getaffinity(0)))
    for b in data["benchmarks"]:
        info = b["extra_info"]["affinity"]
        assert info["keywords"] == {"threads": threads, "tensorflow": True}
        assert info["plan"]["intra_op_threads"] == threads


MARKER_TESTS = '''import pytest


@pytest.mark.affinity("granularity=fine,compakt", threads=1)
def test_typo(affinity_binding):
    pass


@pytest.mark.affinity("granularity=fine,compakt", threads=1, strict=False)
def test_typo_read_as_the_runtime_does(affinity_binding):
    pass


@pytest.mark.affinity("compact", threads=64)
def test_oversubscribed(affinity_binding):
    assert affinity_binding.plan.threads == 64
'''


def test_marker_typos_fail_and_warnings_point_at_the_marker(tmp_path: Path):
    """A spec the runtime would ignore fails its case in one line (it would bind
    nothing); a warning from applying a binding names the user's marker line."""
    (tmp_path / "test_markers.py").write_text(MARKER_TESTS)
    r = _pytest(tmp_path, "-q", "-rA", "--junitxml=junit.xml", "-W", "always::UserWarning")
    outcomes = _outcomes(tmp_path / "junit.xml")
    assert outcomes == {"test_typo[granularity=fine,compakt]": "error",
                        "test_typo_read_as_the_runtime_does[granularity=fine,compakt]": "passed",
                        "test_oversubscribed[compact]": "passed"}, r.stdout[-3000:]
    assert ("ERROR at setup of test_typo[granularity=fine,compakt] _____________\naffinity spec "
            "'granularity=fine,compakt': KMP_AFFINITY: unknown word \"compakt\" (did you mean \"compact\"?)\n") \
        in r.stdout, \
        r.stdout[-3000:]
    assert "Traceback" not in r.stdout and "pytest_plugin.py" not in r.stdout, r.stdout[-3000:]
    assert "During handling" not in r.stdout and "^" not in r.stdout, r.stdout[-3000:]
    warned = r.stdout.split("warnings summary", 1)[1]
    # each warning at the marker's line (the decorator), none at the plugin
    assert "test_markers.py:9: AffinityWarning" in warned, warned
    assert 'parameter invalid, ignoring "compakt"' in warned
    assert "test_markers.py:14: AffinityWarning" in warned and "oversubscribes" in warned, warned


DOCTOR_TESTS = r'''
import ctypes, os, warnings
import affinity

LIBGOMP = os.environ["DOCTOR_LIBGOMP"]
ALL = os.sched_getaffinity(0)


def test_placed(affinity_doctor):
    found = affinity_doctor.assert_clean()
    assert found.ok and found.snapshot.processes[0].pid == os.getpid()


def test_binding_undone(affinity_doctor):
    ctypes.CDLL(LIBGOMP)                      # an OpenMP runtime: apply() pins its team, main as member 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = affinity.apply(threads=2)
    try:
        os.sched_setaffinity(0, ALL)          # something puts the whole mask back
        affinity_doctor.assert_clean()
    finally:
        b.restore()


def test_binding_undone_allowed(affinity_doctor):
    ctypes.CDLL(LIBGOMP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = affinity.apply(threads=2)
    try:
        os.sched_setaffinity(0, ALL)
        found = affinity_doctor.assert_clean(allow=("binding-undone",))
        assert found.kinds() == ["binding-undone"]
    finally:
        b.restore()
'''


def test_doctor_fixture_fails_a_test_with_each_findings_evidence_and_fix(tmp_path: Path):
    """``affinity_doctor.assert_clean()``: a test whose binding was undone fails with the
    finding's evidence and fix; one clean, or allowing that kind, passes."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs in this process's mask")
    from helpers.doctorjob import torch_libgomp

    from affinity.cpulist import format_list

    (tmp_path / "test_doctor_user.py").write_text(DOCTOR_TESTS)
    os.environ["DOCTOR_LIBGOMP"] = torch_libgomp()
    try:
        r = _pytest(tmp_path, "-q", "--junitxml=junit.xml")
    finally:
        del os.environ["DOCTOR_LIBGOMP"]
    assert _outcomes(tmp_path / "junit.xml") == {"test_placed": "passed", "test_binding_undone": "failure",
                                                  "test_binding_undone_allowed": "passed"}, r.stdout[-4000:]
    report = r.stdout.split("test_binding_undone ", 1)[-1]
    assert "affinity doctor: 1 finding" in report and "error binding-undone: pid " in report
    mine = os.sched_getaffinity(0)
    assert f"[main 0 python] was bound to {{{min(mine)}}} by affinity, now on {{{format_list(mine)}}}" in report
    assert "fix: affinity.apply('granularity=fine,compact,1,0', threads=2) again after the call" in report
