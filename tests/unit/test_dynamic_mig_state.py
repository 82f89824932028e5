"""Dynamic MIG at prepare and unprepare on fake GPUs: made, recorded, destroyed; nothing leaks on a crash."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.core import sharing
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu import dynamic
from dra.gpu.discovery import discover
from dra.gpu.library import (
    ERROR_INSUFFICIENT_RESOURCES,
    ComputeInstanceHandle,
    GpuHandle,
    GpuInstanceHandle,
    GpuLibraryError,
    Placement,
)
from dra.kubeletplugin.mps import MpsDaemons
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation, ClaimError, OpaqueConfig
from dra.model.migmode import parse_mig_modes
from tests.skips import Lack, reason
from tests.unit.helpers import DRIVER, MPS_CONTROL, NODE, daemon_devices, mps_ask, mps_root, stop_mps_daemons

UID = "6b1f7e7c-0d3e-4d4b-9a0e-2f1c3b4a5d6e"
THREE_G_AT_4 = "gpu-0-mig-3g40gb-at4"


def _lib(root: Path) -> FakeGpuLibrary:
    return FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE, mig_state=root / "fake-gpu-mig.json")


def _state(root: Path, lib: FakeGpuLibrary | None = None) -> DeviceState:
    lib = lib or _lib(root)
    inventory = discover(lib, parse_mig_modes("dynamic"))
    return DeviceState(
        DRIVER,
        NODE,
        inventory,
        CdiStore(root / "cdi", DRIVER),
        CheckpointStore(root / "checkpoint.json"),
        lib,
    )


def _allocation(*devices: str, uid: str = UID) -> ClaimAllocation:
    return ClaimAllocation(uid, "default", "claim", tuple(AllocatedDevice("mig", NODE, d) for d in devices))


def _instances(root: Path) -> list[tuple[int, str, int, int]]:
    return [
        (gpu, i.profile, i.start, i.size)
        for gpu, found in sorted(_lib(root).instances().items())
        for i in found
    ]


def _specs(root: Path) -> list[str]:
    return CdiStore(root / "cdi", DRIVER).claim_uids()


def test_prepare_makes_the_mig_device_and_unprepare_destroys_it(tmp_path: Path) -> None:
    state = _state(tmp_path)
    claim = state.prepare(_allocation(THREE_G_AT_4, "gpu-0-mig-1g10gb-at0"))
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4), (0, "1g.10gb", 0, 1)]
    uuids = [d.uuid for d in claim.devices]
    assert all(u.startswith("MIG-") for u in uuids)
    spec = (tmp_path / "cdi").glob("*.json").__next__().read_text()
    assert all(u in spec for u in uuids)
    assert [a.done for a in state.actions] == [True, True]
    # The kubelet retries: the recorded answer, nothing made twice.
    assert state.prepare(_allocation(THREE_G_AT_4, "gpu-0-mig-1g10gb-at0")) == claim
    assert len(_instances(tmp_path)) == 2
    state.unprepare(UID)
    assert _instances(tmp_path) == []
    assert _specs(tmp_path) == []
    assert state.actions == []


def test_a_placement_taken_by_hand_is_a_claim_error_and_is_reconciled(tmp_path: Path) -> None:
    lib = _lib(tmp_path)
    lib.create_gpu_instance_with_placement(lib.device_by_index(0), 9, Placement(4, 4))
    state = _state(tmp_path, lib)
    with pytest.raises(ClaimError) as err:
        state.prepare(_allocation("gpu-0-mig-1g10gb-at0", "gpu-0-mig-1g10gb-at5"))
    message = str(err.value)
    assert "1g.10gb at memory slices 5-5 of GPU 0" in message
    assert f"NVML error {ERROR_INSUFFICIENT_RESOURCES}" in message
    assert "no prepared claim held, now destroyed: the retry can succeed" in message
    # Nothing of the failed prepare is left, and the instance nobody held is gone too.
    assert _instances(tmp_path) == []
    assert state.actions == []
    assert state.prepared == {}
    assert _specs(tmp_path) == []
    state.prepare(_allocation("gpu-0-mig-1g10gb-at0", "gpu-0-mig-1g10gb-at5"))
    assert _instances(tmp_path) == [(0, "1g.10gb", 0, 1), (0, "1g.10gb", 5, 1)]


def test_a_placement_a_prepared_claim_holds_is_a_stale_allocation(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare(_allocation(THREE_G_AT_4, uid="uid-holder"))
    with pytest.raises(ClaimError, match="a claim still prepared on this node holds the placement"):
        state.prepare(_allocation("gpu-0-mig-1g10gb-at5"))
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
    assert list(state.prepared) == ["uid-holder"]


class _NoComputeInstances(FakeGpuLibrary):
    """NVML refusing compute instances (as with NVML_ERROR_UNKNOWN from a driver in trouble)."""

    def create_compute_instance(self, gi: GpuInstanceHandle, profile: int) -> ComputeInstanceHandle:
        raise GpuLibraryError(999, "Unknown Error")


def test_a_failed_compute_instance_leaves_no_gpu_instance(tmp_path: Path) -> None:
    lib = _NoComputeInstances(
        load_profile("h100x8-dynamic-mig"), NODE, mig_state=tmp_path / "fake-gpu-mig.json"
    )
    state = _state(tmp_path, lib)
    with pytest.raises(
        ClaimError, match=re.escape("cannot make MIG device gpu-0-mig-3g40gb-at4, 3g.40gb at memory")
    ):
        state.prepare(_allocation(THREE_G_AT_4))
    assert _instances(tmp_path) == []
    assert state.actions == []


def test_recover_adopts_known_instances_and_destroys_the_others(tmp_path: Path) -> None:
    _state(tmp_path).prepare(_allocation(THREE_G_AT_4))
    lib = _lib(tmp_path)
    by_hand = lib.create_gpu_instance_with_placement(lib.device_by_index(1), 19, Placement(0, 1))
    lib.create_compute_instance(by_hand, 0)
    restarted = _state(tmp_path)
    restarted.recover()
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
    assert _specs(tmp_path) == [UID]
    assert [d.uuid for d in restarted.inventory.instances] == [restarted.prepared[UID].devices[0].uuid]


def test_two_overlapping_instances_see_each_others_mig_devices(tmp_path: Path) -> None:
    # A rolling update: the old and the new plugin share the checkpoint, CDI directory and GPUs.
    old, new = _state(tmp_path), _state(tmp_path)
    claim = old.prepare(_allocation(THREE_G_AT_4))
    next((tmp_path / "cdi").glob("*.json")).unlink()
    # The kubelet's retry lands on the new instance: the recorded answer, its spec back with the device.
    assert new.prepare(_allocation(THREE_G_AT_4)) == claim
    assert claim.devices[0].uuid in next((tmp_path / "cdi").glob("*.json")).read_text()
    assert [d.uuid for d in new.inventory.instances] == [claim.devices[0].uuid]
    # The other placements stay taken: the old instance cannot hand the same slices out again.
    with pytest.raises(ClaimError, match="holds the placement"):
        old.prepare(_allocation("gpu-0-mig-1g10gb-at5", uid="uid-other"))
    new.unprepare(UID)
    assert _instances(tmp_path) == []
    assert new.inventory.instances == ()
    old.prepare(_allocation("gpu-0-mig-1g10gb-at5", uid="uid-other"))
    assert _instances(tmp_path) == [(0, "1g.10gb", 5, 1)]
    assert [d.uuid for d in old.inventory.instances] == [old.prepared["uid-other"].devices[0].uuid]


_PREPARE = """
import sys
from pathlib import Path
from tests.unit.test_dynamic_mig_state import _allocation, _state, THREE_G_AT_4
state = _state(Path(sys.argv[1]))
state.recover()
state.{call}
"""

PREPARE_POINTS = [
    "mig-intent-recorded",
    "mig-gpu-instance-created",
    "mig-compute-instance-created",
    "mig-recorded",
    "prepare.cdi-written",
    "prepare.checkpoint-saved",
]


def _crash(root: Path, point: str, call: str) -> None:
    env = {**os.environ, "DRA_GPU_FAULT_POINT": point}
    done = subprocess.run(
        [sys.executable, "-c", _PREPARE.format(call=call), str(root)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 137, done.stderr


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_kill_at_each_prepare_step_leaks_nothing_and_the_retry_converges(tmp_path: Path, point: str) -> None:
    _crash(tmp_path, point, "prepare(_allocation(THREE_G_AT_4))")
    restarted = _state(tmp_path)
    restarted.recover()
    if point == "prepare.checkpoint-saved":
        # Recorded before the crash: the instance is the claim's, adopted with its spec.
        assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
        assert _specs(tmp_path) == [UID]
    else:
        assert _instances(tmp_path) == []
        assert _specs(tmp_path) == []
        assert restarted.actions == []
        assert restarted.prepared == {}
    claim = restarted.prepare(_allocation(THREE_G_AT_4))
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
    assert _specs(tmp_path) == [UID]
    assert claim.devices[0].uuid in _made(tmp_path)
    restarted.unprepare(UID)
    assert _instances(tmp_path) == []


def test_kill_during_unprepare_converges_on_the_retry(tmp_path: Path) -> None:
    _state(tmp_path).prepare(_allocation(THREE_G_AT_4))
    _crash(tmp_path, "mig-destroyed", "unprepare(" + repr(UID) + ")")
    assert _instances(tmp_path) == []
    restarted = _state(tmp_path)
    restarted.recover()
    restarted.unprepare(UID)
    assert restarted.prepared == {}
    assert restarted.actions == []
    assert _specs(tmp_path) == []
    assert dynamic.instances(_lib(tmp_path), 0) == []


def _reboot(root: Path) -> None:
    """What a reboot leaves: no GPU instance (MIG mode the GPU keeps), no CDI spec (tmpfs)."""
    lib = _lib(root)
    for gpu, there in lib.instances().items():
        for instance in there:
            dynamic.destroy(lib, gpu, instance.gpu_instance_id)
    shutil.rmtree(root / "cdi", ignore_errors=True)


def _made(root: Path) -> set[str]:
    return {m.uuid for m in discover(_lib(root), parse_mig_modes("dynamic")).instances}


def test_a_mig_device_a_reboot_took_is_made_again_at_start_for_its_claim(tmp_path: Path) -> None:
    before = _state(tmp_path).prepare(_allocation(THREE_G_AT_4))
    _reboot(tmp_path)
    restarted = _state(tmp_path)
    restarted.recover()
    # The kubelet prepares the claim again after a reboot: the answer names a MIG device that exists.
    claim = restarted.prepare(_allocation(THREE_G_AT_4))
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
    assert claim.devices[0].uuid in _made(tmp_path)
    assert claim.devices[0].uuid != before.devices[0].uuid
    assert _specs(tmp_path) == [UID]
    spec = (tmp_path / "cdi").glob("*.json").__next__().read_text()
    assert claim.devices[0].uuid in spec
    assert before.devices[0].uuid not in spec
    # Recorded: a second restart adopts it as made.
    again = _state(tmp_path)
    again.recover()
    assert again.prepared[UID] == claim
    again.unprepare(UID)
    assert _instances(tmp_path) == []
    assert again.actions == []


def test_a_mig_device_that_cannot_be_made_again_stays_missing_and_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _state(tmp_path).prepare(_allocation(THREE_G_AT_4))
    _reboot(tmp_path)
    _lib(tmp_path).set_mig_mode(GpuHandle(0), 0)
    restarted = _state(tmp_path)
    restarted.recover()
    assert _instances(tmp_path) == []
    assert "cannot make MIG device gpu-0-mig-3g40gb-at4" in caplog.text
    assert UID in restarted.prepared


def test_a_mig_device_discovery_did_not_name_is_taken_as_it_is_never_destroyed(tmp_path: Path) -> None:
    claim = _state(tmp_path).prepare(_allocation(THREE_G_AT_4))
    lib = _lib(tmp_path)
    there = dynamic.instances(lib, 0)
    # A start-up whose discovery missed the device: the instance still serves the claim's containers.
    missed = dataclasses.replace(discover(lib, parse_mig_modes("dynamic")), instances=())
    restarted = DeviceState(
        DRIVER,
        NODE,
        missed,
        CdiStore(tmp_path / "cdi", DRIVER),
        CheckpointStore(tmp_path / "checkpoint.json"),
        lib,
    )
    restarted.recover()
    assert dynamic.instances(_lib(tmp_path), 0) == there
    assert restarted.prepared[UID] == claim
    assert [d.uuid for d in restarted.inventory.instances] == [claim.devices[0].uuid]


MADE_AGAIN_POINTS = ["mig-gpu-instance-created", "mig-compute-instance-created", "mig-made-again"]


@pytest.mark.parametrize("point", MADE_AGAIN_POINTS)
def test_a_kill_while_a_lost_mig_device_is_made_again_is_repaired_by_the_next_start(
    tmp_path: Path, point: str
) -> None:
    _state(tmp_path).prepare(_allocation(THREE_G_AT_4))
    _reboot(tmp_path)
    _crash(tmp_path, point, "unprepare('none')")
    restarted = _state(tmp_path)
    restarted.recover()
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
    assert restarted.prepared[UID].devices[0].uuid in _made(tmp_path)
    assert _specs(tmp_path) == [UID]
    restarted.unprepare(UID)
    assert _instances(tmp_path) == []


MIG_MODE_POINTS = ["mig-mode-intent-recorded", "mig-mode-set", "mig-mode-recorded"]


def _mig_mode(root: Path) -> tuple[int, int]:
    return _lib(root).mig_mode(GpuHandle(0))


@pytest.mark.parametrize("point", MIG_MODE_POINTS)
def test_kill_at_each_mig_mode_step_of_a_whole_gpu_claim_is_undone_at_start_and_the_retry_converges(
    tmp_path: Path, point: str
) -> None:
    _crash(tmp_path, point, "prepare(_allocation('gpu-0'))")
    restarted = _state(tmp_path)
    restarted.recover()
    # The prepare never completed: MIG mode is as it was, and nothing is recorded.
    assert _mig_mode(tmp_path) == (1, 1)
    assert restarted.actions == []
    assert restarted.prepared == {}
    restarted.prepare(_allocation("gpu-0"))
    assert _mig_mode(tmp_path) == (0, 0)
    restarted.unprepare(UID)
    assert restarted.actions == []


def test_a_kill_while_the_start_up_repair_puts_mig_mode_back_is_repaired_by_the_next_start(
    tmp_path: Path,
) -> None:
    _crash(tmp_path, "mig-mode-set", "prepare(_allocation('gpu-0'))")
    _crash(tmp_path, "mig-mode-undone", "unprepare('none')")
    assert _mig_mode(tmp_path) == (1, 1)
    restarted = _state(tmp_path)
    restarted.recover()
    assert restarted.actions == []
    assert _mig_mode(tmp_path) == (1, 1)


def test_admin_access_is_refused_on_dynamic_mig_devices(tmp_path: Path) -> None:
    state = _state(tmp_path)
    admin = ClaimAllocation(
        UID, "default", "claim", (AllocatedDevice("mig", NODE, THREE_G_AT_4, admin_access=True),)
    )
    with pytest.raises(ClaimError, match="which admin access cannot use"):
        state.prepare(admin)
    assert _instances(tmp_path) == []


def _mps_on_mig(**mps_config: object) -> OpaqueConfig:
    return OpaqueConfig(
        "FromClaim",
        (),
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": mps_config},
        },
    )


@pytest.mark.skipif(os.geteuid() != 0, reason=reason(Lack.ROOT, "a mount namespace per MPS daemon"))
def test_a_dynamic_mig_device_is_served_by_an_mps_daemon_once_it_is_made(tmp_path: Path) -> None:
    daemons = MpsDaemons(mps_root(tmp_path), MPS_CONTROL)
    lib = _lib(tmp_path)
    state = DeviceState(
        DRIVER,
        NODE,
        discover(lib, parse_mig_modes("dynamic")),
        CdiStore(tmp_path / "cdi", DRIVER),
        CheckpointStore(tmp_path / "checkpoint.json"),
        lib,
        mps=daemons,
    )
    try:
        claim = state.prepare(
            ClaimAllocation(
                UID,
                "default",
                "claim",
                (AllocatedDevice("mig", NODE, THREE_G_AT_4),),
                (_mps_on_mig(defaultPinnedDeviceMemoryLimit="8Gi"),),
            )
        )
        [device] = claim.devices
        assert device.uuid.startswith("MIG-")
        key = sharing.mps_key([device.uuid])
        pid = daemons.pid(key)
        assert pid is not None
        assert daemon_devices(pid) == device.uuid
        pipe = sharing.mps_dirs(str(daemons.root), key).pipe
        assert mps_ask(pipe, "get_default_device_pinned_mem_limit 0") == "8G"
        state.unprepare(UID)
        assert daemons.pid(key) is None
        assert _instances(tmp_path) == []
    finally:
        stop_mps_daemons(daemons)
        shutil.rmtree(daemons.root, ignore_errors=True)


def test_a_config_too_big_for_the_dynamic_mig_device_is_refused_before_it_is_made(tmp_path: Path) -> None:
    state = _state(tmp_path)
    configured = ClaimAllocation(
        UID,
        "default",
        "claim",
        (AllocatedDevice("mig", NODE, THREE_G_AT_4),),
        (_mps_on_mig(defaultPinnedDeviceMemoryLimit="60Gi"),),
    )
    with pytest.raises(ClaimError, match="defaultPinnedDeviceMemoryLimit: 60Gi is more than the"):
        state.prepare(configured)
    assert _instances(tmp_path) == []


def test_a_claim_allocated_anew_gives_its_mig_device_back(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare(_allocation(THREE_G_AT_4))
    # Allocated again without an unprepare (the kubelet missed it): now a whole GPU.
    claim = state.prepare(_allocation("gpu-1"))
    assert [d.device for d in claim.devices] == ["gpu-1"]
    assert _instances(tmp_path) == []
    # What is left is the MIG mode the whole GPU was given, recorded for the claim.
    assert [(a.device, a.kind, a.params["mode"], a.done) for a in state.actions] == [
        ("gpu-1", "mig-mode", 0, True)
    ]


SHARE_UID = "7c2a8f8d-1e4f-4e5c-8b1f-3a2d4c5b6e7f"
THIRD_UID = "8d3b9a9e-2f50-4f6d-9c20-4b3e5d6c7f80"


def _share(share_id: str, uid: str) -> ClaimAllocation:
    shared = AllocatedDevice(
        "mig", NODE, THREE_G_AT_4, share_id=share_id, consumed_capacity=(("memory", "1Gi"),)
    )
    return ClaimAllocation(uid, "default", f"claim-{uid[0]}", (shared,))


def test_shares_of_an_offer_use_one_mig_device_which_the_last_share_destroys(tmp_path: Path) -> None:
    state = _state(tmp_path)
    first = state.prepare(_share("11111111-0000-4000-8000-000000000001", UID))
    second = state.prepare(_share("22222222-0000-4000-8000-000000000002", SHARE_UID))
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
    [made] = {d.uuid for c in (first, second) for d in c.devices}
    assert made.startswith("MIG-")
    assert [(a.claim_uid, a.done) for a in state.actions] == [(UID, True)]
    # The first share goes: the device stays, handed to the second in the same checkpoint save.
    state.unprepare(UID)
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
    assert [a.claim_uid for a in state.actions] == [SHARE_UID]
    # A restart adopts it for the claim that holds it now.
    restarted = _state(tmp_path)
    restarted.recover()
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
    assert [d.uuid for d in restarted.inventory.instances] == [made]
    restarted.unprepare(SHARE_UID)
    assert _instances(tmp_path) == []
    assert restarted.actions == []


def test_the_same_share_of_an_offer_twice_is_refused(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare(_share("11111111-0000-4000-8000-000000000001", UID))
    with pytest.raises(
        ClaimError, match=f"device {THREE_G_AT_4} is already prepared for claim default/claim-6"
    ):
        state.prepare(_share("11111111-0000-4000-8000-000000000001", THIRD_UID))
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]


def test_every_share_of_a_mig_device_a_reboot_took_gets_the_device_made_again(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare(_share("11111111-0000-4000-8000-000000000001", UID))
    state.prepare(_share("22222222-0000-4000-8000-000000000002", SHARE_UID))
    _reboot(tmp_path)
    restarted = _state(tmp_path)
    restarted.recover()
    # One device again, not one per share, and both shares name it.
    assert _instances(tmp_path) == [(0, "3g.40gb", 4, 4)]
    [made] = _made(tmp_path)
    assert {d.uuid for c in restarted.prepared.values() for d in c.devices} == {made}
    assert sorted(_specs(tmp_path)) == sorted([UID, SHARE_UID])
    restarted.unprepare(UID)
    restarted.unprepare(SHARE_UID)
    assert _instances(tmp_path) == []
