"""The checkpoint file of prepared claims: loaded at start-up, saved before a prepare is answered.

The bytes are dra.core.checkpointformat's; here is the file: a save appends what changed (one
write and one fsync) or writes a fresh snapshot atomically, ``sync`` makes appended changes
durable with one fsync for all waiting callers (group commit: `GroupCommit` has a prepare's fsync
first wait, briefly, for the programs deciding beside it), and an flock on
``checkpoint.lock`` with a re-read when another instance saved lets two instances share it
during a rolling update. The story, and what is fsynced when: docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from dra.adapters import nodefiles
from dra.adapters.nodefiles import (
    LockTimeoutError,
    let_go,
    open_lock,
    remove_leftovers,
    take,
    unlinked,
    write_atomic,
)
from dra.core.checkpointformat import (
    HINT,
    MAX_FILE_BYTES,
    CheckpointError,
    ForeignCheckpointError,
    Journal,
    decode_journal,
    encode,
    encode_changes,
)
from dra.documents import DocumentError, MissingFileError, read_file
from dra.model.prepared import DeviceAction, PreparedClaim

log = logging.getLogger(__name__)

#: The checkpoint's name in the state directory.
FILE_NAME = "checkpoint.json"
#: Appended to the checkpoint's name when NVIDIA's DRA driver left its own there (kept for the admin).
NVIDIA_ASIDE = ".nvidia-dra-driver"
#: Seconds a prepare or unprepare waits for another instance to let go of the checkpoint.
LOCK_TIMEOUT = 30.0
#: Appended lines allowed beyond twice the prepared claims before a save compacts the file.
COMPACT_SLACK = 64

#: The most a save's fsync waits for the programs running beside it to reach their own, so that one
#: fsync covers the burst (docs/testing.md, issue 44): a few programs' decisions, well under a disk's fsync.
GROUP_WAIT = 0.005

#: What tells one version of the file from the next: each save renames a new inode into place.
_Signature = tuple[int, int, int]


class CheckpointStore:
    """The checkpoint file on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_suffix(".lock")
        #: The lock file, opened at the first hold and kept: an open, fchmod and close per prepare and
        #: unprepare cost 16 of the 17 µs a hold took (docs/testing.md, issue 44).
        self._lock_file: IO[bytes] | None = None
        self._seen: _Signature | None = None
        #: The file as last read or written; a save appends what differs from it.
        self._journal: Journal | None = None
        #: Saves numbered in order (tickets), and the last made durable.
        self._appended = self._synced = 0
        #: Guards the fsync and the kept file below: no fsync runs on a descriptor being replaced.
        self._sync_lock = threading.Lock()
        #: The file appended to and fsynced, kept open while it is the checkpoint (its inode is
        #: the signature's): an open and a close per append and per fsync were four of a prepare's 19
        #: system calls, each a switch of threads where others wait for the GIL (docs/testing.md).
        self._file: IO[bytes] | None = None
        self._file_inode = 0
        #: The last ticket a failed fsync covered, and its error.
        self._failed: tuple[int, OSError] = (0, OSError())

    def _signature(self) -> _Signature | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def load(self) -> dict[str, PreparedClaim]:
        """Every prepared claim by UID; empty when no checkpoint exists yet."""
        return self.load_state()[0]

    def load_state(self) -> tuple[dict[str, PreparedClaim], list[DeviceAction]]:
        """Every prepared claim by UID and every recorded device action; empty when there is no file."""
        seen = self._signature()
        try:
            data = read_file(self.path, "checkpoint", MAX_FILE_BYTES)
        except MissingFileError:
            self._seen = self._journal = None
            return {}, []
        except DocumentError as err:
            raise CheckpointError(f"{err}; {HINT}") from None
        try:
            journal = decode_journal(data, self.path)
        except ForeignCheckpointError as foreign:
            return self._after_nvidia(foreign)
        self._seen, self._journal = seen, journal
        return dict(journal.claims), list(journal.actions)

    def _after_nvidia(
        self, foreign: ForeignCheckpointError
    ) -> tuple[dict[str, PreparedClaim], list[DeviceAction]]:
        """The node ran NVIDIA's DRA driver (same driver name, same directory): keep its checkpoint aside
        and start empty when it holds no prepared claim; refuse, naming the claims, when it does."""
        if foreign.claims:
            raise CheckpointError(
                f"checkpoint {self.path} is NVIDIA's DRA driver's and records claims it prepared: "
                f"{', '.join(foreign.claims)}; dra-gpu does not take over claims another driver prepared "
                "(their CDI specs and MIG devices are that driver's): run NVIDIA's driver again until the "
                "pods of those claims are gone (drain the node's GPU pods), then start dra-gpu "
                "(docs/migration.md, from NVIDIA's DRA driver)"
            )
        aside = self.path.with_name(f"{self.path.name}{NVIDIA_ASIDE}")
        try:
            os.replace(self.path, aside)
        except OSError as err:
            raise CheckpointError(
                f"cannot move NVIDIA's DRA driver checkpoint {self.path} aside: {err}"
            ) from None
        log.warning(
            "checkpoint %s was NVIDIA's DRA driver's, with no claim prepared: kept as %s, starting empty",
            self.path,
            aside,
        )
        self._seen = self._journal = None
        return {}, []

    @contextlib.contextmanager
    def exclusive(
        self, timeout: float = LOCK_TIMEOUT
    ) -> Iterator[tuple[dict[str, PreparedClaim], list[DeviceAction]] | None]:
        """Hold the checkpoint against other processes; yields its claims and actions if one saved it since.

        None means the file is as this store last read or wrote it. CheckpointError
        when another process holds the lock for longer than `timeout`.
        """
        saved_elsewhere = self.lock(timeout)
        try:
            yield saved_elsewhere
        finally:
            self.unlock()

    def lock(
        self, timeout: float = LOCK_TIMEOUT
    ) -> tuple[dict[str, PreparedClaim], list[DeviceAction]] | None:
        """`exclusive` without the context manager: the lock is held until `unlock`. The state takes
        it on every call, where the generators of nested context managers cost half a hold."""
        # The flock on the kept lock file, opened again when its name was removed (its directory
        # cleaned by hand): a lock on a file without a name excludes no one who opens the path.
        if self._lock_file is not None and unlinked(self._lock_file):
            self._lock_file.close()
            self._lock_file = None
        if self._lock_file is None:
            try:
                self._lock_file = open_lock(self.lock_path)
            except OSError as err:
                # Named here: the caller's message would be about what it was doing (the CDI specs).
                raise CheckpointError(f"cannot lock checkpoint {self.path}: {err}") from None
        try:
            take(self._lock_file, self.lock_path, timeout)
        except LockTimeoutError as err:
            raise CheckpointError(
                f"cannot lock checkpoint {self.path}: {err}; another dra-gpu kubelet-plugin on this node "
                "is stuck in a prepare or unprepare"
            ) from None
        try:
            return self.load_state() if self._signature() != self._seen else None
        except BaseException:
            self.unlock()
            raise

    def unlock(self) -> None:
        """Let go of the lock `lock` took; nothing when it took none (flock's unlock of a file this
        process does not hold changes nothing, and the caller's thread lock keeps its threads out)."""
        if self._lock_file is not None:
            let_go(self._lock_file)

    def remove_leftovers(self) -> None:
        """Delete temporary checkpoint files a crash left behind."""
        remove_leftovers(self.path.parent, self.path.name)

    def save(
        self,
        claims: Mapping[str, PreparedClaim],
        actions: Sequence[DeviceAction] = (),
        durable: bool = True,
        changed: frozenset[str] | None = None,
    ) -> int:
        """Record these claims and device actions: append what changed, or write a fresh snapshot.

        Durable: fsynced before it returns. Otherwise the change survives the
        process (kill -9) but not necessarily the machine until `sync` with the
        ticket it returns; unsynced only for changes whose loss the next start-up
        repairs (an unprepare: the claim's spec comes back, and a claim that
        needs its device releases it as stale; a MIG device's records: the device
        itself does not outlive a reboot). Nothing changed: nothing is written.
        `changed`: the UIDs whose claims differ from those last saved or read (None: compare all).
        """
        journal = self._journal
        if journal is None or journal.torn or journal.lines > 2 * len(claims) + COMPACT_SLACK:
            write_atomic(self.path, encode(claims, actions), mode=0o600)
            self._journal = Journal(dict(claims), list(actions))
            self._seen = self._signature()
            self._appended += 1
            self._synced = self._appended
            return self._appended
        changes, texts = encode_changes(journal, claims, actions, changed)
        if not changes:
            return 0
        self._append(changes)
        journal.claims, journal.actions, journal.action_texts = dict(claims), list(actions), texts
        journal.lines += changes.count(b"\n")
        self._appended += 1
        ticket = self._appended
        if durable:
            self.sync(ticket)
        return ticket

    def sync(self, ticket: int) -> None:
        """Make the change `save` numbered `ticket` durable; one fsync covers every change appended before it.

        Concurrent callers wait on one another's fsync instead of each doing
        their own (group commit). OSError when the fsync fails, for every change it covered.
        """
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
                # A failed fsync reports once: the changes it covered are failed for every waiter.
                self._failed = (upto, err)
                raise
            finally:
                if kept is None:
                    os.close(fd)
            self._synced = upto

    def _appending(self) -> int:
        """The descriptor to append to: the kept file while the checkpoint is still its inode."""
        kept = self._file
        if kept is not None and self._seen is not None and self._file_inode == self._seen[0]:
            return kept.fileno()
        # Not created here: the checkpoint's first version is a snapshot (write_atomic). Unbuffered,
        # so that writes go straight to the descriptor; a file object, so that a store dropped
        # without a word (tests make thousands) closes it.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        opened = open(fd, "ab", buffering=0)  # noqa: SIM115 (kept open for the saves that follow)
        self._file_inode = os.fstat(opened.fileno()).st_ino
        with self._sync_lock:
            self._file = opened
        if kept is not None:
            kept.close()
        return opened.fileno()

    def _append(self, changes: bytes) -> None:
        """Append lines to the file; on failure the file is cut back to before."""
        fd = self._appending()
        written = 0
        try:
            while written < len(changes):
                written += os.write(fd, changes[written:])
            nodefiles.point("checkpoint.appended")
        except OSError:
            try:
                # The lock is held: the file ends with what this append wrote.
                os.ftruncate(fd, os.fstat(fd).st_size - written)
            except OSError:
                # The next save writes a fresh snapshot over whatever part of the lines is there.
                assert self._journal is not None
                self._journal.torn = True
            raise
        st = os.fstat(fd)
        self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)


