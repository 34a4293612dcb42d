"""A fake serving engine that binds its threads from the engine's own words as the
engine does, and reads each thread's mask back from the kernel -- what
``affinity run --for`` starts in tests/launcher/test_run_for.py.

    python fake_engine.py vllm|sglang WORLD_SIZE   # a server: one worker process per rank
    python fake_engine.py llama.cpp ARGS...        # one instance: its flags in ARGS

* vLLM / SGLang: the server starts ``WORLD_SIZE`` worker processes (they inherit its
  mask and environment, as vLLM's ``spawn``ed workers do); worker ``r`` takes entry
  ``r`` of ``VLLM_CPU_OMP_THREADS_BIND`` (``SGLANG_CPU_OMP_THREADS_BIND``) split at
  ``|``, reads it as libnuma does (a set, refused when a CPU is outside its mask:
  ``numa_parse_cpustring`` fails there), starts one thread per CPU and binds thread
  ``i`` to the ``i``-th CPU in increasing order (``init_cpu_threads_env``'s
  ``omp parallel for`` of one ``sched_setaffinity`` each).
* llama.cpp: ``--threads``/``--cpu-mask``/``--cpu-range``/``--cpu-strict 1`` read as
  ``common/arg.cpp`` does, thread ``j`` bound to the ``j``-th CPU of the mask
  (``ggml_thread_cpumask_next``), and the process's memory policy read from a fresh
  mapping (llama.cpp binds none: it is the launcher's).

Each process writes one JSON file, ``$FAKE_ENGINE_OUT/PID.json`` (the processes run
at once: lines on one pipe could interleave): its mask, its policy, and per thread
the CPU it asked for and the mask the kernel reports for it while every thread is
alive.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from helpers.engine_readers import llama_threads, sglang_reads, vllm_reads  # noqa: E402

VARIABLE = {"vllm": "VLLM_CPU_OMP_THREADS_BIND", "sglang": "SGLANG_CPU_OMP_THREADS_BIND"}


def _kernel_mask(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/status") as fh:
        return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("Cpus_allowed_list"))


def _policy() -> str:
    """The memory policy of a fresh mapping, as /proc/thread-self/numa_maps shows it."""
    buf = mmap.mmap(-1, 4 * mmap.PAGESIZE)
    buf[0:1] = b"x"
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    maps = {}
    with open("/proc/thread-self/numa_maps") as fh:
        for line in fh:
            start, *words = line.split()
            maps[int(start, 16)] = words[0]
    return maps[max(s for s in maps if s <= addr)]


def report(doc: dict) -> None:
    path = os.path.join(os.environ["FAKE_ENGINE_OUT"], f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(doc, fh)
    os.replace(path + ".tmp", path)


def bind_threads(cpus: list[int]) -> list[dict]:
    """One thread per entry, thread ``i`` bound to ``cpus[i]``, each mask read back
    while all are alive."""
    barrier = threading.Barrier(len(cpus) + 1)
    done = threading.Event()
    out: list[dict] = [{} for _ in cpus]

    def work(i: int) -> None:
        os.sched_setaffinity(0, {cpus[i]})  # this thread only (pid 0: the calling thread)
        out[i] = {"thread": i, "asked": cpus[i], "tid": threading.get_native_id()}
        barrier.wait()
        done.wait()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cpus))]
    for t in threads:
        t.start()
    barrier.wait()
    for row in out:
        row["kernel"] = _kernel_mask(row["tid"])
    done.set()
    for t in threads:
        t.join()
    return out


def worker(engine: str, rank: int) -> None:
    reads = vllm_reads if engine == "vllm" else sglang_reads
    cpus = reads(dict(os.environ), rank)
    allowed = os.sched_getaffinity(0)
    outside = sorted(set(cpus) - allowed)
    if outside:  # numa_parse_cpustring: CPUs outside the allowed set fail
        report({"rank": rank, "error": f"CPUs {outside} not allowed"})
        sys.exit(3)
    report({"rank": rank, "mask": sorted(allowed), "threads": bind_threads(cpus)})


def server(engine: str, world: int) -> int:
    me = os.path.abspath(__file__)
    procs = [subprocess.Popen([sys.executable, me, "--worker", engine, str(r)]) for r in range(world)]
    return max(p.wait() for p in procs)


def llama(argv: list[str]) -> None:
    cpus = llama_threads(tuple(argv))
    report({"instance": os.environ.get("AFFINITY_INSTANCE"), "mask": sorted(os.sched_getaffinity(0)),
            "policy": _policy(), "threads": bind_threads(cpus)})


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] in VARIABLE:
        report({"server": sys.argv[1], "mask": sorted(os.sched_getaffinity(0)), "policy": _policy(),
                VARIABLE[sys.argv[1]]: os.environ.get(VARIABLE[sys.argv[1]])})
        sys.exit(server(sys.argv[1], int(sys.argv[2])))
    else:
        llama(sys.argv[2:])
