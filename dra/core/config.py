"""Opaque device configuration: GpuConfig and MigDeviceConfig, parsed and validated.

Claims and DeviceClasses may carry parameters for this driver
(`opaque.driver: gpu.nvidia.com`). The schema is NVIDIA's
`resource.nvidia.com/v1beta1` GpuConfig / MigDeviceConfig, so claims written
for NVIDIA's DRA driver keep working; api/ documents it. A setting this driver
cannot honour is an error for that claim, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra.model.devices import Device, MigDevice

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG = "GpuConfig"
MIG_DEVICE_CONFIG = "MigDeviceConfig"

STRATEGIES = ("TimeSlicing", "MPS")
INTERVALS = ("Default", "Short", "Medium", "Long")
MPS_FIELDS = {
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
}


class ConfigError(ValueError):
    """Invalid or unsupported parameters; the message names the field."""


@dataclass(frozen=True)
class MpsConfig:
    """GpuConfig/MigDeviceConfig `sharing.mpsConfig`: limits of the claim's MPS control daemon."""

    #: defaultActiveThreadPercentage: 1..100, None for MPS's own default (100).
    active_thread_percentage: int | None = None
    #: defaultPinnedDeviceMemoryLimit: a quantity ("10Gi") for every device of the claim.
    pinned_memory_limit: str | None = None
    #: defaultPerDevicePinnedMemoryLimit: (GPU index or UUID, quantity), overriding the default.
    per_device_pinned_memory_limit: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Sharing:
    """How the devices of a claim are shared between its containers."""

    strategy: str = "TimeSlicing"
    interval: str = "Default"
    mps: MpsConfig | None = None


@dataclass(frozen=True)
class DeviceConfig:
    """A parsed GpuConfig or MigDeviceConfig."""

    kind: str
    sharing: Sharing


def _strict_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _sharing(raw: object, kind: str, where: str) -> Sharing:
    if raw is None:
        return Sharing()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected an object")
    allowed = {"strategy", "mpsConfig"} | ({"timeSlicingConfig"} if kind == GPU_CONFIG else set())
    _strict_keys(raw, allowed, where)
    strategy = raw.get("strategy", "TimeSlicing")
    if strategy not in STRATEGIES:
        raise ConfigError(f"{where}.strategy: {strategy!r} is not one of {list(STRATEGIES)}")
    if "mpsConfig" in raw and strategy != "MPS":
        raise ConfigError(f"{where}.mpsConfig: only with strategy MPS (the strategy is {strategy})")
    interval = "Default"
    slicing = raw.get("timeSlicingConfig")
    if slicing is not None:
        if not isinstance(slicing, Mapping):
            raise ConfigError(f"{where}.timeSlicingConfig: expected an object")
        _strict_keys(slicing, {"interval"}, f"{where}.timeSlicingConfig")
        interval = slicing.get("interval", "Default")
        if interval not in INTERVALS:
            raise ConfigError(
                f"{where}.timeSlicingConfig.interval: {interval!r} is not one of {list(INTERVALS)}"
            )
    mps = _mps(raw.get("mpsConfig"), f"{where}.mpsConfig") if strategy == "MPS" else None
    return Sharing(strategy=str(strategy), interval=str(interval), mps=mps)


def _mps(raw: object, where: str) -> MpsConfig:
    if raw is None:
        return MpsConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected an object")
    _strict_keys(raw, MPS_FIELDS, where)
    percentage = raw.get("defaultActiveThreadPercentage")
    if percentage is not None and (
        isinstance(percentage, bool) or not isinstance(percentage, int) or not 1 <= percentage <= 100
    ):
        raise ConfigError(
            f"{where}.defaultActiveThreadPercentage: {percentage!r} is not a whole number 1-100"
        )
    limit = raw.get("defaultPinnedDeviceMemoryLimit")
    if limit is not None and not isinstance(limit, str):
        raise ConfigError(f'{where}.defaultPinnedDeviceMemoryLimit: expected a quantity such as "10Gi"')
    per_device = raw.get("defaultPerDevicePinnedMemoryLimit") or {}
    if not isinstance(per_device, Mapping) or not all(isinstance(v, str) for v in per_device.values()):
        raise ConfigError(
            f"{where}.defaultPerDevicePinnedMemoryLimit: expected an object of GPU index or UUID -> quantity"
        )
    return MpsConfig(
        active_thread_percentage=percentage,
        pinned_memory_limit=limit,
        per_device_pinned_memory_limit=tuple(sorted((str(k), str(v)) for k, v in per_device.items())),
    )


def parse(parameters: Mapping[str, Any]) -> DeviceConfig:
    """Parse one opaque parameters object."""
    api_version = parameters.get("apiVersion")
    kind = parameters.get("kind")
    if api_version != API_VERSION:
        raise ConfigError(f"apiVersion {api_version!r} is not supported; use {API_VERSION}")
    if kind not in (GPU_CONFIG, MIG_DEVICE_CONFIG):
        raise ConfigError(f"kind {kind!r} is not supported; use {GPU_CONFIG} or {MIG_DEVICE_CONFIG}")
    _strict_keys(parameters, {"apiVersion", "kind", "sharing"}, str(kind))
    return DeviceConfig(
        kind=str(kind), sharing=_sharing(parameters.get("sharing"), str(kind), f"{kind}.sharing")
    )


def effective(configs: Sequence[Mapping[str, Any]], device: Device) -> DeviceConfig:
    """The configuration of one device: the last applicable config wins; defaults when there is none."""
    wanted = MIG_DEVICE_CONFIG if isinstance(device, MigDevice) else GPU_CONFIG
    result = DeviceConfig(kind=wanted, sharing=Sharing())
    for parameters in configs:
        config = parse(parameters)
        if config.kind != wanted:
            raise ConfigError(
                f"{config.kind} cannot configure {device.name}, which is a "
                f"{'MIG device' if wanted == MIG_DEVICE_CONFIG else 'full GPU'}: use {wanted}"
            )
        result = config
    return result
