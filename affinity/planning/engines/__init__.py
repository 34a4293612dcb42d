"""Inference engines told a plan in their own words: pure.

One module per engine, each a function of plans (and the machine they were made
on) that returns a value -- nothing here reads the machine or starts anything:

* :mod:`.layout` -- where the instances (or tensor-parallel ranks) of a serving
  engine go: one per NUMA node / SNC domain / L3 group with memory local, ``K``
  cores kept for the API server and tokenizer (:func:`~.layout.serving_layout`);
* :mod:`.vllm`, :mod:`.sglang`, :mod:`.llamacpp` -- the variables or flags each
  server parses (:func:`~.vllm.vllm_words`, :func:`~.sglang.sglang_words`,
  :func:`~.llamacpp.llamacpp_words`), and what each does by itself
  (``*_default``), to say what the plan overrides;
* :mod:`.ort` -- ONNX Runtime's session options (pool sizes and its
  ``session.intra_op_thread_affinities`` syntax) and its own default;
* :mod:`.openvino` -- the OpenVINO CPU properties a plan can be given, and
  what it cannot.

Each rule that mirrors an engine's parser names the engine's source file in its
docstring; ``tests/planning/test_engine_words.py`` names the lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import EngineError
from .llamacpp import llamacpp_words
from .sglang import sglang_words
from .vllm import vllm_words
from .words import ENGINES, EngineWords

__all__ = ["ENGINES", "EngineWords", "words_for"]

_WORDS = {"vllm": vllm_words, "sglang": sglang_words, "llama.cpp": llamacpp_words}


def words_for(engine: str, plans: Sequence[Any], **options: Any) -> EngineWords:
    """``engine``'s words for ``plans`` (one per rank or instance): the function of
    its module (:func:`~.vllm.vllm_words`, :func:`~.sglang.sglang_words`,
    :func:`~.llamacpp.llamacpp_words`) with ``options``."""
    if engine not in _WORDS:
        raise EngineError(f"unknown engine {engine!r}: one of {', '.join(ENGINES)}")
    return _WORDS[engine](plans, **options)
