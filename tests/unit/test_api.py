"""The typed configuration API: strict decoding with paths, normalization, and validation against devices."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dra.api import opaque
from dra.api.fields import FieldError
from dra.api.v1beta1 import (
    GpuConfig,
    GpuSharing,
    IommuConfig,
    MigDeviceConfig,
    MigDeviceSharing,
    MpsConfig,
    TimeSlicingConfig,
    VfioDeviceConfig,
    device_for_key,
    validate,
)
from dra.model.devices import Device, Gpu, MigDevice
from dra.model.quantity import Quantity
from tests.unit.helpers import inventory

API = "resource.nvidia.com/v1beta1"


def gpu_config(**sharing: Any) -> dict[str, Any]:
    """GpuConfig parameters with these sharing fields."""
    return {"apiVersion": API, "kind": "GpuConfig", "sharing": sharing}


def mps(**fields: Any) -> dict[str, Any]:
    """GpuConfig parameters asking MPS with these mpsConfig fields."""
    return gpu_config(strategy="MPS", mpsConfig=fields)


def message(parameters: dict[str, Any]) -> str:
    """The decoding error as prepare shows it (rooted at the kind)."""
    with pytest.raises(FieldError) as err:
        opaque.decode(parameters)
    return err.value.at(str(parameters.get("kind")))


# -- decoding and normalization ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({"apiVersion": API, "kind": "GpuConfig"}, GpuConfig(GpuSharing("TimeSlicing", TimeSlicingConfig()))),
        (gpu_config(), GpuConfig(GpuSharing("TimeSlicing", TimeSlicingConfig("Default")))),
        ({"apiVersion": API, "kind": "GpuConfig", "sharing": None}, GpuConfig()),
        (
            gpu_config(timeSlicingConfig={"interval": "Long"}),
            GpuConfig(GpuSharing("TimeSlicing", TimeSlicingConfig("Long"))),
        ),
        (gpu_config(strategy="MPS"), GpuConfig(GpuSharing("MPS", mps_config=MpsConfig()))),
        (
            mps(
                defaultActiveThreadPercentage=50,
                defaultPinnedDeviceMemoryLimit="10Gi",
                defaultPerDevicePinnedMemoryLimit={"0": "20Gi", "GPU-x": 1073741824},
            ),
            GpuConfig(
                GpuSharing(
                    "MPS",
                    mps_config=MpsConfig(
                        50,
                        Quantity.parse("10Gi"),
                        {"0": Quantity.parse("20Gi"), "GPU-x": Quantity.parse("1Gi")},
                    ),
                )
            ),
        ),
        (mps(multiUser=True), GpuConfig(GpuSharing("MPS", mps_config=MpsConfig(multi_user=True)))),
        ({"apiVersion": API, "kind": "MigDeviceConfig"}, MigDeviceConfig(MigDeviceSharing("TimeSlicing"))),
        (
            {"apiVersion": API, "kind": "VfioDeviceConfig"},
            VfioDeviceConfig(IommuConfig("LegacyOnly", enable_api_device=False)),
        ),
        (
            {
                "apiVersion": API,
                "kind": "VfioDeviceConfig",
                "iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": True},
            },
            VfioDeviceConfig(IommuConfig("PreferIommuFD", enable_api_device=True)),
        ),
        (
            {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}},
            MigDeviceConfig(MigDeviceSharing("MPS", MpsConfig())),
        ),
    ],
)
def test_decoding_fills_in_the_defaults(parameters: dict[str, Any], expected: object) -> None:
    assert opaque.decode(parameters) == expected


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        (
            {"kind": "GpuConfig"},
            'GpuConfig.apiVersion: null is not served; use one of ["resource.nvidia.com/v1beta1"]',
        ),
        (
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            'GpuConfig.apiVersion: "resource.nvidia.com/v1" is not served',
        ),
        (
            {"apiVersion": API, "kind": "ComputeDomainConfig"},
            'ComputeDomainConfig.kind: "ComputeDomainConfig" is not one of ["GpuConfig", "MigDeviceConfig", '
            '"VfioDeviceConfig"]',
        ),
        (
            {"apiVersion": API, "kind": "ComputeDomainChannelConfig", "domainID": "x"},
            "ComputeDomainChannelConfig.kind: ComputeDomainChannelConfig configures NVIDIA's ComputeDomain "
            "driver (compute-domain.nvidia.com), not GPUs; this driver has no ComputeDomains",
        ),
        (
            mps(multiUser="yes"),
            'GpuConfig.sharing.mpsConfig.multiUser: expected true or false, got string "yes"',
        ),
        (
            {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "IommuFD"}},
            'VfioDeviceConfig.iommu.backendPolicy: "IommuFD" is not one of ["LegacyOnly", "PreferIommuFD"]',
        ),
        (
            {"apiVersion": API, "kind": "VfioDeviceConfig", "iommu": {"enableApiDevice": True}},
            "VfioDeviceConfig.iommu.enableApiDevice: unknown field; known: backendPolicy, enableAPIDevice",
        ),
        (
            {"apiVersion": API, "kind": "GpuConfig", "replicas": 2},
            "GpuConfig.replicas: unknown field; known: sharing",
        ),
        (
            {"apiVersion": API, "kind": "GpuConfig", "sharing": "MPS"},
            "GpuConfig.sharing: expected an object, got string",
        ),
        (
            gpu_config(Strategy="MPS"),
            "GpuConfig.sharing.Strategy: unknown field; known: strategy, timeSlicingConfig, mpsConfig",
        ),
        (
            gpu_config(strategy="Exclusive"),
            'GpuConfig.sharing.strategy: "Exclusive" is not one of ["TimeSlicing", "MPS"]',
        ),
        (
            gpu_config(timeSlicingConfig={"interval": "VeryLong"}),
            'GpuConfig.sharing.timeSlicingConfig.interval: "VeryLong" is not one of '
            '["Default", "Short", "Medium", "Long"]',
        ),
        (
            gpu_config(timeSlicingConfig={"interval": 3}),
            "GpuConfig.sharing.timeSlicingConfig.interval: 3 is not one of",
        ),
        (
            mps(defaultActiveThreadPrecentage=50),
            "GpuConfig.sharing.mpsConfig.defaultActiveThreadPrecentage: unknown field; known: "
            "defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, "
            "defaultPerDevicePinnedMemoryLimit",
        ),
        (
            mps(defaultActiveThreadPercentage=0),
            "GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage: 0 is outside 1-100",
        ),
        (mps(defaultActiveThreadPercentage=101), "defaultActiveThreadPercentage: 101 is outside 1-100"),
        (
            mps(defaultActiveThreadPercentage="50"),
            'GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage: expected an integer, got string "50"',
        ),
        (mps(defaultActiveThreadPercentage=True), "expected an integer, got boolean true"),
        (mps(defaultActiveThreadPercentage=50.5), "expected an integer, got number 50.5"),
        (
            mps(defaultPinnedDeviceMemoryLimit="10 GB"),
            'GpuConfig.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "10 GB" is not a quantity',
        ),
        (mps(defaultPinnedDeviceMemoryLimit="0"), 'defaultPinnedDeviceMemoryLimit: "0" must be positive'),
        (mps(defaultPinnedDeviceMemoryLimit=["1Gi"]), 'expected a quantity (such as "4Gi"), got array'),
        (
            mps(defaultPerDevicePinnedMemoryLimit={"0": "lots"}),
            'GpuConfig.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: "lots" is not a quantity',
        ),
        (
            mps(defaultPerDevicePinnedMemoryLimit=["1Gi"]),
            "GpuConfig.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit: expected an object, got array",
        ),
        (
            gpu_config(strategy="TimeSlicing", mpsConfig={}),
            "GpuConfig.sharing.mpsConfig: only allowed with strategy MPS",
        ),
        (
            gpu_config(strategy="MPS", timeSlicingConfig={"interval": "Short"}),
            "GpuConfig.sharing.timeSlicingConfig: only allowed with strategy TimeSlicing",
        ),
        (
            {"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"timeSlicingConfig": {}}},
            "MigDeviceConfig.sharing.timeSlicingConfig: unknown field; known: strategy, mpsConfig",
        ),
    ],
)
def test_bad_parameters_are_refused_with_their_path(parameters: dict[str, Any], expected: str) -> None:
    assert expected in message(parameters)


def test_parameters_over_10_kib_are_refused() -> None:
    parameters = mps(defaultPerDevicePinnedMemoryLimit={f"GPU-{i:05d}": "1Gi" for i in range(700)})
    assert message(parameters).startswith("GpuConfig: ")
    assert "bytes of JSON, more than the 10240 bytes allowed" in message(parameters)


# -- validation against the devices -----------------------------------------------------------


def device(name: str, profile: str = "h100x8-mig") -> Device:
    """A device of a fake inventory."""
    found = inventory(profile).get(name)
    assert found is not None
    return found


def invalid(parameters: dict[str, Any], *devices: Device) -> str:
    """validate's error, rooted at the kind."""
    config = opaque.decode(parameters)
    with pytest.raises(FieldError) as err:
        validate(config, devices)
    return err.value.at(config.KIND)


