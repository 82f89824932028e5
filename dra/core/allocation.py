"""What a ResourceClaim asks of this driver: pure reading of the API object.

The kubelet's NodePrepareResources names a claim; the allocation lives in the
claim's status. This module checks the claim is the one the kubelet meant,
takes the results that belong to this driver and the opaque configuration
that applies to them, and says precisely what is wrong when it cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra.model.allocation import (
    POD_CLAIM_NAME_ANNOTATION,
    AllocatedDevice,
    ClaimAllocation,
    ClaimError,
    OpaqueConfig,
)

Obj = Mapping[str, Any]


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
