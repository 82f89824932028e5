"""Opaque configs at prepare: each checked against the devices it configures."""

from __future__ import annotations

from typing import Any

import pytest

from dra.api.v1beta1 import GpuConfig, GpuSharing, Interval, MigDeviceConfig, TimeSlicingConfig
from dra.core.config import ConfigError, effective, parse, problems
from dra.model.allocation import AllocatedDevice, ClaimAllocation, OpaqueConfig
from dra.model.devices import Device
from tests.unit.helpers import inventory

API = "resource.nvidia.com/v1beta1"


def _gpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", **fields}


def _mig_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "MigDeviceConfig", **fields}


def _device(name: str) -> Device:
    device = inventory("h100x8-mig").get(name)
    assert device is not None
    return device


@pytest.mark.parametrize("interval", ["Default", "Short", "Medium", "Long"])
def test_every_time_slice_interval_is_accepted(interval: Interval) -> None:
    config = parse(_gpu_config(sharing={"timeSlicingConfig": {"interval": interval}}))
    assert config == GpuConfig(GpuSharing("TimeSlicing", TimeSlicingConfig(interval)))


def test_mps_with_limits_is_accepted_on_full_gpus_and_mig_devices() -> None:
    limits = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "4Gi"}
    gpu = OpaqueConfig("FromClaim", ("gpus",), _gpu_config(sharing={"strategy": "MPS", "mpsConfig": limits}))
    mig = OpaqueConfig("FromClaim", ("mig",), _mig_config(sharing={"strategy": "MPS", "mpsConfig": limits}))
    assert _problems(gpu) == []
    assert _problems(mig) == []


def test_no_config_means_defaults_of_the_right_kind() -> None:
    assert effective([], _device("gpu-0")) == GpuConfig()
    assert effective([], _device("gpu-4-mig-1g10gb-3-0")) == MigDeviceConfig()


def test_a_gpu_config_cannot_configure_a_mig_device() -> None:
    with pytest.raises(ConfigError) as err:
        effective([_gpu_config()], _device("gpu-4-mig-1g10gb-3-0"))
    assert str(err.value) == (
        "GpuConfig: GpuConfig cannot configure gpu-4-mig-1g10gb-3-0, which is a MIG device: "
        "use MigDeviceConfig"
    )


def test_every_applicable_config_is_checked_and_the_last_wins() -> None:
    configs = [_gpu_config(), _gpu_config(sharing={"strategy": "TimeSlicing"})]
    assert effective(configs, _device("gpu-0")) == GpuConfig()
    with pytest.raises(ConfigError, match="Exclusive"):
        effective([_gpu_config(sharing={"strategy": "Exclusive"}), _gpu_config()], _device("gpu-0"))


def _claim(*configs: OpaqueConfig) -> ClaimAllocation:
    devices = (
        AllocatedDevice("gpus", "node-a", "gpu-0"),
        AllocatedDevice("gpus", "node-a", "gpu-1"),
        AllocatedDevice("mig", "node-a", "gpu-4-mig-1g10gb-3-0"),
    )
    return ClaimAllocation("uid-1", "team-a", "claim-a", devices, configs)


def _problems(*configs: OpaqueConfig) -> list[str]:
    claim = _claim(*configs)
    return problems(claim, {d.device: _device(d.device) for d in claim.devices})


def test_each_config_is_checked_against_the_devices_of_its_requests() -> None:
    assert (
        _problems(
            OpaqueConfig("FromClass", ("gpus",), _gpu_config()),
            OpaqueConfig("FromClaim", ("mig",), _mig_config(sharing={"strategy": "TimeSlicing"})),
        )
        == []
    )
    assert _problems(OpaqueConfig("FromClaim", (), _gpu_config())) == [
        "invalid configuration for devices gpu-0, gpu-1, gpu-4-mig-1g10gb-3-0: GpuConfig: GpuConfig cannot "
        "configure gpu-4-mig-1g10gb-3-0, which is a MIG device: use MigDeviceConfig"
    ]


def test_every_bad_config_of_a_claim_is_reported() -> None:
    found = _problems(
        OpaqueConfig(
            "FromClaim", ("gpus",), _gpu_config(sharing={"timeSlicingConfig": {"interval": "Sometimes"}})
        ),
        OpaqueConfig("FromClaim", ("mig",), _mig_config(sharing={"strategy": "MPS", "mpsConfig": {"x": 1}})),
    )
    assert found == [
        "invalid configuration for devices gpu-0, gpu-1: GpuConfig.sharing.timeSlicingConfig.interval: "
        '"Sometimes" '
        'is not one of ["Default", "Short", "Medium", "Long"]',
        "invalid configuration for device gpu-4-mig-1g10gb-3-0: MigDeviceConfig.sharing.mpsConfig.x: "
        "unknown field; known: defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, "
        "defaultPerDevicePinnedMemoryLimit, multiUser",
    ]


def test_a_per_device_limit_must_name_a_device_of_its_config() -> None:
    limits = {"defaultPerDevicePinnedMemoryLimit": {"2": "1Gi"}}
    found = _problems(
        OpaqueConfig("FromClaim", ("gpus",), _gpu_config(sharing={"strategy": "MPS", "mpsConfig": limits}))
    )
    assert found == [
        "invalid configuration for devices gpu-0, gpu-1: "
        "GpuConfig.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[2]: names no device of this config; "
        f"it has 0 or {_device('gpu-0').uuid} (gpu-0), 1 or {_device('gpu-1').uuid} (gpu-1)"
    ]
    mig_limit = {"defaultPinnedDeviceMemoryLimit": "20Gi"}
    found = _problems(
        OpaqueConfig("FromClaim", ("mig",), _mig_config(sharing={"strategy": "MPS", "mpsConfig": mig_limit}))
    )
    assert len(found) == 1
    assert found[0].startswith(
        "invalid configuration for device gpu-4-mig-1g10gb-3-0: "
        "MigDeviceConfig.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 20Gi is more than the "
    )


def test_a_config_for_requests_not_on_this_node_checks_nothing() -> None:
    claim = _claim(OpaqueConfig("FromClaim", ("other",), _gpu_config(sharing="bad")))
    assert problems(claim, {d.device: _device(d.device) for d in claim.devices}) == []
