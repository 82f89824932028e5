"""Reading this driver's share of an allocated ResourceClaim."""

from __future__ import annotations

from typing import Any

import pytest

from dra.core.plan import read_allocation
from dra.model.allocation import AllocatedDevice, ClaimError, OpaqueConfig
from tests.unit.helpers import DRIVER, NODE

UID = "5d0c8a6e-claim-uid"


def _result(request: str, device: str, driver: str = DRIVER, **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": NODE, "device": device, **extra}


def _config(
    driver: str = DRIVER, source: str = "FromClaim", requests: list[str] | None = None, **params: Any
) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def _claim(
    results: list[dict[str, Any]] | None, configs: list[dict[str, Any]] | None = None, uid: str = UID
) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team-a", "name": "train", "uid": uid},
        "spec": {"devices": {"requests": []}},
    }
    if results is not None:
        devices: dict[str, Any] = {"results": results}
        if configs is not None:
            devices["config"] = configs
        claim["status"] = {"allocation": {"devices": devices, "nodeSelector": {}}}
    return claim


def test_this_drivers_results_are_taken() -> None:
    claim = _claim(
        [_result("gpu", "gpu-0"), _result("nic", "eth1", driver="net.example.com"), _result("gpu", "gpu-3")]
    )
    allocation = read_allocation(claim, UID, DRIVER)
    assert (allocation.uid, allocation.namespace, allocation.name) == (UID, "team-a", "train")
    assert allocation.ref == "team-a/train"
    assert allocation.devices == (
        AllocatedDevice("gpu", NODE, "gpu-0"),
        AllocatedDevice("gpu", NODE, "gpu-3"),
    )
    assert allocation.configs == ()


def test_a_uid_mismatch_says_the_claim_was_recreated() -> None:
    with pytest.raises(ClaimError) as err:
        read_allocation(_claim([_result("gpu", "gpu-0")], uid="new-uid"), UID, DRIVER)
    message = str(err.value)
    assert (
        "ResourceClaim team-a/train has UID new-uid, but the kubelet asked for UID 5d0c8a6e-claim-uid"
        in message
    )
    assert "deleted and re-created" in message


@pytest.mark.parametrize(
    "status",
    [None, {}, {"allocation": None}, {"allocation": {}}],
    ids=["no status", "empty status", "null allocation", "empty allocation"],
)
def test_an_unallocated_claim(status: dict[str, Any] | None) -> None:
    claim = _claim(None)
    if status is not None:
        claim["status"] = status
    with pytest.raises(ClaimError, match=r"^ResourceClaim team-a/train is not allocated yet$"):
        read_allocation(claim, UID, DRIVER)


def test_results_of_other_drivers_only_are_listed() -> None:
    claim = _claim(
        [
            _result("a", "x", driver="net.example.com"),
            _result("b", "y", driver="fpga.example.com"),
            _result("c", "z", driver="net.example.com"),
        ]
    )
    with pytest.raises(ClaimError) as err:
        read_allocation(claim, UID, DRIVER)
    assert str(err.value) == (
        "ResourceClaim team-a/train has no device allocated by driver gpu.nvidia.com "
        "(allocated by: fpga.example.com, net.example.com)"
    )


def test_an_allocation_without_results() -> None:
    with pytest.raises(ClaimError, match=r"\(allocated by: none\)$"):
        read_allocation(_claim([]), UID, DRIVER)


def test_prioritized_list_results_belong_to_their_request() -> None:
    allocation = read_allocation(
        _claim([_result("gpu/h100", "gpu-0"), _result("small", "gpu-1")]), UID, DRIVER
    )
    assert [(d.request, d.request_name) for d in allocation.devices] == [
        ("gpu/h100", "gpu"),
        ("small", "small"),
    ]


@pytest.mark.parametrize(("flag", "expected"), [(True, True), (False, False), (None, False)])
def test_admin_access(flag: bool | None, expected: bool) -> None:
    result = _result("gpu", "gpu-0") if flag is None else _result("gpu", "gpu-0", adminAccess=flag)
    (device,) = read_allocation(_claim([result]), UID, DRIVER).devices
    assert device.admin_access is expected


def test_opaque_configs_are_this_drivers_only() -> None:
    configs = [
        _config(kind="GpuConfig"),
        _config(driver="net.example.com", mtu=9000),
        {"source": "FromClaim", "requests": ["gpu"]},  # not opaque: nothing for a driver
        {"source": "FromClass", "opaque": {"driver": DRIVER}},  # no parameters
    ]
    allocation = read_allocation(_claim([_result("gpu", "gpu-0")], configs), UID, DRIVER)
    assert allocation.configs == (
        OpaqueConfig("FromClaim", (), {"kind": "GpuConfig"}),
        OpaqueConfig("FromClass", (), {}),
    )


def test_a_config_without_a_source_counts_as_the_claims() -> None:
    entry = {"opaque": {"driver": DRIVER, "parameters": {"kind": "GpuConfig"}}}
    (config,) = read_allocation(_claim([_result("gpu", "gpu-0")], [entry]), UID, DRIVER).configs
    assert config.source == "FromClaim"


@pytest.mark.parametrize(
    ("requests", "applies_to"),
    [
        (None, ["gpu/h100", "gpu/a100", "small"]),
        ([], ["gpu/h100", "gpu/a100", "small"]),
        (["gpu"], ["gpu/h100", "gpu/a100"]),
        (["gpu/h100"], ["gpu/h100"]),
        (["small", "gpu/a100"], ["gpu/a100", "small"]),
        (["other"], []),
    ],
)
def test_configs_apply_to_the_requests_they_name(requests: list[str] | None, applies_to: list[str]) -> None:
    results = [_result("gpu/h100", "gpu-0"), _result("gpu/a100", "gpu-1"), _result("small", "gpu-2")]
    allocation = read_allocation(_claim(results, [_config(requests=requests)]), UID, DRIVER)
    assert [d.request for d in allocation.devices if allocation.configs_for(d)] == applies_to


def test_class_configs_come_before_claim_configs() -> None:
    configs = [
        _config(source="FromClaim", order=1),
        _config(source="FromClass", order=2),
        _config(source="FromClaim", order=3, requests=["gpu"]),
        _config(source="FromClass", order=4, requests=["gpu"]),
        _config(source="FromClaim", order=5, requests=["other"]),
    ]
    allocation = read_allocation(_claim([_result("gpu", "gpu-0")], configs), UID, DRIVER)
    (device,) = allocation.devices
    assert [c.parameters["order"] for c in allocation.configs_for(device)] == [2, 4, 1, 3]
