"""The tuner's default study file: nothing another user planted is followed (#24 item 7).
Each case is an attack that worked before: a dangling ``tune.db`` symlink made root create
a file where another user chose; an ``affinity`` folder symlinked elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from affinity.errors import TuneError
from affinity.tuning.storage import default_storage


def test_the_default_file_is_made_private_under_the_cache_folder(tmp_path):
    url = default_storage({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    path = tmp_path / "cache" / "affinity" / "tune.db"
    assert url == f"sqlite:///{path}" and path.is_file()
    assert oct(os.stat(path.parent).st_mode & 0o777) == "0o700" and oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert default_storage({"XDG_CACHE_HOME": str(tmp_path / "cache")}) == url  # again: the same file


def test_a_dangling_symlink_at_the_study_file_is_not_followed(tmp_path):
    (tmp_path / "cache" / "affinity").mkdir(parents=True, mode=0o700)
    target = tmp_path / "chosen-by-someone-else.db"
    (tmp_path / "cache" / "affinity" / "tune.db").symlink_to(target)
    with pytest.raises(TuneError, match="tune.db: is a symbolic link; not followed"):
        default_storage({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert not target.exists()


def test_the_affinity_folder_may_not_be_a_symlink(tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "cache" / "affinity").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TuneError, match="affinity: is a symlink, not a folder of ours"):
        default_storage({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_folder_writable_by_others_or_owned_by_another_user_is_refused(tmp_path):
    (tmp_path / "cache" / "affinity").mkdir(parents=True)
    os.chmod(tmp_path / "cache" / "affinity", 0o777)
    with pytest.raises(TuneError, match="writable by other users"):
        default_storage({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    os.chmod(tmp_path / "cache" / "affinity", 0o700)
    if os.geteuid() == 0:  # root running with another user's cache folder
        os.chown(tmp_path / "cache" / "affinity", 65534, 65534)
        with pytest.raises(TuneError, match=r"owned by uid 65534, not by this user"):
            default_storage({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    else:  # a folder of root's where ours would be made: refused, nothing made there
        with pytest.raises(TuneError, match="the default study file"):
            default_storage({"XDG_CACHE_HOME": "/"})


def test_the_command_says_it_in_one_line(tmp_path):
    (tmp_path / "cache" / "affinity").mkdir(parents=True, mode=0o700)
    (tmp_path / "cache" / "affinity" / "tune.db").symlink_to(tmp_path / "planted.db")
    r = subprocess.run([sys.executable, "-m", "affinity", "tune", "--", "true"], capture_output=True, text=True,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "not followed" in r.stderr, r.stderr
    assert not (tmp_path / "planted.db").exists()


# ---- issue 42, point 7: a --storage whose folder or lock file cannot be used


def _tune(url: str, prefix: tuple[str, ...] = (), cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "affinity", "tune", "--budget", "1", "--storage", url,
                           "--", "true"], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "XDG_CACHE_HOME": "/nonexistent"})


def test_a_directory_where_the_lock_file_goes(tmp_path):
    """It was an IsADirectoryError traceback from the lock file's open()."""
    (tmp_path / "t.db.lock").mkdir()
    r = _tune(f"sqlite:///{tmp_path}/t.db")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "t.db.lock, where its lock file goes, is a directory" in r.stderr
    assert not (tmp_path / "t.db").exists()


def test_a_folder_this_user_cannot_write():
    """As an unprivileged user, a folder of root's: a PermissionError traceback from the
    lock file.  Run as ``nobody`` (setpriv), the folder root's and closed to others."""
    from helpers.unprivileged import identity, python_runs_as, shared_dir

    ident, why = identity("nobody")
    if ident is None:
        pytest.skip(why)
    with shared_dir() as shared:
        why = python_runs_as(ident, shared)
        if why:
            pytest.skip(why)
        folder = shared / "roots"
        folder.mkdir(mode=0o755)
        if ident.uid == os.geteuid():
            pytest.skip("runs as root to have a folder of another user's")
        r = _tune(f"sqlite:///{folder}/t.db", ident.prefix, cwd=str(shared))
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"folder {folder} is not writable by this user" in r.stderr
        assert list(folder.iterdir()) == []
        # a study file of root's, closed to others, in a folder open to all: a PermissionError too
        study = shared / "t.db"
        study.write_bytes(b"SQLite format 3\x00" + bytes(100))
        study.chmod(0o600)
        r = _tune(f"sqlite:///{study}", ident.prefix, cwd=str(shared))
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"cannot read {study}: permission denied" in r.stderr.lower()
