"""Consumable shares: shareable GPUs published for several claims, shares prepared side by side."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.cli.parser import parse_args
from dra.core import cdi
from dra.core.assignment import parse_selector
from dra.core.deviceentries import ShareMode
from dra.core.plan import PreparePlan, decide_prepare, read_allocation
from dra.core.sharing import decide_sharing
from dra.core.slices import build_slices
from dra.core.versions import ApiFeatures
from dra.kubeletplugin.publisher import SlicePublisher, shareable_devices
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import ClaimError
from dra.model.node import Node
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
    shareable = shareable_devices(parse_selector(selector) if selector else None, inv)
    items = build_slices(inv, DRIVER, NODE, None, generation=1, features=features, shareable=shareable)
    return {d["name"]: d for s in items for d in s["spec"]["devices"]}


def _exclusive(device: dict[str, Any]) -> bool:
    return "allowMultipleAllocations" not in device and "requestPolicy" not in device["capacity"]["memory"]


def test_gpus_are_exclusive_by_default() -> None:
    assert all(_exclusive(device) for device in _devices(None).values())


@pytest.mark.anyio
async def test_where_the_server_drops_consumable_capacity_shareable_devices_go_out_exclusive_said_once(
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
def test_before_1_35_shareable_devices_are_published_with_a_warning_naming_the_scheduler_bug(
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


def test_shareable_gpus_allow_several_allocations_by_whole_mib_of_memory() -> None:
    devices = _devices("0,2")
    assert sorted(n for n, d in devices.items() if d.get("allowMultipleAllocations")) == ["gpu-0", "gpu-2"]
    # An H100 80GB has 81559 MiB: shares are whole MiB (NVIDIA's step), the default takes all of them.
    assert devices["gpu-0"]["capacity"] == {
        "memory": {
            "value": "81559Mi",
            "requestPolicy": {
                "default": "81559Mi",
                "validRange": {"min": "1Mi", "max": "81559Mi", "step": "1Mi"},
            },
        }
    }


def test_nvidias_other_share_modes_unlimited_and_n_equal_shares() -> None:
    inv = inventory("h100x8")
    shareable = shareable_devices(parse_selector("0"), inv)

    def gpu0(mode: ShareMode) -> dict[str, Any]:
        items = build_slices(
            inv, DRIVER, NODE, None, generation=1, features=CONSUMABLE, shareable=shareable, share_mode=mode
        )
        [device] = [d for s in items for d in s["spec"]["devices"] if d["name"] == "gpu-0"]
        return dict(device["capacity"])

    unlimited = {
        "value": "81559Mi",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "81559Mi", "step": "1Mi"}},
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


def test_a_shareable_gpu_in_mig_mode_shares_its_mig_devices() -> None:
    devices = _devices("1,4", "h100x8-mig")
    shared = sorted(n for n, d in devices.items() if d.get("allowMultipleAllocations"))
    assert shared == ["gpu-1", *sorted(n for n in devices if n.startswith("gpu-4-mig-"))]
    capacity = devices["gpu-4-mig-1g10gb-3-0"]["capacity"]
    # A 1g.10gb has 9856 MiB; by memory, a share that asks none takes all of it.
    assert capacity["memory"]["requestPolicy"] == {
        "default": "9856Mi",
        "validRange": {"min": "1Mi", "max": "9856Mi", "step": "1Mi"},
    }
    # Engines are not divided: each share sees them all and reserves none, else the scheduler
    # would charge the first share the whole value and fit no second one.
    assert capacity["multiprocessors"] == {
        "value": "16",
        "requestPolicy": {"default": "0", "validValues": ["0"]},
    }


def test_an_integer_share_of_a_mig_device_counts_shares_of_it() -> None:
    inv = inventory("h100x8-mig")
    items = build_slices(
        inv,
        DRIVER,
        NODE,
        None,
        generation=1,
        features=CONSUMABLE,
        shareable=shareable_devices(parse_selector("all"), inv),
        share_mode=3,
    )
    [device] = [d for s in items for d in s["spec"]["devices"] if d["name"] == "gpu-5-mig-3g40gb-1-0"]
    assert device["capacity"]["shares"] == {
        "value": "3",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "3", "step": "1"}},
    }
    assert device["capacity"]["memory"]["requestPolicy"]["default"] == "0"


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


def _mps_share(
    uid: str, device: str, share: str, consumed: dict[str, str], mps: dict[str, Any]
) -> dict[str, Any]:
    claim: dict[str, Any] = _claim(uid, device, share)
    claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = consumed
    parameters = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", **mps},
    }
    claim["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}
    ]
    return claim


def _mps_settings(claim: dict[str, Any], equal_shares: int) -> tuple[dict[str, Any], list[str]]:
    allocation = read_allocation(claim, claim["metadata"]["uid"], DRIVER)
    gpu = inventory("h100x8").get("gpu-0")
    assert gpu is not None
    _, settings, problems = decide_sharing(allocation, {"gpu-0": gpu}, {}, "/mps", equal_shares)
    return {n: (s.thread_percentage, s.pinned_limit) for n, s in settings.items()}, problems


def test_mps_limits_follow_a_counted_share() -> None:
    # Two of four shares of an 81559 MiB H100: half its SMs and half its memory, to the MiB.
    held = _mps_share(UID_A, "gpu-0", SHARE_1, {"memory": "0", "shares": "2"}, {})
    assert _mps_settings(held, 4) == ({"gpu-0": (50, "40779M")}, [])
    # One of three: the percentage rounds down; memory the share asked for is its pinned limit.
    asked = _mps_share(UID_A, "gpu-0", SHARE_1, {"memory": "10Gi", "shares": "1"}, {})
    assert _mps_settings(asked, 3) == ({"gpu-0": (33, "10240M")}, [])


def test_a_counted_share_may_set_lower_mps_limits_but_not_higher() -> None:
    lower = {"mpsConfig": {"defaultActiveThreadPercentage": 10, "defaultPinnedDeviceMemoryLimit": "5Gi"}}
    assert _mps_settings(_mps_share(UID_A, "gpu-0", SHARE_1, {"shares": "1"}, lower), 4) == (
        {"gpu-0": (10, "5120M")},
        [],
    )
    higher = {"mpsConfig": {"defaultActiveThreadPercentage": 50}}
    assert _mps_settings(_mps_share(UID_A, "gpu-0", SHARE_1, {"shares": "1"}, higher), 4) == (
        {},
        ["device gpu-0: active thread percentage 50 is above its share (25: 1 of 4 shares)"],
    )


def test_two_shares_of_a_mig_device_are_prepared_side_by_side(tmp_path: Path) -> None:
    mig = "gpu-4-mig-2g20gb-2-0"
    state = DeviceState(
        DRIVER,
        NODE,
        inventory("h100x8-mig"),
        CdiStore(tmp_path / "cdi", DRIVER),
        CheckpointStore(tmp_path / "checkpoint.json"),
    )
    a = state.prepare(read_allocation(_claim(UID_A, mig, SHARE_1, "5Gi"), UID_A, DRIVER))
    b = state.prepare(read_allocation(_claim(UID_B, mig, SHARE_2, "10Gi"), UID_B, DRIVER))
    device = state.inventory.get(mig)
    assert device is not None
    assert [(c.devices[0].uuid, c.devices[0].share_memory) for c in (a, b)] == [
        (device.uuid, "5Gi"),
        (device.uuid, "10Gi"),
    ]
    spec = json.loads((tmp_path / "cdi" / cdi.spec_file_name(DRIVER, UID_B)).read_text())
    assert "DRA_GPU_SHARE_MEMORY=10Gi" in spec["devices"][0]["containerEdits"]["env"]
    with pytest.raises(ClaimError, match=f"device {mig} is already prepared for claim team-a/claim-a"):
        state.prepare(read_allocation(_claim(UID_C, mig, None), UID_C, DRIVER))


def test_a_counted_share_of_a_mig_device_with_mps_gets_its_part_at_prepare() -> None:
    mig = "gpu-4-mig-2g20gb-2-0"
    claim = _mps_share(UID_A, mig, SHARE_1, {"memory": "0", "shares": "1"}, {})
    claim["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["kind"] = "MigDeviceConfig"
    allocation = read_allocation(claim, UID_A, DRIVER)
    inv = inventory("h100x8-mig")
    node = Node(driver=DRIVER, pool=NODE, mps_root="/mps", equal_shares=2)
    plan = decide_prepare(allocation, inv, {}, node, stale={}, has_spec=False)
    assert isinstance(plan, PreparePlan)
    [device] = plan.claim.devices
    memory = inv.get(mig).memory_bytes  # type: ignore[union-attr]
    assert (device.mps, device.mps_thread_percentage, device.mps_pinned_limit) == (
        True,
        50,
        f"{memory // 2 // 1024**2}M",
    )


def test_the_kubelet_is_told_which_share_each_device_is() -> None:
    # 1.37's DRA proto carries the share (Device.share_id), and the kubelet lists it in its
    # pod-resources API; a whole device has none, and the field stays unset for older kubelets.
    from dra.kubeletplugin.service import _response
    from dra.model.prepared import PreparedClaim, PreparedDevice

    share = "7a0b7f4e-7c1c-4a4b-9f3e-3c8b9d0a1e22"
    shared = PreparedDevice(("gpu",), NODE, "gpu-0", (), uuid="GPU-0", share_id=share)
    whole = PreparedDevice(("gpu",), NODE, "gpu-1", (), uuid="GPU-1")
    response = _response(PreparedClaim("uid", "ns", "claim", (shared, whole)))
    first, second = response.devices
    assert first.HasField("share_id")
    assert first.share_id == share
    assert not second.HasField("share_id")
