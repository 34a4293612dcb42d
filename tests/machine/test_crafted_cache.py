"""The launch cache: nothing followed where another user points, nothing waited
on, nothing damaged replayed (issue 24, items 7 to 9, the launch cache half).

Before: ``_cache_file`` used ``os.stat`` (following symlinks), so another user's
``$XDG_CACHE_HOME/affinity -> /some/root-owned/dir`` made root's ``affinity run``
write there; a FIFO at the cache path blocked every ``affinity run`` in ``open()``;
a malformed entry raised on every run until deleted; a flipped bit was replayed.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from affinity.errors import UnsafeFile
from affinity.launcher import fastpath
from affinity.machine import userfiles

NOBODY = 65534
WORDS = ["--", "true"]


def run(xdg: Path, *words: str, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg), "AFFINITY_LAUNCH_CACHE": "1"}
    return subprocess.run([sys.executable, "-m", "affinity", "run", *(words or WORDS)], capture_output=True,
                          text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def give_away(path: Path) -> bool:
    """Make ``path`` another user's (root only); False where this user cannot."""
    if os.geteuid() != 0:
        return False
    os.lchown(path, NOBODY, NOBODY)
    return True


def test_a_planted_symlink_to_our_folder_is_not_followed(tmp_path):
    target = tmp_path / "rootdir"
    target.mkdir(mode=0o700)
    base = tmp_path / "eve-cache"
    base.mkdir()
    (base / "affinity").symlink_to(target)
    give_away(base / "affinity")  # another user's link where root can make it so; refused either way (lstat)
    assert run(base).returncode == 0
    assert list(target.iterdir()) == []  # nothing written where the link points
    with pytest.raises(UnsafeFile):
        userfiles.private_dir(str(base / "affinity"), create=True)


def test_a_folder_above_owned_by_another_user_or_open_to_all(tmp_path):
    base = tmp_path / "other"
    base.mkdir()
    if not give_away(base):  # without root: a folder of our own open to all is ours to use
        base.chmod(0o777)
        assert userfiles.private_dir(str(base / "affinity"), create=True)
        return
    assert run(base).returncode == 0
    assert not (base / "affinity").exists()
    with pytest.raises(UnsafeFile, match="owned by uid 65534"):
        userfiles.private_dir(str(base / "affinity"), create=True)


def test_a_folder_of_roots_open_to_all_and_not_sticky(tmp_path):
    base = tmp_path / "srv"
    base.mkdir()
    base.chmod(0o777)
    if os.stat(base).st_uid == 0:  # root's folder anyone may write: another user could plant there
        with pytest.raises(UnsafeFile, match="writable by other users"):
            userfiles.private_dir(str(base / "affinity"), create=True)
        base.chmod(0o1777)  # sticky, like /tmp: what we create there stays ours
    assert userfiles.private_dir(str(base / "affinity"), create=True)


def test_a_symlink_on_the_way_owned_by_another_user(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    if give_away(link):
        with pytest.raises(UnsafeFile, match="symbolic link owned by uid"):
            userfiles.private_dir(str(link / "affinity"), create=True)
        assert not (real / "affinity").exists()
    else:  # our own symlink on the way is followed
        assert userfiles.private_dir(str(link / "affinity"), create=True)


@pytest.fixture
def xdg(tmp_path, monkeypatch):
    base = tmp_path / "xdg"
    base.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(base))
    monkeypatch.setenv("AFFINITY_LAUNCH_CACHE", "1")
    return base


def test_a_fifo_at_the_cache_path_neither_blocks_nor_stays(xdg):
    d = xdg / "affinity"
    d.mkdir(mode=0o700)
    fifo = d / f"launches-{sys.hexversion:x}"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(UnsafeFile, match="FIFO"):
        userfiles.open_private(str(fifo), os.O_RDONLY)  # returns at once: O_NONBLOCK
    r = run(xdg, timeout=60)  # before: blocked in open() for good
    assert r.returncode == 0, r.stderr
    assert fifo.is_file() and not fifo.is_fifo()  # replaced by the launch file


def test_a_dangling_symlink_at_the_file_is_not_followed(xdg, tmp_path):
    d = xdg / "affinity"
    d.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    (d / f"launches-{sys.hexversion:x}").symlink_to(victim)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        userfiles.open_private(str(d / f"launches-{sys.hexversion:x}"), os.O_RDONLY)
    assert run(xdg).returncode == 0
    assert not victim.exists()


class Hit(Exception):
    pass


@pytest.fixture
def remembered(xdg, monkeypatch):
    """One launch remembered in-process; os.execve records a hit instead of executing."""
    monkeypatch.setattr(os, "execve", lambda exe, argv, env: (_ for _ in ()).throw(Hit(argv)))
    key = fastpath.inputs(WORDS)
    fastpath.remember(key, frozenset(os.sched_getaffinity(0)), {"KMP_AFFINITY": "granularity=core,compact"},
                      ("true",))
    with pytest.raises(Hit):
        fastpath.exec_remembered(WORDS)
    return fastpath._cache_file()


def _rewrite(path: str, change) -> None:
    with open(path, "rb") as fh:
        entries = marshal.loads(fh.read())
    entries = {k: change(v) for k, v in entries.items()}
    with open(path, "wb") as fh:
        fh.write(marshal.dumps(entries))


@pytest.mark.parametrize("damage", [
    lambda v: ("not", "a", "launch"),
    lambda v: (v[0][:3], v[1]),
    lambda v: ((("x",), *v[0][1:]), v[1]),
    lambda v: v[0],
    lambda v: None,
])
def test_a_malformed_entry_is_a_miss_not_an_error(remembered, damage):
    _rewrite(remembered, damage)
    key = fastpath.exec_remembered(WORDS)  # no exception, no exec: the full path runs
    assert key == fastpath.inputs(WORDS)
    fastpath.remember(key, frozenset(os.sched_getaffinity(0)), {"A": "1"}, ("true",))  # replaced
    with pytest.raises(Hit):
        fastpath.exec_remembered(WORDS)


def test_a_flipped_bit_is_never_replayed(remembered):
    def flip(v):
        value, check = v
        cpus, env, argv, limits = value
        env = tuple((k, val.replace("granularity", "lranularity")) for k, val in env)  # one damaged byte
        return ((cpus, env, argv, limits), check)

    _rewrite(remembered, flip)
    assert fastpath.exec_remembered(WORDS) == fastpath.inputs(WORDS)  # a miss


def test_checksum_catches_every_single_bit_flip_of_an_entry():
    value = ((0, 1), (("KMP_AFFINITY", "granularity=core,compact"),), ("true",), (("/x", b"max 100000"),))
    text = repr(value).encode()
    good = fastpath._checksum(value)
    # the checksum is the repr read as a number modulo a prime: flipping bit b of byte i
    # changes it by +-2**(8i+b), never a multiple of 2**61 - 1
    p = (1 << 61) - 1
    assert all(pow(2, 8 * i + b, p) != 0 for i in range(len(text)) for b in range(8))
    assert fastpath._checksum(((0, 1), (("KMP_AFFINITY", "lranularity=core,compact"),), ("true",),
                               (("/x", b"max 100000"),))) != good
