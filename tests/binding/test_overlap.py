"""Bindings that overlap without nesting restore exactly (issue 24, item 1).

Before: ``restore()`` put back the snapshot taken at its own ``apply()``, so with
``b1 = apply(); b2 = apply(); b1.restore(); b2.restore()`` (or two threads, A enters,
B enters, A exits, B exits) b2's snapshot held b1's values and b2's restore
re-exported them; a thread pinned by b1 went back to b1's mask; a ``pinned`` used
as a decorator by two threads popped the other thread's binding.

Now each piece of state is put back by the newest binding holding it, and an older
binding restored first hands its saved value to it (``affinity.binding.registry``):
after all end, environment, masks and memory policy are exact, in any order.
"""

from __future__ import annotations

import os
import random
import select
import threading

import pytest

import affinity
from affinity.binding import numa, registry
from affinity.planning.envvars import EXPORTED_VARIABLES
from helpers.threads import Parked, all_masks, in_thread

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")

CPUS = sorted(os.sched_getaffinity(0))
SPECS = ["compact", "scatter", f"explicit,proclist=[{CPUS[1]}]", f"explicit,proclist=[{CPUS[0]}]",
         "granularity=fine,compact,1,0"]
KW = dict(tensorflow=False, openmp=False, blas=False)


def _env_now() -> dict[str, str]:
    return dict(os.environ)


def _expected_env(base: dict[str, str], live: list) -> dict[str, str]:
    """The reference: each variable is the value of the newest active binding that
    exported it, else what it was before any binding."""
    out = dict(base)
    for b in live:  # oldest first: newer ones win
        out.update(b.env_set)
    return out


def _random_apply(rng: random.Random):
    return affinity.apply(rng.choice(SPECS), threads=rng.choice([1, 2]),
                          export=rng.choice([True, "override", "keep"]), blocktime=rng.choice(["0", "200", None]),
                          membind=rng.choice([None, "auto", "local"]), **KW)


def _interleaving(seed: int) -> None:
    """Apply 2-4 bindings and restore them in a random order, with threads born and
    refresh() calls in between; check the environment after every step against the
    reference, and everything at the end."""
    rng = random.Random(seed)
    n = rng.randint(2, 4)
    env0, masks0, mem0 = _env_now(), all_masks(), numa.get_membind()
    mask0 = frozenset(os.sched_getaffinity(0))
    live: list = []
    todo = n
    parked: list[Parked] = []
    try:
        while todo or live:
            op = rng.random()
            if todo and (not live or op < 0.45):
                live.append(_random_apply(rng))
                todo -= 1
            elif op < 0.6 and len(parked) < 3:  # a thread born inside the blocks
                parked.append(Parked().__enter__())
            elif op < 0.75 and live:
                rng.choice(live).refresh()  # pins threads new to it
            else:
                b = live.pop(rng.randrange(len(live)))
                b.restore()
            assert _env_now() == _expected_env(env0, live), f"seed {seed}"
        assert registry.active() == []
        assert _env_now() == env0, f"seed {seed}"
        assert numa.get_membind() == mem0, f"seed {seed}"
        now = all_masks()
        for t, m in now.items():
            assert m == masks0.get(t, mask0), f"seed {seed}: thread {t}"
    finally:
        for p in parked:
            p.__exit__()


def test_out_of_order_in_one_thread_reproduced():
    """The case of the issue: b1, b2, b1.restore(), b2.restore()."""

    def go():
        env0 = _env_now()
        with Parked() as t:
            m0 = frozenset(os.sched_getaffinity(t.tid))
            b1 = affinity.apply(f"explicit,proclist=[{CPUS[1]}]", threads=1, export="override", **KW)
            b1._pin({t.tid: frozenset({CPUS[1]})})  # b1 pinned a thread
            b2 = affinity.apply("compact", threads=2, export="override", blocktime="0", **KW)
            assert os.environ["OMP_NUM_THREADS"] == "2"
            b1.restore()
            assert os.environ["OMP_NUM_THREADS"] == "2" and b2.active  # b2's values stand while it is active
            b2.restore()
            return env0, _env_now(), m0, frozenset(os.sched_getaffinity(t.tid))

    env0, env1, m0, m1 = in_thread(go)
    assert env1 == env0 and not any(k in env1 for k in EXPORTED_VARIABLES if k not in env0)
    assert m1 == m0


@pytest.mark.parametrize("chunk", range(4))
def test_100_random_interleavings_are_exact(chunk):
    def go():
        for seed in range(chunk * 25, chunk * 25 + 25):
            _interleaving(seed)

    in_thread(go)


