"""Restore exact under churn (issue 14, item 3).

Randomized, nested ``pinned()`` / ``apply()`` blocks -- random specs, thread counts,
memory policies, environments, ranks -- with an OpenMP runtime loaded and its teams
running, Python threads and plain pthreads starting and exiting inside them (some
started by other threads while blocks are entered and left, some parked threads
pinned to a CPU of their own, and new threads given the TIDs of ended ones),
exceptions thrown from inside.  After every block, and at the end, what the block found must be back:

* every thread that existed before has its mask (a thread is its TID and its start
  time: the spawners wrap the kernel's TID counter, and a thread born inside may hold
  the TID of one that exited); a thread born inside that is
  still alive has the process's original mask (the main thread's when the block
  was entered), as :meth:`Binding.restore` promises -- also one born while the
  block was being restored -- unless it is now a member of the OpenMP team that
  an enclosing binding pinned: then it is on that binding's slot (an inner team of
  another size makes libgomp end and start workers and re-form its team, so the
  restore pins the enclosing team again, and a worker may now hold another slot);
* the calling thread's memory policy (``numa.get_membind()``);
* the whole environment, byte for byte: ``os.environb`` and the C library's own
  ``environ`` (what ``getenv`` in a runtime or a child sees);
* the OpenMP runtime's team size (``omp_get_max_threads``).

Inside a block whose binding pinned the OpenMP team, a parallel region must see
member ``i`` on the plan's set ``i`` -- also after nested blocks came and went.

The churn runs in a fresh interpreter per OpenMP runtime (two runtimes must not
share a process, and the test process's own state stays out of it).  It is random
but seeded: the seed is printed and ``AFFINITY_CHURN_SEED=N`` replays the same
sequence of blocks (thread timing is the machine's).
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import random
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()

#: a few pthreads the Python side knows nothing about: detached, sleeping for a
#: while or until released, counted so the end of the churn can wait for them
THREADS_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

static int live, stop;

static void *body(void *arg)
{
    long usec = (long)arg;
    if (usec < 0) {
        struct timespec tick = {0, 1000000};
        while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE))
            nanosleep(&tick, NULL);
    } else {
        struct timespec ts = {usec / 1000000, (usec % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    __atomic_fetch_sub(&live, 1, __ATOMIC_ACQ_REL);
    return NULL;
}

/* a detached pthread living usec microseconds (usec < 0: until release_all) */
int start_thread(long usec)
{
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 256 * 1024);
    __atomic_fetch_add(&live, 1, __ATOMIC_ACQ_REL);
    int rc = pthread_create(&t, &a, body, (void *)usec);
    if (rc)
        __atomic_fetch_sub(&live, 1, __ATOMIC_ACQ_REL);
    pthread_attr_destroy(&a);
    return rc;
}

void release_all(void) { __atomic_store_n(&stop, 1, __ATOMIC_RELEASE); }
int live_threads(void) { return __atomic_load_n(&live, __ATOMIC_ACQUIRE); }
"""

SPECS = ["compact", "scatter", "granularity=fine,compact", "granularity=fine,scatter,1",
         "explicit,proclist=[1,0]", "explicit,proclist=[0]", "granularity=core,compact,1", "none",
         "balanced", "disabled", "logical", "physical,1", "OMP_PLACES=cores OMP_PROC_BIND=close",
         "OMP_PLACES={1},{0} OMP_PROC_BIND=spread", "KMP_AFFINITY=compact KMP_HW_SUBSET=1c",
         "compakt"]
MEMBIND = [None, None, None, "auto", "local", "interleave:all", "bind:0", "preferred:0",
           ("preferred", (0,)), "bind:7"]
#: variables the user may have set before a block (a value of ours or theirs, or none)
USER_VARS = {"OMP_NUM_THREADS": ["1", "3"], "KMP_AFFINITY": ["compact", "disabled"],
             "OMP_PLACES": ["cores", "{0}"], "KMP_BLOCKTIME": ["0", "infinite"],
             "TF_NUM_INTRAOP_THREADS": ["5"], "GOMP_CPU_AFFINITY": ["0"],
             "AFFINITY_CHURN_USER": ["x", "y=z"]}


