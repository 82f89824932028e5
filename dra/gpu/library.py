"""The GPU library interface: what the driver asks of NVML and of the host about GPUs.

Discovery and health monitoring talk to GPUs only through `GpuLibrary`: a
small typed surface whose methods map one to one onto NVML calls (plus the
few host facts NVML does not give: PCIe root complex from sysfs, MIG
capability device minors from procfs, which /dev nodes exist). Two
implementations: dra.gpu.nvml on the real driver (the only importer of
pynvml) and dra.fakegpus.library from a profile, so the mapping from NVML values to
published devices runs the same code for both. The values and return codes
here are NVML's (nvml.h).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType, Protocol

from dra.model.devices import MigEngines

GpuHandle = NewType("GpuHandle", object)
MigHandle = NewType("MigHandle", object)
GpuInstanceHandle = NewType("GpuInstanceHandle", object)
ComputeInstanceHandle = NewType("ComputeInstanceHandle", object)
#: An nvmlGpmSample_t: a buffer of GPM counters, freed with GpuLibrary.gpm_free.
GpmSample = NewType("GpmSample", object)

# NVML return codes the driver reacts to (nvml.h).
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_INVALID_STATE = 29
ERROR_UNKNOWN = 999

# Event type bit for XID critical errors (nvmlEventTypeXidCriticalError).
EVENT_XID_CRITICAL = 0x8
# gpuInstanceId / computeInstanceId of an event that concerns no particular MIG instance.
NO_INSTANCE = 0xFFFFFFFF


class GpuLibraryError(Exception):
    """An NVML call failed; `code` is the NVML return code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class MigAttributes:
    """nvmlDeviceGetAttributes for a MIG device."""

    engines: MigEngines
    gpu_instance_slices: int
    compute_instance_slices: int
    memory_mib: int


@dataclass(frozen=True)
class XidEvent:
    """One XID error: which device (GPU UUID, or MIG UUID when NVML names one) and the code.

    On a GPU in MIG mode NVML also says which GPU instance and compute instance
    the error concerns, when it concerns one; None when it does not.
    """

    uuid: str
    xid: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class ProcessMemory:
    """One nvmlProcessInfo_t of nvmlDeviceGetComputeRunningProcesses: a process with a CUDA context."""

    pid: int
    #: Bytes of device memory the process uses; None where NVML cannot say (NVML_VALUE_NOT_AVAILABLE).
    used_bytes: int | None
    #: The MIG device's GPU and compute instance IDs the process runs on; None off MIG mode.
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class ProcessUtilization:
    """One nvmlProcessUtilizationSample_t: a process's share of the GPU's SMs over NVML's last period."""

    pid: int
    #: CPU time of the sample, microseconds since the epoch.
    timestamp_us: int
    #: Percent of the period the process had kernels on the SMs.
    sm_percent: int


@dataclass(frozen=True)
class GpuInstanceProfileInfo:
    """nvmlDeviceGetGpuInstanceProfileInfo (nvmlGpuInstanceProfileInfo_v2_t)."""

    id: int
    slice_count: int
    instance_count: int
    engines: MigEngines
    memory_mib: int
    #: "MIG 3g.40gb"
    name: str


@dataclass(frozen=True)
class Placement:
    """nvmlGpuInstancePlacement_t: where a GPU instance sits, in memory slices."""

    start: int
    size: int


@dataclass(frozen=True)
class GpuInstanceInfo:
    """nvmlGpuInstanceGetInfo."""

    id: int
    profile_id: int
    placement: Placement