def test_two_threads_overlapping():
    """A enters, B enters, A exits, B exits -- each step ordered by events."""
    steps = [threading.Event() for _ in range(4)]
    got: dict[str, object] = {}
    env0, masks0 = _env_now(), all_masks()

    def a():
        with affinity.pinned(f"explicit,proclist=[{CPUS[0]}]", threads=1, membind="auto", **KW):
            steps[0].set()
            steps[1].wait(10)
        got["a_mem"] = numa.get_membind()
        steps[2].set()

    def b():
        steps[0].wait(10)
        mem = numa.get_membind()
        with affinity.pinned("scatter", threads=2, membind="auto", blocktime="0", **KW) as bb:
            steps[1].set()
            steps[2].wait(10)
            got["b_env_while"] = os.environ.get("OMP_NUM_THREADS")
            got["b_active"] = bb.active
        got["b_mem"] = (mem, numa.get_membind())

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start(), tb.start()
    ta.join(30), tb.join(30)
    assert got["b_env_while"] == "2" and got["b_active"] is True
    assert got["b_mem"][0] == got["b_mem"][1]
    assert _env_now() == env0 and registry.active() == []
    now = all_masks()
    assert {t: m for t, m in now.items() if t in masks0} == {t: m for t, m in masks0.items() if t in now}


def test_decorator_shared_by_two_threads_keeps_each_threads_binding():
    deco = affinity.pinned("compact", threads=1, **KW)
    inside = [threading.Event(), threading.Event()]
    leave = [threading.Event(), threading.Event()]
    seen: dict[int, list[bool]] = {0: [], 1: []}

    @deco
    def work(i: int) -> None:
        b = deco._bindings[-1]
        inside[i].set()
        seen[i].append(b.active)
        leave[i].wait(10)
        seen[i].append(b.active)  # the other thread left meanwhile (for i == 1)

    env0 = _env_now()
    t0 = threading.Thread(target=work, args=(0,))
    t1 = threading.Thread(target=work, args=(1,))
    t0.start()
    inside[0].wait(10)
    t1.start()
    inside[1].wait(10)
    leave[0].set()
    t0.join(10)
    leave[1].set()
    t1.join(10)
    assert seen == {0: [True, True], 1: [True, True]}
    assert _env_now() == env0 and registry.active() == []


def test_a_child_forked_inside_a_block_is_left_alone():
    """Before: a child forked from a thread pinned to {1} was moved to the main
    thread's mask when it left the block."""

    def go():
        os.sched_setaffinity(0, {CPUS[1]})
        r, w = os.pipe()
        with affinity.pinned("compact", threads=1, **KW) as b:
            pid = os.fork()
            if pid == 0:  # the child: leaves the block, reports its mask and environment
                try:
                    before = sorted(os.sched_getaffinity(0))
                    omp = os.environ.get("OMP_NUM_THREADS")
                    b.restore()
                    after = sorted(os.sched_getaffinity(0))
                    os.write(w, repr((before, after, omp, os.environ.get("OMP_NUM_THREADS"))).encode())
                finally:
                    os._exit(0)
            os.close(w)
            got = os.read(r, 4096).decode()
            os.waitpid(pid, 0)
            assert b.active  # the parent's binding is the parent's
        return got

    before, after, omp, omp_after = eval(in_thread(go))  # noqa: S307 - our own repr
    assert before == after == [CPUS[1]]
    assert omp == omp_after == "1"


@pytest.mark.parametrize("seed", range(3))
def test_eight_threads_enter_and_leave_in_random_orders(seed):
    """The issue's stress: 8 threads, each in its own pinned() block; every round they
    enter in one random order and leave in another (ordered by a turn counter, so
    every run goes through the same interleaving)."""
    rng = random.Random(seed)
    n, rounds = 8, 4
    orders = [(rng.sample(range(n), n), rng.sample(range(n), n)) for _ in range(rounds)]
    cond = threading.Condition()
    turn = [0]
    env0, masks0 = _env_now(), all_masks()
    errors: list[BaseException] = []

    def wait_turn(k: int) -> None:
        with cond:
            assert cond.wait_for(lambda: turn[0] == k, timeout=30)

    def next_turn() -> None:
        with cond:
            turn[0] += 1
            cond.notify_all()

    def worker(i: int) -> None:
        try:
            for r, (enter, leave) in enumerate(orders):
                base = r * 2 * n
                wait_turn(base + enter.index(i))
                b = affinity.apply(SPECS[i % len(SPECS)], threads=1 + i % 2, export="override",
                                   blocktime=str(i), membind=("auto" if i % 3 == 0 else None), **KW)
                next_turn()
                wait_turn(base + n + leave.index(i))
                b.restore()
                next_turn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            with cond:
                turn[0] = 10**9
                cond.notify_all()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    assert _env_now() == env0 and registry.active() == []
    now = all_masks()
    assert {t: m for t, m in now.items() if t in masks0} == {t: m for t, m in masks0.items() if t in now}


def test_a_child_forked_while_another_thread_applies_can_apply():
    """The lock that serializes apply()/restore() is new in a forked child: the
    thread that held it at the fork does not exist there."""
    affinity.apply("compact", threads=1, **KW).restore()  # (the fork hook is registered on first use)
    held, release = threading.Event(), threading.Event()

    def holder():
        with registry._serial:
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                affinity.apply("compact", threads=1, **KW).restore()
                os.write(w, b"ok")
            finally:
                os._exit(0)
        os.close(w)

        ready = select.select([r], [], [], 30)[0]  # a bound for a deadlock, not a timing assertion
        got = os.read(r, 2) if ready else b""
        if not ready:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    finally:
        release.set()
        t.join(10)
    assert got == b"ok"
