"""GPU passthrough at prepare: who is refused and why, what the group needs, what the spec names.

Run through the real executor (DeviceState) over fake GPUs and a fake sysfs tree
(dra.fakegpus.sysfs); the crash-safety of the same steps is in test_prepare_steps.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.adapters.pcisysfs import PciSysfs
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.fakegpus.sysfs import FakeFunction, FakeSysfs
from dra.gpu.discovery import discover
from dra.gpu.library import GpuHandle
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation, ClaimError, OpaqueConfig
from dra.model.devices import Inventory
from dra.model.migmode import parse_mig_modes
from tests.unit.helpers import DRIVER, NODE, inventory

UID = "0d7e5c1a-3b2f-4e6d-9c8b-7a6f5e4d3c2b"
API = "resource.nvidia.com/v1beta1"
GPU0 = "0000:10:00.0"
AUDIO0 = "0000:10:00.1"


def _vfio(api_device: bool = False, requests: tuple[str, ...] = ()) -> OpaqueConfig:
    parameters = {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"enableAPIDevice": api_device}}
    return OpaqueConfig("FromClaim", requests, parameters)


def _claim(*devices: AllocatedDevice, configs: tuple[OpaqueConfig, ...] = (_vfio(),)) -> ClaimAllocation:
    return ClaimAllocation(UID, "vms", "vm-gpu", devices, configs)


def _gpu(device: str = "gpu-0", request: str = "gpu", **more: object) -> AllocatedDevice:
    return AllocatedDevice(request, NODE, device, **more)  # type: ignore[arg-type]


def _node(
    root: Path, profile: str = "h100x8", *extra: FakeFunction, drivers: tuple[str, ...] = ()
) -> FakeSysfs:
    """Each GPU in its own group (its index), plus `extra` functions, nvidia and vfio-pci registered."""
    fake = FakeSysfs(root / "host")
    gpus = [FakeFunction(g.pci_bus_id, group=g.index) for g in inventory(profile).gpus]
    fake.build([*gpus, *extra], drivers or ("nvidia", "vfio-pci"))
    return fake


def _state(
    root: Path,
    fake: FakeSysfs,
    *,
    vfio: bool = True,
    profile: str = "h100x8",
    modes: str = "static",
    write: object = None,
    lib: FakeGpuLibrary | None = None,
) -> DeviceState:
    # `whole` publishes a GPU in MIG mode as a whole device (--mig-mode whole).
    lib = lib or FakeGpuLibrary(load_profile(profile), NODE)
    found: Inventory = replace(discover(lib, parse_mig_modes(modes)), dev_root=str(fake.root))
    return DeviceState(
        DRIVER,
        NODE,
        found,
        CdiStore(root / "cdi", DRIVER),
        CheckpointStore(root / "checkpoint.json"),
        lib=lib,
        pci=PciSysfs(fake.root, write=write or fake.write),  # type: ignore[arg-type]
        vfio=vfio,
    )


def _refused(state: DeviceState, allocation: ClaimAllocation) -> str:
    with pytest.raises(ClaimError) as err:
        state.prepare(allocation)
    assert state.prepared == {}
    assert state.actions == []
    return str(err.value)


def test_passthrough_off_refuses_the_claim_saying_how_to_turn_it_on(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    message = _refused(_state(tmp_path, fake, vfio=False), _claim(_gpu()))
    assert message == (
        "cannot prepare ResourceClaim vms/vm-gpu: GPU passthrough (VfioDeviceConfig) is off on this node: "
        "start the kubelet plugin with --vfio=true (chart value kubeletPlugin.vfio.enabled=true)"
    )
    assert fake.driver_of(GPU0) == "nvidia"


def test_a_node_without_iommu_refuses_the_claim(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    for group in (fake.sys / "kernel/iommu_groups").iterdir():
        for link in (group / "devices").iterdir():
            link.unlink()
        (group / "devices").rmdir()
        group.rmdir()
    assert "this node has no IOMMU (/sys/kernel/iommu_groups is empty)" in _refused(
        _state(tmp_path, fake), _claim(_gpu())
    )


def test_a_node_without_vfio_pci_refuses_the_claim(tmp_path: Path) -> None:
    fake = _node(tmp_path, drivers=("nvidia",))
    assert "the vfio-pci driver is not loaded on this node (modprobe vfio-pci)" in _refused(
        _state(tmp_path, fake), _claim(_gpu())
    )


@pytest.mark.parametrize(
    ("device", "profile", "expected"),
    [
        (
            _gpu("gpu-4-mig-1g10gb-3-0"),
            "h100x8-mig",
            "cannot configure gpu-4-mig-1g10gb-3-0, which is a MIG device: passthrough (vfio-pci) takes a "
            "whole GPU",
        ),
        (
            _gpu("gpu-1"),
            "h100x8-dynamic-mig:whole",
            "device gpu-1 is in MIG mode: passthrough takes a GPU with MIG mode off",
        ),
        (_gpu(share_id="a1b2"), "h100x8", "device gpu-0: a share of a GPU cannot be passed through"),
        (_gpu(admin_access=True), "h100x8", "device gpu-0: admin access cannot pass a GPU through"),
    ],
    ids=["mig-device", "mig-mode", "share", "admin-access"],
)
def test_what_cannot_be_passed_through_is_refused_per_claim(
    tmp_path: Path, device: AllocatedDevice, profile: str, expected: str
) -> None:
    profile, _, modes = profile.partition(":")
    fake = _node(tmp_path, profile)
    assert expected in _refused(
        _state(tmp_path, fake, profile=profile, modes=modes or "static"), _claim(device)
    )


def test_a_gpu_another_claim_holds_is_refused(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    state = _state(tmp_path, fake)
    state.prepare(replace(_claim(_gpu(), configs=()), uid="11111111-2222-4333-8444-555555555555"))
    with pytest.raises(ClaimError, match="device gpu-0 is already prepared for claim"):
        state.prepare(_claim(_gpu()))
    assert fake.driver_of(GPU0) == "nvidia"


def test_the_audio_function_of_the_card_goes_with_it_and_comes_back(tmp_path: Path) -> None:
    audio = FakeFunction(AUDIO0, group=0, driver="snd_hda_intel", class_code="0x040300")
    fake = _node(tmp_path, "h100x8", audio, drivers=("nvidia", "vfio-pci", "snd_hda_intel"))
    state = _state(tmp_path, fake)
    claim = state.prepare(_claim(_gpu(), configs=(_vfio(api_device=True),)))
    assert claim.devices[0].vfio_group == 0
    assert (fake.driver_of(GPU0), fake.driver_of(AUDIO0)) == ("vfio-pci", "")
    assert os.path.exists(fake.group_node(0))
    state.unprepare(UID)
    assert (fake.driver_of(GPU0), fake.driver_of(AUDIO0)) == ("nvidia", "snd_hda_intel")
    assert (fake.override_of(GPU0), fake.override_of(AUDIO0)) == ("", "")
    assert not os.path.exists(fake.group_node(0))


def test_a_group_shared_with_another_cards_bound_function_is_refused_and_nothing_moves(
    tmp_path: Path,
) -> None:
    nic = FakeFunction("0000:11:00.0", group=0, driver="mlx5_core", class_code="0x020000", vendor="0x15b3")
    bridge = FakeFunction("0000:0f:00.0", group=0, driver="pcieport", class_code="0x060400", vendor="0x8086")
    fake = _node(tmp_path, "h100x8", nic, bridge)
    message = _refused(_state(tmp_path, fake), _claim(_gpu()))
    assert message == (
        "cannot prepare ResourceClaim vms/vm-gpu: GPU gpu-0 shares IOMMU group 0 with 0000:11:00.0 (bound to "
        "mlx5_core); the kernel passes a group through whole, so those must be unbound or bound to vfio-pci"
    )
    assert (fake.driver_of(GPU0), fake.driver_of(nic.address)) == ("nvidia", "mlx5_core")
    assert CdiStore(tmp_path / "cdi", DRIVER).claim_uids() == []
    # A bridge (pcieport) and an unbound function leave the group viable.
    fake.write(fake.sys / "bus/pci/drivers/mlx5_core/unbind", nic.address)
    _state(tmp_path, fake).prepare(_claim(_gpu()))
    assert fake.driver_of(GPU0) == "vfio-pci"


def test_a_gpu_not_on_the_nvidia_driver_is_refused(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    fake.write(fake.sys / "bus/pci/drivers/nvidia/unbind", GPU0)
    assert "GPU gpu-0 (0000:10:00.0) is bound to no driver, not nvidia" in _refused(
        _state(tmp_path, fake), _claim(_gpu())
    )


def test_a_bind_the_kernel_refuses_gives_everything_back(tmp_path: Path) -> None:
    audio = FakeFunction(AUDIO0, group=0, driver="snd_hda_intel", class_code="0x040300")
    fake = _node(tmp_path, "h100x8", audio, drivers=("nvidia", "vfio-pci", "snd_hda_intel"))

    def busy(path: Path, text: str) -> None:
        if path == fake.sys / "bus/pci/drivers/vfio-pci/bind":
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        fake.write(path, text)

    message = _refused(_state(tmp_path, fake, write=busy), _claim(_gpu()))
    assert "cannot bind GPU gpu-0 (0000:10:00.0) to vfio-pci: [Errno 16] Device or resource busy" in message
    assert (fake.driver_of(GPU0), fake.driver_of(AUDIO0)) == ("nvidia", "snd_hda_intel")
    assert fake.override_of(GPU0) == ""


def test_the_spec_names_the_group_and_the_api_device_only_when_asked(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    state = _state(tmp_path, fake)
    # gpu-0 passed through (its request's config), gpu-1 a GPU for CUDA in the same claim.
    state.prepare(_claim(_gpu(), _gpu("gpu-1", "cuda"), configs=(_vfio(requests=("gpu",)),)))
    spec = json.loads((tmp_path / "cdi" / f"k8s.{DRIVER}-claim_{UID}.json").read_text())
    nodes = {
        d["name"].removeprefix(UID + "-"): d["containerEdits"].get("deviceNodes") for d in spec["devices"]
    }
    assert nodes["gpu-0"] == [{"path": "/dev/vfio/0", "hostPath": f"{fake.root}/dev/vfio/0"}]
    assert nodes["gpu-1"] != nodes["gpu-0"]
    assert "deviceNodes" not in spec["containerEdits"]
    state.unprepare(UID)
    state.prepare(_claim(_gpu(), configs=(_vfio(api_device=True),)))
    spec = json.loads((tmp_path / "cdi" / f"k8s.{DRIVER}-claim_{UID}.json").read_text())
    assert spec["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/vfio/vfio", "hostPath": f"{fake.root}/dev/vfio/vfio"}],
    }


def test_the_checkpoint_keeps_the_group_and_a_restart_keeps_the_gpu_bound(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    _state(tmp_path, fake).prepare(_claim(_gpu()))
    restarted = _state(tmp_path, fake)
    restarted.recover()
    assert restarted.prepared[UID].devices[0].vfio_group == 0
    assert fake.driver_of(GPU0) == "vfio-pci"
    # Passthrough turned off meanwhile: the claim stays served, and its unprepare gives the GPU back.
    off = _state(tmp_path, fake, vfio=False)
    off.recover()
    off.unprepare(UID)
    assert fake.driver_of(GPU0) == "nvidia"


def test_a_spec_that_cannot_be_written_gives_the_gpu_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _node(tmp_path)
    state = _state(tmp_path, fake)

    def full(uid: str, spec: object, compare: bool = True) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(state._cdi, "write", full)
    assert "cannot write the CDI spec of claim vms/vm-gpu: [Errno 28]" in _refused(state, _claim(_gpu()))
    assert (fake.driver_of(GPU0), fake.override_of(GPU0)) == ("nvidia", "")


# -- the passthrough twin (NVIDIA's vfio.gpu.nvidia.com class) ---------------------------------------------

OTHER = "11111111-2222-4333-8444-555555555555"


def test_a_claim_for_the_twin_passes_its_gpu_through_without_a_config(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    state = _state(tmp_path, fake)
    state.prepare(_claim(_gpu("gpu-vfio-0"), configs=()))
    assert fake.driver_of(GPU0) == "vfio-pci"
    spec = json.loads((tmp_path / "cdi" / f"k8s.{DRIVER}-claim_{UID}.json").read_text())
    (device,) = spec["devices"]
    # Named as the kubelet knows the device; NVIDIA's default config: no IOMMU API device.
    assert device["name"] == f"{UID}-gpu-vfio-0"
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/vfio/0", "hostPath": f"{fake.root}/dev/vfio/0"}
    ]
    assert "deviceNodes" not in spec["containerEdits"]
    # A restart finds the twin's GPU by its UUID and keeps it bound; unprepare gives it back.
    restarted = _state(tmp_path, fake)
    restarted.recover()
    assert restarted.prepared[UID].devices[0].device == "gpu-vfio-0"
    assert fake.driver_of(GPU0) == "vfio-pci"
    restarted.unprepare(UID)
    assert fake.driver_of(GPU0) == "nvidia"


def test_a_vfio_config_on_the_twin_asks_for_the_api_device(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    state = _state(tmp_path, fake)
    state.prepare(_claim(_gpu("gpu-vfio-0"), configs=(_vfio(api_device=True),)))
    spec = json.loads((tmp_path / "cdi" / f"k8s.{DRIVER}-claim_{UID}.json").read_text())
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/vfio/vfio", "hostPath": f"{fake.root}/dev/vfio/vfio"}
    ]


def test_the_twin_and_its_gpu_are_never_prepared_together(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    state = _state(tmp_path, fake)
    state.prepare(replace(_claim(_gpu(), configs=()), uid=OTHER))
    with pytest.raises(ClaimError, match="device gpu-vfio-0 is already prepared for claim"):
        state.prepare(_claim(_gpu("gpu-vfio-0"), configs=()))
    state.unprepare(OTHER)
    state.prepare(replace(_claim(_gpu("gpu-vfio-0"), configs=()), uid=OTHER))
    with pytest.raises(ClaimError, match="device gpu-0 is already prepared for claim"):
        state.prepare(_claim(_gpu(), configs=()))
    state.unprepare(OTHER)
    message = _refused(state, _claim(_gpu(), _gpu("gpu-vfio-0", "vm"), configs=()))
    assert "device gpu-vfio-0 is GPU gpu-0 passed through: a claim gets one or the other" in message
    assert fake.driver_of(GPU0) == "nvidia"


def test_the_twin_is_refused_where_passthrough_is_off_or_with_a_gpu_config(tmp_path: Path) -> None:
    fake = _node(tmp_path)
    off = _refused(_state(tmp_path, fake, vfio=False), _claim(_gpu("gpu-vfio-0"), configs=()))
    assert "--vfio=true" in off
    gpu_config = OpaqueConfig("FromClaim", (), {"apiVersion": API, "kind": "GpuConfig"})
    message = _refused(_state(tmp_path, fake), _claim(_gpu("gpu-vfio-0"), configs=(gpu_config,)))
    assert "a GpuConfig does not apply to it, a VfioDeviceConfig does" in message
    assert fake.driver_of(GPU0) == "nvidia"


def test_the_twin_of_a_dynamic_mig_gpu_in_mig_mode_gets_mig_mode_off_first(tmp_path: Path) -> None:
    fake = _node(tmp_path, "h100x8-dynamic-mig")
    lib = FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE)
    state = _state(tmp_path, fake, profile="h100x8-dynamic-mig", modes="dynamic", lib=lib)
    gpu = state.inventory.gpus[1]
    assert gpu.mig_enabled
    state.prepare(_claim(_gpu("gpu-vfio-1"), configs=()))
    assert fake.driver_of(gpu.pci_bus_id) == "vfio-pci"
    assert lib.mig_mode(GpuHandle(1)) == (0, 0)
