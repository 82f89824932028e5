"""flock(2) on files in a host directory: how processes that share the directory take turns.

Two processes in different containers (or two pods of one DaemonSet during a
rolling update) see the same inodes, so their flocks exclude each other. A
lock goes with the process that held it, whatever way it ends, so a killed
process never leaves a lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from dra.adapters.atomicfile import ensure_dir
from dra.documents import not_regular

#: Seconds between tries while someone else holds a lock.
POLL = 0.01


class LockTimeoutError(Exception):
    """A lock stayed held by another process for longer than the caller waits."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__(f"{path} stayed locked by another process for {timeout:g}s")
        self.path = path


class LockFileError(OSError):
    """A lock's path holds what is no regular file (a directory, a FIFO, a device); the message names it."""


#: Never blocks (a FIFO would, until someone opened its other end) nor takes a terminal.
_FLAGS = os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def open_lock(path: Path) -> IO[bytes]:
    """The lock file at `path`, created (with its directory) readable and writable by its owner only.

    Explicit modes: created through open(), the file would take whatever the umask leaves.
    LockFileError when the path holds what is no regular file, left as it is.
    """
    ensure_dir(path.parent)
    _check(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _FLAGS, 0o600)
    _check(path, fd)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def open_existing_lock(path: Path) -> IO[bytes] | None:
    """The lock file at `path` opened to test it, None when there is none; LockFileError as open_lock."""
    try:
        _check(path)
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except FileNotFoundError:
        return None
    _check(path, fd)
    return os.fdopen(fd, "rb")


def _check(path: Path, fd: int | None = None) -> None:
    """LockFileError unless `path` (or `fd`, once open) is a regular file or none; `fd` is closed if not."""
    try:
        mode = os.stat(path).st_mode if fd is None else os.fstat(fd).st_mode
    except FileNotFoundError:
        return
    what = not_regular(mode)
    if what is None:
        return
    if fd is not None:
        os.close(fd)
    raise LockFileError(f"lock {path} is {what}, not a regular file; move it away (a new lock is made)")


def try_lock(f: IO[bytes], shared: bool = False) -> bool:
    """Take the lock on an open file without waiting; False when another process holds it."""
    try:
        fcntl.flock(f.fileno(), (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def exclusive(path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing); LockTimeoutError after `timeout` seconds."""
    with open_lock(path) as f, held(f, path, timeout):
        yield


@contextlib.contextmanager
def held(f: IO[bytes], path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive lock on `f`, the lock file at `path` kept open by its caller; LockTimeoutError
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not try_lock(f):
        if time.monotonic() > deadline:
            raise LockTimeoutError(path, timeout)
        time.sleep(POLL)
    try:
        yield
    finally:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def unlinked(f: IO[bytes]) -> bool:
    """Whether the open lock file's name was removed: a lock on it excludes no one who opens the path."""
    return os.fstat(f.fileno()).st_nlink == 0
