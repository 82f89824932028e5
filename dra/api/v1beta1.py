"""`resource.nvidia.com/v1beta1`: GpuConfig, MigDeviceConfig and VfioDeviceConfig, as NVIDIA has them.

The field names, enums and defaults are NVIDIA's (docs/sharing.md, api/README.md), so parameters
written for their driver decode unchanged. `decode_gpu_config` / `decode_mig_device_config`
decode strictly and normalize (the defaults filled in, the strategy's settings present);
`validate` then checks a config against the devices it configures, which only prepare can do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal

from dra.api.fields import FieldError, decode, spec
from dra.model.devices import Device, MigDevice, gpu_of
from dra.model.quantity import Quantity

API_VERSION = "resource.nvidia.com/v1beta1"

Strategy = Literal["TimeSlicing", "MPS"]
Interval = Literal["Default", "Short", "Medium", "Long"]
IommuBackendPolicy = Literal["LegacyOnly", "PreferIommuFD"]

# NVIDIA's MPS documentation, "System Requirements": MPS needs compute capability 3.5 or later;
# the per-client limits (active thread percentage, pinned device memory) are Volta MPS features,
# compute capability 7.0 or later, and so is multi-user MPS (NVIDIA's driver checks for Volta before
# it starts a daemon with -M). MPS runs on MIG devices too (one server per MIG device).
MPS_MIN_COMPUTE_CAPABILITY = (3, 5)
MPS_LIMITS_MIN_COMPUTE_CAPABILITY = (7, 0)
#: MPS takes pinned memory limits in whole MiB: less is 0, which NVIDIA's driver refuses as too low.
MIN_PINNED_MEMORY = 2**20
#: The most bytes a Kubernetes quantity holds as an integer (int64): more than any device has. A
#: limit above the memory of the device it applies to is refused at prepare, where the device is known.
MAX_PINNED_MEMORY = 2**63 - 1


@dataclass(frozen=True)
class TimeSlicingConfig:
    """How long each context runs on a time-sliced GPU before the next."""

    interval: Interval = field(
        default="Default",
        metadata=spec(
            "The GPU's time slice: Default (the driver's own), Short, Medium or Long "
            "(nvidia-smi compute-policy --set-timeslice 0, 1, 2, 3)."
        ),
    )


@dataclass(frozen=True)
class MpsConfig:
    """Limits every client of the claim's MPS control daemon gets by default."""

    default_active_thread_percentage: int | None = field(
        default=None,
        metadata=spec(
            "Share of the device's threads (SMs) each client may use, in percent.", minimum=1, maximum=100
        ),
    )
    default_pinned_device_memory_limit: Quantity | None = field(
        default=None,
        metadata=spec(
            "Device memory each client may pin on every device of the claim.",
            minimum=MIN_PINNED_MEMORY,
            maximum=MAX_PINNED_MEMORY,
        ),
    )
    default_per_device_pinned_memory_limit: Mapping[str, Quantity] = field(
        default_factory=dict,
        metadata=spec(
            "Device memory each client may pin, per device: keyed by the device's index among the "
            "devices this config applies to (as the container numbers them) or by its UUID; "
            "overrides defaultPinnedDeviceMemoryLimit for that device.",
            minimum=MIN_PINNED_MEMORY,
            maximum=MAX_PINNED_MEMORY,
        ),
    )
    multi_user: bool | None = field(
        default=None,
        metadata=spec(
            "Start the control daemon in multi-user mode (-M), so that clients running as different "
            "users share it; default false. Needs compute capability 7.0 or later."
        ),
    )


@dataclass(frozen=True)
class GpuSharing:
    """How the containers sharing a full GPU of the claim share it."""

    strategy: Strategy = field(default="TimeSlicing", metadata=spec("TimeSlicing or MPS."))
    time_slicing_config: TimeSlicingConfig | None = field(
        default=None, metadata=spec("Settings of strategy TimeSlicing (only with it).")
    )
    mps_config: MpsConfig | None = field(
        default=None, metadata=spec("Settings of strategy MPS (only with it).")
    )

    def normalized(self, path: tuple[str, ...]) -> GpuSharing:
        """The strategy's settings filled in; FieldError for the other strategy's settings."""
        if self.strategy == "TimeSlicing":
            if self.mps_config is not None:
                raise FieldError((*path, "mpsConfig"), "only allowed with strategy MPS")
            return replace(self, time_slicing_config=self.time_slicing_config or TimeSlicingConfig())
        if self.time_slicing_config is not None:
            raise FieldError((*path, "timeSlicingConfig"), "only allowed with strategy TimeSlicing")
        return replace(self, mps_config=self.mps_config or MpsConfig())


