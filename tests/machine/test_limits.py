"""Descriptions of machines that cannot exist are refused before hwloc spends
minutes and gigabytes on them, and Ctrl-C is not held up by a native load."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading

import pytest

from affinity.errors import TopologyError
from affinity.machine import _native
from affinity.machine.topology import MAX_PUS, Topology


def test_a_huge_synthetic_description_is_refused_before_loading():
    # 200,000 PUs: hwloc took > 2 minutes and 1.5 GB on it, deaf to Ctrl-C
    r = subprocess.run([sys.executable, "-m", "affinity", "topology", "--topology",
                        "synthetic:pack:100 core:1000 pu:2"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert f"describes 200000 PUs; at most {MAX_PUS} are accepted" in r.stderr
    with pytest.raises(TopologyError, match="65536 PUs"):
        Topology.from_synthetic("pack:64 core:256 pu:4(indexes=2*8192:1*4)")


def test_huge_xml_and_cpuinfo_files_are_refused(tmp_path):
    xml = tmp_path / "big.xml"
    pus = "".join(f'<object type="PU" os_index="{i}"/>' for i in range(MAX_PUS + 1))
    xml.write_text(f'<?xml version="1.0"?><topology><object type="Machine">{pus}</object></topology>')
    with pytest.raises(TopologyError, match=f"describes {MAX_PUS + 1} PUs"):
        Topology.from_xml(xml)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("".join(f"processor\t: {i}\nphysical id\t: 0\ncore id\t: {i}\n\n"
                               for i in range(MAX_PUS + 1)))
    with pytest.raises(TopologyError, match=f"describes {MAX_PUS + 1} PUs"):
        Topology.from_cpuinfo(cpuinfo)


def test_the_largest_accepted_machine_loads_and_plans():
    import affinity

    t = Topology.from_synthetic("pack:8 [numa] core:512 pu:2")
    assert len(t.pus) == MAX_PUS
    assert affinity.plan("scatter", threads=16, topology=t).threads == 16


def test_ctrl_c_interrupts_a_long_native_call():
    """The call runs in a helper thread; the main thread waits in steps and so
    takes the KeyboardInterrupt at once, while the native call is still running."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    libc = ctypes.CDLL(None, use_errno=True)
    started, done = threading.Event(), threading.Event()
    r, w = os.pipe()

    def native_call() -> None:
        started.set()
        libc.read(r, ctypes.create_string_buffer(1), 1)  # blocks in C, GIL released, until the test writes
        done.set()

    # Ctrl-C once the native call is running; it cannot end before the test lets it
    # (no timing: a loaded machine only makes the test wait longer)
    timer = threading.Thread(target=lambda: started.wait(60) and os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _native.interruptible(native_call)
        assert not done.is_set()  # interrupted while the native call was still running
        os.write(w, b"x")
        assert done.wait(30)  # which then ends on its own, its result dropped
    finally:
        timer.join()
        os.close(r)
        os.close(w)


def test_the_cli_exits_130_on_ctrl_c(monkeypatch, capsys):
    from affinity.tools import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_topology", interrupted)
    assert cli.main(["topology"]) == 130
    assert capsys.readouterr().err == "affinity topology: interrupted\n"
