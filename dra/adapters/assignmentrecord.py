"""The host's GPU assignment record: which path advertises which GPU, shared by both commands.

``gpu-assignment.json`` in the state directory, rewritten under an flock on
``gpu-assignment.lock``; each running path also holds ``gpu-assignment.<path>.lock`` for its
lifetime. A command refuses to start while the other path's process is alive and lists one
of its GPUs; a killed process's entry stays but its lock goes, so a stale entry never blocks.
flock works across containers since the files are the same inodes (docs/device-plugin.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from dra import documents
from dra.adapters.nodefiles import (
    LockTimeoutError,
    exclusive,
    open_existing_lock,
    open_lock,
    try_lock,
    write_atomic,
)
from dra.core.assignment import GpuPath, conflict, parse_recorded, recorded
from dra.model.devices import Gpu

log = logging.getLogger(__name__)

RECORD_NAME = "gpu-assignment.json"


class AssignmentConflictError(Exception):
    """Another running process holds GPUs this one wants, or is the same path; the message says which."""


class AssignmentRecord:
    """The record in one state directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / RECORD_NAME
        self._lock_path = directory / "gpu-assignment.lock"

    def _holder_path(self, path: GpuPath) -> Path:
        return self.directory / f"gpu-assignment.{path.value}.lock"

    @contextlib.contextmanager
    def _locked(self, timeout: float = 30.0) -> Iterator[None]:
        try:
            with exclusive(self._lock_path, timeout):
                yield
        except LockTimeoutError:
            raise AssignmentConflictError(
                f"the GPU assignment record lock {self._lock_path} is held"
            ) from None

    def alive(self, path: GpuPath) -> bool:
        """Whether a process of that path holds its lifetime lock right now."""
        lock = open_existing_lock(self._holder_path(path))
        if lock is None:
            return False
        with lock:
            if try_lock(lock):
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
                return False
            return True

    def read(self) -> dict[str, Any]:
        """The record's paths (empty when there is no record); ValueError when it does not parse.

        NotRegularFileError (a ValueError too) when the path holds what is no file: left for the admin.
        """
        source = "GPU assignment record"
        try:
            data = documents.load_json(documents.read_file(self.path, source), f"{source} {self.path}")
        except documents.MissingFileError:
            return {}
        paths = data.get("paths") if isinstance(data, dict) else None
        if not isinstance(paths, dict):
            raise ValueError(f"{source} {self.path}: no `paths` mapping")
        return paths

    def _write(self, paths: dict[str, Any]) -> None:
        data = json.dumps({"version": 1, "paths": paths}, indent=2, sort_keys=True) + "\n"
        write_atomic(self.path, data.encode())

    def lease(
        self, path: GpuPath, gpus: Sequence[Gpu], node_name: str, wait: float = 5.0, shared: bool = False
    ) -> AssignmentLease:
        """Record that `path` advertises `gpus`, or raise AssignmentConflictError saying why it may not.

        `shared`: instances of `path` may overlap (a rolling update); they hold the lifetime
        lock shared, so each admits the others but not an exclusive (non-rolling) one.
        """
        with self._locked():
            other = path.other
            try:
                paths = self.read()
            except documents.NotRegularFileError as err:
                # Not replaced by the next write: what it is, and why, is the admin's to look at.
                raise AssignmentConflictError(
                    f"{err}; move it away (the record is written anew at start)"
                ) from None
            except ValueError as err:
                if self.alive(other):
                    raise AssignmentConflictError(
                        f"unreadable {err}, while {other.title} runs on this node; restart it so that it "
                        "rewrites the record"
                    ) from None
                log.warning("unreadable %s: ignored, and written anew (%s does not run)", err, other.title)
                paths = {}
            entry = paths.get(other.value)
            if entry is not None and self.alive(other):
                try:
                    theirs = parse_recorded(entry.get("gpus") if isinstance(entry, dict) else None)
                except ValueError as err:
                    raise AssignmentConflictError(
                        f"{other.title}'s entry in {self.path} is invalid ({err}); restart it"
                    ) from None
                message = conflict(path, gpus, theirs, where=f" (record {self.path})")
                if message is not None:
                    raise AssignmentConflictError(message)
            elif entry is not None:
                log.info("%s's entry in %s is stale (no process holds its lock)", other.title, self.path)
            holder = open_lock(self._holder_path(path))  # held for the process lifetime
            deadline = time.monotonic() + wait
            while not try_lock(holder, shared=shared):
                if time.monotonic() > deadline:
                    holder.close()
                    if shared:
                        raise AssignmentConflictError(
                            f"a {path.command} process without rolling updates runs on this node (it "
                            f"holds {self._holder_path(path)}); it must end before one with rolling "
                            "updates starts: upgrade onto rolling updates once with them off"
                        )
                    raise AssignmentConflictError(
                        f"another {path.command} process runs on this node (it holds "
                        f"{self._holder_path(path)}); only one may run per node"
                    )
                time.sleep(0.1)
            paths[path.value] = {
                "gpus": recorded(gpus),
                "node": node_name,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            self._write(paths)
        log.info(
            "GPU assignment recorded in %s: %s advertises %s",
            self.path,
            path.title,
            ", ".join(f"GPU {g.index}" for g in gpus) or "no GPU",
        )
        return AssignmentLease(self, path, holder)


class AssignmentLease:
    """A path's entry in the record, held until release()."""

    def __init__(self, record: AssignmentRecord, path: GpuPath, holder: IO[bytes]) -> None:
        self._record = record
        self.path = path
        self._holder = holder

    def release(self) -> None:
        """Remove this path's entry and let go of the lifetime lock (idempotent)."""
        if self._holder.closed:
            return
        try:
            with self._record._locked(timeout=5.0):
                try:
                    paths = self._record.read()
                except ValueError:
                    paths = {}
                entry = paths.get(self.path.value)
                # A newer instance of this path (rolling update) rewrote the entry: it is theirs now.
                # Containers may share PIDs (each its own PID 1); the host name is the pod's.
                mine = {"pid": os.getpid(), "host": socket.gethostname()}
                if isinstance(entry, dict) and all(entry.get(k) == v for k, v in mine.items()):
                    del paths[self.path.value]
                    self._record._write(paths)
        except (OSError, AssignmentConflictError) as err:
            log.warning("could not remove this process's entry from %s: %s", self._record.path, err)
        finally:
            self._holder.close()
