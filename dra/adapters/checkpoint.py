"""The record of prepared claims that survives a crash.

The driver writes the checkpoint before it answers NodePrepareResources and
reads it at start-up, so a restarted driver still knows every claim the
kubelet believes prepared. The file is JSON with a format version and a
SHA-256 checksum of its content; a file that fails either check stops the
driver with an error naming the file, never a silent reset that would let a
GPU be handed out twice.

Two instances of the kubelet plugin overlap during a rolling update and share
the file: each holds an flock on checkpoint.lock around reading, deciding and
saving, and reads the file again under it when the other saved meanwhile.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dra.adapters.atomicfile import remove_leftovers, write_atomic
from dra.adapters.filelock import LockTimeoutError, exclusive
from dra.model.prepared import PreparedClaim, PreparedDevice

KIND = "DraGpuCheckpoint"
VERSION = 1
#: The checkpoint's name in the state directory.
FILE_NAME = "checkpoint.json"
#: Seconds a prepare or unprepare waits for another instance to let go of the checkpoint.
LOCK_TIMEOUT = 30.0

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


def _checksum(claims: Mapping[str, Any]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def encode(claims: Mapping[str, PreparedClaim]) -> bytes:
    """The checkpoint file's bytes for these claims."""
    body = {uid: _claim_to_json(claim) for uid, claim in sorted(claims.items())}
    document = {"kind": KIND, "version": VERSION, "checksum": _checksum(body), "claims": body}
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()


def decode(data: bytes, path: Path) -> dict[str, PreparedClaim]:
    """Parse and verify checkpoint bytes; CheckpointError says what is wrong with `path`."""
    hint = (
        "the driver will not start on a checkpoint it cannot trust; inspect it, and only if no pod on "
        "this node uses a GPU claim, move it away to start empty"
    )
    try:
        document = json.loads(data)
    except ValueError as err:
        raise CheckpointError(f"checkpoint {path} is not valid JSON ({err}); {hint}") from None
    if not isinstance(document, dict) or document.get("kind") != KIND:
        raise CheckpointError(f"checkpoint {path} is not a {KIND} file; {hint}")
    if document.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {document.get('version')!r}, "
            f"this driver reads {VERSION}; {hint}"
        )
    body = document.get("claims")
    if not isinstance(body, dict) or document.get("checksum") != _checksum(body):
        raise CheckpointError(f"checkpoint {path} fails its checksum (corrupted or edited); {hint}")
    try:
        return {uid: _claim_from_json(uid, claim) for uid, claim in body.items()}
    except (KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {path} has a malformed claim entry ({err}); {hint}") from None


class CheckpointStore:
    """The checkpoint file on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_suffix(".lock")
        self._seen: _Signature | None = None

    def _signature(self) -> _Signature | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def load(self) -> dict[str, PreparedClaim]:
        """Every prepared claim by UID; empty when no checkpoint exists yet."""
        seen = self._signature()
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._seen = None
            return {}
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {err}") from None
        claims = decode(data, self.path)
        self._seen = seen
        return claims

    @contextlib.contextmanager
    def exclusive(self, timeout: float = LOCK_TIMEOUT) -> Iterator[dict[str, PreparedClaim] | None]:
        """Hold the checkpoint against other processes; yields its claims if one saved it since we looked.

        None means the file is as this store last read or wrote it. CheckpointError
        when another process holds the lock for longer than `timeout`.
        """
        try:
            with exclusive(self.lock_path, timeout):
                yield self.load() if self._signature() != self._seen else None
        except LockTimeoutError as err:
            raise CheckpointError(
                f"cannot lock checkpoint {self.path}: {err}; another dra-gpu kubelet-plugin on this node "
                "is stuck in a prepare or unprepare"
            ) from None

    def remove_leftovers(self) -> None:
        """Delete temporary checkpoint files a crash left behind."""
        remove_leftovers(self.path.parent, self.path.name)

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Replace the checkpoint atomically and durably."""
        write_atomic(self.path, encode(claims), mode=0o600)
        self._seen = self._signature()