def test_limits_within_the_devices_memory_are_valid() -> None:
    gpu0, gpu1 = device("gpu-0"), device("gpu-1")
    config = opaque.decode(
        mps(
            defaultActiveThreadPercentage=10,
            defaultPinnedDeviceMemoryLimit="40Gi",
            defaultPerDevicePinnedMemoryLimit={"1": "79Gi", gpu0.uuid: "1Gi"},
        )
    )
    validate(config, [gpu0, gpu1])
    # What the daemon is then given: each limit as written, each per-device key naming its device.
    assert isinstance(config, GpuConfig)
    limits = config.sharing.mps_config
    assert limits is not None
    assert limits.default_active_thread_percentage == 10
    assert limits.default_pinned_device_memory_limit == Quantity.parse("40Gi")
    named = {
        getattr(device_for_key(key, [gpu0, gpu1]), "name", None): limit
        for key, limit in limits.default_per_device_pinned_memory_limit.items()
    }
    assert named == {"gpu-1": Quantity.parse("79Gi"), "gpu-0": Quantity.parse("1Gi")}
    # The bound is the device's memory itself: all of it is valid, a byte more is refused.
    validate(opaque.decode(mps(defaultPinnedDeviceMemoryLimit=str(gpu0.memory_bytes))), [gpu0])
    over = invalid(mps(defaultPinnedDeviceMemoryLimit=str(gpu0.memory_bytes + 1)), gpu0)
    assert over.startswith("GpuConfig.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "), over
    mig = device("gpu-4-mig-1g10gb-3-0")
    mig_config = opaque.decode({"apiVersion": API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}})
    validate(mig_config, [mig])
    assert isinstance(mig_config, MigDeviceConfig)
    assert mig_config.sharing.strategy == "MPS"


