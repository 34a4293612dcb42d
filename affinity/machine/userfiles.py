"""Opening the files a user names or owns, safely (docs/hardening.md).

Two ways in, used by every reader and writer of such files:

* :func:`read_file` -- a file named on the command line or in the API
  (``--topology``, ``Topology.from_xml``): read whole and bounded, regular files
  only (a FIFO, ``/dev/zero`` or a terminal is refused at once instead of blocking
  or filling memory), each failure one line that says what the kernel said
  (``EACCES`` as "permission denied", not "no such file").
* :func:`open_private` -- a file in a folder of our own (the tuner's lock file): never
  follows a symlink (``O_NOFOLLOW`` on the file, ``lstat`` on the folder), opened
  with ``O_NONBLOCK`` so that a FIFO planted there cannot block the ``open()``, and
  checked after the open on the descriptor itself (``fstat``): a regular file
  owned by us, not writable by others.  Root therefore never writes where another
  user's symlink points.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any


__all__ = ["MAX_READ", "open_private", "private_dir", "read_file", "why"]

#: The most bytes :func:`read_file` reads: an hwloc XML of an 8,192-PU machine is
#: a few MB; a cpuinfo file of one is about 10 MB.
MAX_READ = 64 << 20

_WHY = {errno.ENOENT: "no such file", errno.EACCES: "permission denied (EACCES)",
        errno.EPERM: "operation not permitted (EPERM)", errno.ENOTDIR: "a part of the path is not a folder",
        errno.EISDIR: "is a folder", errno.ELOOP: "is a symbolic link (not followed)"}


def _unsafe(err: int, message: str) -> Exception:
    from ..errors import UnsafeFile  # lazy: `affinity run`'s fast path imports only built-ins until here

    return UnsafeFile(err, message)


def why(err: OSError) -> str:
    """What the kernel said, in words that keep its errno (EACCES is not ENOENT)."""
    return _WHY.get(err.errno or 0, err.strerror or str(err))


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def read_file(path: str | os.PathLike[str], *, limit: int = MAX_READ, error: Any = None,
              missing: str = "") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them
    (``missing`` is added to the message of a file that does not exist).

    Raises
    ------
    error (default TopologyError), with ``path`` as its source
        Cannot be opened (the errno in words), not a regular file (refused before
        any read: a FIFO or device never blocks), or larger than ``limit``.
    """
    if error is None:
        from ..errors import TopologyError as error  # lazy: see _unsafe
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise error(f"no such file{missing}", p) from None
        raise error(f"cannot open: {why(e)}", p) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"is {_kind(st.st_mode)}, not a regular file", p)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > limit:
                raise error(f"larger than {limit >> 20} MiB: not a topology or cpuinfo file", p)
            chunks.append(chunk)
    except OSError as e:
        raise error(f"cannot read: {why(e)}", p) from None
    finally:
        os.close(fd)


def private_dir(path: str, *, create: bool) -> str | None:
    """``path`` (absolute) as a folder of ours: not a symlink (``lstat``), owned by
    this user, not writable by group or others; every symlink on the way to it this
    user's or root's, and every folder above it too (or sticky, like ``/tmp``).
    Created (mode 0700) when ``create``; ``None`` when it does not exist and
    ``create`` is false.

    Raises
    ------
    UnsafeFile
        It or a folder above it is another user's or open to others, a symlink
        on the way is another user's, or it is a symlink itself.
    """
    _check_way(os.path.dirname(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    _check_ours(st, path, want_dir=True)
    return path


def _check_way(parent: str) -> None:
    """The folders above a private folder: a symlink on the way must be this user's
    or root's (another user's ``$XDG_CACHE_HOME -> /etc`` is not followed), and
    every real folder above owned by this user or root -- root's not open to others
    unless sticky (another user's home, a world-writable ``/srv/x``)."""
    me = os.geteuid()
    cur = "/"
    for name in parent.split("/"):
        if not name:
            continue
        cur = os.path.join(cur, name)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break  # the rest is created by us
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (me, 0):
            raise _unsafe(errno.EPERM, f"{cur}: a symbolic link owned by uid {st.st_uid}; not followed")
    real = os.path.realpath(parent)
    while not os.path.exists(real):
        real = os.path.dirname(real)
    while True:
        st = os.stat(real)
        if st.st_uid not in (me, 0):
            raise _unsafe(errno.EPERM, f"{real}: owned by uid {st.st_uid}; a folder of ours is not put there")
        # root's folders must not be open to others (a folder of ours, such as a home
        # made group-writable by umask 002, may be: what is below is checked itself)
        if st.st_uid == 0 and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise _unsafe(errno.EPERM, f"{real}: writable by other users; a folder of ours is not put there")
        if real == "/":
            return
        real = os.path.dirname(real)


def _check_ours(st: os.stat_result, path: str, *, want_dir: bool) -> None:
    if (stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)) is False:
        raise _unsafe(errno.EPERM, f"{path}: is {_kind(st.st_mode)}, not a "
                                      f"{'folder' if want_dir else 'regular file'} of ours; not used")
    if st.st_uid != os.geteuid():
        raise _unsafe(errno.EPERM, f"{path}: owned by uid {st.st_uid}, not by this user "
                                      f"(uid {os.geteuid()}); not used")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _unsafe(errno.EPERM, f"{path}: writable by other users; not used")


def open_private(path: str, flags: int, mode: int = 0o600) -> int:
    """``os.open(path, flags)`` for a file in a folder of ours: the last component
    never followed (``O_NOFOLLOW``), a FIFO never waited on (``O_NONBLOCK``, cleared
    again on a regular file), and the descriptor checked (:func:`os.fstat`): a
    regular file of this user, not writable by others.  Returns the descriptor.

    Raises
    ------
    UnsafeFile
        A symlink, FIFO, device or folder at ``path``, or another user's file.
    OSError
        The open itself failed (``FileNotFoundError`` for a missing file...).
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _unsafe(errno.ELOOP, f"{path}: is a symbolic link; not followed") from None
        raise
    try:
        _check_ours(os.fstat(fd), path, want_dir=False)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
