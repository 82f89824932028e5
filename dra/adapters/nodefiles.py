"""The node's own files: durable writes and appends, the cross-process lock, the crash points, the CDI specs.

One module for the files this driver writes on the node, in four parts:

* Crash points (test only): with DRA_GPU_FAULT_POINT=NAME the process ends with status 137 the
  first time it reaches ``point(NAME)``, as kill -9 would there; NAME:N at the N-th time. The
  crash-point matrix (tests/e2e/test_crash_points.py) drives every point and checks that the
  restarted driver converges. Unset, a point is one string comparison.
* Durable writes: what the container runtime or a restarted driver reads is
  never half written. A write goes to a temporary file in the same directory,
  is flushed and fsynced, renamed over the target, and the directory is
  fsynced so the rename itself survives a crash. On tmpfs (/var/run/cdi on
  most nodes) nothing survives a reboot and nothing reaches a disk, so there
  the fsyncs are left out (`durable=False`): the rename alone keeps readers
  from a half-written file. A file appended to in place (the checkpoint's
  changes) is kept open, each append written whole or cut back, and made
  durable by tickets: one fsync for every append before a ticket.
* Locks: flock(2) on files in a host directory, how processes that share the
  directory take turns. Two processes in different containers (or two pods of
  one DaemonSet during a rolling update) see the same inodes, so their flocks
  exclude each other. A lock goes with the process that held it, whatever way
  it ends, so a killed process never leaves a lock behind.
* The CDI store: this driver's CDI spec files in the CDI directory (/var/run/cdi by default),
  a claim's named after it, the device plugin's with one fixed name. Claim specs are replaced
  atomically but need not be durable: start-up rewrites the spec of every claim the checkpoint
  records and removes every other one. On tmpfs (statfs) they are written without fsync;
  elsewhere the write is fsynced, and a removal never fsyncs the directory.

A program's step on the node runs inside a `Step`, which gives the program a file's failure as
StepError and passes the step's crash point.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from dra.core import cdi
from dra.documents import DocumentError, not_regular, read_file
from dra.model.node import StepError

# Crash points.

_NAME, _, _COUNT = os.environ.get("DRA_GPU_FAULT_POINT", "").partition(":")
_left = int(_COUNT) if _COUNT else 1


def point(name: str) -> None:
    """End the process here (os._exit(137), no clean-up) when DRA_GPU_FAULT_POINT names this point."""
    global _left
    if name != _NAME:
        return
    _left -= 1
    if _left <= 0:
        # Straight to fd 2: no logging handler, buffer or atexit hook runs, as with SIGKILL.
        os.write(2, f"fault point {name}: exiting with 137\n".encode())
        os._exit(137)


class Step:
    """Around a program's step on the node: a file error reaches the program as StepError, and the
    step's crash point (if any) comes right after it."""

    __slots__ = ("_point",)

    def __init__(self, point: str = "") -> None:
        self._point = point

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: object) -> None:
        if err is None:
            if self._point:
                point(self._point)
        elif isinstance(err, OSError):
            raise StepError(str(err)) from err


# Durable writes.


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
    """Whether `path` is a regular file of exactly `data`, read no further than its length; a FIFO or
    a link to /dev/zero left in its place, or a larger file, is no match and the write replaces it."""
    try:
        return read_file(path, "", len(data)) == data
    except DocumentError:
        return False


def write_atomic(path: Path, data: bytes, mode: int = 0o644, durable: bool = True) -> None:
    """Replace `path` with `data` in one step; readers see the old or the new file, never a mix.
    Durable: the new file and its name are on disk when it returns."""
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
        point("atomicfile.temp-written")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    point("atomicfile.renamed")
    if durable:
        _fsync_dir(path.parent)


