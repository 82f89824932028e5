"""From NVML readings to the node's inventory: pure mapping over a GpuLibrary.

The same code runs on real NVML and on fake GPUs; only the library differs.
A GPU in MIG mode contributes its MIG devices instead of itself, unless the
admin's MIG mode for it (dra.model.migmode) says `whole` (itself) or
`dynamic` (itself, plus the MIG profiles its offer keeps, at every placement,
as partitions).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator
from typing import TypeVar

from dra.gpu import migtables
from dra.gpu.library import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    GpuHandle,
    GpuInstanceProfileInfo,
    GpuLibrary,
    GpuLibraryError,
    MigHandle,
    Placement,
    sysfs_bus_id,
)
from dra.model import migmode
from dra.model.devices import Device, Gpu, Inventory, MigDevice, MigPartition
from dra.model.migoffer import MigOffer

log = logging.getLogger(__name__)

#: nvmlBrandType_t, named as NVIDIA's DRA driver publishes them (go-nvlib's names, not nvidia-smi's:
#: "Nvidia" where nvidia-smi says "NVIDIA"), so that a selector on `brand` means the same on either driver.
BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}

#: nvmlDeviceArchitecture_t, named as nvidia-smi names them.
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}

#: nvmlDeviceAddressingMode values, named as nvidia-smi ("Addressing Mode") and NVIDIA's DRA driver name them.
ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}

#: Control nodes a container needs besides its GPUs' own /dev/nvidiaN, when the host has them.
COMMON_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

_MIG_NAME = re.compile(r"\bMIG\s+(\S+)$")

_T = TypeVar("_T")


def to_semver(version: str) -> str | None:
    """A numeric dotted version as strict semver: "535.104.05" -> "535.104.5", "9.0" -> "9.0.0".

    NVIDIA versions may carry leading zeros or only two parts, which semver
    (and so the `version` attribute type) rejects. None for anything else.
    """
    parts = version.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in numbers)


def cuda_version_string(encoded: int) -> str:
    """NVML's CUDA driver version (12040) as semver ("12.4.0")."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}.0"


