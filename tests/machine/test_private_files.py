"""The files affinity keeps for a user (the tuner's studies and their lock files,
:mod:`affinity.machine.userfiles`): nothing followed where another user points,
nothing waited on.

Before issue 24 a ``os.stat`` that followed symlinks let another user's
``$XDG_CACHE_HOME/affinity -> /some/root-owned/dir`` make root write there, and a FIFO
at the path blocked every run in ``open()``.
"""

from __future__ import annotations

import os

import pytest

from affinity.errors import UnsafeFile
from affinity.machine import userfiles

NOBODY = 65534


def give_away(path) -> bool:
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
    with pytest.raises(UnsafeFile):
        userfiles.private_dir(str(base / "affinity"), create=True)
    assert list(target.iterdir()) == []  # nothing made where the link points


def test_a_folder_above_owned_by_another_user_or_open_to_all(tmp_path):
    base = tmp_path / "other"
    base.mkdir()
    if not give_away(base):  # without root: a folder of our own open to all is ours to use
        base.chmod(0o777)
        assert userfiles.private_dir(str(base / "affinity"), create=True)
        return
    with pytest.raises(UnsafeFile, match="owned by uid 65534"):
        userfiles.private_dir(str(base / "affinity"), create=True)
    assert not (base / "affinity").exists()


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
def xdg(tmp_path):
    base = tmp_path / "xdg"
    base.mkdir(mode=0o700)
    return base


def test_a_fifo_at_a_private_path_does_not_block(xdg):
    d = xdg / "affinity"
    d.mkdir(mode=0o700)
    fifo = d / "study.db.lock"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(UnsafeFile, match="FIFO"):
        userfiles.open_private(str(fifo), os.O_RDONLY)  # returns at once: O_NONBLOCK


def test_a_dangling_symlink_at_the_file_is_not_followed(xdg, tmp_path):
    d = xdg / "affinity"
    d.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    (d / "study.db.lock").symlink_to(victim)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        userfiles.open_private(str(d / "study.db.lock"), os.O_RDWR | os.O_CREAT)
    assert not victim.exists()
