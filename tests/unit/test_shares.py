"""Consumable shares: shareable GPUs published for several claims, shares prepared side by side."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import CheckpointStore
from dra.cli.parser import parse_args
from dra.core import cdi
from dra.core.allocation import ClaimError, read_allocation
from dra.core.assignment import parse_selector
from dra.core.sharing import decide_sharing
from dra.core.slices import ShareMode, build_slices
from dra.core.versions import ApiFeatures
from dra.kubeletplugin.publisher import SlicePublisher, shareable_gpus
from dra.kubeletplugin.state import DeviceState
from tests.unit.helpers import DRIVER, NODE, inventory
from tests.unit.test_publisher import FakeKube

UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"
UID_C = "cccccccc-0000-4000-8000-00000000000c"
SHARE_1 = "11111111-0000-4000-8000-000000000001"
SHARE_2 = "22222222-0000-4000-8000-000000000002"


CONSUMABLE = ApiFeatures(consumable_capacity=True)


def _devices(
    selector: str | None, profile: str = "h100x8", features: ApiFeatures = CONSUMABLE
) -> dict[str, Any]:
    inv = inventory(profile)
    shareable = shareable_gpus(parse_selector(selector) if selector else None, inv)
    items = build_slices(inv, DRIVER, NODE, None, generation=1, features=features, shareable=shareable)
    return {d["name"]: d for s in items for d in s["spec"]["devices"]}


def _exclusive(device: dict[str, Any]) -> bool:
    return "allowMultipleAllocations" not in device and "requestPolicy" not in device["capacity"]["memory"]


def test_gpus_are_exclusive_by_default() -> None:
    assert all(_exclusive(device) for device in _devices(None).values())


@pytest.mark.anyio
async def test_where_the_server_drops_consumable_capacity_shareable_gpus_go_out_exclusive_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert all(_exclusive(device) for device in _devices("all", features=ApiFeatures(34)).values())
    kube = FakeKube()
    with caplog.at_level(logging.WARNING, "dra.kubeletplugin.publisher"):
        publisher = SlicePublisher(
            kube,  # type: ignore[arg-type]
            DRIVER,
            NODE,
            inventory("h100x8"),
            ApiFeatures(34),
            shareable=parse_selector("0,1"),
        )
        await publisher.reconcile()
        await publisher.reconcile()
    published = [d for s in kube.server.list() for d in s["spec"]["devices"]]
    assert published
    assert all(_exclusive(device) for device in published)
    assert [r.getMessage() for r in caplog.records] == [
        "--shareable-gpus: the API server drops consumable capacity (feature gate DRAConsumableCapacity "
        "off): publishing gpu-0, gpu-1 exclusive"
    ]


@pytest.mark.parametrize(("minor", "warned"), [(34, True), (35, False), (37, False)])
def test_before_1_35_shareable_gpus_are_published_with_a_warning_naming_the_scheduler_bug(
    caplog: pytest.LogCaptureFixture, minor: int, warned: bool
) -> None:
    features = ApiFeatures(minor, partitionable_devices=True, consumable_capacity=True)
    with caplog.at_level(logging.WARNING, "dra.kubeletplugin.publisher"):
        SlicePublisher(
            FakeKube(),  # type: ignore[arg-type]
            DRIVER,
            NODE,
            inventory("h100x8"),
            features,
            shareable=parse_selector("all"),
        )
    messages = [r.getMessage() for r in caplog.records]
    assert bool(messages) == warned
    if warned:
        [message] = messages
        assert message.startswith(
            "--shareable-gpus: Kubernetes 1.34's scheduler checks a request against the capacity left on "
            "the device at the request's own index in the candidate's ResourceSlice, not on the candidate "
            "(kubernetes/kubernetes#133705, fixed in 1.35)"
        )


def test_shareable_gpus_allow_several_allocations_by_whole_gib_of_memory() -> None:
    devices = _devices("0,2")
    assert sorted(n for n, d in devices.items() if d.get("allowMultipleAllocations")) == ["gpu-0", "gpu-2"]
    # An H100 80GB has 81559 MiB: shares are whole GiB up to 79Gi, the default takes all of them.
    assert devices["gpu-0"]["capacity"] == {
        "memory": {
            "value": "81559Mi",
            "requestPolicy": {
                "default": "79Gi",
                "validRange": {"min": "1Gi", "max": "79Gi", "step": "1Gi"},
            },
        }
    }


def test_nvidias_other_share_modes_unlimited_and_n_equal_shares() -> None:
    inv = inventory("h100x8")
    shareable = shareable_gpus(parse_selector("0"), inv)

    def gpu0(mode: ShareMode) -> dict[str, Any]:
        items = build_slices(
            inv, DRIVER, NODE, None, generation=1, features=CONSUMABLE, shareable=shareable, share_mode=mode
        )
        [device] = [d for s in items for d in s["spec"]["devices"] if d["name"] == "gpu-0"]
        return dict(device["capacity"])

    unlimited = {
        "value": "81559Mi",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "79Gi", "step": "1Gi"}},
    }
    assert gpu0("unlimited") == {"memory": unlimited}
    # --consumable-shares=4: four equal shares, one by default, as the device plugin's replicas: 4.
    assert gpu0(4) == {
        "memory": unlimited,
        "shares": {
            "value": "4",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
        },
    }


def test_consumable_shares_takes_nvidias_values() -> None:
    assert [
        parse_args(["kubelet-plugin", "--node-name=n", f"--consumable-shares={v}"]).consumable_shares
        for v in (
            "disabled",
            "memory",
            "unlimited",
            "4",
        )
    ] == [None, "memory", "unlimited", 4]
    with pytest.raises(SystemExit):
        parse_args(["kubelet-plugin", "--node-name=n", "--consumable-shares=0"])


def test_an_unlimited_share_that_asks_no_memory_gets_no_pinned_limit_with_mps(state: DeviceState) -> None:
    claim = _claim(UID_A, "gpu-0", SHARE_1, "0")
    mps = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
    claim["status"]["allocation"]["devices"]["config"] = [  # type: ignore[index]
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": mps}}
    ]
    allocation = read_allocation(claim, UID_A, DRIVER)
    _, settings, problems = decide_sharing(allocation, {"gpu-0": state.inventory.get("gpu-0")}, {}, "/mps")  # type: ignore[dict-item]
    assert problems == []
    assert settings["gpu-0"].pinned_limit == ""


def test_mig_devices_and_gpus_in_mig_mode_are_never_shareable() -> None:
    devices = _devices("all", "h100x8-mig")
    shared = {n for n, d in devices.items() if d.get("allowMultipleAllocations")}
    assert shared
    assert not any("mig" in name for name in shared)
    assert not any(devices[n]["attributes"].get("type") == {"string": "mig"} for n in shared)


def _claim(uid: str, device: str, share: str | None, memory: str = "20Gi") -> dict[str, object]:
    result: dict[str, object] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    if share:
        result |= {"shareID": share, "consumedCapacity": {"memory": memory}}
    return {
        "metadata": {"namespace": "team-a", "name": f"claim-{uid[0]}", "uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def test_the_share_id_and_consumed_capacity_are_read_from_the_claim_status() -> None:
    allocation = read_allocation(_claim(UID_A, "gpu-0", SHARE_1), UID_A, DRIVER)
    (result,) = allocation.devices
    assert result.share_id == SHARE_1
    assert result.consumed("memory") == "20Gi"
    assert read_allocation(_claim(UID_A, "gpu-0", None), UID_A, DRIVER).devices[0].share_id == ""


@pytest.fixture
def state(tmp_path: Path) -> DeviceState:
    return DeviceState(
        DRIVER,
        NODE,
        inventory("h100x8"),
        CdiStore(tmp_path / "cdi", DRIVER),
        CheckpointStore(tmp_path / "checkpoint.json"),
    )


def test_two_shares_of_one_gpu_are_prepared_side_by_side_and_told_their_share(
    state: DeviceState, tmp_path: Path
) -> None:
    a = state.prepare(read_allocation(_claim(UID_A, "gpu-0", SHARE_1), UID_A, DRIVER))
    b = state.prepare(read_allocation(_claim(UID_B, "gpu-0", SHARE_2, "30Gi"), UID_B, DRIVER))
    assert (a.devices[0].share_id, a.devices[0].share_memory) == (SHARE_1, "20Gi")
    assert (b.devices[0].share_id, b.devices[0].share_memory) == (SHARE_2, "30Gi")
    assert CheckpointStore(tmp_path / "checkpoint.json").load() == {UID_A: a, UID_B: b}
    spec = json.loads((tmp_path / "cdi" / cdi.spec_file_name(DRIVER, UID_B)).read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert f"DRA_GPU_SHARE_ID={SHARE_2}" in env
    assert "DRA_GPU_SHARE_MEMORY=30Gi" in env


def test_the_same_share_twice_is_a_conflict(state: DeviceState) -> None:
    state.prepare(read_allocation(_claim(UID_A, "gpu-0", SHARE_1), UID_A, DRIVER))
    with pytest.raises(
        ClaimError, match=f"device gpu-0 is already prepared for claim team-a/claim-a \\({UID_A}\\)"
    ):
        state.prepare(read_allocation(_claim(UID_B, "gpu-0", SHARE_1), UID_B, DRIVER))


def test_a_share_and_a_whole_gpu_allocation_conflict(state: DeviceState) -> None:
    state.prepare(read_allocation(_claim(UID_A, "gpu-0", None), UID_A, DRIVER))
    with pytest.raises(ClaimError, match="device gpu-0 is already prepared for claim"):
        state.prepare(read_allocation(_claim(UID_B, "gpu-0", SHARE_1), UID_B, DRIVER))
    state.unprepare(UID_A)
    state.prepare(read_allocation(_claim(UID_B, "gpu-0", SHARE_1), UID_B, DRIVER))
    with pytest.raises(ClaimError, match="device gpu-0 is already prepared for claim"):
        state.prepare(read_allocation(_claim(UID_C, "gpu-0", None), UID_C, DRIVER))