def mig_profile(name: str, memory_mib: int, gi_slices: int, ci_slices: int, parent_memory_mib: int) -> str:
    """The MIG profile ("1g.10gb") from the MIG device's name, else from its sizes.

    Without a name, the memory part is derived as NVIDIA derives it: the
    device's share of the parent's memory rounded up to eighths, times the
    parent's size in whole GB, rounded. Plain MiB / 1024 rounding would call
    the H100's 80384 MiB partition "7g.79gb" instead of "7g.80gb".
    """
    match = _MIG_NAME.search(name)
    if match:
        return match.group(1)
    if parent_memory_mib > 0:
        eighths = -(-memory_mib * 8 // parent_memory_mib)
        gigabytes = (eighths * -(-parent_memory_mib // 1024) + 4) // 8
    else:
        gigabytes = math.ceil(memory_mib / 1024)
    prefix = f"{ci_slices}c." if ci_slices != gi_slices else ""
    return f"{prefix}{gi_slices}g.{gigabytes}gb"


def mig_device_name(parent_index: int, profile: str, gpu_instance: int, compute_instance: int) -> str:
    """A DNS-label device name: gpu-4-mig-1g10gb-7-0."""
    slug = re.sub(r"[^a-z0-9]", "", profile.lower())
    return f"gpu-{parent_index}-mig-{slug}-{gpu_instance}-{compute_instance}"


def partition_name(parent_index: int, profile: str, start: int) -> str:
    """A DNS-label name for a dynamic-MIG offer: gpu-0-mig-3g40gb-at4."""
    slug = re.sub(r"[^a-z0-9]", "", profile.lower())
    return f"gpu-{parent_index}-mig-{slug}-at{start}"


def _unless_unknown(query: Callable[[], _T], *unknown: int) -> _T | None:
    """The answer, or None where NVML says (with one of the `unknown` codes) that it has none."""
    try:
        return query()
    except GpuLibraryError as err:
        if err.code in unknown:
            return None
        raise


def _addressing_mode(lib: GpuLibrary, handle: GpuHandle, index: int) -> str | None:
    # Drivers and bindings older than the call, and platforms without the feature, give no attribute
    # rather than a guess: a selector on it then needs has(), which is what it should need.
    mode = _unless_unknown(
        lambda: lib.addressing_mode(handle),
        ERROR_NOT_SUPPORTED,
        ERROR_FUNCTION_NOT_FOUND,
        ERROR_ARGUMENT_VERSION_MISMATCH,
    )
    if mode is not None and mode not in ADDRESSING_MODES:
        log.warning(
            "GPU %d reports addressing mode %d, unknown to this driver: not publishing it", index, mode
        )
    return None if mode is None else ADDRESSING_MODES.get(mode)


def _mig_mode(lib: GpuLibrary, handle: GpuHandle) -> tuple[int, int] | None:
    """The GPU's (current, pending) MIG mode; None for a GPU without MIG support."""
    try:
        return lib.mig_mode(handle)
    except GpuLibraryError as err:
        if err.code == ERROR_NOT_SUPPORTED:
            return None
        raise


def supports_mig(lib: GpuLibrary) -> bool:
    """Whether a GPU of the node can run in MIG mode: only then does the plugin make or destroy MIG ones."""
    return any(_mig_mode(lib, lib.device_by_index(i)) is not None for i in range(lib.device_count()))


def mig_enabled(lib: GpuLibrary, handle: GpuHandle) -> bool:
    """Whether the GPU's current MIG mode is on (a GPU without MIG support: no)."""
    mode = _mig_mode(lib, handle)
    return mode is not None and mode[0] == 1


def _gpu(lib: GpuLibrary, handle: GpuHandle, index: int) -> Gpu:
    minor = lib.minor_number(handle)
    major_cc, minor_cc = lib.cuda_compute_capability(handle)
    bus_id = lib.pci_bus_id(handle)
    node = f"/dev/nvidia{minor}"
    return Gpu(
        name=f"gpu-{index}",
        index=index,
        minor=minor,
        uuid=lib.uuid(handle),
        product_name=lib.name(handle),
        brand=BRANDS.get(lib.brand(handle), "Unknown"),
        architecture=ARCHITECTURES.get(lib.architecture(handle), "Unknown"),
        cuda_compute_capability=f"{major_cc}.{minor_cc}.0",
        memory_bytes=lib.memory_total(handle),
        pci_bus_id=sysfs_bus_id(bus_id),
        nvml_bus_id=bus_id,
        pcie_root=lib.pcie_root(bus_id),
        numa_node=_unless_unknown(lambda: lib.numa_node(handle), ERROR_NOT_SUPPORTED, ERROR_NOT_FOUND),
        addressing_mode=_addressing_mode(lib, handle, index),
        mig_enabled=mig_enabled(lib, handle),
        device_nodes=(node,) if lib.path_exists(node) else (),
        numa_nodes=lib.numa_nodes(handle),
    )


def mig_handles(lib: GpuLibrary, handle: GpuHandle) -> list[MigHandle]:
    """The GPU's MIG devices that exist, in slot order (NVML's empty slots are NOT_FOUND)."""
    found = []
    for slot in range(lib.max_mig_device_count(handle)):
        try:
            found.append(lib.mig_device_by_index(handle, slot))
        except GpuLibraryError as err:
            if err.code != ERROR_NOT_FOUND:
                raise
    return found


def _mig_devices(lib: GpuLibrary, handle: GpuHandle, parent: Gpu, caps: dict[str, int]) -> list[MigDevice]:
    found = []
    for mig in mig_handles(lib, handle):
        attrs = lib.mig_attributes(mig)
        gi = lib.gpu_instance_id(mig)
        ci = lib.compute_instance_id(mig)
        profile = mig_profile(
            lib.name(mig),
            attrs.memory_mib,
            attrs.gpu_instance_slices,
            attrs.compute_instance_slices,
            parent.memory_bytes // (1024 * 1024),
        )
        cap_nodes = [
            f"/dev/nvidia-caps/nvidia-cap{caps[key]}"
            for key in (f"gpu{parent.minor}/gi{gi}/access", f"gpu{parent.minor}/gi{gi}/ci{ci}/access")
            if key in caps
        ]
        nodes = tuple(p for p in (*parent.device_nodes, *cap_nodes) if lib.path_exists(p))
        placement = _placement(lib, handle, gi)
        found.append(
            MigDevice(
                name=mig_device_name(parent.index, profile, gi, ci),
                uuid=lib.uuid(mig),
                parent=parent,
                profile=profile,
                gpu_instance_id=gi,
                compute_instance_id=ci,
                memory_bytes=attrs.memory_mib * 1024 * 1024,
                engines=attrs.engines,
                device_nodes=nodes,
                placement_start=placement.start if placement else -1,
                placement_size=placement.size if placement else 0,
            )
        )
    return found


def _placement(lib: GpuLibrary, handle: GpuHandle, gpu_instance_id: int) -> Placement | None:
    """Where a GPU instance sits on its GPU; None where the driver cannot say (it is then not published)."""
    try:
        return lib.gpu_instance_info(lib.gpu_instance_by_id(handle, gpu_instance_id)).placement
    except GpuLibraryError as err:
        if err.code not in (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND):
            raise
        return None


#: GPUs whose MIG-mode remark was logged, so that re-discovery says it once per process.
_told: set[tuple[str, str]] = set()


def _tell_once(gpu: Gpu, key: str, message: str, *args: object) -> None:
    if (gpu.uuid, key) not in _told:
        _told.add((gpu.uuid, key))
        log.warning(message, *args)


def profile_infos(
    lib: GpuLibrary, handle: GpuHandle, profile_count: int | None = None
) -> Iterator[GpuInstanceProfileInfo]:
    """The GPU-instance profiles the GPU has, in profile-number order.

    NVML answers NOT_SUPPORTED for a profile the GPU lacks and INVALID_ARGUMENT past the last; with
    MIG mode off, older drivers answer NOT_SUPPORTED for every profile, recent ones as with it on.
    """
    for profile in range(PROFILE_COUNT if profile_count is None else profile_count):
        try:
            yield lib.gpu_instance_profile_info(handle, profile)
        except GpuLibraryError as err:
            if err.code not in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                raise


def _largest_first(p: MigPartition) -> tuple[int, int, int]:
    """The order partitions are listed in: most compute slices, then memory slices, then placement."""
    return (-p.slices, -p.placement_size, p.placement_start)


def partitions(lib: GpuLibrary, handle: GpuHandle, parent: Gpu, profile_count: int) -> list[MigPartition]:
    """Every GPU-instance profile of the GPU at every placement NVML offers for it."""
    found: list[MigPartition] = []
    for info in profile_infos(lib, handle, profile_count):
        name = info.name.removeprefix("MIG ").strip()
        for placement in lib.gpu_instance_possible_placements(handle, info.id):
            found.append(
                MigPartition(
                    name=partition_name(parent.index, name, placement.start),
                    parent=parent,
                    profile=name,
                    profile_id=info.id,
                    slices=info.slice_count,
                    placement_start=placement.start,
                    placement_size=placement.size,
                    memory_bytes=info.memory_mib * 1024 * 1024,
                    engines=info.engines,
                )
            )
    return sorted(found, key=_largest_first)


def _offered(offer: MigOffer, gpu: Gpu, every: list[MigPartition]) -> list[MigPartition]:
    """The placements `offer` keeps of a GPU's; says once which listed profiles the GPU lacks."""
    kept = offer.select(every)
    missing = offer.unmatched(every)
    if missing:
        _tell_once(
            gpu,
            "profiles",
            "GPU %d (%s) has no MIG profile %s (--mig-profiles); it has %s",
            gpu.index,
            gpu.product_name,
            ", ".join(missing),
            ", ".join(dict.fromkeys(p.profile for p in every)),
        )
    if every and not kept:
        _tell_once(
            gpu,
            "no-profiles",
            "GPU %d: --mig-profiles keeps none of its profiles, so it is offered whole only",
            gpu.index,
        )
    return kept


def mig_devices(lib: GpuLibrary, parent: Gpu) -> list[MigDevice]:
    """The MIG devices that exist on a GPU now (after dynamic MIG made one, say)."""
    return _mig_devices(lib, lib.device_by_index(parent.index), parent, lib.mig_capability_minors())


def _dynamic_offers(
    lib: GpuLibrary, handle: GpuHandle, gpu: Gpu, offer: MigOffer, mig: tuple[int, int] | None
) -> list[MigPartition]:
    """What a dynamic-MIG GPU offers besides itself, whatever its MIG mode: the first MIG claim turns it on.

    `mig` is the GPU's MIG mode as _mig_mode reads it. A GPU whose MIG mode waits for a reset to
    turn on offers nothing more: no MIG device can be made on it until then.
    """
    if mig is None:
        return []
    current, pending = mig
    if (current, pending) == (0, 1):
        _tell_once(
            gpu,
            "pending",
            "GPU %d: MIG mode waits for a GPU reset to turn on (nvidia-smi -i %d -r), so dynamic MIG "
            "offers it whole only until then",
            gpu.index,
            gpu.index,
        )
        return []
    # Recent drivers answer the profile queries whatever the MIG mode (a real H200 on 580.159.04 did):
    # their answers are the GPU's own. The table stands in for a driver that refuses them with MIG off.
    if current:
        return _offered(offer, gpu, partitions(lib, handle, gpu, PROFILE_COUNT))
    try:
        every = partitions(lib, handle, gpu, PROFILE_COUNT)
    except GpuLibraryError as err:
        # With MIG off a refusal is the driver's reticence, not the GPU's fault: it stays offered.
        log.debug("GPU %d: NVML did not describe its MIG profiles with MIG off (%s)", gpu.index, err)
        every = []
    if every:
        return _offered(offer, gpu, every)
    table = migtables.BY_PRODUCT.get(gpu.product_name)
    if table is None:
        _tell_once(
            gpu,
            "off",
            "GPU %d (%s): MIG mode is off and this driver does not know the model's MIG profiles, so "
            "dynamic MIG offers it whole only; turn MIG on with nvidia-smi -i %d -mig 1 "
            "(no process may use the GPU)",
            gpu.index,
            gpu.product_name,
            gpu.index,
        )
        return []
    return _offered(offer, gpu, table_partitions(gpu, table))


def _mig_off_pending(gpu: Gpu, mig: tuple[int, int] | None) -> bool:
    """Whether MIG mode (`mig`) waits for a reset to turn off: the GPU is not offered whole until then."""
    if mig != (1, 0):
        return False
    _tell_once(
        gpu,
        "pending-off",
        "GPU %d: MIG mode waits for a GPU reset to turn off (nvidia-smi -i %d -r), so dynamic MIG "
        "offers it as MIG devices only until then",
        gpu.index,
        gpu.index,
    )
    return True


def table_partitions(gpu: Gpu, table: tuple[migtables.GpuInstanceProfile, ...]) -> list[MigPartition]:
    """The partitions `partitions` would read from NVML once MIG mode is on, from the model's table."""
    found = [
        MigPartition(
            name=partition_name(gpu.index, p.name, start),
            parent=gpu,
            profile=p.name,
            profile_id=p.id,
            slices=p.slices,
            placement_start=start,
            placement_size=p.memory_slices,
            memory_bytes=p.memory_mib * 1024 * 1024,
            engines=p.engines,
        )
        for p in sorted(table, key=lambda p: p.nvml_profile)
        for start in p.starts
    ]
    return sorted(found, key=_largest_first)


#: How many NVML_GPU_INSTANCE_PROFILE_* enumerators discovery probes (nvml.h: ..._COUNT).
PROFILE_COUNT = 10


def discover(lib: GpuLibrary, mig_modes: migmode.MigModes | None = None) -> Inventory:
    """Read every GPU and MIG device through `lib` (already initialised).

    A GPU whose queries fail is left out with a warning naming it, so one
    broken GPU does not hide the healthy ones. `mig_modes` (default: every
    GPU static) says how each GPU's MIG is published.
    """
    modes = mig_modes or migmode.MigModes()
    raw_driver_version = lib.driver_version()
    driver_version = to_semver(raw_driver_version)
    if driver_version is None:
        log.warning("driver version %r is not numeric: not publishing driverVersion", raw_driver_version)
    caps = lib.mig_capability_minors()
    gpus: list[Gpu] = []
    devices: list[Device] = []
    offers: list[MigPartition] = []
    instances: list[MigDevice] = []
    for index in range(lib.device_count()):
        try:
            handle = lib.device_by_index(index)
            gpu = _gpu(lib, handle, index)
            mode = modes.of(index, gpu.uuid)
            members: list[Device] = [gpu]
            # Kept only once every query of the GPU has answered: a GPU left out leaves no offer behind.
            gpu_offers: list[MigPartition] = []
            gpu_instances: list[MigDevice] = []
            if mode == migmode.STATIC and gpu.mig_enabled:
                members = list(_mig_devices(lib, handle, gpu, caps))
            elif mode == migmode.WHOLE and gpu.mig_enabled:
                _tell_once(
                    gpu,
                    mode,
                    "GPU %d is in MIG mode but published whole (--mig-mode); CUDA sees no device on a GPU in "
                    "MIG mode without instances: turn MIG off with nvidia-smi -i %d -mig 0",
                    index,
                    index,
                )
            elif mode == migmode.DYNAMIC:
                mig = _mig_mode(lib, handle)
                gpu_offers = _dynamic_offers(lib, handle, gpu, modes.offer, mig)
                if gpu.mig_enabled:
                    gpu_instances = _mig_devices(lib, handle, gpu, caps)
                    if gpu_offers and _mig_off_pending(gpu, mig):
                        members = []
        except GpuLibraryError as err:
            log.warning("skipping GPU %d: NVML error %d: %s", index, err.code, err)
            continue
        gpus.append(gpu)
        devices.extend(members)
        offers.extend(gpu_offers)
        instances.extend(gpu_instances)
    return Inventory(
        devices=tuple(devices),
        driver_version=driver_version,
        cuda_driver_version=cuda_version_string(lib.cuda_driver_version()),
        common_device_nodes=tuple(p for p in COMMON_DEVICE_NODES if lib.path_exists(p)),
        gpus=tuple(gpus),
        partitions=tuple(offers),
        instances=tuple(instances),
    )
