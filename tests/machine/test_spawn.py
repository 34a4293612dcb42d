"""The compiled core's spawn (``_native.spawn``), which starts ``affinity run``'s
instances: what the child gets (new session, stdin from /dev/null, output to the
given descriptor, SIGPIPE back to its default, no close-on-exec descriptor) and
what a failure to start says.  The parent-death signal is tested through the
launcher (tests/launcher/test_launch.py: instances do not outlive a killed launcher)."""

from __future__ import annotations

import errno
import os
import signal
import sys

import pytest

from affinity.machine import _native

#: what the child reports of itself, one line each (a shell: Python would ignore SIGPIPE itself)
REPORT = r"""
echo "$$ $(cut -d' ' -f6 /proc/$$/stat)"
readlink /proc/$$/fd/0
grep SigIgn /proc/$$/status | cut -f2
ls /proc/$$/fd | sort -n | tr '\n' ' '; echo
echo "$SPAWNED" "$0" "$1"
"""


def _reap(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_the_child_gets_a_session_dev_null_the_output_and_default_sigpipe(tmp_path):
    out = tmp_path / "out"
    kept = open(tmp_path / "not-passed-on", "w")  # noqa: SIM115  (close-on-exec, as Python opens files)
    kept_fd = kept.fileno()
    try:
        with open(out, "wb") as f:
            pid = _native.spawn("/bin/sh", ["sh", "-c", REPORT, "zero", "a b"], {"SPAWNED": "yes"},
                                out_fd=f.fileno())
        assert _reap(pid) == 0
    finally:
        kept.close()
    ids, stdin, ignored, fds, words = out.read_text().splitlines()
    pid_, session = ids.split()
    assert pid_ == session == str(pid)  # a session of its own
    assert stdin == "/dev/null"
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # Python's, in the parent ...
    assert not int(ignored, 16) >> (signal.SIGPIPE - 1) & 1  # ... the command got the default
    assert fds.split()[:3] == ["0", "1", "2"] and str(kept_fd) not in fds.split()  # close-on-exec: not passed on
    assert words == "yes zero a b"


@pytest.mark.parametrize("make, code", [(lambda p: None, errno.ENOENT), (lambda p: p.write_text("x"), errno.EACCES)],
                         ids=["missing", "not-executable"])
def test_a_command_that_cannot_be_executed_is_exec_s_errno_and_no_child_is_left(tmp_path, make, code):
    path = tmp_path / "cmd"
    make(path)
    before = _children()
    with pytest.raises(OSError) as e:
        _native.spawn(str(path), [str(path)], {})
    assert e.value.errno == code and e.value.filename == str(path)
    assert _children() <= before  # reaped by the spawn: no zombie left


def _children() -> set[int]:
    """This process's children now, zombies included (/proc's PPid lines)."""
    me, out = os.getpid(), set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as f:
                if any(line.split() == ["PPid:", str(me)] for line in f):
                    out.add(int(entry))
        except (OSError, ValueError):
            continue
    return out


def test_a_death_signal_ends_the_child_when_the_spawning_thread_ends(tmp_path):
    """PR_SET_PDEATHSIG follows the thread that forked: a spawn from a thread that then
    ends delivers the signal at once (why the launcher spawns from its main thread)."""
    import threading

    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(_native.spawn("/bin/sleep", ["sleep", "30"], {},
                                                                 deathsig=signal.SIGTERM)))
    t.start()
    t.join()
    assert _reap(got[0]) == -signal.SIGTERM
