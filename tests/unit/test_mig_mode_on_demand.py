"""MIG mode on demand: a dynamic-MIG GPU is given whole with MIG off and MIG devices with MIG on.

On fake GPUs through the executor, and through the real NVML adapter over the NVML stand-in where a
GPU needs a reset for the change (nvmlDeviceSetMigMode's activation status RESET_REQUIRED).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakenvml.adapter import over
from fakenvml.host import host_tree
from fakenvml.standin import NvmlStandIn

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.core.slices import build_slices
from dra.core.versions import ApiFeatures
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile, parse_profile
from dra.gpu.discovery import discover
from dra.gpu.library import (
    ERROR_NOT_SUPPORTED,
    ERROR_UNKNOWN,
    GpuHandle,
    GpuInstanceProfileInfo,
    GpuLibrary,
    GpuLibraryError,
    Placement,
)
from dra.gpu.nvml import NvmlLibrary
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation, ClaimError
from dra.model.devices import Inventory, MigPartition
from dra.model.migmode import parse_mig_modes
from tests.unit.helpers import DRIVER, NODE

UID = "6b1f7e7c-0d3e-4d4b-9a0e-2f1c3b4a5d6e"
OTHER = "0c2d9e8f-1a2b-4c3d-8e4f-5a6b7c8d9e0f"
MIG = "gpu-0-mig-3g40gb-at4"


def _state(root: Path, lib: GpuLibrary, host: Path = Path("/")) -> DeviceState:
    return DeviceState(
        DRIVER,
        NODE,
        discover(lib, parse_mig_modes("dynamic")),
        CdiStore(root / "cdi", DRIVER, host_root=host),
        CheckpointStore(root / "checkpoint.json"),
        lib,
    )


def _allocation(device: str, uid: str = UID) -> ClaimAllocation:
    return ClaimAllocation(uid, "default", "claim", (AllocatedDevice("gpu", NODE, device),))


def _mode(lib: GpuLibrary, index: int = 0) -> tuple[int, int]:
    return lib.mig_mode(lib.device_by_index(index))


def _offers(inventory: Inventory, gpu: str = "gpu-0") -> list[tuple[object, ...]]:
    """The offers of a GPU without the parent (whose MIG mode differs)."""

    def fields(p: MigPartition) -> tuple[object, ...]:
        return (p.name, p.profile, p.profile_id, p.slices, p.placement_start, p.placement_size)

    return [(*fields(p), p.memory_bytes, p.engines) for p in inventory.partitions if p.parent.name == gpu]


def test_one_gpu_serves_a_whole_claim_then_a_mig_claim_then_a_whole_claim_again(tmp_path: Path) -> None:
    lib = FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE, mig_state=tmp_path / "fake-gpu-mig.json")
    state = _state(tmp_path, lib)
    assert _mode(lib) == (1, 1)
    state.prepare(_allocation("gpu-0"))
    assert _mode(lib) == (0, 0), "CUDA sees the whole GPU only with MIG off"
    state.unprepare(UID)
    assert _mode(lib) == (0, 0)
    # Still offered both ways with MIG off: the first MIG claim turns it on.
    state.set_inventory(discover(lib, parse_mig_modes("dynamic")))
    assert state.inventory.partition(MIG) is not None
    claim = state.prepare(_allocation(MIG, OTHER))
    assert _mode(lib) == (1, 1)
    assert claim.devices[0].uuid.startswith("MIG-")
    with pytest.raises(ClaimError, match="NVML error 19"):
        state.prepare(_allocation("gpu-0"))
    assert _mode(lib) == (1, 1), "a MIG device in use keeps MIG on"
    state.unprepare(OTHER)
    assert _mode(lib) == (0, 0), "the last MIG device released turns MIG off"
    state.prepare(_allocation("gpu-0"))
    assert _mode(lib) == (0, 0)
    state.unprepare(UID)
    assert state.actions == []


def test_the_last_mig_device_released_turns_mig_mode_off_on_hopper_as_nvidias_driver_does(
    tmp_path: Path,
) -> None:
    """NVIDIA's test_gpu_dynmig.bats finds MIG mode off on every GPU after each MIG pod is gone."""
    lib = FakeGpuLibrary(load_profile("h100x8"), NODE, mig_state=tmp_path / "fake-gpu-mig.json")
    state = _state(tmp_path, lib)
    state.prepare(_allocation(MIG))
    state.prepare(_allocation("gpu-0-mig-1g10gb-at0", OTHER))
    assert _mode(lib) == (1, 1)
    state.unprepare(UID)
    assert _mode(lib) == (1, 1), "another claim's MIG device keeps MIG on"
    state.unprepare(OTHER)
    assert _mode(lib) == (0, 0)
    assert state.actions == []


