"""The serving engines' readers, as their sources state them (the lines are named in
``tests/planning/test_engine_words.py``'s docstring): what vLLM, SGLang and llama.cpp
make of the words -- shared by the pure tests of the words, the tests of
``affinity run --for`` and the fake engine (``tests/helpers/fake_engine.py``) that
binds its threads by them for real.  Standard library and affinity's Topology only:
the fake engine imports it in a process of its own."""

from __future__ import annotations

from affinity.machine.topology import Topology
from affinity.planning.engines.llamacpp import MAX_CPUS
from affinity.record import replace


def hybrid(p: int, e: int) -> Topology:
    """One package: ``p`` P-cores with 2 threads, then ``e`` E-cores with one."""
    t = Topology.from_synthetic(f"pack:1 [numa] core:{p + e} pu:2")
    cores = tuple(replace(c, kind="IntelCore" if c.logical_index < p else "IntelAtom",
                          efficiency=1 if c.logical_index < p else 0) for c in t.cores)
    allowed = frozenset(x for c in cores for x in (c.cpuset if c.efficiency else {min(c.cpuset)}))
    return replace(t, cores=cores, allowed=allowed, source=f"hybrid {p}P+{e}E")


def libnuma_cpustring(text: str) -> frozenset[int]:
    """libnuma's ``numa_parse_cpustring`` for what the words use: ``a`` and ``a-b``
    joined by commas (a set: order and repeats are lost)."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


def vllm_reads(environ: dict[str, str], rank: int) -> list[int]:
    """vLLM: the entry of ``rank`` (cpu_worker.py L77-85: split at '|', indexed by the
    worker's rank), then thread i on the i-th CPU in increasing order (utils.cpp
    L21 numa_parse_cpustring, L28-38 the mask's bits in increasing order, L72-76
    thread i -> CPU i)."""
    value = environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")  # envs.py: default "auto"
    assert value not in ("auto", "nobind")
    return sorted(libnuma_cpustring(value.split("|")[rank]))


def sglang_reads(environ: dict[str, str], rank: int) -> list[int]:
    """SGLang: numa_utils.py L484-497 (split at '|', entry of the rank), then the
    same binder as vLLM (numa_utils.cpp L12, L19-29, L62-66)."""
    return sorted(libnuma_cpustring(environ["SGLANG_CPU_OMP_THREADS_BIND"].split("|")[rank]))


def llama_mask(text: str) -> frozenset[int]:
    """common.cpp parse_cpu_mask L348-383: optional 0x, most significant digit first,
    the first 128 digits."""
    digits = text[2:] if text.startswith("0x") else text
    digits = digits[:128]
    n = len(digits) * 4 - 1
    out = set()
    for ch in digits:
        v = int(ch, 16)
        out.update(n - k for k in range(4) if v & (8 >> k))
        n -= 4
    return frozenset(out)


def llama_range(text: str) -> frozenset[int]:
    """common.cpp parse_cpu_range L311-346: one dash; an empty side is 0 / 511."""
    lo, _, hi = text.partition("-")
    return frozenset(range(int(lo or 0), int(hi or MAX_CPUS - 1) + 1))


def llama_threads(argv: tuple[str, ...]) -> list[int]:
    """Where llama.cpp's generation threads go with --cpu-strict 1: thread j on the
    j-th CPU of the mask in increasing order (ggml-cpu.c L2719-2737; arg.cpp L1517,
    L1537/L1547 OR into one mask, L1557)."""
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--cpu-strict"] == "1"
    mask = llama_mask(flags["--cpu-mask"]) if "--cpu-mask" in flags else llama_range(flags["--cpu-range"])
    cpus = sorted(mask)
    n = int(flags["--threads"])
    return [cpus[j % len(cpus)] for j in range(n)]
