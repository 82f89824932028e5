"""The checkpoint of prepared claims, its file and its bytes: read at start, saved before a prepare answers.

A save appends what changed (one write, one fsync) or writes a fresh snapshot atomically; ``sync``
makes appended changes durable with one fsync for every caller waiting; an flock on
``checkpoint.lock``, with a re-read when another instance saved, lets two instances share the file
in a rolling update. The bytes, pure functions below the store: a snapshot (a JSON document, format
1 without device actions, 2 with them, under a SHA-256 checksum), then one line per change since
(format 3), each under its own checksum. Whatever fails a check is a CheckpointError, never a
silent reset. NVIDIA's DRA driver's checkpoint at the same path: dra.adapters.nvidiacheckpoint; the
wait that groups fsyncs: dra.kubeletplugin.state's GroupCommit. Why so, and what is fsynced when:
docs/architecture.md, "Checkpoint format".
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dra.adapters import nodefiles
from dra.adapters.nodefiles import AppendFile, KeptLock, LockTimeoutError, remove_leftovers, write_atomic
from dra.adapters.nvidiacheckpoint import NvidiaCheckpointError, keep_aside, nvidia_claims
from dra.api.fields import json_text_deeper_than
from dra.documents import DocumentError, MissingFileError, read_file
from dra.model.prepared import DeviceAction, PreparedClaim, PreparedDevice

#: The checkpoint's name in the state directory.
FILE_NAME = "checkpoint.json"
#: Seconds a prepare or unprepare waits for another instance to let go of the checkpoint.
LOCK_TIMEOUT = 30.0
#: Appended lines allowed beyond twice the prepared claims before a save compacts the file.
COMPACT_SLACK = 64

KIND = "DraGpuCheckpoint"
VERSION = 1
#: The format version of a checkpoint that records device actions.
VERSION_WITH_ACTIONS = 2
#: A node of 1,000 claims of 8 GPUs each checkpoints 3.3 MB, and twice its claims again in appended
#: changes before a save compacts them: 10 MB. A file past this is no checkpoint the driver wrote.
MAX_FILE_BYTES = 16 * 2**20
#: A checkpoint nests 6 levels; json's decoder recurses per level, so deeper text is refused unread.
MAX_DEPTH = 100
#: What to do about a checkpoint that cannot be trusted: every refusal of one ends with it.
HINT = (
    "the driver will not start on a checkpoint it cannot trust; inspect it, and only if no pod on "
    "this node uses a GPU claim, move it away to start empty"
)


class CheckpointError(Exception):
    """The checkpoint cannot be read or trusted; the message names the file and what to do."""


class ForeignCheckpointError(CheckpointError):
    """The file is NVIDIA's DRA driver's checkpoint (dra.adapters.nvidiacheckpoint recognised it).

    `claims` names the claims it records as prepared ("namespace/name (uid)"); none means it
    holds nothing a node still needs.
    """

    def __init__(self, path: object, claims: Sequence[str]) -> None:
        self.claims = tuple(claims)
        super().__init__(f"checkpoint {path} is NVIDIA's DRA driver's")


#: What tells one version of the file from the next: each save renames a new inode into place.
_Signature = tuple[int, int, int]


class CheckpointStore:
    """The checkpoint file on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_suffix(".lock")
        #: Kept open between holds: an open, fchmod and close per prepare and unprepare cost 16 of the
        #: 17 µs a hold took (docs/testing.md, issue 44).
        self._lock = KeptLock(self.lock_path)
        self._seen: _Signature | None = None
        #: The file as last read or written; a save appends what differs from it.
        self._journal: Journal | None = None
        #: The changes appended, kept open while it is the checkpoint's inode, each save a ticket.
        self._appends = AppendFile(path)

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
            try:
                keep_aside(self.path, foreign.claims)
            except NvidiaCheckpointError as err:
                raise CheckpointError(str(err)) from None
            self._seen = self._journal = None
            return {}, []
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
        try:
            self._lock.take(timeout)
        except LockTimeoutError as err:
            raise CheckpointError(
                f"cannot lock checkpoint {self.path}: {err}; another dra-gpu kubelet-plugin on this node "
                "is stuck in a prepare or unprepare"
            ) from None
        except OSError as err:
            # Named here: the caller's message would be about what it was doing (the CDI specs).
            raise CheckpointError(f"cannot lock checkpoint {self.path}: {err}") from None
        try:
            return self.load_state() if self._signature() != self._seen else None
        except BaseException:
            self.unlock()
            raise

    def unlock(self) -> None:
        """Let go of the lock `lock` took; nothing when it took none (flock's unlock of a file this
        process does not hold changes nothing, and the caller's thread lock keeps its threads out)."""
        self._lock.let_go()

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
        # Torn (a crash, or a failed append not cut back): the file may end with part of a line.
        if (
            journal is None
            or journal.torn
            or self._appends.torn
            or journal.lines > 2 * len(claims) + COMPACT_SLACK
        ):
            write_atomic(self.path, encode(claims, actions), mode=0o600)
            self._journal = Journal(dict(claims), list(actions))
            self._seen = self._signature()
            return self._appends.replaced()
        changes, texts = encode_changes(journal, claims, actions, changed)
        if not changes:
            return 0
        ticket, st = self._appends.append(changes, self._seen[0] if self._seen is not None else None)
        nodefiles.point("checkpoint.appended")
        self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        journal.claims, journal.actions, journal.action_texts = dict(claims), list(actions), texts
        journal.lines += changes.count(b"\n")
        if durable:
            self.sync(ticket)
        return ticket

    def sync(self, ticket: int) -> None:
        """Make the change `save` numbered `ticket` durable; one fsync covers every change appended before it.

        Concurrent callers wait on one another's fsync instead of each doing
        their own (group commit). OSError when the fsync fails, for every change it covered.
        """
        self._appends.sync(ticket)


