"""What a ResourceClaim's allocation gives this driver, and why a claim cannot be prepared.

The kubelet's NodePrepareResources names a claim; its allocation, in the claim's status, is
read into these types by dra.core.plan.read_allocation: the results that belong to this
driver and the opaque configuration that applies to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
