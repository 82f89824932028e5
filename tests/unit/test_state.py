"""DeviceState: applying prepare, unprepare and recover plans to CDI specs and the checkpoint on disk."""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra.adapters.checkpoint import CheckpointError, CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.core import cdi
from dra.core.assignment import restrict
from dra.kubeletplugin import state as state_module
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation, ClaimError, OpaqueConfig
from dra.model.devices import Inventory
from dra.model.node import ClaimRead
from dra.model.prepared import DeviceAction, PreparedClaim, PreparedDevice
from tests.unit.helpers import DRIVER, NODE, inventory

UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"
UID_C = "cccccccc-0000-4000-8000-00000000000c"
#: What the API server answers for a claim deleted, and for one deleted and made again (another UID).
GONE = ClaimRead(None, 404, "not found")
RE_CREATED = ClaimRead({"metadata": {"uid": "dddddddd-0000-4000-8000-00000000000d"}})
OLD = 1_000_000_000


def _allocation(
    uid: str,
    *devices: str,
    requests: tuple[str, ...] = (),
    admin: bool = False,
    pool: str = NODE,
    configs: tuple[OpaqueConfig, ...] = (),
) -> ClaimAllocation:
    names = requests or ("gpu",) * len(devices)
    return ClaimAllocation(
        uid=uid,
        namespace="team-a",
        name=f"claim-{uid[0]}",
        devices=tuple(
            AllocatedDevice(r, pool, d, admin_access=admin) for r, d in zip(names, devices, strict=True)
        ),
        configs=configs,
    )


class Paths:
    """Where one node keeps its CDI specs and checkpoint."""

    def __init__(self, root: Path) -> None:
        self.cdi = root / "cdi"
        self.checkpoint = root / "plugin" / "checkpoint.json"

    def state(self, inv: Inventory | None = None) -> DeviceState:
        return DeviceState(
            DRIVER,
            NODE,
            inv or inventory("h100x8-mig"),
            CdiStore(self.cdi, DRIVER),
            CheckpointStore(self.checkpoint),
        )

    def spec(self, uid: str) -> Path:
        return self.cdi / cdi.spec_file_name(DRIVER, uid)

    def specs(self) -> list[str]:
        return sorted(os.listdir(self.cdi)) if self.cdi.exists() else []

    def checkpointed(self) -> dict[str, PreparedClaim]:
        return CheckpointStore(self.checkpoint).load()


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return Paths(tmp_path)


# -- preparing -------------------------------------------------------------------------------