def test_mig_mode_stays_on_after_the_last_mig_device_on_ampere(tmp_path: Path) -> None:
    """Where the switch may need a GPU reset, as NVIDIA's driver leaves it: a whole claim turns it off."""
    lib = FakeGpuLibrary(load_profile("a100x4-dynamic-mig"), NODE, mig_state=tmp_path / "fake-gpu-mig.json")
    state = _state(tmp_path, lib)
    state.prepare(_allocation("gpu-0-mig-3g40gb-at4"))
    state.unprepare(UID)
    assert _mode(lib) == (1, 1)


@pytest.mark.parametrize("profile", ["h100x8-dynamic-mig", "a100x4-dynamic-mig"])
def test_the_offers_with_mig_off_are_those_nvml_gives_with_mig_on(tmp_path: Path, profile: str) -> None:
    lib = FakeGpuLibrary(load_profile(profile), NODE, mig_state=tmp_path / "fake-gpu-mig.json")
    on = discover(lib, parse_mig_modes("dynamic,@node-a=dynamic"))
    lib.set_mig_mode(GpuHandle(0), 0)
    off = discover(lib, parse_mig_modes("dynamic"))
    assert not off.gpus[0].mig_enabled
    assert _offers(off) == _offers(on)
    assert _offers(off)
    # Switching MIG mode changes nothing the scheduler sees: no slice is rewritten for it.
    features = ApiFeatures(minor=37, partitionable_devices=True)
    published = [build_slices(i, DRIVER, NODE, None, 1, features) for i in (off, on)]
    assert published[0] == published[1]


def _standin_nvml(host: Path, reset_required: set[int]) -> tuple[NvmlLibrary, NvmlStandIn]:
    """The real adapter over the stand-in of `h100x8` (MIG off), where these GPUs need a reset."""
    fake = FakeGpuLibrary(load_profile("h100x8"), NODE, root=host)
    (host / "dev").mkdir(parents=True)
    for node in ("nvidiactl", *(f"nvidia{i}" for i in range(fake.device_count()))):
        (host / "dev" / node).touch()
    sysfs, procfs = host_tree(fake, host)
    standin = NvmlStandIn(fake, reset_required=reset_required)
    lib = over(standin, sysfs=sysfs, procfs=procfs, dev=host)
    lib.init()
    return lib, standin


def test_a_mig_mode_change_that_waits_for_a_reset_is_a_claim_error_and_the_gpu_is_offered_as_it_is(
    tmp_path: Path,
) -> None:
    lib, standin = _standin_nvml(tmp_path / "host", {0})
    try:
        state = _state(tmp_path, lib, tmp_path / "host")
        assert _mode(lib) == (0, 0)
        assert state.inventory.partition(MIG) is not None
        with pytest.raises(ClaimError, match=r"pending until the GPU is reset \(nvidia-smi -i 0 -r.*MIG off"):
            state.prepare(_allocation(MIG))
        assert state.actions == []
        assert state.prepared == {}
        assert _mode(lib) == (0, 1)
        # As it is: whole only, until the reset; the other GPUs switch at once.
        waiting = discover(lib, parse_mig_modes("dynamic"))
        assert _offers(waiting) == []
        assert waiting.get("gpu-0") is not None
        assert _offers(waiting, "gpu-1")
        with pytest.raises(ClaimError, match="pending until the GPU is reset"):
            state.prepare(_allocation(MIG))
        standin.reset_gpu(0)
        state.set_inventory(discover(lib, parse_mig_modes("dynamic")))
        assert state.prepare(_allocation(MIG)).devices[0].uuid.startswith("MIG-")
        assert _mode(lib) == (1, 1)
    finally:
        lib.shutdown()


def _blocked(root: Path) -> FakeGpuLibrary:
    """An A100 and an H100 with MIG off whose reset NVML cannot do (passthrough to a VM, say)."""
    profile = parse_profile(
        {
            "gpus": [
                {"model": "a100-sxm4-80gb", "migResetBlocked": True},
                {"model": "h100-sxm5-80gb", "migResetBlocked": True},
            ]
        },
        "blocked",
    )
    return FakeGpuLibrary(profile, NODE, mig_state=root / "fake-gpu-mig.json")


def test_the_fake_leaves_a_mig_mode_change_pending_on_ampere_only_where_the_gpu_cannot_be_reset(
    tmp_path: Path,
) -> None:
    lib = _blocked(tmp_path)
    lib.set_mig_mode(GpuHandle(0), 1)
    lib.set_mig_mode(GpuHandle(1), 1)
    assert _mode(lib, 0) == (0, 1), "Ampere needs the reset NVML cannot do here"
    assert _mode(lib, 1) == (1, 1), "Hopper needs no reset"
    assert _mode(_blocked(tmp_path), 0) == (0, 1), "kept with the GPU's state"
    lib.set_mig_mode(GpuHandle(0), 0)  # asked back before a reset: nothing waits any more
    assert _mode(lib, 0) == (0, 0)
    lib.set_mig_mode(GpuHandle(0), 1)
    lib.reset_gpu(0)
    assert _mode(lib, 0) == (1, 1)


