"""The LD_PRELOAD library (csrc/pinthreads.c) on a real C program.

The program starts N pthreads that are all alive at once (a barrier), each
reading its own mask with sched_getaffinity and its TID; the main thread
reports the same about itself.  The library's rule, checked here:
main thread -> slot 0, then the k-th created thread that is not skipped ->
slot (k + 1) mod nslots; a skipped thread keeps its creator's mask.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from affinity.cpulist import format_list, parse_list
from affinity.launcher.preload import pin_library
from helpers.pinprog import LINE, PROGRAM

CPUS = sorted(os.sched_getaffinity(0))



@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler is needed to build the test program"
    d = tmp_path_factory.mktemp("pinprog")
    src = d / "threads.c"
    src.write_text(PROGRAM)
    exe = d / "threads"
    subprocess.run([cc, "-O1", "-pthread", str(src), "-o", str(exe)], check=True)
    return exe


def run_pinned(program: Path, *args: str, **env: str) -> tuple[dict, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AFFINITY_PIN_")}
    full.update(env)
    full["LD_PRELOAD"] = str(pin_library())
    r = subprocess.run([str(program), *args], capture_output=True, text=True, env=full, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    seen: dict = {}
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        assert m, line
        who, i, tid, cpus = m.groups()
        seen[(who, int(i))] = (int(tid), frozenset(int(c) for c in cpus.split(",") if c))
    return seen, r.stderr


def expected(slots: list[frozenset[int]], n: int, skip: int = 0, pin_main: bool = True,
             main_mask: frozenset[int] | None = None) -> dict[int, frozenset[int]]:
    main = slots[0] if pin_main else main_mask
    out, taken = {0: main}, 0
    for k in range(n):
        if skip >> k & 1:
            out[k + 1] = main  # a skipped thread inherits its creator's mask
        else:
            out[k + 1] = slots[(taken + (1 if pin_main else 0)) % len(slots)]
            taken += 1
    return out


def test_library_is_built_with_the_package_and_exports_only_pthread_create():
    lib = pin_library()
    assert lib.name == "libaffinity_pin.so" and lib.parent.name == "launcher" and lib.is_file()
    syms = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                          check=True).stdout.split()
    assert "pthread_create" in syms
    assert not [s for s in syms if s not in ("T", "pthread_create") and not s.startswith("0")]


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
def test_four_threads_are_pinned_in_creation_order_with_wrap_around(program):
    slots = [frozenset({CPUS[1]}), frozenset({CPUS[0]}), frozenset(CPUS[:2])]
    seen, err = run_pinned(program, "4", AFFINITY_PIN_SLOTS=";".join(format_list(s) for s in slots))
    want = expected(slots, 4)
    assert {i: seen[("main", i)][1] for i in range(5)} == want
    # main -> {1}, threads -> {0}, {0,1}, {1} (wrap), {0}
    assert want[1] == {CPUS[0]} and want[3] == {CPUS[1]}
    assert err == ""  # quiet unless asked


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
def test_skip_mask_verbose_report_and_main_thread_option(program):
    slots = [frozenset({CPUS[0]}), frozenset({CPUS[1]})]
    text = f"{CPUS[0]};{CPUS[1]}"
    seen, err = run_pinned(program, "4", AFFINITY_PIN_SLOTS=text, AFFINITY_PIN_SKIP="0x5",
                           AFFINITY_PIN_VERBOSE="1")
    want = expected(slots, 4, skip=0x5)
    assert {i: seen[("main", i)][1] for i in range(5)} == want
    # the report names every thread by its real TID, in the Intel runtime's words
    reports = err.strip().splitlines()
    pid_tid = {i: seen[("main", i)][0] for i in range(5)}
    for i in (0, 2, 4):
        assert (f"tid {pid_tid[i]} thread {i} bound to OS proc set {{{format_list(want[i])}}}"
                in err), err
    for i in (1, 3):
        assert f"tid {pid_tid[i]} thread {i} skipped (AFFINITY_PIN_SKIP)" in err
    assert len(reports) == 5 and all(r.startswith(f"affinity-pin: pid {pid_tid[0]} ") for r in reports)

    mask = frozenset(CPUS)
    seen, _ = run_pinned(program, "3", AFFINITY_PIN_SLOTS=text, AFFINITY_PIN_MAIN="0")
    assert {i: seen[("main", i)][1] for i in range(4)} == expected(slots, 3, pin_main=False,
                                                                   main_mask=mask)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs a process mask of at least 2 CPUs")
def test_a_forked_child_gets_the_plan_and_does_not_hang(program):
    """A process forked without exec is one the command started, as an exec'd one is:
    every CPU of the plan and no pinning (it used to stay on its forking thread's slot
    and go on counting: a DataLoader worker on one CPU); with AFFINITY_PIN_CHILDREN=1
    it pins from slot 0 again."""
    slots = [frozenset({CPUS[0]}), frozenset({CPUS[1]})]
    text = f"{CPUS[0]};{CPUS[1]}"
    seen, _ = run_pinned(program, "3", "fork", AFFINITY_PIN_SLOTS=text)
    # parent: main + 3 threads use slots 0,1,0,1
    assert [seen[("main", i)][1] for i in range(4)] == [slots[0], slots[1], slots[0], slots[1]]
    # the child (forked from the main thread, on slot 0): the plan's CPUs, its threads too
    assert [seen[("child", i)][1] for i in (0, 1, 2)] == [slots[0] | slots[1]] * 3
    seen, _ = run_pinned(program, "3", "fork", AFFINITY_PIN_SLOTS=text, AFFINITY_PIN_CHILDREN="1")
    assert [seen[("main", i)][1] for i in range(4)] == [slots[0], slots[1], slots[0], slots[1]]
    assert [seen[("child", i)][1] for i in (0, 1, 2)] == [slots[0], slots[1], slots[0]]


def test_without_slots_the_library_changes_nothing(program):
    seen, err = run_pinned(program, "2")
    assert {m for _, m in seen.values()} == {frozenset(CPUS)} and err == ""


def test_bad_configuration_disables_pinning_with_a_message(program):
    seen, err = run_pinned(program, "2", AFFINITY_PIN_SLOTS="0;x")
    assert err.strip() == 'affinity-pin: bad AFFINITY_PIN_SLOTS="0;x": thread pinning disabled'
    assert {m for _, m in seen.values()} == {frozenset(CPUS)}
    seen, err = run_pinned(program, "2", AFFINITY_PIN_SLOTS="0", AFFINITY_PIN_SKIP="zz")
    assert "bad AFFINITY_PIN_SKIP=\"zz\"" in err


def test_a_failed_pin_is_reported_and_the_thread_runs_on(program):
    # CPU 1000 does not exist here: sched_setaffinity says EINVAL
    outside = max(CPUS) + 1000
    seen, err = run_pinned(program, "1", AFFINITY_PIN_SLOTS=f"{outside};{CPUS[0]}")
    main_tid = seen[("main", 0)][0]
    assert (f"affinity-pin: sched_setaffinity(tid {main_tid}, {{{outside}}}) failed for thread 0: "
            "Invalid argument") in err
    assert seen[("main", 0)][1] == frozenset(CPUS)
    assert seen[("main", 1)][1] == {CPUS[0]}
    assert parse_list(format_list(seen[("main", 1)][1])) == {CPUS[0]}


def _via_shell(program: Path, script: str, **env: str) -> tuple[dict, str]:
    """Run ``script`` (``$P`` is the program) under sh with the library preloaded."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("AFFINITY_PIN_")}
    full.update(env, P=str(program), LD_PRELOAD=str(pin_library()))
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=full, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = {}
    for line in r.stdout.splitlines():
        who, i, _, cpus = LINE.match(line).groups()
        seen[(who, int(i))] = frozenset(int(c) for c in cpus.split(",") if c)
    return seen, r.stderr


