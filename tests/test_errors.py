"""Error classes callers catch the way psutil's users do: one class per way a call
fails, each also the builtin a caller would catch, each naming the call and argument."""

from __future__ import annotations

import errno
import os

import pytest

from affinity.errors import (AccessDenied, AffinityError, BindError, ForeignTopologyError,
                             MaskNarrowedError, NoSuchThread, UnsupportedError)
from affinity.machine import _native


@pytest.mark.parametrize("err, cls, builtin", [
    (errno.ESRCH, NoSuchThread, ProcessLookupError),
    (errno.EPERM, AccessDenied, PermissionError),
    (errno.EACCES, AccessDenied, PermissionError),
    (errno.ENOSYS, UnsupportedError, NotImplementedError),
    (errno.EXDEV, UnsupportedError, NotImplementedError),
    (errno.EINVAL, BindError, OSError),
])
def test_each_errno_has_its_class(err, cls, builtin):
    e = _native.error_for(err, "hwloc_linux_set_tid_cpubind", "tid=7, cpus={0}")
    assert type(e) is cls and isinstance(e, builtin) and isinstance(e, AffinityError)
    assert isinstance(e, OSError) and e.errno == err
    assert e.call == "hwloc_linux_set_tid_cpubind" and "tid=7, cpus={0}" in str(e)


def test_the_three_meanings_of_exdev_are_told_apart():
    hwloc = _native.error_for(errno.EXDEV, "hwloc_set_membind", "nodes={0}")
    assert "hwloc cannot enforce" in str(hwloc) and type(hwloc) is UnsupportedError
    foreign = ForeignTopologyError("binding through topology 'x.xml' refused: it is not this system",
                                   call="binding")
    assert foreign.errno == errno.EXDEV and isinstance(foreign, UnsupportedError)
    narrowed = MaskNarrowedError(errno.EXDEV, "set_affinity", "tid=1", message="asked for {0-1}, got {0}")
    assert not isinstance(narrowed, UnsupportedError) and str(narrowed).endswith("asked for {0-1}, got {0}")


def test_a_thread_that_is_gone_is_no_such_thread_for_real():
    from affinity.binding import threads

    with pytest.raises(ProcessLookupError):
        threads.set_affinity({0}, tid=2**22 + 999)
    assert 2**22 + 999 not in threads.get_process_affinity()  # a gone thread is left out, not an error
    assert os.getpid() in threads.get_process_affinity()


# ---- issue 42, point 12: the arguments of the API's calls, one rule for all

SYNTH = "synthetic:pack:1 core:2 pu:1"


def _apply(**kw):
    import affinity

    b = affinity.apply("compact", tensorflow=False, **kw)
    b.restore()  # (not reached when the arguments are refused)


def _calls():
    import affinity
    from affinity.machine.topology import Topology

    return {  # what was raised before: a plain TypeError or ValueError (an AttributeError for plan_env(5))
        "plan(123)": (lambda: affinity.plan(123, topology=SYNTH), TypeError),
        "plan(b'compact')": (lambda: affinity.plan(b"compact", topology=SYNTH), TypeError),
        "plan(runtime=5)": (lambda: affinity.plan("compact", topology=SYNTH, runtime=5), TypeError),
        "plan(topology=5)": (lambda: affinity.plan("compact", topology=5), TypeError),
        "plan(env=5)": (lambda: affinity.plan("compact", topology=SYNTH, env=5), TypeError),
        "plan(env={OMP_PLACES: 1})": (lambda: affinity.plan("compact", topology=SYNTH, env={"OMP_PLACES": 1}),
                                      TypeError),
        "plan_env(5)": (lambda: affinity.plan_env(5, topology=SYNTH), TypeError),
        "Topology.load(5)": (lambda: Topology.load(5), TypeError),
        "apply(membind='bogus:0')": (lambda: _apply(membind="bogus:0"), ValueError),
        "apply(membind='')": (lambda: _apply(membind=""), ValueError),
        "apply(membind=42)": (lambda: _apply(membind=42), TypeError),
        "apply(5)": (lambda: affinity.apply(5, tensorflow=False), TypeError),
        "apply(export='x')": (lambda: _apply(export="x"), ValueError),
        "apply(inter_placement='x')": (lambda: _apply(inter_placement="x"), ValueError),
        "apply(runtime=5)": (lambda: _apply(runtime=5), TypeError),
        "plan().translation_env('x')": (
            lambda: affinity.plan("compact", topology=SYNTH).translation_env("x"), ValueError),
    }


@pytest.mark.parametrize("name", sorted(_calls()))
def test_a_wrong_argument_is_an_affinity_error_and_the_builtin(name):
    """docs/hardening.md: a wrong type is ArgumentTypeError (a TypeError), a wrong value a
    ValueError of affinity's (UsageError, SpecError, PlanError); each names the argument."""
    call, builtin = _calls()[name]
    with pytest.raises(AffinityError) as caught:
        call()
    assert isinstance(caught.value, builtin)
    assert "\n" not in str(caught.value)


def test_an_inverted_list_that_selects_nothing_names_its_option():
    """``-C '!0-1'`` on CPUs 0-1 said "system: mask  selects no PU" (no name, no CPUs)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "affinity", "run", "-C", "!0-1", "--dry-run", "--topology",
                        "synthetic:pack:1 core:2 pu:1", "--", "true"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == ("affinity run: error: --physcpubind !0-1: selects no CPU: it leaves out every "
                                "CPU allowed (0-1)")
