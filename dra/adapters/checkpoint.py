"""The record of prepared claims that survives a crash.

The driver writes the checkpoint before it answers NodePrepareResources and
reads it at start-up, so a restarted driver still knows every claim the
kubelet believes prepared. The file is JSON with a format version and a
SHA-256 checksum of its content; a file that fails either check stops the
driver with an error naming the file, never a silent reset that would let a
GPU be handed out twice.

Beside the claims it holds the device actions (dra.model.prepared.DeviceAction:
MIG devices made for claims), recorded before each is carried out. A file with
actions is format version 2, its checksum covering claims and actions; one
without is version 1, as before, so that an older driver still reads it.

Two instances of the kubelet plugin overlap during a rolling update and share
the file: each holds an flock on checkpoint.lock around reading, deciding and
saving, and reads the file again under it when the other saved meanwhile.

A save costs the same with 1,000 claims prepared as with none: the file is that
document (the snapshot) followed by one line per change since, appended
(format 3: a claim recorded or dropped, or the device actions replaced), each
line with its own checksum. An append is one write and one fsync of the file:
no temporary file and no directory fsync. A crash mid-append leaves a last line
without its newline; that line was never fsynced, so no caller was answered on
it, and loading ignores it. When the lines outgrow the claims the next save
writes a fresh snapshot atomically (compaction), as it does over a file in
format 1 or 2. An older driver refuses a file with appended lines ("not valid
JSON"): it never acts on a record it cannot read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dra.adapters import faults
from dra.adapters.atomicfile import remove_leftovers, write_atomic
from dra.adapters.filelock import LockTimeoutError, exclusive
from dra.model.prepared import DeviceAction, PreparedClaim, PreparedDevice

KIND = "DraGpuCheckpoint"
VERSION = 1
#: The format version of a checkpoint that records device actions.
VERSION_WITH_ACTIONS = 2
#: The checkpoint's name in the state directory.
FILE_NAME = "checkpoint.json"
#: Seconds a prepare or unprepare waits for another instance to let go of the checkpoint.
LOCK_TIMEOUT = 30.0
#: Appended lines allowed beyond twice the prepared claims before a save compacts the file.
COMPACT_SLACK = 64

#: What tells one version of the file from the next: each save renames a new inode into place.
_Signature = tuple[int, int, int]


class CheckpointError(Exception):
    """The checkpoint cannot be read; the message names the file and what to do."""


def _claim_to_json(claim: PreparedClaim) -> dict[str, Any]:
    data = asdict(claim)
    data.pop("uid")
    return data


def _claim_from_json(uid: str, data: Mapping[str, Any]) -> PreparedClaim:
    return PreparedClaim(
        uid=uid,
        namespace=str(data["namespace"]),
        name=str(data["name"]),
        devices=tuple(
            PreparedDevice(
                request_names=tuple(d["request_names"]),
                pool=str(d["pool"]),
                device=str(d["device"]),
                cdi_device_ids=tuple(d["cdi_device_ids"]),
                admin_access=bool(d.get("admin_access", False)),
                uuid=str(d.get("uuid", "")),
                time_slice=str(d.get("time_slice", "")),
                share_id=str(d.get("share_id", "")),
                share_memory=str(d.get("share_memory", "")),
                mps=bool(d.get("mps", False)),
                mps_thread_percentage=int(d.get("mps_thread_percentage", 0)),
                mps_pinned_limit=str(d.get("mps_pinned_limit", "")),
            )
            for d in data["devices"]
        ),
    )


def _action_to_json(action: DeviceAction) -> dict[str, Any]:
    return asdict(action)


def _action_from_json(data: Mapping[str, Any]) -> DeviceAction:
    return DeviceAction(
        claim_uid=str(data["claim_uid"]),
        device=str(data["device"]),
        kind=str(data["kind"]),
        params=dict(data["params"]),
        done=bool(data["done"]),
        result=dict(data["result"]),
    )


def _checksum(claims: Any) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def encode(claims: Mapping[str, PreparedClaim], actions: Sequence[DeviceAction] = ()) -> bytes:
    """The checkpoint file's bytes for these claims and device actions."""
    body = {uid: _claim_to_json(claim) for uid, claim in sorted(claims.items())}
    document: dict[str, Any] = {"kind": KIND, "version": VERSION, "checksum": _checksum(body), "claims": body}
    if actions:
        recorded = [_action_to_json(a) for a in actions]
        document.update(
            version=VERSION_WITH_ACTIONS,
            checksum=_checksum({"claims": body, "actions": recorded}),
            actions=recorded,
        )
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