# ----------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    from helpers.ompprog import build  # lazy: only the pytest side needs the helpers

    d = tmp_path_factory.mktemp("churn")
    (d / "threads.c").write_text(THREADS_C)
    subprocess.run(["gcc", "-O1", "-fPIC", "-shared", "-pthread", str(d / "threads.c"), "-o",
                    str(d / "libchurnthreads.so")], check=True)
    return {"threads": d / "libchurnthreads.so",
            **{kind: build(kind, d) for kind in ("libgomp", "libiomp5")}}


def churn(libs: dict[str, Path], kind: str, blocks: int, blas: str) -> dict:
    seed = int(os.environ.get("AFFINITY_CHURN_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"churn: {kind}, {blocks} blocks, blas={blas}, seed {seed} "
          f"(AFFINITY_CHURN_SEED={seed} replays it)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "GOMP_", "TF_NUM_"))}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(HERE), str(seed), str(blocks), str(libs[kind]),
                        str(libs["threads"]), blas], capture_output=True, text=True, env=env,
                       timeout=120 + blocks)
    elapsed = time.monotonic() - t0
    where = f"seed {seed} ({kind}, {blocks} blocks, blas={blas}; AFFINITY_CHURN_SEED={seed} replays it)"
    assert r.returncode == 0, f"{where}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    out = json.loads(r.stdout.splitlines()[-1])
    print(f"churn: {elapsed:.1f} s; {json.dumps(out['counts'], sort_keys=True)}")
    assert out["blocks"] >= blocks
    assert out["failures"] == [], f"{where}:\n" + "\n".join(out["failures"])
    return out


@pytest.mark.parametrize("kind, blas", [("libgomp", "false"), ("libiomp5", "auto")])
def test_fifty_nested_blocks_restore_exactly(libs, kind, blas):
    out = churn(libs, kind, 50, blas)
    # the churn did what it says: teams ran, threads came and went, blocks failed
    c = out["counts"]
    assert c["omp regions"] and c["threads started"] and c["boom"] and c["spawners"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["libgomp", "libiomp5"])
def test_a_thousand_nested_blocks_restore_exactly(libs, kind):
    out = churn(libs, kind, 1000, "auto")
    c = out["counts"]
    assert c["omp regions"] and c["threads started"] and c["boom"] and c["membind"]
    assert any(k.startswith("refused") for k in c)  # some blocks could not start: nothing changed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process mask of at least 2 CPUs")
def test_process_wide_binds_with_hundreds_of_threads_coming_and_going():
    """The C core's all-or-nothing process bind re-lists the threads until no new one
    shows up: with 300 parked threads (more than its first buffers hold) and others
    starting and exiting all along, every thread ends on the set, every time."""
    from affinity.binding import threads
    from helpers.threads import all_masks, restore_masks  # lazy: only the pytest side needs the helpers

    cpus = sorted(os.sched_getaffinity(0))
    before = all_masks()
    park, stop = threading.Event(), threading.Event()
    parked = [threading.Thread(target=park.wait, daemon=True) for _ in range(300)]

    def churn() -> None:
        while not stop.is_set():
            t = threading.Thread(target=time.sleep, args=(0.002,))
            t.start()

    churner = threading.Thread(target=churn)
    try:
        for t in parked:
            t.start()
        churner.start()
        for i in range(10):
            want = frozenset({cpus[i % 2]})
            got = threads.set_process_affinity(want)
            assert len(got) > 300 and set(got.values()) == {want}
    finally:
        stop.set()
        churner.join()
        park.set()
        for t in parked:
            t.join()
        restore_masks(before)
    assert all_masks()[os.getpid()] == before[os.getpid()]


# ---------------------------------------------------- the churn (a fresh process)

