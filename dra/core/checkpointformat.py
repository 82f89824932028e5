"""The checkpoint's format: claims and device actions to bytes and back, checked, with no file in sight.

A snapshot (a JSON document, format 1 without device actions, 2 with them, under a SHA-256
checksum) followed by one line per change since (format 3), each under its own checksum.
Anything that fails a check is a CheckpointError, never a silent reset. dra.adapters.checkpoint
stores it; docs/architecture.md ("Checkpoint format") tells why it is shaped so.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from dra.api.fields import json_text_deeper_than
from dra.model.prepared import DeviceAction, PreparedClaim, PreparedDevice

KIND = "DraGpuCheckpoint"
VERSION = 1
#: The format version of a checkpoint that records device actions.
VERSION_WITH_ACTIONS = 2
#: A node of 1,000 claims of 8 GPUs each checkpoints 3.3 MB, and twice its claims again in appended
#: changes before a save compacts them: 10 MB. A file past this is no checkpoint the driver wrote.
MAX_FILE_BYTES = 16 * 2**20
#: A checkpoint nests 6 levels; json's decoder recurses per level, so deeper text is refused unread.
MAX_DEPTH = 100


class CheckpointError(Exception):
    """The checkpoint cannot be read or trusted; the message names the file and what to do."""


class ForeignCheckpointError(CheckpointError):
    """The file is NVIDIA's DRA driver's checkpoint: same driver name, same directory, same file name.

    `claims` names the claims it records as prepared ("namespace/name (uid)"); none means it
    holds nothing a node still needs.
    """

    def __init__(self, path: object, claims: Sequence[str]) -> None:
        self.claims = tuple(claims)
        super().__init__(f"checkpoint {path} is NVIDIA's DRA driver's")


def nvidia_claims(document: object) -> list[str] | None:
    """The prepared claims an NVIDIA DRA driver checkpoint records, or None when it is not one.

    Its shape (sigs.k8s.io/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/checkpointv.go): a
    checksum beside the formats it keeps, "v1" and "v2", each with "preparedClaims" by UID, v2's
    with the claim's name and namespace and its state: a prepare that failed stays
    "PrepareStarted" (that driver rolls it back on its next prepare), and only "PrepareCompleted"
    claims were handed to containers. v1 has no state: each of its claims was prepared.
    """
    if not isinstance(document, dict) or "checksum" not in document or not {"v1", "v2"} & set(document):
        return None
    found: dict[str, str] = {}
    for version in ("v2", "v1"):  # v2 names the claim
        body = document.get(version)
        prepared = body.get("preparedClaims") if isinstance(body, dict) else None
        for uid, claim in (prepared or {}).items() if isinstance(prepared, dict) else ():
            known = claim if isinstance(claim, dict) else {}
            if version == "v2" and known.get("checkpointState") != "PrepareCompleted":
                continue
            named = known.get("namespace") and known.get("name")
            found.setdefault(
                str(uid), f"{known['namespace']}/{known['name']} ({uid})" if named else f"claim {uid}"
            )
    return sorted(found.values())


#: Fields read by name: dataclasses.asdict deep-copies every value, some 40 µs a claim, where these
#: values (strings, numbers, tuples of strings) are immutable and need no copy (3 µs).
_CLAIM_FIELDS = tuple(f.name for f in fields(PreparedClaim) if f.name not in ("uid", "devices"))
_DEVICE_FIELDS = tuple(f.name for f in fields(PreparedDevice))


def _claim_to_json(claim: PreparedClaim) -> dict[str, Any]:
    data = {name: getattr(claim, name) for name in _CLAIM_FIELDS}
    data["devices"] = [{name: getattr(d, name) for name in _DEVICE_FIELDS} for d in claim.devices]
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
                mps_multi_user=bool(d.get("mps_multi_user", False)),
                vfio_group=int(d.get("vfio_group", -1)),
                vfio_api_device=bool(d.get("vfio_api_device", False)),
            )
            for d in data["devices"]
        ),
        pod_claim_name=str(data.get("pod_claim_name", "")),
        metadata=bool(data.get("metadata", False)),
    )


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
    return _sum(json.dumps(claims, sort_keys=True, separators=(",", ":")))


def _sum(canonical: str) -> str:
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


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
    return (json.dumps(document, sort_keys=True, separators=(",", ":")) + "\n").encode()


#: What to do about a checkpoint that cannot be trusted: every refusal of one ends with it.
HINT = (
    "the driver will not start on a checkpoint it cannot trust; inspect it, and only if no pod on "
    "this node uses a GPU claim, move it away to start empty"
)


def _record_line(record: dict[str, Any]) -> bytes:
    """One appended change, with the checksum of the rest of the line."""
    return _line(_canonical(record))


def _line(canonical: str) -> bytes:
    """A record's canonical JSON object as an appended line, its checksum added as the last key."""
    # The checksum is of the same canonical text: encoded once, not twice.
    return f'{canonical[:-1]},"sum":"{_sum(canonical)}"}}\n'.encode()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


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
                lines.append(_record_line({"uid": uid, "gone": True}))
        elif (old := before.get(uid)) is not claim and old != claim:
            lines.append(_record_line({"uid": uid, "claim": _claim_to_json(claim)}))
    texts = journal.action_texts
    if list(actions) != journal.actions:
        known = {id(a): texts[id(a)] for a in journal.actions if id(a) in texts}
        texts = {id(a): known.get(id(a)) or _canonical(_action_to_json(a)) for a in actions}
        lines.append(_line('{"actions":[' + ",".join(texts[id(a)] for a in actions) + "]}"))
    return b"".join(lines), texts


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


def decode(data: bytes, path: object) -> dict[str, PreparedClaim]:
    """Parse and verify checkpoint bytes; CheckpointError says what is wrong with `path` (named only)."""
    return decode_journal(data, path).claims


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
    hint = HINT
    foreign = nvidia_claims(document)
    if foreign is not None:
        raise ForeignCheckpointError(path, foreign)
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