def _temporary(path: Path) -> tuple[int, str]:
    """A new file beside `path`, opened for writing: its descriptor and name. A dot prefix and .tmp
    suffix keep it out of CDI's *.json/*.yaml scan; the random part is os.urandom's, as in
    tempfile.mkstemp, whose name generator costs a third of a spec write on tmpfs (architecture.md).
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
    point("atomicfile.removed")
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


class AppendFile:
    """A file appended to in place and made durable by tickets (group commit): one fsync covers every
    append before a ticket, and callers that arrive meanwhile wait on it instead of doing their own.

    The file is created elsewhere, by a durable write (`write_atomic`, then `replaced`), and kept
    open while it is the file at its path: an open and a close per append and per fsync were four
    of a prepare's 19 system calls, each a switch of threads where others wait for the GIL
    (docs/testing.md). Appends come one at a time (the caller's lock); fsyncs from any thread.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        #: Appends numbered in order (tickets), and the last made durable.
        self._appended = self._synced = 0
        #: Guards the fsync and the kept file below: no fsync runs on a descriptor being replaced.
        self._sync_lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._file_inode = 0
        #: The last ticket a failed fsync covered, and its error.
        self._failed: tuple[int, OSError] = (0, OSError())
        #: An append failed and could not be cut back: the file may end with part of it.
        self.torn = False

    def replaced(self) -> int:
        """The file at the path was replaced by a durable write: its ticket, durable already."""
        self._appended += 1
        self._synced = self._appended
        self.torn = False
        return self._appended

    def append(self, data: bytes, inode: int | None) -> tuple[int, os.stat_result]:
        """Append `data` to the file whose inode the caller last saw at the path: the ticket to `sync`
        and the file's status after. OSError when a write fails, the file cut back to before (else
        `torn`)."""
        fd = self._appending(inode)
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError:
            try:
                # Appends come one at a time: the file ends with what this one wrote.
                os.ftruncate(fd, os.fstat(fd).st_size - written)
            except OSError:
                self.torn = True
            raise
        self._appended += 1
        return self._appended, os.fstat(fd)

    def _appending(self, inode: int | None) -> int:
        """The descriptor to append to: the kept file while the file at the path is still its inode."""
        kept = self._file
        if kept is not None and inode is not None and self._file_inode == inode:
            return kept.fileno()
        # Not created here. Unbuffered, so that writes go straight to the descriptor; a file object,
        # so that an AppendFile dropped without a word (tests make thousands) closes it.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        opened = open(fd, "ab", buffering=0)  # noqa: SIM115 (kept open for the appends that follow)
        self._file_inode = os.fstat(opened.fileno()).st_ino
        with self._sync_lock:
            self._file = opened
        if kept is not None:
            kept.close()
        return opened.fileno()

    def sync(self, ticket: int) -> None:
        """Make the append numbered `ticket` durable, with every one before it: one fsync for all
        (concurrent callers wait on one another's); OSError when it fails, for every append it covered."""
        with self._sync_lock:
            if ticket <= self._synced:
                return
            if ticket <= self._failed[0]:
                raise self._failed[1]
            upto = self._appended
            kept = self._file
            fd = kept.fileno() if kept is not None else os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            except OSError as err:
                # A failed fsync reports once: the appends it covered are failed for every waiter.
                self._failed = (upto, err)
                raise
            finally:
                if kept is None:
                    os.close(fd)
            self._synced = upto


# Locks.

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
    """The lock file at `path`, created (with its directory) readable and writable by its owner only
    (explicit modes: through open() it would take the umask's); LockFileError when the path holds
    what is no regular file, left as it is."""
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
    with open_lock(path) as f:
        take(f, path, timeout)
        try:
            yield
        finally:
            let_go(f)


def take(f: IO[bytes], path: Path, timeout: float) -> None:
    """Take an exclusive lock on the open lock file `f` (at `path`), until `let_go`; LockTimeoutError
    after `timeout` seconds. Plain calls: a caller that holds and lets go on every call does without
    a context manager's generator (docs/testing.md, issue 57)."""
    deadline = time.monotonic() + timeout
    while not try_lock(f):
        if time.monotonic() > deadline:
            raise LockTimeoutError(path, timeout)
        time.sleep(POLL)


def let_go(f: IO[bytes]) -> None:
    """Let go of the lock `take` took."""
    fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class KeptLock:
    """A lock file opened at the first hold and kept open for the next, opened again when its name was
    removed (its directory cleaned by hand): a lock on a file without a name excludes no one who opens
    the path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[bytes] | None = None

    def take(self, timeout: float) -> None:
        """Take the lock until `let_go`, the file opened first where it is not (LockFileError or another
        OSError when it cannot be); LockTimeoutError after `timeout` seconds."""
        if self._file is not None and os.fstat(self._file.fileno()).st_nlink == 0:
            self._file.close()
            self._file = None
        if self._file is None:
            self._file = open_lock(self.path)
        take(self._file, self.path, timeout)

    def let_go(self) -> None:
        """Let go of the lock `take` took."""
        if self._file is not None:
            let_go(self._file)


# The CDI store.

#: The longest file name Linux file systems take, in bytes.
_NAME_MAX = 255


class CdiStore:
    """Writes, reads and removes this driver's claim specs, atomically."""

    def __init__(self, root: Path, driver: str, host_root: Path = Path("/")) -> None:
        self.root = root
        self.driver = driver
        #: Where this process sees the host's / (the paths in specs are the host's).
        self.host_root = host_root
        self._prefix = f"{cdi.vendor(driver)}-{cdi.CDI_CLASS}_"
        self._root = str(root)
        #: Whether writes are fsynced: known at the first write, when the directory exists.
        self._durable: bool | None = None

    def path(self, claim_uid: str) -> Path:
        """Where a claim's spec lives."""
        return self.root / cdi.spec_file_name(self.driver, claim_uid)

    def missing_host_paths(self, spec: dict[str, Any]) -> list[str]:
        """The host paths a spec names that are not there: a runtime would fail the container."""
        return [p for p in cdi.host_paths(spec) if not os.path.lexists(self.host_root / p.lstrip("/"))]

    def write(self, claim_uid: str, spec: dict[str, Any], compare: bool = True) -> Path:
        """Write a claim's spec unless (`compare`) the same bytes are already there; return its path."""
        return self._write(self.path(claim_uid), spec, compare)

    def device_spec_path(self) -> Path:
        """Where the device plugin's spec lives."""
        return self.root / cdi.device_spec_file_name(self.driver)

    def write_device_spec(self, spec: dict[str, Any]) -> Path:
        """Write the device plugin's spec (atomically, unless unchanged); return its path."""
        return self._write(self.device_spec_path(), spec)

    def remove_device_spec(self) -> bool:
        """Delete the device plugin's spec, durably; False when there was none."""
        return remove_durably(self.device_spec_path())

    def _write(self, path: Path, spec: dict[str, Any], compare: bool = True) -> Path:
        data = cdi.render(spec)
        if compare and holds(path, data):
            return path
        if self._durable is None:
            ensure_dir(self.root)
            self._durable = not is_tmpfs(self.root)
        write_atomic(path, data, durable=self._durable)
        return path

    def exists(self, claim_uid: str) -> bool:
        """Whether the claim's spec file is present."""
        return self.path(claim_uid).is_file()

    def remove(self, claim_uid: str) -> None:
        """Delete a claim's spec; absent is fine, and so is a UID that no file could be named after."""
        name = cdi.spec_file_name(self.driver, claim_uid)
        if "/" in claim_uid or "\0" in claim_uid or len(name.encode()) > _NAME_MAX:
            # Specs are written only for UIDs the API server issued; the kubelet may still ask to
            # unprepare anything, and a UID with a slash, a NUL or too many bytes has no spec here.
            return
        # By its name as a string: a Path's parsing and unlink cost as much again as the system call.
        try:
            os.unlink(f"{self._root}/{name}")
        except FileNotFoundError:
            return
        point("atomicfile.removed")

    def claim_uids(self) -> list[str]:
        """UIDs of every claim spec of this driver in the directory."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name[len(self._prefix) : -len(".json")]
            for p in self.root.iterdir()
            if p.name.startswith(self._prefix) and p.name.endswith(".json")
        )

    def remove_leftovers(self) -> None:
        """Delete this driver's half-written specs, left behind by a crash."""
        remove_leftovers(self.root, self._prefix)
