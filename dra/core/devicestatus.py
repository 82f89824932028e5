"""What each device of a prepared claim is, for the claim's status.devices and the join metric.

A claim's allocation names devices as this driver publishes them (gpu-0, or the name of a
dynamic-MIG offer), which says nothing to a monitoring system. NVML and DCGM know a device by
its UUID, a MIG device by its parent GPU's UUID and its GPU-instance ID. This module joins
the two: `identify` reads a prepared device's identity from the inventory (for a dynamic MIG
device, the one made for the claim, which only exists after prepare), `status_entries` turns
a claim's identities into the AllocatedDeviceStatus entries the driver owns in the claim
(KEP-4817), and `join_labels` into the labels of dra_gpu_claim_device_info, named as
dcgm-exporter names its own (UUID, GPU_I_ID, GPU_I_PROFILE), so that its series join on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra.model.devices import Inventory, MigDevice
from dra.model.prepared import PreparedClaim, PreparedDevice

#: How a device is shared, as status.devices[].data.sharing.strategy says it.
EXCLUSIVE = "Exclusive"
TIME_SLICING = "TimeSlicing"
MPS = "MPS"

#: The interval of a share the claim configured no time slice for: the GPU's own default.
DEFAULT_INTERVAL = "Default"


@dataclass(frozen=True)
class DeviceIdentity:
    """One prepared device as NVML, DCGM and an operator know it."""

    entry: PreparedDevice
    #: The full GPU's UUID (the parent's for a MIG device): DCGM's UUID label.
    gpu_uuid: str
    pci_bus_id: str
    #: The MIG device's own UUID; "" for a full GPU.
    mig_uuid: str = ""
    profile: str = ""
    #: The MIG device's GPU-instance and compute-instance IDs; None for a full GPU.
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


def identify(entry: PreparedDevice, inventory: Inventory) -> DeviceIdentity | None:
    """The identity of a prepared device; None when the inventory no longer has it (it vanished)."""
    device = inventory.by_uuid(entry.uuid) if entry.uuid else inventory.get(entry.device)
    if device is None:
        return None
    if isinstance(device, MigDevice):
        return DeviceIdentity(
            entry,
            gpu_uuid=device.parent.uuid,
            pci_bus_id=device.parent.pci_bus_id,
            mig_uuid=device.uuid,
            profile=device.profile,
            gpu_instance_id=device.gpu_instance_id,
            compute_instance_id=device.compute_instance_id,
        )
    return DeviceIdentity(entry, gpu_uuid=device.uuid, pci_bus_id=device.pci_bus_id)


def identities(claim: PreparedClaim, inventory: Inventory) -> tuple[DeviceIdentity, ...]:
    """The identities of a claim's devices that the inventory still has."""
    found = (identify(entry, inventory) for entry in claim.devices)
    return tuple(i for i in found if i is not None)


def sharing(entry: PreparedDevice) -> dict[str, Any]:
    """How the claim shares the device: exclusive, time-sliced (its interval) or MPS (its limits)."""
    shared: dict[str, Any]
    if entry.mps:
        shared = {"strategy": MPS}
        if entry.mps_thread_percentage:
            shared["defaultActiveThreadPercentage"] = entry.mps_thread_percentage
        if entry.mps_pinned_limit:
            shared["defaultPinnedDeviceMemoryLimit"] = entry.mps_pinned_limit
    elif entry.time_slice or entry.share_id:
        # Claims that share a GPU without a configured interval run time-sliced at the GPU's default.
        shared = {"strategy": TIME_SLICING, "interval": entry.time_slice or DEFAULT_INTERVAL}
    else:
        shared = {"strategy": EXCLUSIVE}
    if entry.share_id:
        shared["shareID"] = entry.share_id
        shared["shareMemory"] = entry.share_memory
    return shared


def _data(identity: DeviceIdentity) -> dict[str, Any]:
    data: dict[str, Any] = {
        "uuid": identity.mig_uuid or identity.gpu_uuid,
        "pciBusID": identity.pci_bus_id,
        "sharing": sharing(identity.entry),
    }
    if identity.mig_uuid:
        data.update(
            parentUUID=identity.gpu_uuid,
            profile=identity.profile,
            gpuInstanceID=identity.gpu_instance_id,
            computeInstanceID=identity.compute_instance_id,
        )
    if identity.entry.admin_access:
        data["adminAccess"] = True
    return data


def status_entries(driver: str, devices: Iterable[DeviceIdentity]) -> list[dict[str, Any]]:
    """The claim's status.devices entries this driver owns, one per prepared device (and share)."""
    entries = []
    for identity in devices:
        entry: dict[str, Any] = {
            "driver": driver,
            "pool": identity.entry.pool,
            "device": identity.entry.device,
            "data": _data(identity),
        }
        if identity.entry.share_id:
            # The share is part of the entry's key, as it is of the allocation result's.
            entry["shareID"] = identity.entry.share_id
        entries.append(entry)
    return entries


#: The labels of dra_gpu_claim_device_info, in order: dcgm-exporter's names where it has them.
JOIN_LABELS = (
    "UUID",
    "GPU_I_ID",
    "GPU_I_PROFILE",
    "dra_claim_namespace",
    "dra_claim_name",
    "dra_device_name",
    "namespace",
    "pod",
    "container",
)


@dataclass(frozen=True)
class Consumer:
    """A container the kubelet says uses a claim's device (pod-resources' DynamicResources)."""

    namespace: str
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    #: The allocated device's name; "" when the kubelet does not say (before 1.31): every device.
    device: str


def join_labels(
    claims: Mapping[str, tuple[PreparedClaim, tuple[DeviceIdentity, ...]]], consumers: Iterable[Consumer]
) -> list[tuple[str, ...]]:
    """One label set per prepared device and container using it, in JOIN_LABELS' order.

    A device no running container uses yet still has one series, with empty pod labels, so
    that DCGM's series of a prepared claim's device can always be named by its claim.
    """
    by_claim: dict[tuple[str, str], list[Consumer]] = {}
    for consumer in consumers:
        by_claim.setdefault((consumer.claim_namespace, consumer.claim_name), []).append(consumer)
    series: dict[tuple[str, ...], None] = {}
    for claim, devices in claims.values():
        users = by_claim.get((claim.namespace, claim.name), [])
        for identity in devices:
            device = identity.entry.device
            gpu = (
                identity.gpu_uuid,
                "" if identity.gpu_instance_id is None else str(identity.gpu_instance_id),
                identity.profile,
                claim.namespace,
                claim.name,
                device,
            )
            mine = [u for u in users if u.device in ("", device)]
            for user in mine:
                series[(*gpu, user.namespace, user.pod, user.container)] = None
            if not mine:
                series[(*gpu, "", "", "")] = None
    return list(series)
