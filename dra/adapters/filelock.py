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

#: Seconds between tries while someone else holds a lock.
POLL = 0.01


class LockTimeoutError(Exception):
    """A lock stayed held by another process for longer than the caller waits."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__(f"{path} stayed locked by another process for {timeout:g}s")
        self.path = path


def open_lock(path: Path) -> IO[bytes]:
    """The lock file at `path`, created (with its directory) readable and writable by its owner only.

    Explicit modes: created through open(), the file would take whatever the umask leaves.
    """
    ensure_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


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
