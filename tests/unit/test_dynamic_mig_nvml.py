"""Dynamic MIG through NVML (marked `gpu`): the same flow as on fake GPUs.

On a machine with NVIDIA GPUs: needs a MIG-capable GPU without MIG devices;
the test makes and destroys MIG devices and never touches a GPU that already
has some (skipped where there is none). It runs there only with
DRA_GPU_TEST_CHANGE_MIG_MODE=1: the claim switches MIG mode on as the
driver does, and off again after (it ran so on a real H200: docs/testing.md).
Without GPUs it runs the real adapter over the NVML stand-in of the
h100x8-dynamic-mig profile.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.core.migdevices import RESETLESS_MIG_SWITCH
from dra.fakegpus.profiles import MODELS
from dra.gpu import dynamic, migtables
from dra.gpu.discovery import discover
from dra.gpu.library import ERROR_INSUFFICIENT_RESOURCES, GpuLibraryError, Placement
from dra.gpu.nvml import NvmlLibrary
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation
from dra.model.devices import Gpu, Inventory, MigPartition
from dra.model.migmode import parse_mig_modes
from tests.skips import Lack, reason
from tests.unit.helpers import DRIVER, NODE, real_or_standin_nvml

pytestmark = pytest.mark.gpu

#: On a real GPU the prepare test makes MIG devices and switches MIG mode as the driver does: only when asked.
CHANGE_MIG_MODE = "DRA_GPU_TEST_CHANGE_MIG_MODE"


@pytest.fixture
def nvml(tmp_path: Path) -> Iterator[NvmlLibrary]:
    with real_or_standin_nvml(tmp_path / "host", "h100x8-dynamic-mig") as lib:
        yield lib


def _free_dynamic_gpu(lib: NvmlLibrary) -> tuple[Inventory, Gpu]:
    inventory = discover(lib, parse_mig_modes("dynamic"))
    for gpu in inventory.dynamic_gpus:
        if not dynamic.instances(lib, gpu.index):
            return inventory, gpu
    pytest.skip(
        reason(Lack.GPU, "no GPU in MIG mode without MIG devices (turn MIG on: nvidia-smi -i N -mig 1)")
    )


def _host(lib: NvmlLibrary, tmp_path: Path) -> Path:
    """Where the GPUs' device nodes are: the machine's, or the stand-in's fake host."""
    return Path("/") if lib.library is None else tmp_path / "host"


def _offer(inventory: Inventory, gpu: Gpu, slices: int, start: int) -> MigPartition:
    return next(
        p
        for p in inventory.partitions
        if p.parent == gpu and p.slices == slices and p.placement_start == start and p.placement_size <= 4
    )


def test_the_fake_tables_are_what_nvml_says(nvml: NvmlLibrary) -> None:
    inventory, gpu = _free_dynamic_gpu(nvml)
    model = next((m for m in MODELS.values() if m.product_name == gpu.product_name and m.mig_table), None)
    if model is None:
        pytest.skip(reason(Lack.GPU, f"{gpu.product_name} is not in the fake catalog"))
    real = {
        (p.profile, p.placement_start, p.placement_size, p.memory_bytes >> 20)
        for p in inventory.partitions
        if p.parent == gpu
    }
    fake = {(p.name, start, p.memory_slices, p.memory_mib) for p in model.mig_table for start in p.starts}
    assert real == fake
    assert max(p.slices for p in inventory.partitions if p.parent == gpu) == migtables.COMPUTE_SLICES


def test_prepare_makes_and_unprepare_destroys_mig_devices(nvml: NvmlLibrary, tmp_path: Path) -> None:
    inventory, gpu = _free_dynamic_gpu(nvml)
    if nvml.library is None and os.environ.get(CHANGE_MIG_MODE) != "1":
        pytest.skip(
            reason(
                Lack.GPU,
                f"makes MIG devices on GPU {gpu.index} and may switch its MIG mode: {CHANGE_MIG_MODE}=1",
            )
        )
    state = DeviceState(
        DRIVER,
        NODE,
        inventory,
        CdiStore(tmp_path / "cdi", DRIVER, host_root=_host(nvml, tmp_path)),
        CheckpointStore(tmp_path / "cp.json"),
        nvml,
    )
    offers = [_offer(inventory, gpu, 3, 4), _offer(inventory, gpu, 2, 0), _offer(inventory, gpu, 1, 2)]
    allocation = ClaimAllocation(
        "uid-real", "default", "real", tuple(AllocatedDevice("mig", NODE, o.name) for o in offers)
    )
    try:
        claim = state.prepare(allocation)
        made = {(i.placement.start, i.placement.size) for i in dynamic.instances(nvml, gpu.index)}
        assert made == {(o.placement_start, o.placement_size) for o in offers}
        assert all(d.uuid.startswith("MIG-") for d in claim.devices)
        with pytest.raises(GpuLibraryError) as err:
            dynamic.create_gpu_instance(nvml, gpu.index, offers[0].profile_id, Placement(4, 4))
        assert err.value.code == ERROR_INSUFFICIENT_RESOURCES
    finally:
        state.unprepare("uid-real")
    assert dynamic.instances(nvml, gpu.index) == []
    # The last MIG device gone, the driver switches MIG mode off where no reset is needed.
    if gpu.architecture in RESETLESS_MIG_SWITCH:
        assert dynamic.mig_mode(nvml, gpu.index) == (0, 0)