_HINT = (
    "the driver will not start on a checkpoint it cannot trust; inspect it, and only if no pod on "
    "this node uses a GPU claim, move it away to start empty"
)


def _record_line(record: dict[str, Any]) -> bytes:
    """One appended change, with the checksum of the rest of the line."""
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"))
    return f'{canonical[:-1]},"sum":"{_checksum(record)}"}}\n'.encode()


def encode_changes(
    before: Mapping[str, PreparedClaim],
    claims: Mapping[str, PreparedClaim],
    before_actions: Sequence[DeviceAction],
    actions: Sequence[DeviceAction],
) -> bytes:
    """The lines that turn the recorded claims and actions into these; empty when nothing changed.

    Its cost follows what changed: unchanged claims are the same objects, told apart by identity first.
    """
    lines = [
        _record_line({"uid": uid, "claim": _claim_to_json(claim)})
        for uid, claim in claims.items()
        if (old := before.get(uid)) is not claim and old != claim
    ]
    lines += [_record_line({"uid": uid, "gone": True}) for uid in before if uid not in claims]
    if list(actions) != list(before_actions):
        lines.append(_record_line({"actions": [_action_to_json(a) for a in actions]}))
    return b"".join(lines)


@dataclass
class Journal:
    """A checkpoint file as read: the state, and what the next save must know about the file."""

    claims: dict[str, PreparedClaim]
    actions: list[DeviceAction]
    #: Changes appended after the snapshot.
    lines: int = 0
    #: A last line without its newline: a crash cut an append short.
    torn: bool = False


def decode(data: bytes, path: Path) -> dict[str, PreparedClaim]:
    """Parse and verify checkpoint bytes; CheckpointError says what is wrong with `path`."""
    return decode_journal(data, path).claims


def decode_journal(data: bytes, path: Path) -> Journal:
    """The snapshot and every complete appended line; CheckpointError says what is wrong."""
    try:
        text = data.decode()
        document, end = json.JSONDecoder().raw_decode(text)
    except ValueError as err:
        raise CheckpointError(f"checkpoint {path} is not valid JSON ({err}); {_HINT}") from None
    claims, actions = _snapshot(document, path)
    lines = text[end:].split("\n")
    if lines[0].strip():
        raise CheckpointError(f"checkpoint {path} is not valid JSON (text after the document); {_HINT}")
    journal = Journal(claims, actions, torn=bool(lines[-1].strip()))
    for number, line in enumerate(lines[1:-1], start=2):
        if line:
            _apply_line(journal, line, path, number)
    return journal


def _apply_line(journal: Journal, line: str, path: Path, number: int) -> None:
    """Apply one appended change to the journal's state; CheckpointError when it fails its checksum."""
    where = f"checkpoint {path}: appended change {number - 1}"
    try:
        record = json.loads(line)
        recorded_sum = record.pop("sum")
    except (ValueError, AttributeError, KeyError, TypeError):
        raise CheckpointError(f"{where} is not a valid record; {_HINT}") from None
    if recorded_sum != _checksum(record):
        raise CheckpointError(f"{where} fails its checksum (corrupted or edited); {_HINT}")
    try:
        if "actions" in record:
            journal.actions = [_action_from_json(a) for a in record["actions"]]
        elif record.get("gone") is True:
            journal.claims.pop(str(record["uid"]), None)
        else:
            uid = str(record["uid"])
            journal.claims[uid] = _claim_from_json(uid, record["claim"])
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"{where} is a malformed record ({err}); {_HINT}") from None
    journal.lines += 1


