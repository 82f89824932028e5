"""Opaque device configuration at prepare: the typed API (dra.api) applied to a claim's devices.

Claims and DeviceClasses may carry parameters for this driver
(`opaque.driver: gpu.nvidia.com`; allocation.read_allocation keeps only those).
They decode to NVIDIA's `resource.nvidia.com/v1beta1` GpuConfig / MigDeviceConfig /
VfioDeviceConfig (dra.api.v1beta1) and are validated against the devices each applies to. The
admission webhook runs the same decoding, so it refuses what prepare would; only
the checks that need the devices wait for prepare. A setting this driver cannot
honour is an error for that claim, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra.api import opaque
from dra.api.fields import FieldError
from dra.api.v1beta1 import (
    KINDS,
    DeviceConfig,
    GpuConfig,
    MigDeviceConfig,
    SharingConfig,
    check_kind,
    validate,
)
from dra.model.allocation import ClaimAllocation, OpaqueConfig
from dra.model.devices import Device, MigDevice


class ConfigError(ValueError):
    """Invalid or unsupported parameters; the message names the field."""


def root(parameters: Mapping[str, Any]) -> str:
    """How messages spell the parameters object: its kind when it is a known one, as in GpuConfig.sharing."""
    kind = parameters.get("kind")
    return kind if isinstance(kind, str) and kind in KINDS else "parameters"


def decode(parameters: Mapping[str, Any]) -> DeviceConfig:
    """One opaque parameters object, decoded and normalized; ConfigError naming the field."""
    try:
        return opaque.decode(parameters)
    except FieldError as err:
        raise ConfigError(err.at(root(parameters))) from None


def parse(parameters: Mapping[str, Any]) -> DeviceConfig:
    """Decoded: everything that can be checked without the devices (the webhook's check)."""
    return decode(parameters)


def checked(config: DeviceConfig, devices: Sequence[Device]) -> DeviceConfig:
    """The config, valid for these devices; ConfigError naming the field otherwise."""
    try:
        validate(config, devices)
    except FieldError as err:
        raise ConfigError(err.at(config.KIND)) from None
    return config


def default(device: Device) -> SharingConfig:
    """The configuration of a device no config applies to: NVIDIA's defaults (time-sliced)."""
    return MigDeviceConfig() if isinstance(device, MigDevice) else GpuConfig()


def effective(configs: Sequence[Mapping[str, Any]], device: Device) -> DeviceConfig:
    """The configuration of one device: the last applicable config wins; defaults when there is none.

    Each config is decoded and of the device's kind, or ConfigError; the checks
    against all the devices a config applies to (per-device limits) are `problems`', which
    prepare makes first.
    """
    result: DeviceConfig = default(device)
    for parameters in configs:
        config = decode(parameters)
        try:
            result = check_kind(config, device)
        except FieldError as err:
            raise ConfigError(err.at(config.KIND)) from None
    return result


def problems(allocation: ClaimAllocation, devices: Mapping[str, Device]) -> list[str]:
    """Every problem of the claim's configs, each with the devices it configures.

    `devices` maps the names of the claim's devices on this node to them; each config
    is checked against those it applies to (its requests', or all).
    """
    found: list[str] = []
    for entry in allocation.configs:
        configured = targets(allocation, entry, devices)
        if not configured:
            continue
        try:
            checked(decode(entry.parameters), configured)
        except ConfigError as err:
            plural = "s" if len(configured) > 1 else ""
            found.append(
                f"invalid configuration for device{plural} {', '.join(d.name for d in configured)}: {err}"
            )
    return found


def targets(allocation: ClaimAllocation, entry: OpaqueConfig, devices: Mapping[str, Device]) -> list[Device]:
    """The devices of `devices` (the claim's on this node) a config applies to, in allocation order.

    Its per-device MPS limits number them in this order.
    """
    names = dict.fromkeys(r.device for r in allocation.devices if entry.applies_to(r) and r.device in devices)
    return [devices[name] for name in names]
