"""The serving engines' words (vLLM, SGLang, llama.cpp) and ONNX Runtime's and
OpenVINO's settings from plans, on described machines, read back by each engine's
parsing rule as its source states it.

Sources (the rule of each reader below names its lines):

* vLLM: ``vllm/v1/worker/cpu_worker.py`` at cbea7e6 (``init_device`` L54-88,
  ``_get_autobind_cpu_ids`` L127-204), ``csrc/cpu/utils.cpp`` at fc10a04
  (``init_cpu_threads_env`` L20-77), ``vllm/envs.py`` (the two variables' defaults).
* SGLang 0.5.23 (the PyPI wheel): ``sglang/srt/utils/numa_utils.py``
  (``init_threads_binding`` L454-505), ``sglang/srt/utils/common.py``
  (``get_physical_cpus_by_numa`` L4481-4512, ``get_cpu_memory_capacity`` L911-918),
  ``sgl-kernel/csrc/cpu/numa_utils.cpp`` at 9e738db (``init_cpu_threads_env`` L11-66).
* llama.cpp as vendored by llama-cpp-python 0.3.36 (the PyPI sdist):
  ``common/arg.cpp`` (``-t`` L1517, ``-tb`` L1527, ``-C`` L1537, ``-Cr`` L1547,
  ``--cpu-strict`` L1557, ``-Cb`` L1581, ``-Crb`` L1591, ``--cpu-strict-batch`` L1601,
  ``--numa`` L2723), ``common/common.cpp`` (``postprocess_cpu_params`` L290-309,
  ``parse_cpu_range`` L311-346, ``parse_cpu_mask`` L348-383),
  ``ggml/include/ggml.h`` L225 (``GGML_MAX_N_THREADS`` 512),
  ``ggml/src/ggml-cpu/ggml-cpu.c`` (``set_numa_thread_affinity`` L2177-2215,
  ``ggml_thread_cpumask_next`` L2719-2737, workers' masks L3352-3373).
* ONNX Runtime: ``onnxruntime/core/util/thread_utils.cc`` at 3618e5c
  (``ReadThreadAffinityConfig`` L40-88, ``CreateThreadPoolHelper`` L91-130:
  the default pool L94-103, ``thread_pool_size - 1`` entries L112-124).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affinity.errors import EngineError, PlanError
from affinity.machine.topology import Topology
from affinity.planning.engines import words_for
from affinity.planning.engines.layout import serving_layout
from affinity.planning.engines.llamacpp import cpu_mask, cpu_range, llamacpp_default
from affinity.planning.engines.openvino import NOT_TOLD, ov_default_threads, ov_properties
from affinity.planning.engines.ort import (format_affinities, ort_default, ort_threading, overridden,
                                           parse_affinities)
from affinity.planning.engines.sglang import sglang_default
from affinity.planning.engines.vllm import vllm_default
from affinity.planning.planner import plan
from helpers.engine_readers import hybrid, llama_mask, llama_range, llama_threads, sglang_reads, vllm_reads

XEON = "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"  # 2x28x2, siblings i and i+56
EPYC_NPS4 = "pack:2 group:4 [numa] l3:2 core:4 pu:2(indexes=2*64:1*2)"  # 8 nodes of 2 CCX of 4 cores
SNC2 = "pack:2 group:2 [numa] core:6 pu:2(indexes=2*24:1*2)"  # 2 SNC domains per package


# ------------------------------------------------------------ vLLM

def test_vllm_tp2_on_a_2x28x2_xeon_one_rank_per_node_two_cores_kept_each():
    t = Topology.from_synthetic(XEON)
    layout = serving_layout(t, 2, reserve=2, unit="rank")
    w = words_for("vllm", layout.plans)
    env = w.environ
    for r, share in enumerate(layout.shares):
        threads = vllm_reads(env, r)
        assert threads == [next(iter(s)) for s in sorted(share.plan.cpusets, key=min)]
        assert set(threads) == share.cpus and not set(threads) & layout.reserved
        assert {t.pu(c).numa for c in threads} == {r}  # memory: the node of its lowest CPU (utils.cpp L42)
        assert w.memory[r] == frozenset({r})
        assert len(threads) == 26 and len({t.pu(c).core for c in threads}) == 26  # one thread per core
    # the kept cores are each node's last two, both siblings: free for the API server
    assert layout.reserved == {26, 27, 82, 83, 54, 55, 110, 111}
    assert any("VLLM_CPU_NUM_OF_RESERVED_CPU is read only with VLLM_CPU_OMP_THREADS_BIND=auto" in n
               for n in w.notes)  # cpu_worker.py L185-198: reservation inside _get_autobind_cpu_ids


def test_vllm_default_auto_binding_as_its_source_says():
    t = Topology.from_synthetic(XEON)
    # cpu_worker.py L65-69: x86 keeps each core's last sibling; L186-192: one CPU reserved with 2 ranks
    a, b = vllm_default(t, 2)
    assert a == frozenset(range(56, 83)) and b == frozenset(range(84, 111))
    assert vllm_default(t, 1) == (frozenset(range(56, 84)),)  # one rank: nothing reserved
    with pytest.raises(EngineError, match="3 ranks need as many NUMA nodes"):  # L146-154
        vllm_default(t, 3)
    with pytest.raises(EngineError, match="should be less than"):  # L193-196
        vllm_default(t.with_allowed({0, 56}), 1, reserved=1)


def test_vllm_refuses_a_thread_on_two_cpus_and_ranks_that_overlap():
    t = Topology.from_synthetic(XEON)
    core_plan = plan("granularity=core,compact", threads=4, topology=t)
    with pytest.raises(EngineError, match=r"vLLM: rank 0 thread 0 may run on CPUs \{0,56\}"):
        words_for("vllm", [core_plan])
    fine = plan("granularity=fine,compact,1,0", threads=4, topology=t)
    with pytest.raises(EngineError, match="ranks 0 and 1 share CPUs 0-3"):
        words_for("vllm", [fine, fine])
    with pytest.raises(EngineError, match="threads 0 and 1 share CPU 0"):
        words_for("vllm", [plan("granularity=fine,compact", threads=2, topology=t.with_allowed({0}))])


def test_vllm_rank_spanning_nodes_is_noted_with_the_one_node_vllm_binds():
    t = Topology.from_synthetic(SNC2)
    layout = serving_layout(t, 1, unit="rank")  # one rank over all four SNC domains
    w = words_for("vllm", layout.plans)
    assert w.memory == (frozenset({0}),)
    assert any("binds its memory to node 0 only" in n for n in w.notes)
    assert any("spans NUMA nodes 0-3" in n for n in layout.notes)


# ------------------------------------------------------------ SGLang

def test_sglang_tp8_on_epyc_nps4_one_rank_per_node():
    t = Topology.from_synthetic(EPYC_NPS4)
    layout = serving_layout(t, unit="rank", reserve=1)
    assert len(layout.shares) == 8
    w = words_for("sglang", layout.plans)
    assert len(w.environ["SGLANG_CPU_OMP_THREADS_BIND"].split("|")) == 8  # one entry per rank (L486-496)
    for r, share in enumerate(layout.shares):
        threads = sglang_reads(w.environ, r)
        assert set(threads) == share.cpus and len(threads) == 7
        assert {t.pu(c).numa for c in threads} == {r}
    assert any("--max-total-tokens" in n for n in w.notes)  # common.py L911-918


def test_sglang_default_first_sibling_per_core_per_node():
    t = Topology.from_synthetic(SNC2)
    d = sglang_default(t, 4)  # common.py L4490-4495: the first CPU seen of each core
    assert d[0] == frozenset(range(0, 6)) and d[3] == frozenset(range(18, 24))
    with pytest.raises(EngineError, match="5 ranks"):
        sglang_default(t, 5)
    # a core whose first sibling is not allowed is left out (L4509)
    assert sglang_default(t.with_allowed({24, 25, 1}), 1) == (frozenset({1}),)


# ------------------------------------------------------------ llama.cpp

def test_llamacpp_one_instance_per_snc_domain_masks_read_back():
    t = Topology.from_synthetic(SNC2)
    layout = serving_layout(t, reserve=1)
    w = words_for("llama.cpp", layout.plans)
    assert len(w.argv) == 4
    for share, argv, mem in zip(layout.shares, w.argv, w.memory):
        assert llama_threads(argv) == sorted(share.cpus)
        flags = dict(zip(argv[::2], argv[1::2]))
        assert flags["--threads-batch"] == flags["--threads"] == "5"
        assert llama_mask(flags["--cpu-mask-batch"]) == share.cpus and flags["--cpu-strict-batch"] == "1"
        assert "--numa" not in argv  # ggml-cpu.c L2177-2215 would re-pin each thread
        assert mem == share.memory and len(mem) == 1
    ranged = words_for("llama.cpp", layout.plans, form="range")
    for share, argv in zip(layout.shares, ranged.argv):
        assert llama_threads(argv) == sorted(share.cpus)


def test_llamacpp_refuses_what_it_cannot_say():
    t = Topology.from_synthetic(XEON)
    holes = plan("granularity=fine,scatter", threads=4, topology=t)  # 0, 28, 1, 29: two runs
    with pytest.raises(EngineError, match=r"-Cr/--cpu-range takes one lo-hi range, and CPUs 0-1,28-29 are 2 ranges"):
        words_for("llama.cpp", [holes], form="range")
    assert llama_mask(cpu_mask(frozenset({0, 1, 28, 29}))) == {0, 1, 28, 29}
    big = Topology.from_synthetic("pack:1 core:520 pu:1")
    far = plan("granularity=fine,compact", threads=2, topology=big.with_allowed({510, 512}))
    with pytest.raises(EngineError, match=r"CPUs 0-511 only \(GGML_MAX_N_THREADS\); CPUs 512"):
        words_for("llama.cpp", [far])
    assert cpu_range(frozenset({510, 511})) == "510-511" and llama_range("510-511") == {510, 511}
    with pytest.raises(EngineError, match="form must be"):
        words_for("llama.cpp", [holes], form="list")
    with pytest.raises(EngineError, match="unknown engine"):
        words_for("tgi", [holes])


def test_llamacpp_default_thread_count_ignores_the_mask():
    t = Topology.from_synthetic(XEON).with_allowed(range(8))
    assert llamacpp_default(t) == 56  # common.cpp L77-103: thread_siblings of every CPU
    assert llamacpp_default(hybrid(8, 16)) == 8  # L207-215: the P-cores of a hybrid x86


# ------------------------------------------------------------ layouts

def test_hybrid_engine_threads_on_p_cores_first_server_on_e_cores():
    t = hybrid(8, 16)
    layout = serving_layout(t, 1, reserve=4)
    share = layout.shares[0]
    p_cores = {c.logical_index for c in t.cores if c.efficiency == 1}
    first = [t.pu(next(iter(s))).core for s in share.plan.cpusets[:8]]
    assert set(first) == p_cores  # the first eight threads on the eight P-cores
    assert all(t.core_of(c).efficiency == 0 for c in share.reserved)  # the server on E-cores
    assert len(share.reserved) == 4
    assert any("hybrid machine: engine threads on the fastest cores first" in n for n in layout.notes)


def test_layout_per_l3_group_on_epyc_keeps_each_instance_in_one_ccx():
    t = Topology.from_synthetic(EPYC_NPS4)
    layout = serving_layout(t, by="llc", reserve=1)
    assert len(layout.shares) == 16
    for s in layout.shares:
        assert sum(1 for llc in t.llcs if s.cpus | s.reserved <= llc.cpuset) == 1
        assert len(s.cpus) == 3 and len(s.memory) == 1


def test_layout_reserve_per_node_and_more_ranks_than_nodes():
    t = Topology.from_synthetic(SNC2)
    layout = serving_layout(t, 8, reserve=1, reserve_per="node", unit="rank")
    assert len(layout.shares) == 8 and layout.node_reserved == {5, 29, 11, 35, 17, 41, 23, 47}
    assert not any(s.cpus & layout.node_reserved for s in layout.shares)
    assert any("8 ranks on 4 NUMA nodes" in n for n in layout.notes)
    with pytest.raises(PlanError, match="has 6 cores, so 6 cannot be kept"):
        serving_layout(t, reserve=6)
    with pytest.raises(PlanError, match="by must be"):
        serving_layout(t, by="socket")


# ------------------------------------------------------------ ONNX Runtime

def ort_reads(text: str) -> tuple[frozenset[int], ...]:
    """thread_utils.cc L40-88: ';' between threads (L43), one 'a-b' range (L47-63) or
    an 'a,b' list (L65-73), ids from 1 (L57, L71-72: id - 1)."""
    out = []
    for entry in text.split(";"):
        if re.fullmatch(r"\d+-\d+", entry):
            lo, hi = map(int, entry.split("-"))
            out.append(frozenset(range(lo - 1, hi)))
        else:
            assert re.fullmatch(r"\d+(,\d+)*", entry), entry
            out.append(frozenset(int(x) - 1 for x in entry.split(",")))
    return tuple(out)


def test_ort_threading_gives_n_minus_one_entries_one_based():
    t = Topology.from_synthetic(XEON)
    p = plan("granularity=fine,scatter", threads=4, topology=t)
    th = ort_threading(p)
    assert th.intra_op_num_threads == 4 and th.inter_op_num_threads == 2
    # L112-124: as many entries as thread_pool_size - 1: the caller (member 0) has none
    assert ort_reads(th.intra_op_thread_affinities) == tuple(p.cpusets[1:])
    assert th.intra_op_thread_affinities == "29;2;30"
    core = plan("granularity=core,compact", threads=4, topology=t)  # two cores, a thread per sibling
    assert ort_threading(core).intra_op_thread_affinities == "2,58"  # a core's two siblings: a list
    assert ort_threading(plan("granularity=fine,compact", threads=1, topology=t)).intra_op_thread_affinities is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.frozensets(st.integers(0, 300), min_size=1, max_size=6), min_size=1, max_size=8))
def test_ort_affinity_strings_round_trip_through_its_parser(sets):
    text = format_affinities(sets)
    assert ort_reads(text) == tuple(sets) == parse_affinities(text)


def test_ort_parser_refuses_as_ort_does():
    for bad, said in (("", "must not be empty"), ("1,3-5", "only digits"), ("0", "start from 1"),
                      ("4-2", "Invalid processor interval"), ("1;x", "only digits")):
        with pytest.raises(EngineError, match=said):
            parse_affinities(bad)


def test_ort_default_and_what_the_plan_overrides_under_a_mask_and_a_quota():
    t = Topology.from_synthetic(XEON).with_allowed(range(14))
    d = ort_default(t)  # L94-103 + posix env.cc GetDefaultThreadAffinities: one per physical core
    assert d.threads == 56 and len(d.outside) == 42
    p = plan("granularity=fine,compact", threads=4, topology=t)
    said = overridden(t, ort_threading(p), quota_cpus=4.0)
    assert len(said) == 1 and "56 threads" in said[0] and "42 of its threads pinned to cores outside" in said[0]
    assert "replaced by the plan's 4 threads" in said[0] and "quota of 4 CPUs" in said[0]
    whole = Topology.from_synthetic("pack:1 core:4 pu:1")
    assert overridden(whole, ort_threading(plan("granularity=fine,compact", topology=whole))) == []


# ------------------------------------------------------------ OpenVINO

def test_openvino_properties_from_plans():
    t = hybrid(8, 16)
    p_only = plan("granularity=fine,compact,1,0", threads=8, topology=t.with_allowed(
        min(c.cpuset) for c in t.cores if c.efficiency == 1))
    props = ov_properties(p_only)
    assert props.config() == {"INFERENCE_NUM_THREADS": "8", "NUM_STREAMS": "1", "ENABLE_CPU_PINNING": "YES",
                              "ENABLE_HYPER_THREADING": "NO", "SCHEDULING_CORE_TYPE": "PCORE_ONLY"}
    assert props.notes[0] == NOT_TOLD
    mixed = ov_properties(plan("granularity=fine,compact,1,0", threads=24, topology=t))
    assert mixed.scheduling_core_type == "ANY_CORE" and any("P- and E-cores together" in n for n in mixed.notes)
    x = Topology.from_synthetic(XEON)
    smt = ov_properties(plan("granularity=fine,compact", threads=4, topology=x))  # 0,56,1,57
    assert smt.enable_hyper_threading and smt.inference_num_threads == 4
    assert ov_default_threads(x) == 28 and ov_default_threads(t) == 8