def _snapshot(document: Any, path: Path) -> tuple[dict[str, PreparedClaim], list[DeviceAction]]:
    """Claims and device actions of the snapshot document; CheckpointError says what is wrong."""
    hint = _HINT
    if not isinstance(document, dict) or document.get("kind") != KIND:
        raise CheckpointError(f"checkpoint {path} is not a {KIND} file; {hint}")
    version = document.get("version")
    if version not in (VERSION, VERSION_WITH_ACTIONS):
        raise CheckpointError(
            f"checkpoint {path} has format version {version!r}, "
            f"this driver reads {VERSION} and {VERSION_WITH_ACTIONS}; {hint}"
        )
    body = document.get("claims")
    actions = document.get("actions", []) if version == VERSION_WITH_ACTIONS else []
    covered = {"claims": body, "actions": actions} if version == VERSION_WITH_ACTIONS else body
    if (
        not isinstance(body, dict)
        or not isinstance(actions, list)
        or document.get("checksum") != _checksum(covered)
    ):
        raise CheckpointError(f"checkpoint {path} fails its checksum (corrupted or edited); {hint}")
    try:
        return (
            {uid: _claim_from_json(uid, claim) for uid, claim in body.items()},
            [_action_from_json(a) for a in actions],
        )
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} has a malformed claim entry ({err}); {hint}") from None


class CheckpointStore:
    """The checkpoint file on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_suffix(".lock")
        self._seen: _Signature | None = None
        #: The file as last read or written; a save appends what differs from it.
        self._journal: Journal | None = None
        #: Saves numbered in order (tickets), and the last made durable.
        self._appended = self._synced = 0
        self._sync_lock = threading.Lock()
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
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._seen = self._journal = None
            return {}, []
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {err}") from None
        journal = decode_journal(data, self.path)
        self._seen, self._journal = seen, journal
        return dict(journal.claims), list(journal.actions)

    @contextlib.contextmanager
    def exclusive(
        self, timeout: float = LOCK_TIMEOUT
    ) -> Iterator[tuple[dict[str, PreparedClaim], list[DeviceAction]] | None]:
        """Hold the checkpoint against other processes; yields its claims and actions if one saved it since.

        None means the file is as this store last read or wrote it. CheckpointError
        when another process holds the lock for longer than `timeout`.
        """
        try:
            with exclusive(self.lock_path, timeout):
                yield self.load_state() if self._signature() != self._seen else None
        except LockTimeoutError as err:
            raise CheckpointError(
                f"cannot lock checkpoint {self.path}: {err}; another dra-gpu kubelet-plugin on this node "
                "is stuck in a prepare or unprepare"
            ) from None

    def remove_leftovers(self) -> None:
        """Delete temporary checkpoint files a crash left behind."""
        remove_leftovers(self.path.parent, self.path.name)

    def save(
        self,
        claims: Mapping[str, PreparedClaim],
        actions: Sequence[DeviceAction] = (),
        durable: bool = True,
    ) -> int:
        """Record these claims and device actions: append what changed, or write a fresh snapshot.

        Durable: fsynced before it returns. Otherwise the change survives the
        process (kill -9) but not necessarily the machine until `sync` with the
        ticket it returns; unsynced only for changes whose loss the next start-up
        repairs (an unprepare: the claim's spec comes back, and a claim that
        needs its device releases it as stale). Nothing changed: nothing is written.
        """
        journal = self._journal
        if journal is None or journal.torn or journal.lines > 2 * len(claims) + COMPACT_SLACK:
            write_atomic(self.path, encode(claims, actions), mode=0o600)
            self._journal = Journal(dict(claims), list(actions))
            self._seen = self._signature()
            self._appended += 1
            self._synced = self._appended
            return self._appended
        changes = encode_changes(journal.claims, claims, journal.actions, actions)
        if not changes:
            return 0
        self._append(changes)
        journal.claims, journal.actions = dict(claims), list(actions)
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
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            except OSError as err:
                # A failed fsync reports once: the changes it covered are failed for every waiter.
                self._failed = (upto, err)
                raise
            finally:
                os.close(fd)
            self._synced = upto

    def _append(self, changes: bytes) -> None:
        """Append lines to the file; on failure the file is cut back to before."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            try:
                written = 0
                while written < len(changes):
                    written += os.write(fd, changes[written:])
                faults.point("checkpoint.appended")
            except OSError:
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    # The next save writes a fresh snapshot over whatever part of the lines is there.
                    assert self._journal is not None
                    self._journal.torn = True
                raise
            st = os.fstat(fd)
            self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        finally:
            os.close(fd)
