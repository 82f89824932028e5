"""Time-slice intervals: set on the GPU while a claim asks one, refused when claims differ, then restored."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.cli import main
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.library import GpuHandle, GpuLibraryError
from dra.gpu.nvml import NvmlLibrary
from dra.kubeletplugin.state import DeviceState
from dra.kubeletplugin.timeslice import TimeSlicer
from dra.model.allocation import AllocatedDevice, ClaimAllocation, ClaimError, OpaqueConfig
from tests.unit.helpers import DRIVER, NODE, inventory

UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"


def _interval(interval: str) -> OpaqueConfig:
    return OpaqueConfig(
        "FromClaim",
        (),
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
        },
    )


def _claim(uid: str, device: str, interval: str | None, admin: bool = False) -> ClaimAllocation:
    return ClaimAllocation(
        uid=uid,
        namespace="team-a",
        name=f"claim-{uid[0]}",
        devices=(AllocatedDevice("gpu", NODE, device, admin_access=admin),),
        configs=(_interval(interval),) if interval else (),
    )


class Node:
    """A node's state directory with fake GPUs that keep their settings in it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def gpus(self) -> FakeGpuLibrary:
        return FakeGpuLibrary(load_profile("h100x8"), NODE, state_file=self.root / "fake-gpu-state.json")

    def level(self, index: int) -> int:
        return self.gpus().time_slice(GpuHandle(index))

    def state(self, lib: Any = None) -> DeviceState:
        state = DeviceState(
            DRIVER,
            NODE,
            inventory("h100x8"),
            CdiStore(self.root / "cdi", DRIVER),
            CheckpointStore(self.root / "checkpoint.json"),
            time_slicer=TimeSlicer(lib or self.gpus()),
        )
        state.recover()
        return state


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_the_interval_is_set_while_the_claim_is_prepared_and_restored_after(node: Node) -> None:
    state = node.state()
    claim = state.prepare(_claim(UID_A, "gpu-1", "Long"))
    assert claim.devices[0].time_slice == "Long"
    assert node.level(1) == 3
    assert node.level(0) == 0
    state.unprepare(UID_A)
    assert node.level(1) == 0


def test_default_leaves_the_gpu_as_it_is(node: Node) -> None:
    node.gpus().set_time_slice(GpuHandle(2), 1)
    state = node.state()
    state.prepare(_claim(UID_A, "gpu-2", "Default"))
    state.unprepare(UID_A)
    assert node.level(2) == 1


def test_a_second_claim_asking_another_interval_is_refused_naming_the_first(node: Node) -> None:
    state = node.state()
    state.prepare(_claim(UID_A, "gpu-0", "Short", admin=True))
    with pytest.raises(ClaimError) as err:
        state.prepare(_claim(UID_B, "gpu-0", "Medium", admin=True))
    assert (
        "device gpu-0 cannot run time-slice interval Medium: claim team-a/claim-a "
        f"({UID_A}) runs it with interval Short"
    ) in str(err.value)
    assert UID_B not in state.prepared
    assert node.level(0) == 1


def test_the_gpu_goes_back_to_default_only_with_the_last_claim_that_set_it(node: Node) -> None:
    state = node.state()
    state.prepare(_claim(UID_A, "gpu-0", "Short", admin=True))
    state.prepare(_claim(UID_B, "gpu-0", "Short", admin=True))
    state.unprepare(UID_A)
    assert node.level(0) == 1
    state.unprepare(UID_B)
    assert node.level(0) == 0


def test_a_restarted_driver_sets_recorded_intervals_again_and_still_restores_them(node: Node) -> None:
    node.state().prepare(_claim(UID_A, "gpu-3", "Medium"))
    # A crash between recording the claim and setting the GPU: the GPU is at Default.
    node.gpus().set_time_slice(GpuHandle(3), 0)
    restarted = node.state()
    assert node.level(3) == 2
    restarted.unprepare(UID_A)
    assert node.level(3) == 0


class FailingGpus(FakeGpuLibrary):
    def set_time_slice(self, gpu: GpuHandle, level: int) -> None:
        raise GpuLibraryError(999, "nvidia-smi compute-policy: Insufficient Permissions")


def test_a_gpu_that_refuses_the_interval_fails_the_claim_and_leaves_nothing(node: Node) -> None:
    state = node.state(FailingGpus(load_profile("h100x8"), NODE))
    with pytest.raises(ClaimError) as err:
        state.prepare(_claim(UID_A, "gpu-0", "Long"))
    assert "cannot set time-slice interval Long on GPU GPU-" in str(err.value)
    assert "Insufficient Permissions" in str(err.value)
    assert state.prepared == {}
    assert CheckpointStore(node.root / "checkpoint.json").load() == {}
    assert not list((node.root / "cdi").glob("*.json"))


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_nvidia_smi_gets_the_uuid_and_level_and_its_error_is_surfaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = NvmlLibrary()
    monkeypatch.setattr(lib, "uuid", lambda gpu: "GPU-1234")
    record = tmp_path / "args"
    lib.nvidia_smi = _script(tmp_path / "ok", f'echo "$@" > {record}')
    lib.set_time_slice(GpuHandle(0), 2)
    assert record.read_text().split() == ["compute-policy", "-i", "GPU-1234", "--set-timeslice", "2"]

    lib.nvidia_smi = _script(tmp_path / "fails", 'echo "Failed to set timeslice: Not Supported" >&2; exit 3')
    with pytest.raises(GpuLibraryError) as err:
        lib.set_time_slice(GpuHandle(0), 1)
    assert "exited with 3: Failed to set timeslice: Not Supported" in str(err.value)

    lib.nvidia_smi = str(tmp_path / "missing")
    with pytest.raises(GpuLibraryError, match="No such file"):
        lib.set_time_slice(GpuHandle(0), 1)


def test_fake_gpus_refuse_levels_nvidia_smi_refuses(node: Node) -> None:
    with pytest.raises(GpuLibraryError, match="invalid time slice 4"):
        node.gpus().set_time_slice(GpuHandle(0), 4)


def test_dra_gpu_time_slices_shows_what_the_driver_set(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    node.state().prepare(_claim(UID_A, "gpu-1", "Long"))
    argv = ["time-slices", "--fake-gpus", "h100x8", "--node-name", NODE, "--state-dir", str(node.root)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8
    assert lines[0].split("\t")[::2] == ["0", "Default"]
    assert lines[1].split("\t")[::2] == ["1", "Long"]