def test_prepare_writes_the_spec_and_the_checkpoint_and_returns_cdi_ids(paths: Paths) -> None:
    state = paths.state()
    claim = state.prepare(_allocation(UID_A, "gpu-0", "gpu-4-mig-3g40gb-1-0"))
    gpu, mig = (state.inventory.get(name) for name in ("gpu-0", "gpu-4-mig-3g40gb-1-0"))
    assert gpu is not None
    assert mig is not None
    assert claim == PreparedClaim(
        uid=UID_A,
        namespace="team-a",
        name="claim-a",
        devices=(
            PreparedDevice(
                ("gpu",), NODE, "gpu-0", (f"k8s.gpu.nvidia.com/claim={UID_A}-gpu-0",), uuid=gpu.uuid
            ),
            PreparedDevice(
                ("gpu",),
                NODE,
                "gpu-4-mig-3g40gb-1-0",
                (f"k8s.gpu.nvidia.com/claim={UID_A}-gpu-4-mig-3g40gb-1-0",),
                uuid=mig.uuid,
            ),
        ),
    )
    spec = json.loads(paths.spec(UID_A).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{UID_A}-gpu-0", f"{UID_A}-gpu-4-mig-3g40gb-1-0"]
    assert paths.checkpointed() == {UID_A: claim}
    assert state.prepared == {UID_A: claim}


class OrderCheckingCheckpoint(CheckpointStore):
    """A checkpoint that checks, whenever it is saved, that every claim it records has its spec on disk."""

    def __init__(self, path: Path, specs: CdiStore) -> None:
        super().__init__(path)
        self.specs = specs
        self.saves = 0

    def save(
        self,
        claims: Mapping[str, PreparedClaim],
        actions: Sequence[DeviceAction] = (),
        durable: bool = True,
        changed: frozenset[str] | None = None,
    ) -> int:
        missing = [uid for uid in claims if not self.specs.exists(uid)]
        assert not missing, f"checkpoint names claims whose spec is not written yet: {missing}"
        self.saves += 1
        return super().save(claims, actions, durable, changed)


def test_the_spec_is_on_disk_before_the_checkpoint_names_the_claim(paths: Paths) -> None:
    specs = CdiStore(paths.cdi, DRIVER)
    checkpoint = OrderCheckingCheckpoint(paths.checkpoint, specs)
    state = DeviceState(DRIVER, NODE, inventory("h100x8"), specs, checkpoint)
    state.prepare(_allocation(UID_A, "gpu-0"))
    state.prepare(_allocation(UID_B, "gpu-1"))
    assert checkpoint.saves == 2


class FailingCheckpoint(CheckpointStore):
    def save(
        self,
        claims: Mapping[str, PreparedClaim],
        actions: Sequence[DeviceAction] = (),
        durable: bool = True,
        changed: frozenset[str] | None = None,
    ) -> int:
        raise OSError("no space left on device")


def test_a_failed_checkpoint_save_leaves_no_spec_and_the_retry_prepares(paths: Paths) -> None:
    """A crash at this step (not an error) is the crash-point matrix's: tests/e2e/test_crash_points.py."""
    state = DeviceState(
        DRIVER, NODE, inventory("h100x8"), CdiStore(paths.cdi, DRIVER), FailingCheckpoint(paths.checkpoint)
    )
    with pytest.raises(
        ClaimError, match=r"cannot record claim team-a/claim-a in the checkpoint .*: no space"
    ):
        state.prepare(_allocation(UID_A, "gpu-0"))
    assert state.prepared == {}
    assert paths.specs() == []
    # The kubelet retries once the disk has room, and the claim is prepared.
    paths.state(inventory("h100x8")).prepare(_allocation(UID_A, "gpu-0"))
    assert list(paths.checkpointed()) == [UID_A]
    assert paths.specs() == [paths.spec(UID_A).name]


def test_request_names_of_one_device_are_reported_once_per_request(paths: Paths) -> None:
    state = paths.state()
    claim = state.prepare(_allocation(UID_A, "gpu-0", "gpu-1", requests=("train/h100", "train/h100")))
    assert [d.request_names for d in claim.devices] == [("train",), ("train",)]


def test_repeated_prepare_gives_the_same_answer_without_rewriting(paths: Paths) -> None:
    state = paths.state()
    first = state.prepare(_allocation(UID_A, "gpu-0"))
    os.utime(paths.spec(UID_A), ns=(OLD, OLD))
    os.utime(paths.checkpoint, ns=(OLD, OLD))
    again = state.prepare(_allocation(UID_A, "gpu-0"))
    assert again == first
    assert paths.spec(UID_A).stat().st_mtime_ns == OLD
    assert paths.checkpoint.stat().st_mtime_ns == OLD


def test_a_claim_allocated_anew_without_unprepare_is_prepared_with_its_new_devices(paths: Paths) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0"))
    moved = state.prepare(_allocation(UID_A, "gpu-1"))
    assert [d.device for d in moved.devices] == ["gpu-1"]
    assert [d.device for d in paths.checkpointed()[UID_A].devices] == ["gpu-1"]
    assert "gpu-1" in paths.spec(UID_A).read_text()
    assert "-gpu-0" not in paths.spec(UID_A).read_text()


def test_repeated_prepare_recreates_a_missing_spec(paths: Paths) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0", "gpu-5-mig-2g20gb-2-0"))
    original = paths.spec(UID_A).read_bytes()
    paths.spec(UID_A).unlink()
    state.prepare(_allocation(UID_A, "gpu-0", "gpu-5-mig-2g20gb-2-0"))
    assert paths.spec(UID_A).read_bytes() == original


def _refused_asking(state: DeviceState, allocation: ClaimAllocation, asked: list[str]) -> str:
    """Refused, every holder live; the UIDs of the holders the prepare asked about go to `asked`."""

    def live(holders: Sequence[PreparedClaim]) -> Mapping[str, ClaimRead]:
        asked.extend(c.uid for c in holders)
        return {}

    with pytest.raises(ClaimError) as err:
        state.prepare(allocation, live)
    return str(err.value)


def _refused(
    state: DeviceState, allocation: ClaimAllocation, stale: Mapping[str, ClaimRead] | None = None
) -> str:
    with pytest.raises(ClaimError) as err:
        state.prepare(allocation, lambda holders: stale or {})
    return str(err.value)


def test_a_device_not_on_this_node_is_refused_and_nothing_is_written(paths: Paths) -> None:
    message = _refused(paths.state(), _allocation(UID_A, "gpu-0", "gpu-99"))
    assert (
        message == "cannot prepare ResourceClaim team-a/claim-a: device gpu-99 does not exist on node node-a"
    )
    assert paths.specs() == []
    assert not paths.checkpoint.exists()


def test_a_mig_mode_gpu_itself_is_not_preparable(paths: Paths) -> None:
    assert "device gpu-4 does not exist on node node-a" in _refused(
        paths.state(), _allocation(UID_A, "gpu-4")
    )


def test_a_device_of_another_nodes_pool_is_refused(paths: Paths) -> None:
    message = _refused(paths.state(), _allocation(UID_A, "gpu-0", pool="node-b"))
    assert "device gpu-0 is in pool 'node-b', not this node's pool 'node-a'" in message
    assert paths.specs() == []


def test_a_device_prepared_for_another_claim_is_refused_naming_that_claim(paths: Paths) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0", "gpu-1"))
    message = _refused(state, _allocation(UID_B, "gpu-2", "gpu-1"))
    assert message == (
        "cannot prepare ResourceClaim team-a/claim-b: "
        f"device gpu-1 is already prepared for claim team-a/claim-a ({UID_A})"
    )
    assert list(state.prepared) == [UID_A]
    assert paths.specs() == [paths.spec(UID_A).name]


def test_every_problem_of_a_claim_is_reported_at_once(paths: Paths) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0"))
    message = _refused(state, _allocation(UID_B, "gpu-0", "gpu-77"))
    assert "device gpu-0 is already prepared for claim" in message
    assert "device gpu-77 does not exist" in message
    assert message.count("; ") == 1


def test_an_invalid_config_is_refused(paths: Paths) -> None:
    bad = OpaqueConfig(
        "FromClaim",
        (),
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"timeSlicingConfig": {"interval": "VeryLong"}},
        },
    )
    message = _refused(paths.state(), _allocation(UID_A, "gpu-0", configs=(bad,)))
    assert (
        "invalid configuration for device gpu-0: GpuConfig.sharing.timeSlicingConfig.interval: "
        '"VeryLong" is not one of' in message
    )
    assert paths.specs() == []