class GpuLibrary(Protocol):
    """What the driver asks of NVML and of the host about GPUs."""

    def init(self) -> None:
        """Load and initialise the library; GpuLibraryError when there is no usable driver."""

    def shutdown(self) -> None:
        """Release the library."""

    def driver_version(self) -> str:
        """The kernel driver version, e.g. "550.54.15"."""

    def cuda_driver_version(self) -> int:
        """The CUDA version the driver supports, as NVML encodes it (12040 for 12.4)."""

    def device_count(self) -> int:
        """How many GPUs NVML sees."""

    def device_by_index(self, index: int) -> GpuHandle:
        """The handle of GPU `index`."""

    def name(self, gpu: GpuHandle | MigHandle) -> str:
        """Product name; for a MIG device NVML appends " MIG <profile>"."""

    def uuid(self, gpu: GpuHandle | MigHandle) -> str:
        """GPU-... or MIG-... UUID."""

    def brand(self, gpu: GpuHandle) -> int:
        """nvmlBrandType_t value."""

    def architecture(self, gpu: GpuHandle) -> int:
        """nvmlDeviceArchitecture_t value."""

    def cuda_compute_capability(self, gpu: GpuHandle) -> tuple[int, int]:
        """(major, minor)."""

    def memory_total(self, gpu: GpuHandle) -> int:
        """Total framebuffer memory in bytes."""

    def pci_bus_id(self, gpu: GpuHandle) -> str:
        """NVML's bus ID, e.g. "00000000:18:00.0"."""

    def minor_number(self, gpu: GpuHandle) -> int:
        """The N of /dev/nvidiaN."""

    def addressing_mode(self, gpu: GpuHandle) -> int:
        """nvmlDeviceAddressingMode value: 0 none active, 1 HMM, 2 ATS.

        GpuLibraryError(NOT_SUPPORTED) where the platform has neither, and
        (FUNCTION_NOT_FOUND) where the driver or the bindings predate the call.
        """

    def numa_node(self, gpu: GpuHandle) -> int:
        """NUMA node of the GPU; GpuLibraryError(NOT_SUPPORTED) where there is none."""

    def numa_nodes(self, gpu: GpuHandle) -> tuple[int, ...]:
        """The GPU's PCI device's NUMA node, then its socket's as close (dra.gpu.numa); () if none."""

    def mig_mode(self, gpu: GpuHandle) -> tuple[int, int]:
        """(current, pending) MIG mode; GpuLibraryError(NOT_SUPPORTED) on GPUs without MIG."""

    def set_mig_mode(self, gpu: GpuHandle, mode: int) -> None:
        """Ask for MIG mode on (1) or off (0); it may stay pending until the GPU is reset (see mig_mode).

        GpuLibraryError(NOT_SUPPORTED) on GPUs without MIG, (IN_USE) while processes or MIG
        devices use the GPU.
        """

    def pci_device_id(self, gpu: GpuHandle) -> int:
        """nvmlPciInfo_t.pciDeviceId: device ID << 16 | vendor ID (0x233010DE for an H100 SXM5)."""

    def max_mig_device_count(self, gpu: GpuHandle) -> int:
        """How many MIG device slots to probe."""

    def mig_device_by_index(self, gpu: GpuHandle, index: int) -> MigHandle:
        """The MIG device in slot `index`; GpuLibraryError(NOT_FOUND) for an empty slot."""

    def mig_attributes(self, mig: MigHandle) -> MigAttributes:
        """Sizes of a MIG device."""

    def gpu_instance_id(self, mig: MigHandle) -> int:
        """GPU instance ID of a MIG device."""

    def compute_instance_id(self, mig: MigHandle) -> int:
        """Compute instance ID of a MIG device."""

    def gpu_instance_profile_info(self, gpu: GpuHandle, profile: int) -> GpuInstanceProfileInfo:
        """Sizes of NVML_GPU_INSTANCE_PROFILE_<profile>.

        NOT_SUPPORTED with MIG mode off or where the GPU lacks the profile; INVALID_ARGUMENT past the last.
        """

    def gpu_instance_possible_placements(self, gpu: GpuHandle, profile_id: int) -> list[Placement]:
        """Every placement a GPU instance of this profile ID may take; NOT_SUPPORTED with MIG off."""

    def create_gpu_instance_with_placement(
        self, gpu: GpuHandle, profile_id: int, placement: Placement
    ) -> GpuInstanceHandle:
        """Create a GPU instance; INSUFFICIENT_RESOURCES where the placement overlaps one that exists."""

    def gpu_instances(self, gpu: GpuHandle, profile_id: int) -> list[GpuInstanceHandle]:
        """The GPU instances of one profile ID that exist."""

    def gpu_instance_by_id(self, gpu: GpuHandle, gpu_instance_id: int) -> GpuInstanceHandle:
        """The GPU instance of this ID; NOT_FOUND where there is none."""

    def gpu_instance_info(self, gi: GpuInstanceHandle) -> GpuInstanceInfo:
        """ID, profile ID and placement of a GPU instance."""

    def create_compute_instance(self, gi: GpuInstanceHandle, profile: int) -> ComputeInstanceHandle:
        """Create a compute instance of NVML_COMPUTE_INSTANCE_PROFILE_<profile> (shared engines) in it."""

    def compute_instances(self, gi: GpuInstanceHandle) -> list[ComputeInstanceHandle]:
        """Every compute instance of a GPU instance, whatever its profile."""

    def compute_instance_info_id(self, ci: ComputeInstanceHandle) -> int:
        """nvmlComputeInstanceGetInfo().id."""

    def destroy_compute_instance(self, ci: ComputeInstanceHandle) -> None:
        """Destroy a compute instance; IN_USE while a process runs on it."""

    def destroy_gpu_instance(self, gi: GpuInstanceHandle) -> None:
        """Destroy a GPU instance; IN_USE while it still has compute instances."""

    def pcie_root(self, pci_bus_id: str) -> str | None:
        """The PCIe root complex ("pci0000:15") the device sits under, from sysfs."""

    def mig_capability_minors(self) -> dict[str, int]:
        """/proc/driver/nvidia-caps/mig-minors: "gpu0/gi1/access" -> minor."""

    def path_exists(self, path: str) -> bool:
        """Whether a device node exists on the host."""

    def watch_xid_events(self, gpu: GpuHandle) -> None:
        """Start collecting XID critical errors of this GPU; GpuLibraryError when it cannot be watched."""

    def wait_xid_event(self, timeout_ms: int) -> XidEvent | None:
        """The next XID event, or None after timeout_ms; GpuLibraryError when the wait itself fails."""

    def set_time_slice(self, gpu: GpuHandle, level: int) -> None:
        """Set the GPU's compute time slice (0 Default, 1 Short, 2 Medium, 3 Long); GpuLibraryError."""

    def time_slice(self, gpu: GpuHandle) -> int:
        """The GPU's time slice level; GpuLibraryError NOT_SUPPORTED where it cannot be read."""

    def unwatch_xid_events(self) -> None:
        """Stop collecting XID events and free what that holds; nothing may wait any more."""

    def memory_used(self, device: GpuHandle | MigHandle) -> int:
        """nvmlDeviceGetMemoryInfo().used of a GPU or a MIG device, in bytes."""

    def utilization(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetUtilizationRates().gpu: percent of NVML's last period with a kernel running.

        GpuLibraryError(NOT_SUPPORTED) on a GPU in MIG mode, where NVML cannot measure it.
        """

    def running_processes(self, device: GpuHandle | MigHandle) -> list[ProcessMemory]:
        """nvmlDeviceGetComputeRunningProcesses: processes with a context on the GPU or MIG device.

        On a GPU in MIG mode, every MIG device's processes, each with its instance IDs.
        """

    def process_utilization(self, gpu: GpuHandle, since_us: int) -> list[ProcessUtilization]:
        """nvmlDeviceGetProcessUtilization: samples newer than `since_us` of processes that used the SMs.

        GpuLibraryError(NOT_FOUND) when there is no such sample (every process idle), and
        (NOT_SUPPORTED) on a GPU in MIG mode.
        """

    def gpm_supported(self, gpu: GpuHandle) -> bool:
        """nvmlGpmQueryDeviceSupport: whether the GPU has GPM counters (Hopper and newer)."""

    def gpm_sample(self, gpu: GpuHandle, gpu_instance_id: int | None) -> GpmSample:
        """A GPM sample of the GPU (nvmlGpmSampleGet) or of one GPU instance (nvmlGpmMigSampleGet)."""

    def gpm_graphics_utilization(self, first: GpmSample, second: GpmSample) -> float:
        """NVML_GPM_METRIC_GRAPHICS_UTIL between two samples: percent of the time an engine was busy."""

    def gpm_free(self, sample: GpmSample) -> None:
        """nvmlGpmSampleFree."""


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML's bus ID ("00000000:3B:00.0") as the kernel names the device ("0000:3b:00.0").

    That is also the extended BDF form of the standard resource.kubernetes.io/pciBusID attribute.
    """
    # NVML pads the PCI domain to 8 hex digits; sysfs prints it with at least 4 (%04x), in lower case.
    # Keeping only the last 4 would turn VMD domain 10000 into domain 0000: another device, or none.
    domain, _, rest = pci_bus_id.partition(":")
    return f"{domain.lstrip('0').rjust(4, '0')}:{rest}".lower()
