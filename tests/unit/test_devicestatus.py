"""dra.core.devicestatus: a prepared claim's devices as status.devices entries and as join-metric labels."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dra.core.devicestatus import Consumer, identify, identities, join_labels, sharing, status_entries
from dra.model.devices import MigDevice
from dra.model.prepared import PreparedClaim, PreparedDevice
from tests.unit.helpers import DRIVER, NODE, inventory


def _entry(device: str, uuid: str = "", **fields: Any) -> PreparedDevice:
    return PreparedDevice(("gpu",), NODE, device, (f"k8s.{DRIVER}/claim=u-{device}",), uuid=uuid, **fields)


def test_a_full_gpu_is_named_by_its_uuid_and_bus_id() -> None:
    found = inventory("mixed")
    gpu = found.gpus[0]
    identity = identify(_entry(gpu.name, gpu.uuid), found)
    assert identity is not None
    [entry] = status_entries(DRIVER, [identity])
    assert entry == {
        "driver": DRIVER,
        "pool": NODE,
        "device": gpu.name,
        "data": {"uuid": gpu.uuid, "pciBusID": gpu.pci_bus_id, "sharing": {"strategy": "Exclusive"}},
    }


def test_a_mig_device_is_named_by_its_own_uuid_its_parent_and_its_instances() -> None:
    found = inventory("h100x8-mig")
    mig = next(d for d in found.devices if isinstance(d, MigDevice))
    identity = identify(_entry(mig.name, mig.uuid), found)
    assert identity is not None
    [entry] = status_entries(DRIVER, [identity])
    assert entry["data"] == {
        "uuid": mig.uuid,
        "pciBusID": mig.parent.pci_bus_id,
        "sharing": {"strategy": "Exclusive"},
        "parentUUID": mig.parent.uuid,
        "profile": mig.profile,
        "gpuInstanceID": mig.gpu_instance_id,
        "computeInstanceID": mig.compute_instance_id,
    }


def test_a_dynamic_mig_device_is_found_by_the_uuid_prepare_recorded_under_the_offers_name() -> None:
    found = inventory("h100x8-mig")
    mig = next(d for d in found.devices if isinstance(d, MigDevice))
    # The kubelet knows it by the offer's name; only the recorded UUID finds what was made.
    identity = identify(_entry("gpu-0-mig-1g10gb-at3", mig.uuid), found)
    assert identity is not None
    assert (identity.gpu_uuid, identity.mig_uuid, identity.gpu_instance_id) == (
        mig.parent.uuid,
        mig.uuid,
        mig.gpu_instance_id,
    )
    assert status_entries(DRIVER, [identity])[0]["device"] == "gpu-0-mig-1g10gb-at3"


def test_a_vanished_device_has_no_identity() -> None:
    assert identify(_entry("gpu-9", "GPU-gone"), inventory("mixed")) is None
    claim = PreparedClaim("u", "ns", "c", (_entry("gpu-9", "GPU-gone"), _entry("gpu-0")))
    assert [i.entry.device for i in identities(claim, inventory("mixed"))] == ["gpu-0"]


def test_sharing_says_how_and_with_what_limits() -> None:
    assert sharing(_entry("gpu-0")) == {"strategy": "Exclusive"}
    assert sharing(_entry("gpu-0", time_slice="Long")) == {"strategy": "TimeSlicing", "interval": "Long"}
    mps = _entry("gpu-0", mps=True, mps_thread_percentage=50, mps_pinned_limit="20480M")
    assert sharing(mps) == {
        "strategy": "MPS",
        "defaultActiveThreadPercentage": 50,
        "defaultPinnedDeviceMemoryLimit": "20480M",
    }
    share = _entry("gpu-0", share_id="s1", share_memory="20Gi")
    assert sharing(share) == {
        "strategy": "TimeSlicing",
        "interval": "Default",
        "shareID": "s1",
        "shareMemory": "20Gi",
    }


def test_a_share_is_part_of_the_entrys_key_and_admin_access_is_said() -> None:
    found = inventory("mixed")
    gpu = found.gpus[0]
    shared = identify(_entry(gpu.name, gpu.uuid, share_id="s1", share_memory="1Gi"), found)
    admin = identify(_entry(gpu.name, gpu.uuid, admin_access=True), found)
    assert shared is not None
    assert admin is not None
    assert status_entries(DRIVER, [shared])[0]["shareID"] == "s1"
    assert status_entries(DRIVER, [admin])[0]["data"]["adminAccess"] is True


def test_join_labels_name_each_container_of_a_device_and_a_device_no_container_uses() -> None:
    found = inventory("h100x8-mig")
    mig = next(d for d in found.devices if isinstance(d, MigDevice))
    claim = PreparedClaim("u1", "team", "train", (_entry(mig.name, mig.uuid),))
    idle = PreparedClaim("u2", "team", "idle", (replace(_entry(mig.name, mig.uuid), device="other"),))
    claims = {c.uid: (c, identities(c, found)) for c in (claim, idle)}
    users = [
        Consumer("team", "pod-a", "main", "team", "train", mig.name),
        Consumer("team", "pod-a", "side", "team", "train", ""),
        # Another claim's device of the same name, in another namespace: never credited to this one.
        Consumer("other", "pod-b", "main", "other", "train", mig.name),
    ]
    series = join_labels(claims, users)
    gpu_labels = (mig.parent.uuid, str(mig.gpu_instance_id), mig.profile)
    assert sorted(series) == sorted(
        [
            (*gpu_labels, "team", "train", mig.name, "team", "pod-a", "main"),
            (*gpu_labels, "team", "train", mig.name, "team", "pod-a", "side"),
            (*gpu_labels, "team", "idle", "other", "", "", ""),
        ]
    )