class Boom(Exception):
    """Thrown from inside a block on purpose."""


def _tids() -> set[str]:
    """The entries of /proc/self/task, listed again until none is new: while a thread
    exits, Linux's listing can skip the next thread, a live one (one listing here missed
    a thread in about one run of a thousand blocks in seventy)."""
    seen = set(os.listdir("/proc/self/task"))
    while not (again := set(os.listdir("/proc/self/task"))) <= seen:
        seen |= again
    return seen


NEXT_PID = "/proc/sys/kernel/ns_last_pid"


def _start(tid: int) -> int | None:
    """When thread ``tid`` started (clock ticks since boot, field 22 of its stat), None
    if it is gone.  A TID is a thread only while it lives: the spawners start thousands
    of pthreads, the kernel's counter wraps (``pid_max``) and a thread born inside a
    block can get the TID of one that was there before it and exited."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return int(raw[raw.rindex(b")") + 2:].split()[19])


def _c_environ() -> list[bytes]:
    """The C library's environment (what getenv and exec see), entry by entry."""
    env = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    out, i = [], 0
    while env[i] is not None:
        out.append(env[i])
        i += 1
    return sorted(out)


class Churn:
    def __init__(self, rng: random.Random, omp: ctypes.CDLL, cthreads: ctypes.CDLL, blas: str,
                 target: int):
        import affinity
        from affinity.binding import numa, openmp
        from affinity.binding.apply import active_bindings
        from affinity.errors import AffinityError

        self.affinity, self.numa, self.expected_errors = affinity, numa, (AffinityError, ValueError)
        self.active_bindings = active_bindings
        self.rng, self.omp, self.c, self.target = rng, omp, cthreads, target
        self.blas = "auto" if blas == "auto" else False
        (self.runtime,) = openmp.loaded_runtimes()
        self.blocks = 0
        self.cpus = sorted(os.sched_getaffinity(0))  # the process's, before any block
        self.counts: collections.Counter = collections.Counter()
        self.failures: list[str] = []
        self.parked: list[tuple[threading.Event, threading.Thread]] = []
        self.spawners: list[tuple[threading.Event, threading.Thread]] = []
        # held from the snapshot before a block until its binding is applied: a thread
        # spawned in between would be neither in the snapshot nor born inside
        self.gate, self.gated = threading.Lock(), False

    # -------------------------------------------------------------- state
    def state(self) -> dict:
        masks, starts = {}, {}
        tick = int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))  # as a start reads
        for t in map(int, _tids()):
            try:
                mask = frozenset(os.sched_getaffinity(t))
            except OSError:
                continue  # exited meanwhile
            if (start := _start(t)) is not None:  # (None: exited meanwhile)
                masks[t], starts[t] = mask, start
        return {"masks": masks, "starts": starts, "tick": tick, "main": masks[os.getpid()],
                "mempolicy": str(self.numa.get_membind()),
                "environ": dict(os.environb), "c_environ": _c_environ(),
                "omp_max": self.runtime.max_threads()}

    def compare(self, before: dict, after: dict, where: str) -> None:
        # a spawner running on after the block starts threads with its own mask: one born
        # after the restore cannot be told from one born inside by its mask alone
        spawned = {after["masks"].get(t.native_id) for _, t in self.spawners}
        parked = {t.native_id for _, t in self.parked}  # started by the main thread inside blocks: no excuse
        # a thread born inside that is now a member of the OpenMP team of the nearest
        # enclosing binding that pinned one belongs on that binding's slot (a restore
        # may have to regrow that team: libgomp ends the threads a smaller team leaves)
        enclosing = next((b.pins for b in reversed(self.active_bindings()) if b.openmp), {})
        bad = []
        for tid, mask in sorted(after["masks"].items()):
            # the same thread: the same TID and start (a TID reused since is one born inside)
            pre = tid in before["masks"] and before["starts"][tid] == after["starts"][tid]
            if tid in before["masks"] and not pre:
                self.counts["tids reused"] += 1
            want = before["masks"][tid] if pre else before["main"]
            if tid in enclosing and enclosing[tid].role == "openmp":
                want = enclosing[tid].cpus  # re-pinned with the enclosing team (see above)
            if mask != want and (pre or tid in parked or mask not in spawned):
                born = "pre-existing" if pre else "born inside" + (", a reused TID" if tid in before["masks"] else "")
                born += f", started {after['starts'][tid] - after['tick']:+d} ticks from the check"
                bad.append(f"tid {tid} ({born}) has {sorted(mask)}, want {sorted(want)}")
        for key in ("mempolicy", "omp_max"):
            if after[key] != before[key]:
                bad.append(f"{key} {after[key]!r}, want {before[key]!r}")
        if after["environ"] != before["environ"]:
            b, a = before["environ"], after["environ"]
            diff = {k.decode(): (b.get(k), a.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)}
            bad.append(f"os.environ differs (name: (want, got)): {diff}")
        if after["c_environ"] != before["c_environ"]:
            bad.append(f"the C environ differs: +{sorted(set(after['c_environ']) - set(before['c_environ']))} "
                       f"-{sorted(set(before['c_environ']) - set(after['c_environ']))}")
        if bad:
            self.fail(f"{where}: " + "; ".join(bad))

    def fail(self, text: str) -> None:
        self.counts["failures"] += 1
        if len(self.failures) < 25:
            self.failures.append(text)

    # ------------------------------------------------------------ threads
    def region(self, b=None) -> None:
        """One parallel region on the main thread; with a binding that pinned the team,
        member i must be on the plan's set i."""
        tids, masks = (ctypes.c_int * 16)(), (ctypes.c_ulong * 16)()
        n = self.omp.report(tids, masks, 16)
        self.counts["omp regions"] += 1
        if b is not None and b.openmp:
            want = [frozenset(s) for s in b.plan.cpusets]
            got = [frozenset(c for c in range(64) if masks[i] >> c & 1) for i in range(min(n, 16))]
            if got != want[:len(got)] or n != len(want):
                self.fail(f"block {self.blocks}: a region in a pinned block ran {n} members on "
                          f"{[sorted(g) for g in got]}, the plan is {[sorted(w) for w in want]}")

    def python_thread(self, seconds: float, region: bool = False) -> None:
        """A thread that lives a while; with ``region``, it first runs a parallel region of
        its own (a second team), and the block waits for that region: the runtime
        itself sets the masks of the threads it registers (libiomp5 puts them on its
        start-up mask), which must not happen after the block is left."""
        done = threading.Event()

        def run() -> None:
            if region:
                self.omp.report((ctypes.c_int * 16)(), (ctypes.c_ulong * 16)(), 16)
            done.set()
            time.sleep(seconds)

        threading.Thread(target=run, daemon=True).start()
        self.counts["threads started"] += 1
        done.wait(60)

    def park(self) -> None:
        ev = threading.Event()
        t = threading.Thread(target=ev.wait, daemon=True)
        t.start()
        if self.rng.random() < 0.5:  # a thread its owner pinned itself: a mask of its own
            os.sched_setaffinity(t.native_id, {self.rng.choice(self.cpus)})
        self.parked.append((ev, t))
        self.counts["threads started"] += 1

    def reuse(self) -> None:
        """End a parked thread and start one with its TID: the kernel's next number set
        just below it (``/proc/sys/kernel/ns_last_pid``, root), as a wrap of its counter
        does by chance (the spawners wrap it every few runs).  Elsewhere: nothing."""
        if not self.parked:
            return
        ev, old = self.parked.pop(self.rng.randrange(len(self.parked)))
        ev.set()
        old.join()
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/self/task/{old.native_id}") and time.monotonic() < deadline:
            time.sleep(0.0005)  # joined in Python, the kernel task may take a moment to go
        time.sleep(0.02)  # a start is in ticks: a natural reuse is a whole wrap later, never the same tick
        try:
            with open(NEXT_PID) as fh:
                last = int(fh.read())
            for _ in range(50):
                with open(NEXT_PID, "w") as fh:
                    fh.write(str(old.native_id - 1))
                self.park()
                if self.parked[-1][1].native_id == old.native_id:
                    self.counts["tids forced"] += 1
                    break
            # the counter back where it was: otherwise it would sweep on from here and hand
            # out at once the TIDs of threads just ended, a reuse far denser than a wrap's
            with open(NEXT_PID, "w") as fh:
                fh.write(str(last))
        except OSError:
            return

    def spawner(self) -> None:
        """A thread that keeps starting pthreads while blocks are entered and left."""
        ev = threading.Event()
        period, life = self.rng.uniform(0.0002, 0.001), self.rng.randrange(5_000, 40_000)

        def run() -> None:
            while not ev.wait(period):
                with self.gate:
                    self.c.start_thread(life)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.spawners.append((ev, t))
        self.counts["spawners"] += 1

    def release_some(self) -> None:
        for pool in (self.parked, self.spawners):
            for item in [x for x in pool if self.rng.random() < 0.3]:
                item[0].set()
                item[1].join()
                pool.remove(item)

    def act(self, b, depth: int) -> None:
        """What happens inside a block: a few random things, nested blocks among them;
        every tenth block ends with an exception, others may too."""
        n = self.blocks
        for _ in range(self.rng.randrange(6)):
            what = self.rng.choices(
                ["region", "thread", "thread+region", "pthread", "park", "reuse", "spawner", "release",
                 "refresh", "report", "nest", "boom"],
                [4, 3, 1, 3, 1, 1, 2, 2, 1, 1, 5 if depth < 4 else 0, 1])[0]
            if what == "region":
                self.region(b)
            elif what == "thread":
                self.python_thread(self.rng.uniform(0, 0.01))
            elif what == "thread+region":
                self.python_thread(self.rng.uniform(0, 0.005), region=True)
            elif what == "pthread":
                self.c.start_thread(self.rng.choice([-1, 0, 1000, 20000]))
                self.counts["threads started"] += 1
            elif what == "park":
                self.park()
            elif what == "reuse":
                self.reuse()
            elif what == "spawner":
                self.spawner()
            elif what == "release":
                self.release_some()
            elif what == "refresh" and b is not None:
                b.refresh()
            elif what == "report":
                self.affinity.report()
            elif what == "nest" and self.blocks < self.target:
                self.block(depth + 1)
            elif what == "boom":
                raise Boom
        if n % 10 == 0:
            raise Boom

    # ------------------------------------------------------------- blocks
    def kwargs(self) -> dict:
        r = self.rng
        return {"threads": r.choice([None, 1, 2, 3]), "tensorflow": False,
                "openmp": r.choice(["auto", "auto", "auto", False]), "blas": self.blas,
                "membind": r.choice(MEMBIND), "export": r.choice([True, True, "override", False]),
                "inter_placement": r.choice(["union", "package"]), "rank": r.choice([None] * 6 + ["0/2", "1/2"]),
                "blocktime": r.choice(["1", None, "0", "200"])}

    def user_env(self) -> list[tuple[str, str | None]]:
        """Set (or unset) a few variables as the user would; return how to undo it."""
        undo = []
        for _ in range(self.rng.choice([0, 0, 0, 1, 2])):
            name = self.rng.choice(sorted(USER_VARS))
            undo.append((name, os.environ.get(name)))
            if self.rng.random() < 0.25:
                os.environ.pop(name, None)
            else:
                os.environ[name] = self.rng.choice(USER_VARS[name])
        return undo

    def block(self, depth: int) -> None:
        self.blocks += 1
        n = self.blocks
        spec, kw = self.rng.choice(SPECS), self.kwargs()
        mode = self.rng.choice(["with", "with", "apply", "decorator"])
        where = f"block {n} (depth {depth}, {mode} {spec!r}, {kw})"
        self.gate.acquire()
        self.gated = True
        before = self.state()
        undo = self.user_env()
        try:
            self.run_block(mode, spec, kw, depth, where)
        finally:
            self.open_gate()
            for name, value in reversed(undo):
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        if kw["membind"] is not None:
            self.counts["membind"] += 1
        self.compare(before, self.state(), f"after {where}")

    def open_gate(self) -> None:
        if self.gated:
            self.gated = False
            self.gate.release()

    def run_block(self, mode: str, spec: str, kw: dict, depth: int, where: str) -> None:
        applied = False
        if mode == "decorator":
            ran = []

            def body() -> None:
                self.open_gate()
                ran.append(True)
                self.act(self.active_bindings()[-1], depth)
                ran.append(False)

            try:
                self.affinity.pinned(spec, **kw)(body)()
            except Boom:
                self.counts["boom"] += 1
            except self.expected_errors as e:
                if ran and not ran[-1]:  # the body finished: the restore raised
                    self.fail(f"{where}: restore raised {e!r}")
                self.counts[f"refused: {type(e).__name__}"] += 1
            return
        try:
            if mode == "with":
                cm = self.affinity.pinned(spec, **kw)
                b = cm.__enter__()
            else:
                b = self.affinity.apply(spec, **kw)
            applied = True
        except self.expected_errors as e:
            self.open_gate()
            self.counts[f"refused: {type(e).__name__}"] += 1
            return
        self.open_gate()
        exc: tuple = (None, None, None)
        try:
            self.act(b, depth)
        except Boom:
            self.counts["boom"] += 1
            exc = sys.exc_info()
        finally:
            try:
                if mode == "with":
                    cm.__exit__(*exc)
                else:
                    b.restore()
            except BaseException as e:  # noqa: BLE001 - a restore must not raise
                self.fail(f"{where}: restore raised {e!r}\n{traceback.format_exc()}")
        assert applied

    def run(self) -> None:
        while self.blocks < self.target:
            self.block(0)

    def settle(self) -> None:
        """Let every thread the churn started end (OpenMP's pool stays)."""
        for pool in (self.spawners, self.parked):
            for ev, t in pool:
                ev.set()
                t.join()
        self.c.release_all()
        for t in threading.enumerate():
            if t is not threading.main_thread():
                t.join()
        end = time.monotonic() + 60
        while self.c.live_threads() and time.monotonic() < end:
            time.sleep(0.01)
        last: list[str] = []
        while time.monotonic() < end:  # exited threads leave /proc/self/task a moment later
            now = sorted(os.listdir("/proc/self/task"))
            if now == last:
                break
            last = now
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    seed, blocks, omp_path, threads_path, blas = int(argv[0]), int(argv[1]), argv[2], argv[3], argv[4]
    omp = ctypes.CDLL(omp_path)  # the OpenMP runtime comes with it
    omp.report((ctypes.c_int * 16)(), (ctypes.c_ulong * 16)(), 16)  # its team starts
    cthreads = ctypes.CDLL(threads_path)
    cthreads.start_thread.argtypes = [ctypes.c_long]
    if blas == "auto":
        import numpy  # noqa: F401  (its BLAS pool is what blas="auto" limits)
    incomplete: list[str] = []

    def show(message, category, *rest, **kw):  # noqa: ANN001
        if "restore was incomplete" in str(message):
            incomplete.append(str(message))

    warnings.showwarning = show
    warnings.simplefilter("always")
    c = Churn(random.Random(seed), omp, cthreads, blas, blocks)
    start = c.state()
    c.run()
    c.settle()
    c.compare(start, c.state(), f"after all {c.blocks} blocks (seed {seed})")
    for w in incomplete[:5]:
        c.fail(f"warning: {w}")
    print(json.dumps({"seed": seed, "blocks": c.blocks, "counts": c.counts, "failures": c.failures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
