"""``python -m affinity demo`` (what ``make demo`` runs): the main job end to end."""

from __future__ import annotations

import os
import threading
from typing import TextIO

XEON_2S28C2T = "pack:2 [numa] core:28 pu:2(indexes=2*56:1*2)"


def run(out: TextIO) -> int:
    from .cpulist import format_list
    from .threads import get_affinity, set_affinity
    from .topology import Topology

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    here = Topology.from_system()
    say("== This machine ==")
    say(here.tree())
    say()
    xeon = Topology.from_synthetic(XEON_2S28C2T)
    say("== A 2 x 28 x 2 Xeon (hwloc synthetic; siblings are i and i+56) ==")
    lines = xeon.tree().splitlines()
    say("\n".join(lines[:6] + ["      ..."]))
    say()
    say("== Bind the calling thread to each allowed CPU, read back from the kernel ==")
    tid = threading.get_native_id()
    original = get_affinity()
    try:
        for cpu in sorted(here.allowed):
            got = set_affinity({cpu})
            kernel = os.sched_getaffinity(0)
            ok = "ok" if got == kernel == {cpu} else "MISMATCH"
            say(f"thread {tid} bound to OS proc set {{{format_list(got)}}}  "
                f"(os.sched_getaffinity: {{{format_list(kernel)}}}) {ok}")
            if ok != "ok":
                return 1
    finally:
        set_affinity(original)
    say(f"restored thread {tid} to {{{format_list(get_affinity())}}}")
    return 0
