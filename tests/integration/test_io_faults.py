"""A failing disk under the CDI or state directory: per-claim errors, nothing half written, then recovery.

The plugin runs in-process (tests.integration.inprocess) on real files; the
fault is injected at os.fsync, where a full or failing file system reports
ENOSPC or EIO for data it could not write back (fsync(2), ERRORS), either for
the temporary file before its rename or for the directory after it. Once, as
root, the disk is really full: a 64 KiB tmpfs (tests/integration/fulldisk.py).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra.pb.dra.v1 import dra_pb2
from tests.integration.inprocess import Node, serving
from tests.skips import Lack, reason

DRIVER = "io.dra-gpu.test"


class FailingFsync:
    """os.fsync that fails with `code` for a file in, or the directory itself of, `directory` while armed."""

    def __init__(self, real: object, directory: Path, code: int, on_directory: bool) -> None:
        self._real = real
        self.directory = directory
        self.code = code
        self.on_directory = on_directory
        self.armed = False
        self.failures = 0

    def __call__(self, fd: int) -> None:
        is_directory = stat.S_ISDIR(os.fstat(fd).st_mode)
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        where = path if is_directory else path.parent
        if self.armed and is_directory == self.on_directory and where == self.directory:
            self.failures += 1
            raise OSError(self.code, os.strerror(self.code))
        self._real(fd)  # type: ignore[operator]


@pytest.fixture
def node() -> Iterator[Node]:
    """A fresh plugin per test: its files are what the test inspects."""
    with serving(DRIVER) as plugin:
        yield plugin


def _prepare(node: Node, ref: dra_pb2.Claim) -> dra_pb2.NodePrepareResourceResponse:
    request = dra_pb2.NodePrepareResourcesRequest(claims=[ref])
    return node.stub.NodePrepareResources(request, timeout=10).claims[ref.uid]


def _unprepare(node: Node, ref: dra_pb2.Claim) -> str:
    request = dra_pb2.NodeUnprepareResourcesRequest(claims=[ref])
    return node.stub.NodeUnprepareResources(request, timeout=10).claims[ref.uid].error


def _assert_whole(node: Node) -> None:
    """No temporary file; every spec has its checkpoint entry, on disk as in memory."""
    for directory in (node.cdi.root, node.checkpoint.path.parent):
        assert not list(directory.glob(".*.tmp")), f"half-written files in {directory}"
    on_disk = node.checkpoint.load()
    assert on_disk == node.state.prepared
    assert set(node.cdi.claim_uids()) <= set(on_disk)


FAULTS = [
    pytest.param(
        where, code, on_directory, id=f"{where}-{errno.errorcode[code]}-{'dir' if on_directory else 'file'}"
    )
    for where in ("cdi", "state")
    for code in (errno.ENOSPC, errno.EIO)
    for on_directory in (False, True)
]


@pytest.mark.parametrize(
    ("where", "code", "on_directory"),
    # An append to the checkpoint fsyncs the file alone: the state directory's own fsync comes
    # only with a fresh snapshot (tests/unit/test_checkpoint.py fails that one).
    [f for f in FAULTS if f.values[::2] != ("state", True)],
)
def test_a_failed_write_is_a_per_claim_error_and_the_retry_works(
    node: Node, monkeypatch: pytest.MonkeyPatch, where: str, code: int, on_directory: bool
) -> None:
    directory = node.cdi.root if where == "cdi" else node.checkpoint.path.parent
    fsync = FailingFsync(os.fsync, directory, code, on_directory)
    monkeypatch.setattr(os, "fsync", fsync)
    held = node.claim("held", ["gpu-0"])
    assert _prepare(node, held).error == ""  # the directories exist before the disk fails

    fresh = node.claim("fresh", ["gpu-1"])
    other = node.claim("other", ["gpu-2"])
    fsync.armed = True
    answers = node.stub.NodePrepareResources(
        dra_pb2.NodePrepareResourcesRequest(claims=[fresh, other]), timeout=10
    ).claims
    assert fsync.failures
    for ref in (fresh, other):
        assert os.strerror(code) in answers[ref.uid].error
        assert not answers[ref.uid].devices
    assert "ns/fresh" in answers[fresh.uid].error
    assert set(node.state.prepared) == {held.uid}
    assert node.cdi.claim_uids() == [held.uid]
    _assert_whole(node)
    assert any(name == "fresh" and os.strerror(code) in message for name, _, message in node.kube.events)

    fsync.armed = False
    assert _prepare(node, fresh).error == ""
    assert sorted(node.cdi.claim_uids()) == sorted([held.uid, fresh.uid])
    _assert_whole(node)


@pytest.mark.parametrize(("where", "code", "on_directory"), FAULTS)
def test_an_unprepare_waits_on_no_fsync(
    node: Node, monkeypatch: pytest.MonkeyPatch, where: str, code: int, on_directory: bool
) -> None:
    """Unprepare removes the spec and appends to the checkpoint without fsync: what a power cut undoes,
    start-up repairs (the spec goes again, or a claim that needs the device releases the stale entry)."""
    directory = node.cdi.root if where == "cdi" else node.checkpoint.path.parent
    fsync = FailingFsync(os.fsync, directory, code, on_directory)
    monkeypatch.setattr(os, "fsync", fsync)
    ref = node.claim("c", ["gpu-3"])
    assert _prepare(node, ref).error == ""

    fsync.armed = True
    assert _unprepare(node, ref) == ""
    assert fsync.failures == 0
    assert node.state.prepared == {}
    assert node.checkpoint.load() == {}
    assert node.cdi.claim_uids() == []
    _assert_whole(node)


@pytest.mark.skipif(os.geteuid() != 0, reason=reason(Lack.ROOT, "mounts a private tmpfs"))
@pytest.mark.skipif(shutil.which("unshare") is None, reason=reason(Lack.TOOL, "needs unshare(1)"))
def test_a_really_full_tmpfs_fails_the_prepare_cleanly(tmp_path: Path) -> None:
    """The kernel's own ENOSPC, at write(2) this time, on a 64 KiB tmpfs mounted in a private namespace."""
    run = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            sys.executable,
            "-m",
            "tests.integration.fulldisk",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["before"] == {"error": "", "specs": ["first"], "checkpointed": ["first"], "temporary": []}
    full = report["full"]
    assert "cannot write the CDI spec of claim ns/second" in full["error"]
    assert os.strerror(errno.ENOSPC) in full["error"]
    assert (full["specs"], full["checkpointed"], full["temporary"]) == (["first"], ["first"], [])
    assert report["emptied"] == {
        "error": "",
        "specs": ["first", "second"],
        "checkpointed": ["first", "second"],
        "temporary": [],
    }
