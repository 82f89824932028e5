"""Claims this node has prepared, as the checkpoint records them and the kubelet was told."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as reported to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    admin_access: bool = False
    #: The physical device: names follow NVML indexes, which shift when a GPU leaves the bus.
    uuid: str = ""
    #: The time-slice interval this claim set on the GPU (Short, Medium, Long); "" for none.
    time_slice: str = ""
    #: The allocation's share of a device allocated to several claims (KEP-5075); "" when exclusive.
    share_id: str = ""
    #: The memory the share consumes, as the claim status states it ("20Gi"); "" when exclusive.
    share_memory: str = ""
    #: Whether the claim's MPS control daemon serves this device (GpuConfig strategy MPS).
    mps: bool = False
    #: The daemon's default active thread percentage; 0 for MPS's own default.
    mps_thread_percentage: int = 0
    #: The daemon's pinned device memory limit for this device, as MPS takes it ("20480M"); "" for none.
    mps_pinned_limit: str = ""
    #: Whether the daemon runs in multi-user mode (-M: clients of several users); mpsConfig.multiUser.
    mps_multi_user: bool = False
    #: The IOMMU group of a GPU passed through (bound to vfio-pci for this claim); -1 when it is not.
    vfio_group: int = -1
    #: Whether the container gets the IOMMU API device (/dev/vfio/vfio) with it: iommu.enableAPIDevice.
    vfio_api_device: bool = False

    def is_device(self, name: str, uuid: str) -> bool:
        """Whether this entry is that device (by UUID when recorded, else by name)."""
        return self.uuid == uuid if self.uuid else self.device == name


@dataclass(frozen=True)
class PreparedClaim:
    """A claim this node has prepared."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    #: The pod's name for a claim made from a template (annotation resource.kubernetes.io/pod-claim-name);
    #: "" for a claim the pod names itself.
    pod_claim_name: str = ""
    #: Whether the claim's requests have device metadata files (KEP-5304), mounted through its CDI spec.
    metadata: bool = False

    @property
    def uses_mps(self) -> bool:
        """Whether the claim's devices are served by an MPS control daemon."""
        return any(d.mps for d in self.devices)

    @property
    def uses_time_slices(self) -> bool:
        """Whether a device of the claim sets its GPU's time-slice interval."""
        return any(d.time_slice for d in self.devices)

    def holds(self, name: str, uuid: str, share_id: str = "") -> bool:
        """Whether this claim holds that device (or that share of it) so that another cannot have it.

        Admin access shares; two different shares of one device do not clash, but a
        share and a whole-device allocation do.
        """
        return any(
            d.is_device(name, uuid) and (not share_id or not d.share_id or d.share_id == share_id)
            for d in self.devices
            if not d.admin_access
        )


#: DeviceAction kind: make a MIG device (GPU instance and compute instance) for a claim.
MIG_CREATE = "mig-create"
#: DeviceAction kind: switch a dynamic-MIG GPU's MIG mode for a claim (params: gpu, index, mode, was).
MIG_MODE = "mig-mode"
#: DeviceAction kind: bind a GPU to vfio-pci for a claim (params: gpu, address, group, siblings).
VFIO_BIND = "vfio-bind"