def test_a_pinned_limit_above_the_gpus_memory_is_refused() -> None:
    gpu0 = device("gpu-0")
    assert invalid(mps(defaultPinnedDeviceMemoryLimit="100Gi"), gpu0) == (
        f"GpuConfig.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 100Gi is more than the "
        f"{gpu0.memory_bytes // 2**20} MiB of memory of gpu-0"
    )
    mig = device("gpu-4-mig-1g10gb-3-0")
    per_device = {"defaultPerDevicePinnedMemoryLimit": {"0": "20Gi"}}
    limits = {
        "apiVersion": API,
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": per_device},
    }
    assert invalid(limits, mig).startswith(
        "MigDeviceConfig.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: 20Gi is more than the"
    )


def test_a_pinned_limit_for_a_device_not_in_the_claim_is_refused() -> None:
    gpu0, gpu1 = device("gpu-0"), device("gpu-1")
    text = invalid(mps(defaultPerDevicePinnedMemoryLimit={"2": "1Gi"}), gpu0, gpu1)
    assert text == (
        "GpuConfig.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[2]: names no device of this config; "
        f"it has 0 or {gpu0.uuid} (gpu-0), 1 or {gpu1.uuid} (gpu-1)"
    )
    other = device("gpu-3").uuid
    assert f"defaultPerDevicePinnedMemoryLimit[{other}]: names no device" in invalid(
        mps(defaultPerDevicePinnedMemoryLimit={other: "1Gi"}), gpu0
    )


def test_mps_where_the_gpu_cannot_run_it_is_refused() -> None:
    h100 = device("gpu-0", "h100x8")
    assert isinstance(h100, Gpu)
    old = dataclasses.replace(h100, cuda_compute_capability="3.0", product_name="Tesla K10")
    assert invalid(gpu_config(strategy="MPS"), old) == (
        "GpuConfig.sharing.strategy: MPS needs compute capability 3.5 or later; gpu-0 (Tesla K10) has 3.0"
    )
    kepler = dataclasses.replace(old, cuda_compute_capability="3.7")
    validate(opaque.decode(gpu_config(strategy="MPS")), [kepler])
    assert invalid(mps(defaultActiveThreadPercentage=50), kepler).endswith(
        "MPS with limits needs compute capability 7.0 or later; gpu-0 (Tesla K10) has 3.7"
    )
    # NVIDIA's driver checks for Volta before it starts a multi-user daemon.
    assert invalid(mps(multiUser=True), kepler).endswith(
        "MPS with multiUser needs compute capability 7.0 or later; gpu-0 (Tesla K10) has 3.7"
    )
    validate(opaque.decode(mps(multiUser=True)), [h100])


def test_a_config_of_the_wrong_kind_is_refused() -> None:
    mig = device("gpu-4-mig-1g10gb-3-0")
    assert isinstance(mig, MigDevice)
    assert invalid(gpu_config(), mig) == (
        "GpuConfig: GpuConfig cannot configure gpu-4-mig-1g10gb-3-0, which is a MIG device: "
        "use MigDeviceConfig"
    )
    gpu = device("gpu-1")
    assert isinstance(gpu, Gpu)
    assert "which is a full GPU: use GpuConfig" in invalid(
        {"apiVersion": API, "kind": "MigDeviceConfig"}, gpu
    )


def test_a_vfio_config_configures_a_full_gpu_and_refuses_a_mig_device() -> None:
    validate(opaque.decode({"apiVersion": API, "kind": "VfioDeviceConfig"}), [device("gpu-1")])
    assert invalid({"apiVersion": API, "kind": "VfioDeviceConfig"}, device("gpu-4-mig-1g10gb-3-0")) == (
        "VfioDeviceConfig: cannot configure gpu-4-mig-1g10gb-3-0, which is a MIG device: passthrough "
        "(vfio-pci) takes a whole GPU"
    )
