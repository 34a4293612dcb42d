"""CPU sets given to the thread-binding calls: read by the cpulist checks, and a CPU
this machine does not have named as ``affinity run --physcpubind`` names it.

Before: ``set_affinity({5})`` on a 2-CPU machine raised hwloc's bare ``EINVAL``
(``hwloc_set_cpubind(tid=..., cpus={5}) failed: Invalid argument``), even with
``strict=False`` for ``{0, 5}``; ``set_affinity(0)`` raised ``'int' object is not
iterable``.
"""

from __future__ import annotations

import errno
import os

import pytest

from affinity.binding import threads
from affinity.cpulist import MAX_CPUS, format_list
from affinity.errors import AffinityError, ArgumentTypeError, BindError
from affinity.machine.topology import Topology

HERE = Topology.from_system().cpuset
CPU = min(os.sched_getaffinity(0))
ABSENT = MAX_CPUS - 1  # below the id bound, past the core's mask words: refused before any call
#: the next CPU id, where the kernel has no such CPU: hwloc's EINVAL
NEXT = max(HERE) + 1
ON_THIS_MACHINE = f"does not exist on this machine (CPUs {format_list(HERE)})"


@pytest.fixture(autouse=True)
def _keep_mask():
    before = os.sched_getaffinity(0)
    yield
    os.sched_setaffinity(0, before)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("absent", [ABSENT, pytest.param(NEXT, marks=pytest.mark.skipif(
    os.path.exists(f"/sys/devices/system/cpu/cpu{NEXT}"), reason="the next CPU exists (offline)"))])
def test_a_cpu_the_machine_lacks_is_named_with_the_cpus_it_has(strict, absent):
    mine = os.sched_getaffinity(0)
    with pytest.raises(BindError) as ei:  # EINVAL, as the kernel and hwloc said it
        threads.set_affinity({absent}, strict=strict)
    assert ei.value.errno == errno.EINVAL
    assert str(ei.value) == f"[Errno 22] set_affinity(cpus={{{absent}}}): CPU {absent} {ON_THIS_MACHINE}"
    with pytest.raises(BindError) as ei:  # strict=False narrows to allowed CPUs, not to existing ones
        threads.set_affinity({CPU, absent}, strict=strict)
    assert str(ei.value) == (f"[Errno 22] set_affinity(cpus={{{format_list({CPU, absent})}}}): CPU {absent} "
                             f"{ON_THIS_MACHINE}")
    assert os.sched_getaffinity(0) == mine


def test_the_bulk_calls_name_it_too():
    tid = threads.current_tid()
    with pytest.raises(BindError, match=rf"^\[Errno 22\] set_process_affinity\(cpus=\{{{ABSENT}\}}\): CPU {ABSENT} "
                                        rf"does not exist on this machine"):
        threads.set_process_affinity({ABSENT})
    with pytest.raises(BindError, match=rf"^\[Errno 22\] set_threads_affinity\(tid={tid}, cpus=\{{{ABSENT}\}}\): "
                                        rf"CPU {ABSENT} does not exist on this machine"):
        threads.set_threads_affinity({tid: {ABSENT}})


def test_one_int_is_a_type_error_asking_for_a_set():
    for call, name in [(lambda: threads.set_affinity(CPU), "set_affinity"),
                       (lambda: threads.set_process_affinity(CPU), "set_process_affinity"),
                       (lambda: threads.set_threads_affinity({threads.current_tid(): CPU}),
                        "set_threads_affinity")]:
        with pytest.raises(ArgumentTypeError) as ei:
            call()
        e = ei.value
        assert isinstance(e, TypeError) and isinstance(e, AffinityError) and "\n" not in str(e)
        assert str(e).startswith(name) and f"expected a set of CPU ids ({{{CPU}}} for one), got int {CPU}" in str(e)
