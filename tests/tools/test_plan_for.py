"""``affinity plan --for vllm|sglang|llama.cpp``: the layout, the engine's words, what
the engine would do by itself, JSON and the picture, from the pure functions."""

from __future__ import annotations

import json

from affinity.machine.topology import Topology
from affinity.planning.engines import words_for
from affinity.planning.engines.layout import serving_layout
from affinity.tools.cli import main

XEON = "synthetic:pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"
SNC2 = "synthetic:pack:2 group:2 [numa] core:6 pu:2(indexes=2*24:1*2)"


def test_plan_for_vllm_tp2_prints_the_layout_and_the_variable(capsys):
    assert main(["plan", "--for", "vllm", "--tp", "2", "--reserve", "2", "--topology", XEON]) == 0
    out = capsys.readouterr().out
    layout = serving_layout(Topology.load(XEON), 2, reserve=2, unit="rank")
    words = words_for("vllm", layout.plans)
    assert "2 cores per rank kept for the API server and tokenizer" in out
    for line in layout.lines() + words.lines():
        assert f"  {line}" in out
    assert "vLLM by itself (VLLM_CPU_OMP_THREADS_BIND=auto): rank 0 on 56-82" in out


def test_plan_for_json_and_picture(capsys, tmp_path):
    pic = tmp_path / "sglang.svg"
    assert main(["plan", "--for", "sglang", "--topology", SNC2, "--reserve", "1", "--json",
                 "--picture", str(pic)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["engine"] == "sglang" and len(doc["layout"]["shares"]) == 4
    assert doc["words"]["env"]["SGLANG_CPU_OMP_THREADS_BIND"] == "0-4|6-10|12-16|18-22"
    assert "the engine threads of one rank" in pic.read_text()


def test_plan_for_refuses_what_does_not_go_with_it_and_what_the_engine_cannot_say(capsys):
    assert main(["plan", "granularity=fine", "--for", "vllm"]) == 2
    assert "does not go with SPEC" in capsys.readouterr().err
    # one instance over both SMT siblings of each core: two runs of CPUs, which -Cr cannot say
    assert main(["plan", "--for", "llama.cpp", "--tp", "2", "--smt", "--form", "range", "--topology", XEON]) == 1
    assert "-Cr/--cpu-range takes one lo-hi range" in capsys.readouterr().err
    assert main(["plan", "--for", "sglang", "--topology", SNC2, "--reserve", "6"]) == 1
    assert "cannot be kept for the server" in capsys.readouterr().err