@dataclass(frozen=True)
class DeviceAction:
    """A change made to a device for a claim: recorded as intent before it is made, and as done after.

    What a crash leaves is repaired from these at start-up: an action that is
    done for a prepared claim is adopted; any other is undone.
    """

    claim_uid: str
    #: The allocated device the action is for.
    device: str
    kind: str
    #: What the action needs (for MIG_CREATE: gpu, profile, profileId, start, size; for MIG_MODE: gpu,
    #: index, mode, was; for VFIO_BIND: gpu, address, group, siblings).
    params: Mapping[str, str | int]
    done: bool = False
    #: What it made (for MIG_CREATE: gpuInstance, computeInstance, uuid).
    result: Mapping[str, str | int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        """(claim UID, device): one action per device of a claim."""
        return (self.claim_uid, self.device)


class Holders:
    """Prepared claims by the devices they hold, built in one pass over them.

    A prepare asks who holds each device it needs; scanning every prepared claim for each question
    cost a millisecond at 1,000 claims held (docs/testing.md, node scale), a lookup here does not.
    """

    def __init__(self, prepared: Mapping[str, PreparedClaim]) -> None:
        #: The claims indexed (the very mapping: a save replaces it, never changes it in place).
        self.prepared = prepared
        self._order = {uid: position for position, uid in enumerate(prepared)}
        self._next = len(self._order)
        # As PreparedDevice.is_device matches: by UUID where one is recorded, else by name.
        self._by_uuid: dict[str, list[PreparedClaim]] = {}
        #: Every entry by the device name the kubelet knows it by, UUID or not.
        self._by_name: dict[str, list[tuple[PreparedClaim, PreparedDevice]]] = {}
        for claim in prepared.values():
            for device in claim.devices:
                if device.uuid:
                    self._by_uuid.setdefault(device.uuid, []).append(claim)
                self._by_name.setdefault(device.device, []).append((claim, device))

    def updated(self, prepared: Mapping[str, PreparedClaim], changed: frozenset[str]) -> Holders:
        """The index of `prepared`, which differs from the claims indexed here only in `changed`.

        Built in the time of the change (a save at 1,000 claims held changes one or two); this index
        stays as it was. A claim added comes after the others, one replaced keeps its place: the
        order in which a prepare's saves build their claims. Where `prepared` does not fit that
        (its size or its last keys say otherwise), the index is built afresh.
        """
        added = [uid for uid in changed if uid in prepared and uid not in self._order]
        dropped = sum(uid in self.prepared and uid not in prepared for uid in changed)
        # Added claims end the mapping, in its order.
        tail = list(prepared)[len(prepared) - len(added) :] if added else []
        if len(prepared) != len(self.prepared) + len(added) - dropped or set(tail) != set(added):
            return Holders(prepared)
        # Attribute by attribute: copy.copy's reduce protocol cost more than the rest of the update.
        index = object.__new__(Holders)
        index.prepared = prepared
        index._order = dict(self._order)
        index._next = self._next
        # Only the lists of the devices the changed claims hold are copied; the rest are shared.
        index._by_uuid, index._by_name = dict(self._by_uuid), dict(self._by_name)
        for old in (self.prepared[uid] for uid in changed if uid in self.prepared):
            for device in old.devices:
                if device.uuid in index._by_uuid:
                    _keep(
                        index._by_uuid, device.uuid, [c for c in index._by_uuid[device.uuid] if c is not old]
                    )
                if device.device in index._by_name:
                    named = index._by_name[device.device]
                    _keep(index._by_name, device.device, [e for e in named if e[0] is not old])
        for uid in tail:
            index._order[uid] = index._next
            index._next += 1
        for uid in (*(u for u in changed if u not in added), *tail):
            claim = prepared.get(uid)
            if claim is None:
                index._order.pop(uid, None)
                continue
            for device in claim.devices:
                if device.uuid:
                    index._by_uuid[device.uuid] = [*index._by_uuid.get(device.uuid, ()), claim]
                index._by_name[device.device] = [*index._by_name.get(device.device, ()), (claim, device)]
        return index

    def of(self, name: str, uuid: str, uid: str, share_id: str = "") -> list[PreparedClaim]:
        """The claims other than `uid` holding that device (or clashing with that share), in their order."""
        by_uuid = self._by_uuid.get(uuid, []) if uuid else []
        by_name = (c for c, d in self._by_name.get(name, ()) if not d.uuid)
        candidates = {c.uid: c for c in (*by_uuid, *by_name)}
        found = [c for c in candidates.values() if c.uid != uid and c.holds(name, uuid, share_id)]
        return sorted(found, key=lambda c: self._order[c.uid])

    def with_uuid(self, uuid: str) -> list[PreparedClaim]:
        """Every claim holding a device of this UUID (a share of a MIG device made, say), in their order."""
        return sorted(self._by_uuid.get(uuid, []), key=lambda c: self._order[c.uid])

    def named(self, name: str) -> list[tuple[PreparedClaim, PreparedDevice]]:
        """Every (claim, entry) whose entry the kubelet knows by this device name, in the claims' order."""
        return sorted(self._by_name.get(name, []), key=lambda entry: self._order[entry[0].uid])


def _keep(index: dict[str, list[T]], key: str, entries: list[T]) -> None:
    """Set an index entry, or drop it when nothing is left in it."""
    if entries:
        index[key] = entries
    else:
        del index[key]