def test_processes_the_command_starts_are_left_alone_unless_asked(program):
    """A multiprocessing worker or a helper a script runs used to pin itself from slot 0
    again; now only the command's process (and what it exec's) pins."""
    slots = f"{CPUS[0]};{CPUS[1]}"
    # the shell (pinned to slot 0) forks a child for the program: another process,
    # which gets every CPU of the plan back (not its creator's one slot) and pins nothing
    seen, _ = _via_shell(program, '"$P" 1; true', AFFINITY_PIN_SLOTS=slots)
    assert {seen[("main", 0)], seen[("main", 1)]} == {frozenset(CPUS[:2])}
    # exec keeps the pid: the exec chain of the command (a pyenv shim) is pinned
    seen, _ = _via_shell(program, 'exec "$P" 1', AFFINITY_PIN_SLOTS=slots)
    assert [seen[("main", 0)], seen[("main", 1)]] == [{CPUS[0]}, {CPUS[1]}]
    # asked for: children pin their threads too, from slot 0 again
    seen, _ = _via_shell(program, '"$P" 1; true', AFFINITY_PIN_SLOTS=slots, AFFINITY_PIN_CHILDREN="1")
    assert [seen[("main", 0)], seen[("main", 1)]] == [{CPUS[0]}, {CPUS[1]}]

