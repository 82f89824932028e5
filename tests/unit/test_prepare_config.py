"""Issue 10's bad sharing inputs at prepare: each a per-claim refusal naming the field, nothing planned.

The admission webhook refuses the same inputs where it can (tests/unit/test_webhook_admission.py);
those that need the allocated devices (memory, per-device keys, MPS capability) only prepare can.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dra.core.plan import PreparePlan, Refusal, decide_prepare
from dra.model.allocation import AllocatedDevice, ClaimAllocation, OpaqueConfig
from dra.model.devices import Gpu, Inventory
from dra.model.node import Node
from tests.unit.helpers import DRIVER, NODE, inventory

INVENTORY = inventory("h100x8")


def _mps(**fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": fields},
    }


def _decide(parameters: dict[str, Any], *devices: str, inv: Inventory = INVENTORY) -> PreparePlan | Refusal:
    allocation = ClaimAllocation(
        uid="aaaaaaaa-0000-4000-8000-00000000000a",
        namespace="team-a",
        name="shared",
        devices=tuple(AllocatedDevice("gpu", NODE, d) for d in devices),
        configs=(OpaqueConfig("FromClaim", ("gpu",), parameters),),
    )
    return decide_prepare(allocation, inv, {}, Node(driver=DRIVER, pool=NODE), stale={}, has_spec=False)


def _old_gpu_inventory() -> Inventory:
    gpus = tuple(
        dataclasses.replace(g, cuda_compute_capability="3.0.0", product_name="Tesla K10")
        for g in INVENTORY.devices
        if isinstance(g, Gpu)
    )
    return dataclasses.replace(INVENTORY, devices=gpus, gpus=gpus)


MEMORY_MIB = INVENTORY.devices[0].memory_bytes // 2**20


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        pytest.param(
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "Shared"},
            },
            'GpuConfig.sharing.strategy: "Shared" is not one of ["TimeSlicing", "MPS"]',
            id="unknown-strategy",
        ),
        pytest.param(
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"timeSlicingConfig": {"interval": "Forever"}},
            },
            'GpuConfig.sharing.timeSlicingConfig.interval: "Forever" is not one of',
            id="unknown-interval",
        ),
        pytest.param(
            _mps(defaultActiveThreadPercentage=101),
            "GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage: 101 is outside 1-100",
            id="percentage",
        ),
        pytest.param(
            _mps(defaultPinnedDeviceMemoryLimit="81Gi"),
            f"mpsConfig.defaultPinnedDeviceMemoryLimit: 81Gi is more than the {MEMORY_MIB} MiB",
            id="limit-above-memory",
        ),
        pytest.param(
            _mps(defaultPerDevicePinnedMemoryLimit={"1": "1Gi"}),
            "GpuConfig.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]: names no device",
            id="limit-for-another-device",
        ),
        pytest.param(
            _mps(defaultPerDevicePinnedMemoryLimit={f"GPU-{i:032d}": "1Gi" for i in range(300)}),
            "GpuConfig: ",
            id="over-10-KiB",
        ),
    ],
)
def test_bad_sharing_is_refused_per_claim_with_the_field(parameters: dict[str, Any], message: str) -> None:
    plan = _decide(parameters, "gpu-0")
    assert isinstance(plan, Refusal), plan
    assert plan.message.startswith(
        "cannot prepare ResourceClaim team-a/shared: invalid configuration for device gpu-0: "
    )
    assert message in plan.message


def test_mps_where_the_gpu_cannot_run_it_is_refused() -> None:
    plan = _decide(_mps(), "gpu-0", inv=_old_gpu_inventory())
    assert isinstance(plan, Refusal)
    assert (
        "GpuConfig.sharing.strategy: MPS needs compute capability 3.5 or later; gpu-0 (Tesla K10) has 3.0"
        in plan.message
    )
