"""A process bound by affinity publishes its bind map (``affinity.binding.publication``):
written at apply(), rewritten as pins are added, removed at the last restore and at exit;
read by another process only when it is this user's own regular file, named by the
process's PID and start time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import affinity
from affinity.binding import publication
from affinity.binding.threads import task_starts

CHILD = r"""
import os, sys, warnings
import affinity
warnings.simplefilter("ignore")
b = affinity.apply(threads=1)
print(os.getpid(), flush=True)
sys.stdin.readline()
"""


def _file(pid: int) -> Path:
    start = task_starts(pid, [pid])[pid]
    return Path(publication.folders()[0]) / f"{pid}-{start}.json"


@pytest.fixture
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_written_at_apply_rewritten_nested_and_removed_at_the_last_restore(quiet):
    me = os.getpid()
    outer = affinity.apply(threads=1)
    try:
        path = _file(me)
        data = json.loads(path.read_text())
        assert (data["format"], data["pid"], data["start"]) == (1, me, task_starts(me, [me])[me])
        assert [p["threads"] for p in data["plans"]] == [1]
        assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
        inner = affinity.apply(threads=2)
        assert [p["threads"] for p in json.loads(path.read_text())["plans"]] == [1, 2]
        inner.restore()
        assert [p["threads"] for p in json.loads(path.read_text())["plans"]] == [1]
    finally:
        outer.restore()
    assert not path.exists() and publication.last_error is None


def _child(*extra: str):
    return subprocess.Popen([sys.executable, "-c", CHILD, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def test_read_from_another_process_and_removed_at_its_exit():
    p = _child()
    try:
        pid = int(p.stdout.readline())
        path = _file(pid)
        pub, note = publication.read(pid)
        assert note is None and pub.pid == pid and pub.source == str(path)
        assert pub.plans[0].threads == 1 and pub.plans[0].rules == "intel"
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    assert not path.exists()  # exited without restore(): removed at exit


def test_a_killed_process_leaves_its_file_which_the_next_restore_sweeps(quiet):
    p = _child()
    pid = int(p.stdout.readline())
    path = _file(pid)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    p.stdin.close()
    assert path.exists()
    affinity.apply(threads=1).restore()  # the last restore of a process sweeps the folder
    assert not path.exists()


@pytest.mark.parametrize("damage, said", [
    ("symlink", "is a symbolic link; not followed"),
    ("writable", "writable by other users; not used"),
    ("other user", "owned by uid 65534, not by this user"),
    ("garbage", "not read: Expecting property name"),
    ("another start", "started at"),
])
def test_a_file_that_is_not_the_processs_own_is_refused(damage, said, tmp_path):
    """What `show`/`doctor` take from a publication must come from the process itself."""
    if damage == "other user" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    p = _child()
    try:
        pid = int(p.stdout.readline())
        path = _file(pid)
        good = path.read_text()
        path.unlink()
        if damage == "symlink":
            (tmp_path / "x.json").write_text(good)
            path.symlink_to(tmp_path / "x.json")
        elif damage == "garbage":
            path.write_text("{")
        elif damage == "another start":
            d = json.loads(good)
            d["start"] += 1
            path.write_text(json.dumps(d))
        else:
            path.write_text(good)
        path.chmod(0o666 if damage == "writable" else 0o600)
        if damage == "other user":
            os.chown(path, 65534, 65534)
        pub, note = publication.read(pid)
        assert pub is None and note is not None and said in note, note
        shown = affinity.report(pid)
        assert shown.publication is None and shown.notes == (note,)
    finally:
        p.stdin.close()
        p.wait(timeout=60)
        if path.exists() or path.is_symlink():
            path.unlink()


def test_no_publication_no_note():
    assert publication.read(1) in ((None, None), (None, "pid 1 is uid 0's: its publication is not read (roles "
                                                     "inferred)"))
    r = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert publication.read(int(r.stdout)) == (None, None)  # a process that is gone
