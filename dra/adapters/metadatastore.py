"""Claims' device metadata files (KEP-5304): `<root>/<claim dir>/<request>/metadata.json`.

The bytes come from dra.core.devicemetadata. Files are replaced atomically (the container
runtime bind-mounts them read-only) but not fsynced: start-up writes again the files of every
claim the checkpoint records and removes every other claim's directory, as for CDI specs.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping
from pathlib import Path

from dra.adapters.nodefiles import ensure_dir, holds, remove_leftovers, write_atomic
from dra.core import devicemetadata

#: The files' mode, and their directories': readable by every container user, as the Go helper makes them.
FILE_MODE = 0o644
DIR_MODE = 0o755


class MetadataStore:
    """Writes and removes the metadata directories of claims."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _claim(self, directory: str) -> Path:
        if not directory or "/" in directory or directory in (".", ".."):
            raise ValueError(f"{directory!r} is not a claim's metadata directory")
        return self.root / directory

    def write(self, directory: str, files: Mapping[str, bytes]) -> None:
        """Make a claim's files these (request name to bytes); files of other requests go."""
        claim = self._claim(directory)
        for request, data in files.items():
            path = claim / request / devicemetadata.HOST_FILE
            if holds(path, data):
                continue
            ensure_dir(path.parent, DIR_MODE)
            write_atomic(path, data, FILE_MODE, durable=False)
        if claim.is_dir():
            for stale in claim.iterdir():
                if stale.name in files:
                    continue
                if stale.is_dir():
                    shutil.rmtree(stale)
                else:
                    stale.unlink()

    def remove(self, directory: str) -> None:
        """Delete a claim's directory; absent is fine."""
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self._claim(directory))

    def directories(self) -> frozenset[str]:
        """The claim directories under the root."""
        if not self.root.is_dir():
            return frozenset()
        return frozenset(p.name for p in self.root.iterdir() if p.is_dir())

    def remove_leftovers(self) -> None:
        """Delete half-written files a crash left in the claims' request directories."""
        if not self.root.is_dir():
            return
        for request in self.root.glob("*/*"):
            remove_leftovers(request, devicemetadata.HOST_FILE)