@dataclass(frozen=True)
class MigDeviceSharing:
    """How the containers sharing a MIG device of the claim share it.

    No timeSlicingConfig: the time slice is a setting of the whole GPU, not of one MIG device.
    """

    strategy: Strategy = field(default="TimeSlicing", metadata=spec("TimeSlicing or MPS."))
    mps_config: MpsConfig | None = field(
        default=None, metadata=spec("Settings of strategy MPS (only with it).")
    )

    def normalized(self, path: tuple[str, ...]) -> MigDeviceSharing:
        """The strategy's settings filled in; FieldError for the other strategy's settings."""
        if self.strategy == "TimeSlicing":
            if self.mps_config is not None:
                raise FieldError((*path, "mpsConfig"), "only allowed with strategy MPS")
            return self
        return replace(self, mps_config=self.mps_config or MpsConfig())


@dataclass(frozen=True)
class GpuConfig:
    """Opaque configuration of the full GPUs of a claim."""

    KIND: ClassVar[str] = "GpuConfig"
    sharing: GpuSharing = field(
        default_factory=lambda: GpuSharing(time_slicing_config=TimeSlicingConfig()),
        metadata=spec("How containers share the GPUs; default TimeSlicing with the Default interval."),
    )


@dataclass(frozen=True)
class MigDeviceConfig:
    """Opaque configuration of the MIG devices of a claim."""

    KIND: ClassVar[str] = "MigDeviceConfig"
    sharing: MigDeviceSharing = field(
        default_factory=MigDeviceSharing,
        metadata=spec("How containers share the MIG devices; default TimeSlicing."),
    )


@dataclass(frozen=True)
class IommuConfig:
    """How a GPU passed through with vfio-pci reaches the IOMMU."""

    backend_policy: IommuBackendPolicy = field(
        default="LegacyOnly",
        metadata=spec(
            "LegacyOnly (the VFIO container, /dev/vfio/vfio) or PreferIommuFD (/dev/iommu where the "
            "host has it)."
        ),
    )
    enable_api_device: bool | None = field(
        default=None,
        metadata=spec(
            "Give the container the IOMMU API device of the chosen backend; default false.",
            name="enableAPIDevice",
        ),
    )


@dataclass(frozen=True)
class VfioDeviceConfig:
    """Opaque configuration of GPUs a claim takes for passthrough (vfio-pci), as NVIDIA's driver has it.

    Prepare binds the GPU to vfio-pci and back at unprepare (dra.core.vfio) where the node has
    passthrough on; IOMMUFD is not served, so PreferIommuFD takes the legacy backend, as NVIDIA's
    driver does on a node without /dev/iommu.
    """

    KIND: ClassVar[str] = "VfioDeviceConfig"
    iommu: IommuConfig = field(
        default_factory=IommuConfig,
        metadata=spec("The IOMMU backend; default LegacyOnly without the API device."),
    )


#: The kinds of NVIDIA's API group that configure its other driver (compute-domain.nvidia.com):
#: NVIDIA's GPU driver decodes and then refuses them as well.
COMPUTE_DOMAIN_KINDS = ("ComputeDomainChannelConfig", "ComputeDomainDaemonConfig")

#: The kinds this driver serves: they say how containers share a device.
SharingConfig = GpuConfig | MigDeviceConfig
DeviceConfig = SharingConfig | VfioDeviceConfig
KINDS: dict[str, type[GpuConfig] | type[MigDeviceConfig] | type[VfioDeviceConfig]] = {
    c.KIND: c for c in (GpuConfig, MigDeviceConfig, VfioDeviceConfig)
}


