"""Where a study is kept: checking a storage before optuna touches it, the default
file under the user's cache folder (owner-checked, no symlink followed), and the
optuna storage with heartbeats that several tuners can share.

* :func:`check_storage`: a URL that is not one, a folder that does not exist, a file
  that is not a study -- each said before anything runs, and such a file left
  untouched;
* :func:`default_storage`: ``$XDG_CACHE_HOME/affinity/tune.db``
  (``~/.cache/affinity/tune.db``), each component checked with ``lstat``: the cache
  folder owned by this user, ``affinity/`` and ``tune.db`` owned by this user, not
  symlinks, ``affinity/`` not writable by others (docs/tuning.md, "Who may write
  the study");
* :func:`rdb_storage`: a SQLite file opened with optuna's heartbeats (a trial whose
  tuner died is failed by :func:`optuna.storages.fail_stale_trials` after the grace
  period; a live tuner's running trial is never touched), the schema created under a
  file lock so that two tuners starting together do not both create it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import stat
import warnings
from collections.abc import Iterator
from typing import Any

from ..errors import TuneError, TuneUsageError

__all__ = ["GRACE_S", "HEARTBEAT_S", "check_storage", "default_storage", "rdb_storage", "sqlite_path"]

#: seconds between two heartbeats of a running trial
HEARTBEAT_S = 5
#: a running trial without a heartbeat for this long belongs to a tuner that died
GRACE_S = 20


def sqlite_path(storage: Any) -> str | None:
    """The file of a ``sqlite:///FILE`` URL (None for anything else, or in memory)."""
    if not isinstance(storage, str) or not storage.startswith("sqlite:///"):
        return None
    path = storage[len("sqlite:///"):]
    return None if not path or path == ":memory:" else path


def check_storage(storage: Any) -> Any:
    """Check a storage before optuna touches it; returns what optuna takes.

    Parameters
    ----------
    storage : None, str or optuna storage
        ``None`` (in memory), ``"sqlite:///FILE"`` or another optuna storage URL, or
        an optuna storage object.

    Returns
    -------
    None, str or optuna storage

    Raises
    ------
    TuneUsageError
        A URL that is not one, a directory, a folder that does not exist.
    TuneError
        An existing file that is not an optuna study (not SQLite, or a SQLite
        database of something else): it is left untouched.
    """
    if storage is None or not isinstance(storage, str):
        return storage
    if "://" not in storage:
        raise TuneUsageError(f"storage {storage!r}: expected a URL such as sqlite:///tune.db")
    path = sqlite_path(storage)
    if path is None:
        return storage
    if os.path.isdir(path):
        raise TuneUsageError(f"storage {storage!r}: {path} is a directory, not a database file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise TuneUsageError(f"storage {storage!r}: folder {folder} does not exist")
    if os.path.exists(path) and os.path.getsize(path) > 0:
        _check_study_file(path, storage)
    return storage


def _check_study_file(path: str, url: str) -> None:
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head != b"SQLite format 3\x00":
        raise TuneError(f"storage {url}: {path} is not a study (not a SQLite database); "
                        f"it was left untouched: give another file")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise TuneError(f"storage {url}: {path} cannot be read as a study ({e}); it was left untouched") from e
    if tables and not {"studies", "trials"} <= tables:
        raise TuneError(f"storage {url}: {path} is a SQLite database of something else (tables: "
                        f"{', '.join(sorted(tables))}), not an optuna study; it was left untouched")


# ------------------------------------------------------------------ the default file

def default_storage(environ: dict[str, str] | None = None, *, uid: int | None = None) -> str:
    """The default study file, ``$XDG_CACHE_HOME/affinity/tune.db`` (else
    ``~/.cache/affinity/tune.db``), made and checked so that nothing another user
    planted is followed.

    Parameters
    ----------
    environ : mapping, optional
        Where ``XDG_CACHE_HOME`` is read; default ``os.environ``.
    uid : int, optional
        Who must own the folders and the file; default this process's effective user.

    Returns
    -------
    str
        ``sqlite:///PATH``.

    Raises
    ------
    TuneError
        The cache folder owned by another user (or not a folder), ``affinity/`` or
        ``tune.db`` a symlink or another user's, ``affinity/`` writable by others, or
        a folder that cannot be made: one line naming the path.
    """
    env = os.environ if environ is None else environ
    me = os.geteuid() if uid is None else uid
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    base = os.path.abspath(base)
    _own_folder(base, me, create=True, private=False)
    folder = os.path.join(base, "affinity")
    _own_folder(folder, me, create=True, private=True)
    path = os.path.join(folder, "tune.db")
    _own_file(path, me)
    return "sqlite:///" + path


def _refuse(path: str, why: str) -> TuneError:
    return TuneError(f"the default study file: {path} {why}; not followed (give --storage sqlite:///FILE, "
                     f"or fix the path)")


def _own_folder(path: str, me: int, *, create: bool, private: bool) -> None:
    """``path`` a folder of user ``me``: the cache folder may be reached through a symlink
    of that user's; ``affinity/`` may not be a symlink at all, and only its owner writes it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise _refuse(path, "does not exist") from None
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as e:
            raise _refuse(path, f"cannot be made ({e.strerror})") from None
        st = os.lstat(path)
    except OSError as e:
        raise _refuse(path, f"cannot be read ({e.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        if private or st.st_uid != me:
            raise _refuse(path, f"is a symlink (owned by uid {st.st_uid})")
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a folder")
    if st.st_uid != me:
        raise _refuse(path, f"is owned by uid {st.st_uid}, not by this user (uid {me})")
    if private and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refuse(path, f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})")


def _own_file(path: str, me: int) -> None:
    """``path`` absent (made now, mode 0600, never through a symlink) or a regular file of this user."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if os.path.islink(path):
            raise _refuse(path, f"is a symlink (owned by uid {os.lstat(path).st_uid})") from None
        raise _refuse(path, f"cannot be opened ({e.strerror})") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "is not a regular file")
    if st.st_uid != me:
        raise _refuse(path, f"is owned by uid {st.st_uid}, not by this user (uid {me})")


# ------------------------------------------------------------------ optuna's storage

@contextlib.contextmanager
def _locked(path: str | None) -> Iterator[None]:
    """An exclusive lock on ``PATH.lock`` (nothing for a storage that is not a file)."""
    if path is None:
        yield
        return
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def rdb_storage(url: str, optuna: Any) -> tuple[Any, Any]:
    """optuna's RDB storage for ``url`` with heartbeats, and the lock that serialises
    creating its schema and studies.

    Parameters
    ----------
    url : str
        A checked URL (:func:`check_storage`).
    optuna : module
        optuna.

    Returns
    -------
    (optuna.storages.RDBStorage, context manager factory)
    """
    path = sqlite_path(url)
    kwargs = {"connect_args": {"timeout": 60}} if path else {}
    with _locked(path), warnings.catch_warnings():  # optuna calls heartbeats experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                             grace_period=GRACE_S)
    return storage, (lambda: _locked(path))