def test_a_gpu_config_on_a_mig_device_is_refused(paths: Paths) -> None:
    config = OpaqueConfig("FromClass", (), {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"})
    message = _refused(paths.state(), _allocation(UID_A, "gpu-6-mig-1g10gb-3-0", configs=(config,)))
    assert "GpuConfig cannot configure gpu-6-mig-1g10gb-3-0, which is a MIG device" in message


def test_a_config_for_another_request_does_not_apply(paths: Paths) -> None:
    config = OpaqueConfig(
        "FromClaim", ("other",), {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
    )
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-6-mig-1g10gb-3-0", configs=(config,)))
    assert list(state.prepared) == [UID_A]


def test_two_admin_access_claims_share_a_device(paths: Paths) -> None:
    state = paths.state()
    first = state.prepare(_allocation(UID_A, "gpu-2", admin=True))
    second = state.prepare(_allocation(UID_B, "gpu-2", admin=True))
    assert first.devices[0].admin_access
    assert second.devices[0].admin_access
    assert sorted(state.prepared) == [UID_A, UID_B]
    assert len(paths.specs()) == 2


@pytest.mark.parametrize("admin_first", [True, False])
def test_admin_access_and_an_exclusive_claim_coexist(paths: Paths, admin_first: bool) -> None:
    state = paths.state()
    admin = _allocation(UID_A, "gpu-3", admin=True)
    exclusive = _allocation(UID_B, "gpu-3")
    for allocation in (admin, exclusive) if admin_first else (exclusive, admin):
        state.prepare(allocation)
    assert sorted(state.prepared) == [UID_A, UID_B]
    # A second exclusive claim is still refused.
    assert f"already prepared for claim team-a/claim-b ({UID_B})" in _refused(
        state, _allocation(UID_C, "gpu-3")
    )


# -- unpreparing -----------------------------------------------------------------------------


def test_unprepare_removes_the_spec_and_the_entry(paths: Paths) -> None:
    state = paths.state()
    claim = state.prepare(_allocation(UID_A, "gpu-0"))
    state.prepare(_allocation(UID_B, "gpu-1"))
    assert state.unprepare(UID_A) == claim
    assert paths.specs() == [paths.spec(UID_B).name]
    assert list(paths.checkpointed()) == [UID_B]
    assert list(state.prepared) == [UID_B]
    # The device is free again.
    state.prepare(_allocation(UID_C, "gpu-0"))


def test_unprepare_of_an_unknown_claim_succeeds(paths: Paths) -> None:
    state = paths.state()
    assert state.unprepare(UID_C) is None
    assert not paths.checkpoint.exists()


def test_unprepare_of_an_unknown_claim_removes_its_stray_spec(paths: Paths) -> None:
    CdiStore(paths.cdi, DRIVER).write(UID_C, {"cdiVersion": "0.5.0"})
    assert paths.state().unprepare(UID_C) is None
    assert paths.specs() == []


def test_unprepare_twice(paths: Paths) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0"))
    assert state.unprepare(UID_A) is not None
    assert state.unprepare(UID_A) is None
    assert paths.checkpointed() == {}


# -- restarts ----------------------------------------------------------------------------------


def test_a_restarted_driver_sees_the_prepared_claims(paths: Paths) -> None:
    before = paths.state()
    a = before.prepare(_allocation(UID_A, "gpu-0", "gpu-4-mig-1g10gb-3-0"))
    b = before.prepare(_allocation(UID_B, "gpu-1", admin=True))
    after = paths.state()
    assert after.prepared == {UID_A: a, UID_B: b}
    # Exclusivity survives the restart, and a retried prepare gets the recorded answer.
    assert f"({UID_A})" in _refused(after, _allocation(UID_C, "gpu-0"))
    assert after.prepare(_allocation(UID_A, "gpu-0", "gpu-4-mig-1g10gb-3-0")) == a


def test_recover_removes_stale_specs_and_recreates_missing_ones(paths: Paths) -> None:
    before = paths.state()
    before.prepare(_allocation(UID_A, "gpu-0"))
    before.prepare(_allocation(UID_B, "gpu-5-mig-3g40gb-1-0"))
    spec_b = paths.spec(UID_B).read_bytes()
    paths.spec(UID_B).unlink()
    CdiStore(paths.cdi, DRIVER).write(UID_C, {"cdiVersion": "0.5.0", "devices": []})
    foreign = paths.cdi / "vendor.example.com-gpu.yaml"
    foreign.write_text("cdiVersion: 0.5.0\n")
    after = paths.state()
    after.recover()
    assert paths.specs() == sorted([paths.spec(UID_A).name, paths.spec(UID_B).name, foreign.name])
    assert paths.spec(UID_B).read_bytes() == spec_b


def test_recover_gives_specs_an_older_driver_wrote_the_current_layout(paths: Paths) -> None:
    before = paths.state()
    before.prepare(_allocation(UID_A, "gpu-0", "gpu-4-mig-1g10gb-3-0"))
    before.prepare(_allocation(UID_B, "gpu-5-mig-3g40gb-1-0"))
    current = {uid: paths.spec(uid).read_bytes() for uid in (UID_A, UID_B)}
    # The layout of earlier versions: the claim's UUIDs spec-wide, which leaked into containers
    # that use one request of the claim and clashed between the claims of one container.
    old = json.loads(current[UID_A])
    old["containerEdits"]["env"] = ["NVIDIA_VISIBLE_DEVICES=GPU-x,MIG-y", f"DRA_GPU_CLAIM_UID={UID_A}"]
    paths.spec(UID_A).write_text(json.dumps(old))
    os.utime(paths.spec(UID_B), ns=(OLD, OLD))

    paths.state().recover()
    assert {uid: paths.spec(uid).read_bytes() for uid in (UID_A, UID_B)} == current
    assert paths.spec(UID_B).stat().st_mtime_ns == OLD, "a spec already current is left alone"


def test_recover_leaves_a_spec_alone_rather_than_drop_a_vanished_device(paths: Paths) -> None:
    paths.state().prepare(_allocation(UID_A, "gpu-0", "gpu-4-mig-3g40gb-1-0"))
    spec = paths.spec(UID_A).read_bytes()
    paths.state(inventory("h100x8")).recover()
    assert paths.spec(UID_A).read_bytes() == spec


def test_a_device_gone_after_a_restart_is_left_out_of_the_recreated_spec(
    paths: Paths, caplog: pytest.LogCaptureFixture
) -> None:
    # MIG was turned off on GPU 4 while the driver was down: its MIG device no longer exists.
    paths.state().prepare(_allocation(UID_A, "gpu-0", "gpu-4-mig-3g40gb-1-0"))
    paths.state().prepare(_allocation(UID_B, "gpu-5-mig-3g40gb-1-0"))
    for uid in (UID_A, UID_B):
        paths.spec(uid).unlink()
    after = paths.state(inventory("h100x8"))
    with caplog.at_level(logging.WARNING, logger="dra.kubeletplugin.state"):
        after.recover()
    spec = json.loads(paths.spec(UID_A).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{UID_A}-gpu-0"]
    # A claim with no device left gets no spec at all, but stays prepared until the kubelet unprepares it.
    assert paths.specs() == [paths.spec(UID_A).name]
    assert sorted(after.prepared) == [UID_A, UID_B]
    assert "uses gpu-4-mig-3g40gb-1-0, which this node no longer has" in caplog.text


def test_a_corrupt_checkpoint_stops_the_driver(paths: Paths) -> None:
    paths.state().prepare(_allocation(UID_A, "gpu-0"))
    document: dict[str, Any] = json.loads(paths.checkpoint.read_text())
    document["claims"][UID_A]["devices"][0]["device"] = "gpu-1"
    paths.checkpoint.write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match=str(paths.checkpoint)):
        paths.state()


def test_prepared_is_a_snapshot(paths: Paths) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0"))
    snapshot = state.prepared
    state.unprepare(UID_A)
    assert list(snapshot) == [UID_A]
    assert dict(state.prepared) == {}


def test_a_gpu_renamed_by_renumbering_is_still_held_by_its_claim(paths: Paths) -> None:
    """NVML indexes shift when a GPU leaves the bus: gpu-1 becomes gpu-0; holders are found by UUID."""
    state = paths.state(inventory("h100x8"))
    state.prepare(_allocation(UID_A, "gpu-1"))
    held = state.inventory.get("gpu-1")
    assert held is not None
    shifted = Inventory(
        devices=tuple(replace(g, name=f"gpu-{i}", index=i) for i, g in enumerate(state.inventory.gpus[1:])),
        driver_version=state.inventory.driver_version,
        cuda_driver_version=state.inventory.cuda_driver_version,
        gpus=state.inventory.gpus[1:],
    )
    state.set_inventory(shifted)
    blocked = _allocation(UID_B, "gpu-0")
    asked: list[str] = []
    _refused_asking(state, blocked, asked)
    assert asked == [UID_A]
    assert f"device gpu-0 is already prepared for claim team-a/claim-a ({UID_A})" in _refused(state, blocked)


def test_a_relayout_changes_the_inventory_before_any_other_prepare_runs(paths: Paths) -> None:
    """A MIG layout applied while serving: no prepare between the change and the new inventory."""
    state = paths.state(inventory("h100x8"))
    state.prepare(_allocation(UID_A, "gpu-1"))
    smaller = restrict(state.inventory, state.inventory.gpus[:1])
    started, release = threading.Event(), threading.Event()
    seen: list[str] = []

    def change(claims: Mapping[str, PreparedClaim], actions: Sequence[DeviceAction]) -> tuple[str, Inventory]:
        seen.extend(claims)
        started.set()
        release.wait(5)
        return "applied", smaller

    worker = threading.Thread(target=lambda: state.relayout(change))
    worker.start()
    started.wait(5)
    # A prepare of a device the change removes waits for it, then is refused.
    refused: list[str] = []
    other = threading.Thread(target=lambda: refused.append(_refused(state, _allocation(UID_B, "gpu-2"))))
    other.start()
    other.join(0.2)
    assert other.is_alive()
    release.set()
    worker.join(5)
    other.join(5)
    assert seen == [UID_A]
    assert state.inventory == smaller
    assert "gpu-2" in refused[0]
    assert state.relayout(lambda claims, actions: ("unchanged", None)) == ("unchanged", None)
    assert state.inventory == smaller


def test_recover_removes_half_written_files_of_a_crash(paths: Paths) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0"))
    spec_leftover = paths.cdi / f".{cdi.spec_file_name(DRIVER, UID_B)}.x1y2.tmp"
    checkpoint_leftover = paths.checkpoint.parent / ".checkpoint.json.a1b2.tmp"
    foreign = paths.cdi / ".other-vendor.json.z9.tmp"
    for leftover in (spec_leftover, checkpoint_leftover, foreign):
        leftover.write_text("{")
    paths.state().recover()
    assert not spec_leftover.exists()
    assert not checkpoint_leftover.exists()
    assert foreign.exists(), "only this driver's files are touched"
    assert paths.spec(UID_A).exists()


# -- stale holders -----------------------------------------------------------------------------


def test_a_stale_holder_is_released_with_one_checkpoint_save(paths: Paths) -> None:
    specs = CdiStore(paths.cdi, DRIVER)
    checkpoint = OrderCheckingCheckpoint(paths.checkpoint, specs)
    state = DeviceState(DRIVER, NODE, inventory("h100x8"), specs, checkpoint)
    state.prepare(_allocation(UID_A, "gpu-0", "gpu-1"))
    state.prepare(_allocation(UID_C, "gpu-2"))
    claim = state.prepare(_allocation(UID_B, "gpu-1"), lambda _: {UID_A: GONE})
    assert checkpoint.saves == 3
    assert paths.checkpointed() == {UID_C: state.prepared[UID_C], UID_B: claim}
    assert paths.specs() == sorted([paths.spec(UID_B).name, paths.spec(UID_C).name])
    # gpu-0 went with its stale holder.
    state.prepare(_allocation(UID_A, "gpu-0"))


def test_a_holder_not_named_stale_is_kept_and_refuses_the_claim(paths: Paths) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0"))
    state.prepare(_allocation(UID_C, "gpu-1"))
    message = _refused(state, _allocation(UID_B, "gpu-0"), {UID_C: GONE})
    assert f"already prepared for claim team-a/claim-a ({UID_A})" in message
    assert sorted(paths.checkpointed()) == [UID_A, UID_C]
    assert paths.specs() == sorted([paths.spec(UID_A).name, paths.spec(UID_C).name])


def test_a_failed_save_while_releasing_a_stale_holder_is_repaired_by_the_restart_and_the_retry(
    paths: Paths,
) -> None:
    paths.state().prepare(_allocation(UID_A, "gpu-0"))
    crashing = DeviceState(
        DRIVER,
        NODE,
        inventory("h100x8-mig"),
        CdiStore(paths.cdi, DRIVER),
        FailingCheckpoint(paths.checkpoint),
    )
    with pytest.raises(ClaimError, match="no space"):
        crashing.prepare(_allocation(UID_B, "gpu-0"), lambda _: {UID_A: RE_CREATED})
    # The holder's spec is gone and the new one withdrawn, but the checkpoint still names the holder.
    assert paths.specs() == []
    assert list(paths.checkpointed()) == [UID_A]
    restarted = paths.state()
    restarted.recover()
    assert paths.specs() == [paths.spec(UID_A).name]
    # The kubelet retries; the holder is found stale again and released.
    restarted.prepare(_allocation(UID_B, "gpu-0"), lambda _: {UID_A: RE_CREATED})
    assert list(paths.checkpointed()) == [UID_B]
    assert paths.specs() == [paths.spec(UID_B).name]


def test_claims_prepared_together_share_one_fsync(paths: Paths, monkeypatch: pytest.MonkeyPatch) -> None:
    state = paths.state(inventory("h100x8"))
    state.prepare(_allocation(UID_A, "gpu-0"))  # the checkpoint exists: prepares append to it
    fsyncs: list[int] = []
    real = os.fsync

    def counted(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(paths.checkpoint):
            fsyncs.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    # Generous, so that a slow machine still groups them; a burst waits for its own decisions only.
    monkeypatch.setattr(state_module, "GROUP_WAIT", 5.0)
    allocations = [_allocation(str(uuid.uuid4()), f"gpu-{n}") for n in range(1, 8)]
    start = threading.Barrier(len(allocations))

    def prepare(allocation: ClaimAllocation) -> None:
        start.wait(10)
        state.prepare(allocation)

    threads = [threading.Thread(target=prepare, args=(a,)) for a in allocations]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert paths.checkpointed().keys() == {UID_A, *(a.uid for a in allocations)}
    # Each answered once durable, by a few fsyncs for all (one each without the wait; more than one
    # when a thread reached its fsync before the others had started).
    assert 1 <= len(fsyncs) <= 3


def test_a_claim_prepared_alone_does_not_wait_for_a_group(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0"))
    # Were it to wait for a group, this would take the whole minute.
    monkeypatch.setattr(state_module, "GROUP_WAIT", 60.0)
    done = threading.Thread(target=state.prepare, args=(_allocation(UID_B, "gpu-1"),))
    done.start()
    done.join(30)
    assert not done.is_alive()
    assert UID_B in paths.checkpointed()


def test_a_prepare_waiting_for_its_fsync_holds_up_no_other_claim(
    paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = paths.state()
    state.prepare(_allocation(UID_A, "gpu-0"))  # the checkpoint exists: prepares append to it
    entered, release = threading.Event(), threading.Event()
    real = os.fsync

    def slow_for_the_checkpoint(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(paths.checkpoint) and not release.is_set():
            entered.set()
            assert release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fsync", slow_for_the_checkpoint)
    first = threading.Thread(target=state.prepare, args=(_allocation(UID_B, "gpu-1"),))
    first.start()
    assert entered.wait(10)
    # The first prepare's fsync has not returned; the second decides, writes its spec and records it.
    second = threading.Thread(target=state.prepare, args=(_allocation(UID_C, "gpu-2"),))
    second.start()
    for _ in range(1000):
        if UID_C in state.prepared:
            break
        threading.Event().wait(0.01)
    assert paths.spec(UID_C).exists()
    assert second.is_alive()  # answered only once its record is durable
    release.set()
    first.join(10)
    second.join(10)
    assert paths.checkpointed().keys() == {UID_A, UID_B, UID_C}
