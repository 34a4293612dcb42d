"""Where a study is kept: checking a storage before optuna touches it, the default
file under the user's cache folder (owner-checked, no symlink followed), and the
optuna storage with heartbeats that several tuners can share.

* :func:`check_storage`: a URL that is not one, a folder that does not exist, a file
  that is not a study -- each said before anything runs, and such a file left
  untouched;
* :func:`default_storage`: ``$XDG_CACHE_HOME/affinity/tune.db``
  (``~/.cache/affinity/tune.db``) through :mod:`affinity.machine.userfiles`: no
  symlink followed, every folder and the file this user's, none writable by others
  (docs/tuning.md, "Who may write the study");
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
import warnings
from collections.abc import Iterator
from typing import Any

from ..errors import TuneError, TuneUsageError, UnsafeFile
from ..machine import userfiles

__all__ = ["GRACE_S", "HEARTBEAT_S", "check_storage", "default_storage", "owner_gone", "rdb_storage", "sqlite_path",
           "tuner_identity"]

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
        database of something else): it is left untouched; a file that cannot be
        read, a folder this user cannot write, a directory where the lock file goes.
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
    lock = path + ".lock"
    if os.path.isdir(lock):
        raise TuneError(f"storage {storage!r}: {lock}, where its lock file goes, is a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise TuneError(f"storage {storage!r}: folder {folder} is not writable by this user (the study and "
                        f"its lock file {os.path.basename(lock)} go there)")
    if os.path.exists(path) and os.path.getsize(path) > 0:
        _check_study_file(path, storage)
    return storage


def _check_study_file(path: str, url: str) -> None:
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError as e:
        raise TuneError(f"storage {url}: cannot read {path}: {userfiles.why(e)}") from None
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

def default_storage(environ: dict[str, str] | None = None) -> str:
    """The default study file, ``$XDG_CACHE_HOME/affinity/tune.db`` (else
    ``~/.cache/affinity/tune.db``), made and opened through
    :mod:`affinity.machine.userfiles` -- the one owner-checked, no-follow way to a
    user's files -- so that nothing another user planted is followed.

    Parameters
    ----------
    environ : mapping, optional
        Where ``XDG_CACHE_HOME`` is read; default ``os.environ``.

    Returns
    -------
    str
        ``sqlite:///PATH``.

    Raises
    ------
    TuneError
        ``affinity/`` or ``tune.db`` a symlink or another user's, ``affinity/``
        writable by others, a folder above it another user's or open to others, a
        symlink on the way another user's, or a folder that cannot be made: one line
        naming the path.
    """
    env = os.environ if environ is None else environ
    base = os.path.abspath(env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"))
    folder = os.path.join(base, "affinity")
    path = os.path.join(folder, "tune.db")
    try:
        userfiles.private_dir(folder, create=True)
        os.close(userfiles.open_private(path, os.O_RDONLY | os.O_CREAT, 0o600))
    except UnsafeFile as e:
        raise _refuse(str(e)) from None
    except OSError as e:
        raise _refuse(f"{e.filename or path}: {userfiles.why(e)}") from None
    return "sqlite:///" + path


def _refuse(why: str) -> TuneError:
    return TuneError(f"the default study file: {why} (give --storage sqlite:///FILE, or fix the path)")


# ------------------------------------------------------------------ optuna's storage

@contextlib.contextmanager
def _locked(path: str | None) -> Iterator[None]:
    """An exclusive lock on ``PATH.lock`` (nothing for a storage that is not a file)."""
    if path is None:
        yield
        return
    try:
        fd = userfiles.open_private(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)  # ours, never a symlink
    except UnsafeFile as e:
        raise TuneError(f"storage sqlite:///{path}: its lock file: {e}") from None
    except OSError as e:  # (checked first by check_storage; the folder may have changed since)
        raise TuneError(f"storage sqlite:///{path}: cannot open its lock file {path}.lock: "
                        f"{userfiles.why(e)}") from None
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


# ------------------------------------------------------------------ who runs a trial

def _process_start(pid: Any) -> int | None:
    """When process ``pid`` started (``/proc/PID/stat`` field 22, clock ticks since
    boot); None when there is no such process here."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 1:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return int(data.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _where() -> str:
    """This machine's boot and PID namespace: where a PID means one process."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def tuner_identity() -> dict[str, Any]:
    """This tuner, as a running trial records it: where (boot and PID namespace), its
    PID and when it started -- so that a tuner opening the study can tell at once that
    a trial's tuner is dead (a PID gone, or another process's since), without waiting
    for its heartbeat to go stale."""
    return {"where": _where(), "pid": os.getpid(), "start": _process_start(os.getpid())}


def owner_gone(owner: Any, me: dict[str, Any]) -> bool:
    """Whether the tuner ``owner`` (a :func:`tuner_identity` stored with a trial) ran
    where ``me`` runs and is not running any more; False for one elsewhere (another
    machine, container or boot: only its heartbeat can tell) or not recorded."""
    if not isinstance(owner, dict) or not me.get("where") or owner.get("where") != me["where"]:
        return False
    return _process_start(owner.get("pid")) != owner.get("start")