def test_a_claim_on_an_ampere_gpu_that_cannot_be_reset_gets_the_pending_error_then_works_after_a_reset(
    tmp_path: Path,
) -> None:
    lib = _blocked(tmp_path)
    state = _state(tmp_path, lib)
    offer = "gpu-0-mig-3g40gb-at4"
    assert state.inventory.partition(offer) is not None
    with pytest.raises(ClaimError, match="pending until the GPU is reset"):
        state.prepare(_allocation(offer))
    assert state.actions == []
    assert _offers(discover(lib, parse_mig_modes("dynamic"))) == []
    lib.reset_gpu(0)
    state.set_inventory(discover(lib, parse_mig_modes("dynamic")))
    assert state.prepare(_allocation(offer)).devices[0].uuid.startswith("MIG-")


def test_a_gpu_without_mig_in_dynamic_mode_is_published_whole(tmp_path: Path) -> None:
    lib = FakeGpuLibrary(load_profile("mixed"), NODE)
    inventory = discover(lib, parse_mig_modes("dynamic"))
    assert [g.name for g in inventory.gpus] == [d.name for d in inventory.devices]
    assert len(inventory.gpus) == lib.device_count()
    assert inventory.partitions == ()


def test_a_gpu_whose_mig_mode_waits_to_turn_off_is_offered_as_mig_devices_only(tmp_path: Path) -> None:
    lib, standin = _standin_nvml(tmp_path / "host", {0})
    try:
        lib.set_mig_mode(lib.device_by_index(0), 1)
        standin.reset_gpu(0)
        state = _state(tmp_path, lib, tmp_path / "host")
        with pytest.raises(ClaimError, match=r"needs MIG mode off on GPU 0 .* MIG on"):
            state.prepare(_allocation("gpu-0"))
        assert _mode(lib) == (1, 0)
        waiting = discover(lib, parse_mig_modes("dynamic"))
        assert waiting.get("gpu-0") is None
        assert _offers(waiting)
        features = ApiFeatures(minor=37, partitionable_devices=True)
        names = [
            d["name"]
            for s in build_slices(waiting, DRIVER, NODE, None, 1, features)
            for d in s["spec"].get("devices", [])
        ]
        assert "gpu-0" not in names
        assert "gpu-0-mig-3g40gb-at4" in names
        assert "gpu-1" in names
    finally:
        lib.shutdown()


class _OlderDriver(FakeGpuLibrary):
    """A driver that describes no GPU-instance profile while MIG mode is off (NOT_SUPPORTED)."""

    def gpu_instance_profile_info(self, gpu: GpuHandle, profile: int) -> GpuInstanceProfileInfo:
        if self.mig_mode(gpu)[0] == 0:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "MIG mode is disabled")
        return super().gpu_instance_profile_info(gpu, profile)


def test_a_driver_silent_about_profiles_with_mig_off_gets_the_models_table(tmp_path: Path) -> None:
    lib = _OlderDriver(load_profile("h100x8-dynamic-mig"), NODE, mig_state=tmp_path / "fake-gpu-mig.json")
    on = discover(lib, parse_mig_modes("dynamic"))
    lib.set_mig_mode(GpuHandle(0), 0)
    off = discover(lib, parse_mig_modes("dynamic"))
    assert _offers(off) == _offers(on)


def test_a_model_without_a_table_is_offered_whole_while_such_a_driver_has_mig_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profile = parse_profile(
        {"gpus": [{"model": "h100-sxm5-80gb", "productName": "NVIDIA H100 NVL", "mig": []}]}, "nvl"
    )
    lib = _OlderDriver(profile, NODE, mig_state=tmp_path / "fake-gpu-mig.json")
    lib.set_mig_mode(GpuHandle(0), 0)
    inventory = discover(lib, parse_mig_modes("dynamic"))
    assert inventory.partitions == ()
    assert "this driver does not know the model's MIG profiles" in caplog.text


class _PlacementsRefusedWithMigOff(FakeGpuLibrary):
    """A driver that describes the profiles with MIG off but fails on their placements."""

    def gpu_instance_possible_placements(self, gpu: GpuHandle, profile_id: int) -> list[Placement]:
        if self.mig_mode(gpu)[0] == 0:
            raise GpuLibraryError(ERROR_UNKNOWN, "unknown error")
        return super().gpu_instance_possible_placements(gpu, profile_id)


def test_a_driver_failing_on_placements_with_mig_off_still_gets_the_gpu_and_the_table(tmp_path: Path) -> None:
    lib = _PlacementsRefusedWithMigOff(
        load_profile("h100x8-dynamic-mig"), NODE, mig_state=tmp_path / "fake-gpu-mig.json"
    )
    on = discover(lib, parse_mig_modes("dynamic"))
    lib.set_mig_mode(GpuHandle(0), 0)
    off = discover(lib, parse_mig_modes("dynamic"))
    assert [g.name for g in off.gpus] == [g.name for g in on.gpus]
    assert _offers(off) == _offers(on)