# The bytes: claims and device actions to bytes and back, checked, with no file in sight.


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
    # Compact: json's C encoder (an indented one runs in Python: 137 ms for 1,000 claims, during the
    # prepare whose save compacts the file). Readers take either; the lines after it are compact too.
    return (_canonical(document) + "\n").encode()


def encode_changes(
    journal: Journal,
    claims: Mapping[str, PreparedClaim],
    actions: Sequence[DeviceAction],
    changed: frozenset[str] | None = None,
) -> tuple[bytes, dict[int, str]]:
    """The lines that turn the journal's claims and actions into these (empty when nothing changed),
    and the actions' encodings for the journal to keep.

    Its cost follows what changed, not what is held: `changed` names the UIDs whose claims differ
    (None: every claim is compared, unchanged ones told apart by identity first), and an action
    the journal already holds is not encoded again (the list is one line, rewritten whole when one
    action changes: 100 MIG devices made cost 0.4 ms a save to re-encode, bench_scale).
    """
    before = journal.claims
    lines = []
    for uid in _changed_uids(before, claims, changed):
        claim = claims.get(uid)
        if claim is None:
            if uid in before:
                lines.append(_line(_canonical({"uid": uid, "gone": True})))
        elif (old := before.get(uid)) is not claim and old != claim:
            lines.append(_line(_canonical({"uid": uid, "claim": _claim_to_json(claim)})))
    texts = journal.action_texts
    if list(actions) != journal.actions:
        known = {id(a): texts[id(a)] for a in journal.actions if id(a) in texts}
        texts = {id(a): known.get(id(a)) or _canonical(_action_to_json(a)) for a in actions}
        lines.append(_line('{"actions":[' + ",".join(texts[id(a)] for a in actions) + "]}"))
    return b"".join(lines), texts


def _changed_uids(
    before: Mapping[str, PreparedClaim], claims: Mapping[str, PreparedClaim], changed: frozenset[str] | None
) -> Iterable[str]:
    """The UIDs to compare: `changed` where it accounts for the difference in size, else all of them."""
    if changed is not None:
        added = sum(uid in claims and uid not in before for uid in changed)
        dropped = sum(uid in before and uid not in claims for uid in changed)
        if len(claims) == len(before) + added - dropped:
            return sorted(changed)
    return itertools.chain(claims, (uid for uid in before if uid not in claims))


@dataclass
class Journal:
    """A checkpoint file as read: the state, and what the next save must know about the file."""

    claims: dict[str, PreparedClaim]
    actions: list[DeviceAction]
    #: Changes appended after the snapshot.
    lines: int = 0
    #: A last line without its newline: a crash cut an append short.
    torn: bool = False
    #: The canonical JSON of `actions`, by id() (they are alive in `actions`): encoded once each.
    action_texts: dict[int, str] = field(default_factory=dict)


def _line(canonical: str) -> bytes:
    """A record's canonical JSON object as an appended line, its checksum added as the last key."""
    # The checksum is of the same canonical text: encoded once, not twice.
    return f'{canonical[:-1]},"sum":"{_sum(canonical)}"}}\n'.encode()


def _checksum(value: Any) -> str:
    return _sum(_canonical(value))


def _sum(canonical: str) -> str:
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


#: Fields read by name: dataclasses.asdict deep-copies every value, some 40 µs a claim, where these
#: values (strings, numbers, tuples of strings) are immutable and need no copy (3 µs).
_CLAIM_FIELDS = tuple(f.name for f in fields(PreparedClaim) if f.name not in ("uid", "devices"))
_DEVICE_FIELDS = tuple(f.name for f in fields(PreparedDevice))


def _claim_to_json(claim: PreparedClaim) -> dict[str, Any]:
    data = {name: getattr(claim, name) for name in _CLAIM_FIELDS}
    data["devices"] = [{name: getattr(d, name) for name in _DEVICE_FIELDS} for d in claim.devices]
    return data


