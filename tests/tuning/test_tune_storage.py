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