class GroupCommit:
    """The programs deciding now, and the fsync that waits for them: one fsync for a burst of prepares.

    The claims of a burst arrive together, each on its own thread: the first at its fsync waits (at
    most GROUP_WAIT) for the others to decide and save, so that one fsync makes them all durable.
    With the GIL the others' decisions would otherwise fall between fsyncs, one each.
    """

    def __init__(self, checkpoint: CheckpointStore) -> None:
        """Group the fsyncs of this checkpoint."""
        self._checkpoint = checkpoint
        self._deciding = 0
        self._decided = threading.Condition()

    def join(self) -> Member:
        """Count a call's program among those deciding, until it syncs or ends."""
        with self._decided:
            self._deciding += 1
        return Member()

    def leave(self, member: Member | None) -> None:
        """The program is done deciding (at its fsync, or its end); once only."""
        if member is None or member.left:
            return
        member.left = True
        with self._decided:
            self._deciding -= 1
            if not self._deciding:
                self._decided.notify_all()

    def sync(self, member: Member | None, ticket: int) -> None:
        """Wait, briefly, for the programs deciding beside this one, then for the fsync of `ticket`."""
        self.leave(member)
        with self._decided:
            self._decided.wait_for(lambda: not self._deciding, GROUP_WAIT)
        self._checkpoint.sync(ticket)


class Member:
    """One call's place among the programs deciding."""

    def __init__(self) -> None:
        self.left = False