def _action_to_json(action: DeviceAction) -> dict[str, Any]:
    # By hand, not asdict: every save that changes an action writes them all, and asdict's recursive
    # copy made that the largest cost of a prepare with 100 MIG devices made (bench_scale).
    return {
        "claim_uid": action.claim_uid,
        "device": action.device,
        "kind": action.kind,
        "params": dict(action.params),
        "done": action.done,
        "result": dict(action.result),
    }


def decode_journal(data: bytes, path: object) -> Journal:
    """The snapshot and every complete appended line; CheckpointError says what is wrong."""
    if len(data) > MAX_FILE_BYTES:
        raise CheckpointError(f"checkpoint {path} is larger than {MAX_FILE_BYTES} bytes; {HINT}")
    try:
        text = data.decode()
    except ValueError as err:
        raise CheckpointError(f"checkpoint {path} is not valid JSON ({err}); {HINT}") from None
    # The whole text, once: each line decoded follows only valid JSON (the first invalid line is
    # refused), so its depth is what the text's depth is there.
    if json_text_deeper_than(text, MAX_DEPTH):
        raise CheckpointError(f"checkpoint {path} is nested deeper than {MAX_DEPTH} levels; {HINT}")
    try:
        document, end = json.JSONDecoder().raw_decode(text)
    except ValueError as err:
        raise CheckpointError(f"checkpoint {path} is not valid JSON ({err}); {HINT}") from None
    claims, actions = _snapshot(document, path)
    lines = text[end:].split("\n")
    if lines[0].strip():
        raise CheckpointError(f"checkpoint {path} is not valid JSON (text after the document); {HINT}")
    journal = Journal(claims, actions, torn=bool(lines[-1].strip()))
    for number, line in enumerate(lines[1:-1], start=2):
        if line:
            _apply_line(journal, line, path, number)
    return journal


def _apply_line(journal: Journal, line: str, path: object, number: int) -> None:
    """Apply one appended change to the journal's state; CheckpointError when it fails its checksum."""
    where = f"checkpoint {path}: appended change {number - 1}"
    try:
        record = json.loads(line)
        recorded_sum = record.pop("sum")
    except (ValueError, AttributeError, KeyError, TypeError):
        raise CheckpointError(f"{where} is not a valid record; {HINT}") from None
    if recorded_sum != _checksum(record):
        raise CheckpointError(f"{where} fails its checksum (corrupted or edited); {HINT}")
    try:
        if "actions" in record:
            journal.actions = [_action_from_json(a) for a in record["actions"]]
        elif record.get("gone") is True:
            journal.claims.pop(str(record["uid"]), None)
        else:
            uid = str(record["uid"])
            journal.claims[uid] = _claim_from_json(uid, record["claim"])
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"{where} is a malformed record ({err}); {HINT}") from None
    journal.lines += 1


def _snapshot(document: Any, path: object) -> tuple[dict[str, PreparedClaim], list[DeviceAction]]:
    """Claims and device actions of the snapshot document; CheckpointError says what is wrong."""
    foreign = nvidia_claims(document)
    if foreign is not None:
        raise ForeignCheckpointError(path, foreign)
    if not isinstance(document, dict) or document.get("kind") != KIND:
        raise CheckpointError(f"checkpoint {path} is not a {KIND} file; {HINT}")
    version = document.get("version")
    if version not in (VERSION, VERSION_WITH_ACTIONS):
        raise CheckpointError(
            f"checkpoint {path} has format version {version!r}, "
            f"this driver reads {VERSION} and {VERSION_WITH_ACTIONS}; {HINT}"
        )
    body = document.get("claims")
    actions = document.get("actions", []) if version == VERSION_WITH_ACTIONS else []
    covered = {"claims": body, "actions": actions} if version == VERSION_WITH_ACTIONS else body
    if (
        not isinstance(body, dict)
        or not isinstance(actions, list)
        or document.get("checksum") != _checksum(covered)
    ):
        raise CheckpointError(f"checkpoint {path} fails its checksum (corrupted or edited); {HINT}")
    try:
        return (
            {uid: _claim_from_json(uid, claim) for uid, claim in body.items()},
            [_action_from_json(a) for a in actions],
        )
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} has a malformed claim entry ({err}); {HINT}") from None


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
                mps_multi_user=bool(d.get("mps_multi_user", False)),
                vfio_group=int(d.get("vfio_group", -1)),
                vfio_api_device=bool(d.get("vfio_api_device", False)),
            )
            for d in data["devices"]
        ),
        pod_claim_name=str(data.get("pod_claim_name", "")),
        metadata=bool(data.get("metadata", False)),
    )


def _action_from_json(data: Mapping[str, Any]) -> DeviceAction:
    return DeviceAction(
        claim_uid=str(data["claim_uid"]),
        device=str(data["device"]),
        kind=str(data["kind"]),
        params=dict(data["params"]),
        done=bool(data["done"]),
        result=dict(data["result"]),
    )
