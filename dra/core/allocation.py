"""What a ResourceClaim asks of this driver: pure reading of the API object.

The kubelet's NodePrepareResources names a claim; the allocation lives in the
claim's status. This module checks the claim is the one the kubelet meant,
takes the results that belong to this driver and the opaque configuration
that applies to them, and says precisely what is wrong when it cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = Mapping[str, Any]

#: Set by the ResourceClaim controller on a claim made from a template: the pod's name for the claim.
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


class ClaimError(Exception):
    """A claim cannot be prepared; the message is what the admin sees in the pod's events."""


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result for this driver."""

    request: str
    pool: str
    device: str
    admin_access: bool = False
    #: The share of a device allocated to several claims (KEP-5075 `shareID`); "" when exclusive.
    share_id: str = ""
    #: Capacity the share consumes (`consumedCapacity`), name -> quantity as the API states it.
    consumed_capacity: tuple[tuple[str, str], ...] = ()

    def consumed(self, name: str) -> str:
        """The quantity of capacity `name` this result consumes, "" when the status states none."""
        return dict(self.consumed_capacity).get(name, "")

    @property
    def request_name(self) -> str:
        """The claim's request: a prioritized-list result "req/sub" belongs to request "req"."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class OpaqueConfig:
    """Driver parameters from the DeviceClass (FromClass) or the claim (FromClaim)."""

    source: str
    requests: tuple[str, ...]
    parameters: Mapping[str, Any]

    def applies_to(self, device: AllocatedDevice) -> bool:
        """A config naming no requests applies to all; "req" also covers its subrequests."""
        return not self.requests or device.request in self.requests or device.request_name in self.requests


@dataclass(frozen=True)
class ClaimAllocation:
    """This driver's share of an allocated claim."""

    uid: str
    namespace: str
    name: str
    devices: tuple[AllocatedDevice, ...]
    configs: tuple[OpaqueConfig, ...] = ()
    #: The pod's name for a claim made from a template (resource.kubernetes.io/pod-claim-name); "" if none.
    pod_claim_name: str = ""

    @property
    def ref(self) -> str:
        """namespace/name, for messages."""
        return f"{self.namespace}/{self.name}"

    def configs_for(self, device: AllocatedDevice) -> list[OpaqueConfig]:
        """Configs that apply to a device, class configs before claim configs (later ones win)."""
        applicable = [c for c in self.configs if c.applies_to(device)]
        return sorted(applicable, key=lambda c: 0 if c.source == "FromClass" else 1)


def read_allocation(claim: Obj, expected_uid: str, driver: str) -> ClaimAllocation:
    """This driver's allocation in `claim`; ClaimError when there is none to prepare."""
    meta = claim.get("metadata") or {}
    ref = f"{meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != expected_uid:
        raise ClaimError(
            f"ResourceClaim {ref} has UID {meta.get('uid')}, but the kubelet asked for UID {expected_uid}: "
            "the claim was deleted and re-created; delete the pod so that it gets the new claim"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref} is not allocated yet")
    devices_status = allocation.get("devices") or {}
    results = devices_status.get("results") or []
    mine = [
        AllocatedDevice(
            request=str(r["request"]),
            pool=str(r["pool"]),
            device=str(r["device"]),
            admin_access=bool(r.get("adminAccess")),
            share_id=str(r.get("shareID") or ""),
            consumed_capacity=tuple(
                sorted((str(k), str(v)) for k, v in (r.get("consumedCapacity") or {}).items())
            ),
        )
        for r in results
        if r.get("driver") == driver
    ]
    if not mine:
        drivers = sorted({str(r.get("driver")) for r in results}) or ["none"]
        raise ClaimError(
            f"ResourceClaim {ref} has no device allocated by driver {driver} "
            f"(allocated by: {', '.join(drivers)})"
        )
    configs = tuple(
        OpaqueConfig(
            source=str(entry.get("source", "FromClaim")),
            requests=tuple(entry.get("requests") or ()),
            parameters=entry["opaque"].get("parameters") or {},
        )
        for entry in devices_status.get("config") or []
        if (entry.get("opaque") or {}).get("driver") == driver
    )
    return ClaimAllocation(
        uid=expected_uid,
        namespace=str(meta.get("namespace")),
        name=str(meta.get("name")),
        devices=tuple(mine),
        configs=configs,
        pod_claim_name=str((meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) or ""),
    )
