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