def decode_config(kind: str, body: Mapping[str, object]) -> DeviceConfig:
    """Decode and normalize the parameters (less apiVersion and kind) of one of KINDS."""
    cls = KINDS[kind]
    config = decode(cls, body)
    if isinstance(config, VfioDeviceConfig):
        iommu = config.iommu
        return VfioDeviceConfig(iommu=replace(iommu, enable_api_device=bool(iommu.enable_api_device)))
    if isinstance(config, GpuConfig):
        return GpuConfig(sharing=config.sharing.normalized(("sharing",)))
    return MigDeviceConfig(sharing=config.sharing.normalized(("sharing",)))


def _capability(device: Device) -> tuple[int, int]:
    # Discovery writes it in semver form ("9.0.0"); the patch part means nothing here.
    major, minor, *_ = (*gpu_of(device).cuda_compute_capability.split("."), "0", "0")
    return int(major), int(minor)


def validate(config: DeviceConfig, devices: Sequence[Device]) -> None:
    """Check a normalized config against the devices it configures; FieldError naming the field.

    What this needs the devices for: whether they can run MPS, their memory, and which
    indexes and UUIDs defaultPerDevicePinnedMemoryLimit may name. An admission webhook has
    no devices yet; prepare has.
    """
    for device in devices:
        check_kind(config, device)
    if isinstance(config, VfioDeviceConfig):
        return
    mps = config.sharing.mps_config
    if config.sharing.strategy != "MPS" or mps is None:
        return
    limited = (
        mps.default_active_thread_percentage is not None
        or mps.default_pinned_device_memory_limit is not None
        or bool(mps.default_per_device_pinned_memory_limit)
    )
    what = "MPS with multiUser" if mps.multi_user else "MPS with limits" if limited else "MPS"
    need = MPS_LIMITS_MIN_COMPUTE_CAPABILITY if limited or mps.multi_user else MPS_MIN_COMPUTE_CAPABILITY
    for device in devices:
        have = _capability(device)
        if have < need:
            raise FieldError(
                ("sharing", "strategy"),
                f"{what} needs compute capability {need[0]}.{need[1]} "
                f"or later; {device.name} ({gpu_of(device).product_name}) has {have[0]}.{have[1]}",
            )
    path = ("sharing", "mpsConfig")
    if mps.default_pinned_device_memory_limit is not None:
        for device in devices:
            _fits(mps.default_pinned_device_memory_limit, device, (*path, "defaultPinnedDeviceMemoryLimit"))
    per_device = (*path, "defaultPerDevicePinnedMemoryLimit")
    for key, limit in mps.default_per_device_pinned_memory_limit.items():
        named = device_for_key(key, devices)
        if named is None:
            names = ", ".join(f"{i} or {d.uuid} ({d.name})" for i, d in enumerate(devices))
            raise FieldError((*per_device, f"[{key}]"), f"names no device of this config; it has {names}")
        _fits(limit, named, (*per_device, f"[{key}]"))


def check_kind(config: DeviceConfig, device: Device) -> DeviceConfig:
    """The config, when its kind configures this kind of device (GpuConfig: full GPUs); FieldError if not.

    VfioDeviceConfig passes a full GPU through; a MIG device cannot be (vfio-pci takes a PCI function).
    """
    if isinstance(config, VfioDeviceConfig):
        if isinstance(device, MigDevice):
            raise FieldError(
                (),
                f"cannot configure {device.name}, which is a MIG device: passthrough (vfio-pci) takes "
                "a whole GPU",
            )
        return config
    mig = isinstance(device, MigDevice)
    if not isinstance(config, MigDeviceConfig if mig else GpuConfig):
        what, use = ("a MIG device", "MigDeviceConfig") if mig else ("a full GPU", "GpuConfig")
        raise FieldError((), f"{config.KIND} cannot configure {device.name}, which is {what}: use {use}")
    return config


def device_for_key(key: str, devices: Sequence[Device]) -> Device | None:
    """The device a defaultPerDevicePinnedMemoryLimit key names: an index into `devices`, or a UUID."""
    if key.isdigit():
        return devices[int(key)] if int(key) < len(devices) else None
    return next((d for d in devices if d.uuid == key), None)


def _fits(limit: Quantity, device: Device, path: tuple[str, ...]) -> None:
    if limit.exact() > device.memory_bytes:
        raise FieldError(
            path,
            f"{limit} is more than the {device.memory_bytes // 2**20} MiB of memory of {device.name}",
        )
