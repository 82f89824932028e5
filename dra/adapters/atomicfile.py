"""Durable file writes: what the container runtime or a restarted driver reads is never half written.

A write goes to a temporary file in the same directory, is flushed and
fsynced, renamed over the target, and the directory is fsynced so the rename
itself survives a crash. On tmpfs (/var/run/cdi on most nodes) nothing
survives a reboot and nothing reaches a disk, so there the fsyncs are left out
(`durable=False`): the rename alone keeps readers from a half-written file.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from dra.adapters import faults
from dra.documents import DocumentError, read_file


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: statfs(2)'s f_type of tmpfs (linux/magic.h).
TMPFS_MAGIC = 0x01021994


def is_tmpfs(directory: Path) -> bool:
    """Whether `directory` lies on tmpfs, by statfs(2); False when statfs cannot say."""
    # Imported here: only the CDI store asks, once.
    import ctypes

    class StatFs(ctypes.Structure):
        # struct statfs of 64-bit Linux starts with its f_type (a long); the rest stays opaque.
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 256)]

    buf = StatFs()
    # The interpreter's own symbols include the C library's statfs.
    if ctypes.CDLL(None, use_errno=True).statfs(os.fsencode(directory), ctypes.byref(buf)) != 0:
        return False
    return bool(buf.f_type == TMPFS_MAGIC)


def ensure_dir(path: Path, mode: int = 0o755) -> None:
    """`path` and its missing parents, made with `mode` whatever the umask; existing ones are left alone."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            continue
        # mkdir's mode passes through the umask (umask 000 would leave 0777 where 0755 was meant).
        os.chmod(directory, mode)


def holds(path: Path, data: bytes) -> bool:
    """Whether `path` is a regular file of exactly `data`, read no further than its length.

    Before a write that would change nothing: what is no such file (a FIFO or a link to
    /dev/zero left in its place, a larger file) is no match, and the write replaces it.
    """
    try:
        return read_file(path, "", len(data)) == data
    except DocumentError:
        return False


def write_atomic(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace `path` with `data` in one step; readers see the old or the new file, never a mix.

    Durable: the new file and its name are on disk when it returns.
    """
    try:
        fd, tmp = _temporary(path)
    except FileNotFoundError:
        # Made on the first write, or again after someone removed it: a stat per write otherwise.
        ensure_dir(path.parent)
        fd, tmp = _temporary(path)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        faults.point("atomicfile.temp-written")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    faults.point("atomicfile.renamed")
    if durable:
        _fsync_dir(path.parent)


def _temporary(path: Path) -> tuple[int, str]:
    """A new file beside `path`, opened for writing: its descriptor and name.

    A dot prefix and .tmp suffix keep half-written files out of CDI's *.json/*.yaml scan. The
    random part comes from os.urandom, as in tempfile.mkstemp, whose name generator costs
    a third of a CDI spec write on tmpfs (docs/architecture.md).
    """
    while True:
        tmp = f"{path.parent}/.{path.name}.{os.urandom(6).hex()}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue


def remove_durably(path: Path, durable: bool = True) -> bool:
    """Delete `path` and (durable) make the deletion durable; False if it was already gone."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    faults.point("atomicfile.removed")
    if durable:
        _fsync_dir(path.parent)
    return True


def remove_leftovers(directory: Path, name_prefix: str) -> list[Path]:
    """Delete temporary files a crash left between write and rename, for targets named name_prefix*."""
    if not directory.is_dir():
        return []
    leftovers = [p for p in directory.glob(f".{name_prefix}*.tmp") if p.is_file()]
    for leftover in leftovers:
        leftover.unlink(missing_ok=True)
    return leftovers
