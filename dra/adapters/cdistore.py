"""This driver's CDI spec files in the CDI directory (/var/run/cdi by default).

Claim specs (DRA) are named after their claim; the device plugin's spec has one fixed name.

Claim specs are replaced atomically but need not be durable: start-up rewrites
the spec of every claim the checkpoint records and removes every other one.
On tmpfs (statfs) they are written without fsync, as nothing there reaches a
disk; elsewhere the write is fsynced, and a claim's spec is removed without
a directory fsync either way (a spec back after a power loss goes at start-up).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dra.adapters.atomicfile import (
    ensure_dir,
    holds,
    is_tmpfs,
    remove_durably,
    remove_leftovers,
    write_atomic,
)
from dra.core import cdi

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
        path = self.path(claim_uid)
        if "/" in claim_uid or "\0" in claim_uid or len(path.name.encode()) > _NAME_MAX:
            # Specs are written only for UIDs the API server issued; the kubelet may still ask to
            # unprepare anything, and a UID with a slash, a NUL or too many bytes has no spec here.
            return
        remove_durably(path, durable=False)

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
