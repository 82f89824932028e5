"""Opaque GpuConfig / MigDeviceConfig parameters: what is accepted, and what is refused with a reason."""

from __future__ import annotations

from typing import Any

import pytest

from dra.core.config import ConfigError, DeviceConfig, MpsConfig, Sharing, effective, parse
from dra.model.devices import Device
from tests.unit.helpers import inventory

API = "resource.nvidia.com/v1beta1"


def _gpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "GpuConfig", **fields}


def _mig_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "MigDeviceConfig", **fields}


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (_gpu_config(), DeviceConfig("GpuConfig", Sharing())),
        (_gpu_config(sharing=None), DeviceConfig("GpuConfig", Sharing())),
        (_gpu_config(sharing={}), DeviceConfig("GpuConfig", Sharing())),
        (
            _gpu_config(sharing={"strategy": "TimeSlicing"}),
            DeviceConfig("GpuConfig", Sharing("TimeSlicing", "Default")),
        ),
        (
            _gpu_config(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}),
            DeviceConfig("GpuConfig", Sharing()),
        ),
        (_gpu_config(sharing={"timeSlicingConfig": {}}), DeviceConfig("GpuConfig", Sharing())),
        (_mig_config(), DeviceConfig("MigDeviceConfig", Sharing())),
        (_mig_config(sharing={"strategy": "TimeSlicing"}), DeviceConfig("MigDeviceConfig", Sharing())),
    ],
)
def test_valid_configs(parameters: dict[str, Any], expected: DeviceConfig) -> None:
    assert parse(parameters) == expected


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"kind": "GpuConfig"}, "apiVersion None is not supported; use resource.nvidia.com/v1beta1"),
        (
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            "apiVersion 'resource.nvidia.com/v1' is not supported",
        ),
        ({"apiVersion": API}, "kind None is not supported; use GpuConfig or MigDeviceConfig"),
        ({"apiVersion": API, "kind": "ComputeDomainConfig"}, "kind 'ComputeDomainConfig' is not supported"),
        (
            _gpu_config(replicas=2),
            "GpuConfig: unknown field(s) ['replicas']; allowed: ['apiVersion', 'kind', 'sharing']",
        ),
        (_gpu_config(sharing="TimeSlicing"), "GpuConfig.sharing: expected an object"),
        (
            _gpu_config(sharing={"strategy": "TimeSlicing", "priority": 1}),
            "GpuConfig.sharing: unknown field(s) ['priority']",
        ),
        (
            _gpu_config(sharing={"strategy": "Exclusive"}),
            "GpuConfig.sharing.strategy: 'Exclusive' is not one of ['TimeSlicing', 'MPS']",
        ),
        (
            _gpu_config(sharing={"timeSlicingConfig": {"interval": "Default", "replicas": 4}}),
            "GpuConfig.sharing.timeSlicingConfig: unknown field(s) ['replicas']",
        ),
        (
            _gpu_config(sharing={"timeSlicingConfig": "Short"}),
            "GpuConfig.sharing.timeSlicingConfig: expected an object",
        ),
        (
            _gpu_config(sharing={"timeSlicingConfig": {"interval": "Fast"}}),
            "GpuConfig.sharing.timeSlicingConfig.interval: 'Fast' is not one of "
            "['Default', 'Short', 'Medium', 'Long']",
        ),
        (
            _mig_config(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}),
            "MigDeviceConfig.sharing: unknown field(s) ['timeSlicingConfig']; "
            "allowed: ['mpsConfig', 'strategy']",
        ),
        (_mig_config(extra=True), "MigDeviceConfig: unknown field(s) ['extra']"),
    ],
)
def test_invalid_configs_name_the_field(parameters: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(parameters)
    assert message in str(err.value)


def test_mps_limits_are_parsed() -> None:
    config = parse(
        _gpu_config(
            sharing={
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi"},
                },
            }
        )
    )
    assert config.sharing == Sharing("MPS", "Default", MpsConfig(50, "10Gi", (("0", "5Gi"),)))
    assert parse(_mig_config(sharing={"strategy": "MPS"})).sharing == Sharing("MPS", mps=MpsConfig())


@pytest.mark.parametrize(
    ("mps", "message"),
    [
        (
            {"defaultActiveThreadPercentage": 0},
            "defaultActiveThreadPercentage: 0 is not a whole number 1-100",
        ),
        ({"defaultActiveThreadPercentage": 101}, "defaultActiveThreadPercentage: 101 is not a whole"),
        ({"defaultActiveThreadPercentage": "50"}, "defaultActiveThreadPercentage: '50' is not a whole"),
        ({"defaultPinnedDeviceMemoryLimit": 10}, "defaultPinnedDeviceMemoryLimit: expected a quantity"),
        (
            {"defaultPerDevicePinnedMemoryLimit": ["0"]},
            "defaultPerDevicePinnedMemoryLimit: expected an object",
        ),
        ({"clients": 4}, "GpuConfig.sharing.mpsConfig: unknown field(s) ['clients']"),
    ],
)
def test_bad_mps_limits_are_refused_with_the_field(mps: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(_gpu_config(sharing={"strategy": "MPS", "mpsConfig": mps}))
    assert message in str(err.value)


def test_mps_config_needs_the_mps_strategy() -> None:
    with pytest.raises(ConfigError, match=r"sharing.mpsConfig: only with strategy MPS \(the strategy is"):
        parse(_gpu_config(sharing={"strategy": "TimeSlicing", "mpsConfig": {}}))


@pytest.mark.parametrize("interval", ["Short", "Medium", "Long"])
def test_every_time_slice_interval_is_accepted(interval: str) -> None:
    config = parse(
        _gpu_config(sharing={"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}})
    )
    assert config.sharing == Sharing("TimeSlicing", interval)


# -- the configuration of one device -----------------------------------------------------------


def _device(name: str) -> Device:
    device = inventory("h100x8-mig").get(name)
    assert device is not None
    return device


def test_no_config_means_defaults_of_the_right_kind() -> None:
    assert effective([], _device("gpu-0")) == DeviceConfig("GpuConfig", Sharing())
    assert effective([], _device("gpu-4-mig-1g10gb-3-0")) == DeviceConfig("MigDeviceConfig", Sharing())


def test_a_gpu_config_cannot_configure_a_mig_device() -> None:
    with pytest.raises(ConfigError) as err:
        effective([_gpu_config()], _device("gpu-4-mig-1g10gb-3-0"))
    assert str(err.value) == (
        "GpuConfig cannot configure gpu-4-mig-1g10gb-3-0, which is a MIG device: use MigDeviceConfig"
    )


def test_a_mig_config_cannot_configure_a_full_gpu() -> None:
    with pytest.raises(
        ConfigError, match="MigDeviceConfig cannot configure gpu-1, which is a full GPU: use GpuConfig"
    ):
        effective([_mig_config()], _device("gpu-1"))


def test_every_applicable_config_is_validated_and_the_last_wins() -> None:
    configs = [_gpu_config(), _gpu_config(sharing={"strategy": "TimeSlicing"})]
    assert effective(configs, _device("gpu-0")) == DeviceConfig(
        "GpuConfig", Sharing("TimeSlicing", "Default")
    )
    with pytest.raises(ConfigError, match="Exclusive"):
        effective([_gpu_config(sharing={"strategy": "Exclusive"}), _gpu_config()], _device("gpu-0"))
