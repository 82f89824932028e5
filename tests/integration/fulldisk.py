"""A prepare on a really full file system: run as root in a private mount namespace (unshare -m).

    unshare -m --propagation private python -m tests.integration.fulldisk DIR

Mounts a 64 KiB tmpfs on DIR (seen only in this namespace) holding the CDI and
state directories, prepares one claim, fills the tmpfs, prepares a second
claim (the kernel answers ENOSPC), empties it and prepares the second again.
Prints one JSON object: each prepare's error ("" on success) and, after each,
the spec files, checkpointed claims and temporary files on the tmpfs.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.core.plan import read_allocation
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import ClaimError
from tests.integration.inprocess import StubKube

DRIVER = "fulldisk.dra-gpu.test"
NODE = "node-a"


def _fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)


def main() -> None:
    """Mount, prepare, fill, prepare, empty, prepare; print what happened."""
    root = Path(sys.argv[1])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(root)], check=True)
    cdi = CdiStore(root / "cdi", DRIVER)
    checkpoint = CheckpointStore(root / "state" / "checkpoint.json")
    state = DeviceState(DRIVER, NODE, discover(FakeGpuLibrary(load_profile("h100x8"), NODE)), cdi, checkpoint)
    kube = StubKube()
    report: dict[str, Any] = {}

    def prepare(step: str, name: str, device: str) -> None:
        claim = kube.claims.get(("ns", name)) or kube.add_claim("ns", name, DRIVER, NODE, [device])
        try:
            state.prepare(read_allocation(claim, claim["metadata"]["uid"], DRIVER))
            error = ""
        except ClaimError as err:
            error = str(err)
        report[step] = {
            "error": error,
            "specs": [n for (_, n), c in kube.claims.items() if c["metadata"]["uid"] in cdi.claim_uids()],
            "checkpointed": sorted(c.name for c in checkpoint.load().values()),
            "temporary": sorted(p.name for p in root.rglob(".*.tmp")),
        }

    prepare("before", "first", "gpu-0")
    _fill(root / "filler")
    prepare("full", "second", "gpu-1")
    (root / "filler").unlink()
    prepare("emptied", "second", "gpu-1")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
