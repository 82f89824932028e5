"""The host's GPU assignment record (dra.adapters.assignmentrecord) on real files and real flock locks.

Two claims in one test stand for the two processes: flock locks belong to open
files, so a second open of the same lock file conflicts even in one process.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from dra.adapters.assignmentrecord import AssignmentConflictError, AssignmentRecord
from dra.core.assignment import GpuPath, recorded
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Gpu


@pytest.fixture
def gpus() -> list[Gpu]:
    """Four GPUs: two L40S, two T4."""
    return list(discover(FakeGpuLibrary(load_profile("mixed"), "node-a")).gpus)


def read(record: AssignmentRecord) -> dict[str, list[int]]:
    data = json.loads(record.path.read_text())
    return {path: [g["index"] for g in entry["gpus"]] for path, entry in data["paths"].items()}


def test_claims_of_disjoint_gpus_are_both_recorded(tmp_path: Path, gpus: list[Gpu]) -> None:
    record = AssignmentRecord(tmp_path / "state")
    dra = record.lease(GpuPath.DRA, gpus[:2], "node-a")
    plugin = record.lease(GpuPath.DEVICE_PLUGIN, gpus[2:], "node-a")
    assert read(record) == {"dra": [0, 1], "device-plugin": [2, 3]}
    entry = json.loads(record.path.read_text())["paths"]["device-plugin"]
    assert entry["pid"] == os.getpid()
    assert entry["node"] == "node-a"
    assert record.alive(GpuPath.DRA)
    assert record.alive(GpuPath.DEVICE_PLUGIN)
    plugin.release()
    dra.release()
    assert read(record) == {}
    assert not record.alive(GpuPath.DRA)


def test_overlap_with_a_running_path_is_refused_naming_the_gpu(tmp_path: Path, gpus: list[Gpu]) -> None:
    record = AssignmentRecord(tmp_path)
    dra = record.lease(GpuPath.DRA, gpus[:2], "node-a")
    with pytest.raises(AssignmentConflictError) as raised:
        record.lease(GpuPath.DEVICE_PLUGIN, gpus[1:], "node-a")
    message = str(raised.value)
    assert message.startswith(
        f"GPU 1 ({gpus[1].uuid}, NVIDIA L40S) is already advertised by the DRA kubelet-plugin on this node"
    )
    assert str(record.path) in message
    assert read(record) == {"dra": [0, 1]}, "the refused process wrote nothing"
    assert not record.alive(GpuPath.DEVICE_PLUGIN), "and holds no lock"
    dra.release()
    record.lease(GpuPath.DEVICE_PLUGIN, gpus[1:], "node-a").release()


def test_an_entry_whose_process_is_gone_does_not_block(tmp_path: Path, gpus: list[Gpu]) -> None:
    record = AssignmentRecord(tmp_path)
    # What a killed device plugin leaves behind: its entry, but no lock holder.
    record.path.write_text(json.dumps({"version": 1, "paths": {"device-plugin": {"gpus": recorded(gpus)}}}))
    lease = record.lease(GpuPath.DRA, gpus, "node-a")
    assert read(record) == {"device-plugin": [0, 1, 2, 3], "dra": [0, 1, 2, 3]}
    lease.release()
    assert read(record) == {"device-plugin": [0, 1, 2, 3]}


def test_a_second_process_of_the_same_path_is_refused(tmp_path: Path, gpus: list[Gpu]) -> None:
    record = AssignmentRecord(tmp_path)
    first = record.lease(GpuPath.DEVICE_PLUGIN, gpus, "node-a")
    with pytest.raises(
        AssignmentConflictError, match="another dra-gpu device-plugin process runs on this node"
    ):
        record.lease(GpuPath.DEVICE_PLUGIN, gpus, "node-a", wait=0.2)
    first.release()
    first.release()  # idempotent


def test_an_unreadable_record_is_rewritten_unless_the_other_path_runs(
    tmp_path: Path, gpus: list[Gpu]
) -> None:
    record = AssignmentRecord(tmp_path)
    record.path.write_text("{not json")
    lease = record.lease(GpuPath.DRA, gpus[:2], "node-a")
    assert read(record) == {"dra": [0, 1]}
    record.path.write_text('{"paths": 3}')
    with pytest.raises(
        AssignmentConflictError,
        match=r"^unreadable GPU assignment record .*: no `paths` mapping, while the DRA",
    ):
        record.lease(GpuPath.DEVICE_PLUGIN, gpus[2:], "node-a")
    lease.release()


def test_the_record_lock_serialises_writers(tmp_path: Path, gpus: list[Gpu]) -> None:
    record = AssignmentRecord(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    with open(tmp_path / "gpu-assignment.lock", "ab") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(AssignmentConflictError, match=r"lock .* is held"), record._locked(timeout=0.2):
            pass
