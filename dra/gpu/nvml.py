"""The GPU library interface, and its implementation on NVML (pynvml) and the host.

Discovery and health monitoring talk to GPUs only through `GpuLibrary`: a
small typed surface whose methods map one to one onto NVML calls (plus the
few host facts NVML does not give: PCIe root complex from sysfs, MIG
capability device minors from procfs, which /dev nodes exist). The fake GPU
library (dra.gpu.fake) implements the same surface from a profile, so the
mapping from NVML values to published devices runs the same code for both.

This is the only module that imports pynvml.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NewType, Protocol

GpuHandle = NewType("GpuHandle", object)
MigHandle = NewType("MigHandle", object)
GpuInstanceHandle = NewType("GpuInstanceHandle", object)
ComputeInstanceHandle = NewType("ComputeInstanceHandle", object)

# NVML return codes the driver reacts to (nvml.h).
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_TIMEOUT = 10
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_IN_USE = 19
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_INVALID_STATE = 29

#: NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: a compute instance shares its GPU instance's engines.
_ENGINE_PROFILE_SHARED = 0
#: Enough room for every placement and GPU instance of one profile (at most 8 on current GPUs).
_MAX_INSTANCES = 32
ERROR_UNKNOWN = 999

#: Seconds nvidia-smi may take to change a setting before the driver gives up on it.
NVIDIA_SMI_TIMEOUT = 30.0

# Event type bit for XID critical errors (nvmlEventTypeXidCriticalError).
EVENT_XID_CRITICAL = 0x8
# gpuInstanceId / computeInstanceId of an event that concerns no particular MIG instance.
NO_INSTANCE = 0xFFFFFFFF

# A PCI root bus directory in sysfs: pci<domain>:<bus>.
_PCI_ROOT_BUS = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$")


class GpuLibraryError(Exception):
    """An NVML call failed; `code` is the NVML return code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class MigAttributes:
    """nvmlDeviceGetAttributes for a MIG device."""

    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
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
class GpuInstanceProfileInfo:
    """nvmlDeviceGetGpuInstanceProfileInfo (nvmlGpuInstanceProfileInfo_v2_t)."""

    id: int
    slice_count: int
    instance_count: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
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


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML's bus ID ("00000000:3B:00.0") as the kernel names the device ("0000:3b:00.0").

    That is also the extended BDF form of the standard resource.kubernetes.io/pciBusID attribute.
    """
    # NVML pads the PCI domain to 8 hex digits; sysfs prints it with at least 4 (%04x), in lower case.
    # Keeping only the last 4 would turn VMD domain 10000 into domain 0000: another device, or none.
    domain, _, rest = pci_bus_id.partition(":")
    return f"{domain.lstrip('0').rjust(4, '0')}:{rest}".lower()


class NvmlLibrary:
    """GpuLibrary on the real NVIDIA driver, through pynvml."""

    def __init__(
        self,
        sysfs: Path = Path("/sys"),
        procfs: Path = Path("/proc"),
        dev: Path = Path("/"),
    ) -> None:
        #: The nvidia-smi binary that changes GPU settings (on PATH by default).
        self.nvidia_smi = "nvidia-smi"
        self._sysfs = sysfs
        self._procfs = procfs
        self._dev_root = dev
        self._nvml: Any = None
        self._event_set: Any = None
        self._lock = threading.Lock()

    def _call(self, fn: str, *args: Any) -> Any:
        function = getattr(self._nvml, fn, None)
        if function is None:
            # Bindings older than a call are no different from a driver older than it.
            raise GpuLibraryError(ERROR_FUNCTION_NOT_FOUND, f"{fn}: not in this pynvml (nvidia-ml-py)")
        try:
            return function(*args)
        except self._nvml.NVMLError as err:
            raise GpuLibraryError(int(err.value), f"{fn}: {err}") from err

    def init(self) -> None:
        """Import pynvml and initialise NVML."""
        try:
            import pynvml  # the one import of NVML bindings in the project
        except ImportError as err:  # pragma: no cover - the dependency is always installed
            raise GpuLibraryError(-1, "pynvml (nvidia-ml-py) is not installed") from err
        self._nvml = pynvml
        self._call("nvmlInit")

    def shutdown(self) -> None:
        """Free the event set if still there and shut NVML down."""
        self.unwatch_xid_events()
        self._call("nvmlShutdown")

    def driver_version(self) -> str:
        """nvmlSystemGetDriverVersion."""
        return str(self._call("nvmlSystemGetDriverVersion"))

    def cuda_driver_version(self) -> int:
        """nvmlSystemGetCudaDriverVersion_v2."""
        return int(self._call("nvmlSystemGetCudaDriverVersion_v2"))

    def device_count(self) -> int:
        """nvmlDeviceGetCount."""
        return int(self._call("nvmlDeviceGetCount"))

    def device_by_index(self, index: int) -> GpuHandle:
        """nvmlDeviceGetHandleByIndex."""
        return GpuHandle(self._call("nvmlDeviceGetHandleByIndex", index))

    def name(self, gpu: GpuHandle | MigHandle) -> str:
        """nvmlDeviceGetName."""
        return str(self._call("nvmlDeviceGetName", gpu))

    def uuid(self, gpu: GpuHandle | MigHandle) -> str:
        """nvmlDeviceGetUUID."""
        return str(self._call("nvmlDeviceGetUUID", gpu))

    def brand(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetBrand."""
        return int(self._call("nvmlDeviceGetBrand", gpu))

    def architecture(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetArchitecture."""
        return int(self._call("nvmlDeviceGetArchitecture", gpu))

    def cuda_compute_capability(self, gpu: GpuHandle) -> tuple[int, int]:
        """nvmlDeviceGetCudaComputeCapability."""
        major, minor = self._call("nvmlDeviceGetCudaComputeCapability", gpu)
        return int(major), int(minor)

    def memory_total(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetMemoryInfo().total."""
        return int(self._call("nvmlDeviceGetMemoryInfo", gpu).total)

    def pci_bus_id(self, gpu: GpuHandle) -> str:
        """nvmlDeviceGetPciInfo().busId."""
        bus_id = self._call("nvmlDeviceGetPciInfo", gpu).busId
        return bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)

    def minor_number(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetMinorNumber."""
        return int(self._call("nvmlDeviceGetMinorNumber", gpu))

    def addressing_mode(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetAddressingMode, a recent call: older drivers and bindings lack it."""
        return int(self._call("nvmlDeviceGetAddressingMode", gpu))

    def numa_node(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetNumaNodeId, else the PCI device's numa_node in sysfs."""
        try:
            return int(self._call("nvmlDeviceGetNumaNodeId", gpu))
        except GpuLibraryError:
            path = self._sysfs / "bus/pci/devices" / sysfs_bus_id(self.pci_bus_id(gpu)) / "numa_node"
            try:
                node = int(path.read_text().strip())
            except (OSError, ValueError) as err:
                raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"no NUMA node for {path}") from err
            if node < 0:
                raise GpuLibraryError(ERROR_NOT_SUPPORTED, "the GPU is not attached to a NUMA node") from None
            return node

    def mig_mode(self, gpu: GpuHandle) -> tuple[int, int]:
        """nvmlDeviceGetMigMode."""
        current, pending = self._call("nvmlDeviceGetMigMode", gpu)
        return int(current), int(pending)

    def set_mig_mode(self, gpu: GpuHandle, mode: int) -> None:
        """nvmlDeviceSetMigMode; its activation status is the NVML code of applying the change now.

        A status other than success leaves the mode pending (a GPU reset applies it), which
        mig_mode then shows; the change itself failing raises.
        """
        self._call("nvmlDeviceSetMigMode", gpu, mode)

    def pci_device_id(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetPciInfo().pciDeviceId."""
        return int(self._call("nvmlDeviceGetPciInfo", gpu).pciDeviceId)

    def max_mig_device_count(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetMaxMigDeviceCount."""
        return int(self._call("nvmlDeviceGetMaxMigDeviceCount", gpu))

    def mig_device_by_index(self, gpu: GpuHandle, index: int) -> MigHandle:
        """nvmlDeviceGetMigDeviceHandleByIndex."""
        return MigHandle(self._call("nvmlDeviceGetMigDeviceHandleByIndex", gpu, index))

    def mig_attributes(self, mig: MigHandle) -> MigAttributes:
        """nvmlDeviceGetAttributes."""
        a = self._call("nvmlDeviceGetAttributes", mig)
        return MigAttributes(
            multiprocessors=int(a.multiprocessorCount),
            copy_engines=int(a.sharedCopyEngineCount),
            decoders=int(a.sharedDecoderCount),
            encoders=int(a.sharedEncoderCount),
            jpeg_engines=int(a.sharedJpegCount),
            ofa_engines=int(a.sharedOfaCount),
            gpu_instance_slices=int(a.gpuInstanceSliceCount),
            compute_instance_slices=int(a.computeInstanceSliceCount),
            memory_mib=int(a.memorySizeMB),
        )

    def gpu_instance_id(self, mig: MigHandle) -> int:
        """nvmlDeviceGetGpuInstanceId."""
        return int(self._call("nvmlDeviceGetGpuInstanceId", mig))

    def compute_instance_id(self, mig: MigHandle) -> int:
        """nvmlDeviceGetComputeInstanceId."""
        return int(self._call("nvmlDeviceGetComputeInstanceId", mig))

    def gpu_instance_profile_info(self, gpu: GpuHandle, profile: int) -> GpuInstanceProfileInfo:
        """nvmlDeviceGetGpuInstanceProfileInfoV (the v2 structure, with the profile's name)."""
        i = self._call("nvmlDeviceGetGpuInstanceProfileInfo", gpu, profile)
        name = i.name.decode() if isinstance(i.name, bytes) else str(i.name)
        return GpuInstanceProfileInfo(
            id=int(i.id),
            slice_count=int(i.sliceCount),
            instance_count=int(i.instanceCount),
            multiprocessors=int(i.multiprocessorCount),
            copy_engines=int(i.copyEngineCount),
            decoders=int(i.decoderCount),
            encoders=int(i.encoderCount),
            jpeg_engines=int(i.jpegCount),
            ofa_engines=int(i.ofaCount),
            memory_mib=int(i.memorySizeMB),
            name=name,
        )

    def gpu_instance_possible_placements(self, gpu: GpuHandle, profile_id: int) -> list[Placement]:
        """nvmlDeviceGetGpuInstancePossiblePlacements_v2."""
        placements = (self._nvml.c_nvmlGpuInstancePlacement_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(_MAX_INSTANCES)
        self._call(
            "nvmlDeviceGetGpuInstancePossiblePlacements", gpu, profile_id, placements, ctypes.byref(count)
        )
        return [Placement(int(p.start), int(p.size)) for p in placements[: count.value]]

    def create_gpu_instance_with_placement(
        self, gpu: GpuHandle, profile_id: int, placement: Placement
    ) -> GpuInstanceHandle:
        """nvmlDeviceCreateGpuInstanceWithPlacement."""
        where = self._nvml.c_nvmlGpuInstancePlacement_t()
        where.start, where.size = placement.start, placement.size
        return GpuInstanceHandle(
            self._call("nvmlDeviceCreateGpuInstanceWithPlacement", gpu, profile_id, ctypes.byref(where))
        )

    def gpu_instances(self, gpu: GpuHandle, profile_id: int) -> list[GpuInstanceHandle]:
        """nvmlDeviceGetGpuInstances."""
        found = (self._nvml.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(0)
        self._call("nvmlDeviceGetGpuInstances", gpu, profile_id, found, ctypes.byref(count))
        return [GpuInstanceHandle(found[i]) for i in range(count.value)]

    def gpu_instance_by_id(self, gpu: GpuHandle, gpu_instance_id: int) -> GpuInstanceHandle:
        """nvmlDeviceGetGpuInstanceById."""
        return GpuInstanceHandle(self._call("nvmlDeviceGetGpuInstanceById", gpu, gpu_instance_id))

    def gpu_instance_info(self, gi: GpuInstanceHandle) -> GpuInstanceInfo:
        """nvmlGpuInstanceGetInfo."""
        info = self._call("nvmlGpuInstanceGetInfo", gi)
        placement = Placement(int(info.placement.start), int(info.placement.size))
        return GpuInstanceInfo(id=int(info.id), profile_id=int(info.profileId), placement=placement)

    def create_compute_instance(self, gi: GpuInstanceHandle, profile: int) -> ComputeInstanceHandle:
        """nvmlGpuInstanceGetComputeInstanceProfileInfo (for the ID), nvmlGpuInstanceCreateComputeInstance."""
        info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, profile, _ENGINE_PROFILE_SHARED)
        return ComputeInstanceHandle(self._call("nvmlGpuInstanceCreateComputeInstance", gi, int(info.id)))

    def compute_instances(self, gi: GpuInstanceHandle) -> list[ComputeInstanceHandle]:
        """nvmlGpuInstanceGetComputeInstances for every compute-instance profile the GPU instance has."""
        found: list[ComputeInstanceHandle] = []
        for profile in range(int(getattr(self._nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8))):
            try:
                info = self._call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, profile, _ENGINE_PROFILE_SHARED
                )
            except GpuLibraryError as err:
                if err.code in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                    continue
                raise
            handles = (self._nvml.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
            count = ctypes.c_uint(0)
            self._call("nvmlGpuInstanceGetComputeInstances", gi, int(info.id), handles, ctypes.byref(count))
            found.extend(ComputeInstanceHandle(handles[i]) for i in range(count.value))
        return found

    def compute_instance_info_id(self, ci: ComputeInstanceHandle) -> int:
        """nvmlComputeInstanceGetInfo().id."""
        return int(self._call("nvmlComputeInstanceGetInfo", ci).id)

    def destroy_compute_instance(self, ci: ComputeInstanceHandle) -> None:
        """nvmlComputeInstanceDestroy."""
        self._call("nvmlComputeInstanceDestroy", ci)

    def destroy_gpu_instance(self, gi: GpuInstanceHandle) -> None:
        """nvmlGpuInstanceDestroy."""
        self._call("nvmlGpuInstanceDestroy", gi)

    def pcie_root(self, pci_bus_id: str) -> str | None:
        """The first pciDDDD:BB component of the device's resolved sysfs path."""
        link = self._sysfs / "bus/pci/devices" / sysfs_bus_id(pci_bus_id)
        try:
            resolved = os.path.realpath(link, strict=True)
        except OSError:
            return None
        return next((part for part in Path(resolved).parts if _PCI_ROOT_BUS.match(part)), None)

    def mig_capability_minors(self) -> dict[str, int]:
        """Parse /proc/driver/nvidia-caps/mig-minors ("gpu0/gi1/access 12" per line)."""
        try:
            text = (self._procfs / "driver/nvidia-caps/mig-minors").read_text()
        except OSError:
            return {}
        minors: dict[str, int] = {}
        for line in text.splitlines():
            name, _, minor = line.strip().rpartition(" ")
            if name and minor.isdigit():
                minors[name] = int(minor)
        return minors

    def path_exists(self, path: str) -> bool:
        """Whether the device node exists (under the host root this library was given)."""
        return (self._dev_root / path.lstrip("/")).exists()

    def watch_xid_events(self, gpu: GpuHandle) -> None:
        """Register one GPU for XID critical error events (in one event set for all GPUs)."""
        with self._lock:
            if self._event_set is None:
                self._event_set = self._call("nvmlEventSetCreate")
            self._call("nvmlDeviceRegisterEvents", gpu, EVENT_XID_CRITICAL, self._event_set)

    def wait_xid_event(self, timeout_ms: int) -> XidEvent | None:
        """nvmlEventSetWait_v2; None on timeout."""
        try:
            data = self._call("nvmlEventSetWait_v2", self._event_set, timeout_ms)
        except GpuLibraryError as err:
            if err.code == ERROR_TIMEOUT:
                return None
            raise
        uuid = self.uuid(GpuHandle(data.device))
        return XidEvent(
            uuid=uuid,
            xid=int(data.eventData),
            gpu_instance_id=_instance(data.gpuInstanceId),
            compute_instance_id=_instance(data.computeInstanceId),
        )

    def set_time_slice(self, gpu: GpuHandle, level: int) -> None:
        """`nvidia-smi compute-policy -i <uuid> --set-timeslice <level>`, as NVIDIA's DRA driver does.

        NVML has no public call for the compute time slice; nvidia-smi's output is
        the error message when it fails.
        """
        command = [self.nvidia_smi, "compute-policy", "-i", self.uuid(gpu), "--set-timeslice", str(level)]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise GpuLibraryError(ERROR_UNKNOWN, f"{' '.join(command)}: {err}") from None
        if done.returncode != 0:
            output = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
            raise GpuLibraryError(
                ERROR_UNKNOWN, f"{' '.join(command)} exited with {done.returncode}: {output}"
            )

    def time_slice(self, gpu: GpuHandle) -> int:
        """Not readable: neither NVML nor nvidia-smi report the compute time slice."""
        raise GpuLibraryError(ERROR_NOT_SUPPORTED, "the compute time slice of a GPU cannot be read")

    def unwatch_xid_events(self) -> None:
        """nvmlEventSetFree, once; the caller makes sure no thread is inside nvmlEventSetWait_v2."""
        with self._lock:
            event_set, self._event_set = self._event_set, None
        if event_set is not None:
            self._call("nvmlEventSetFree", event_set)


def _instance(value: int) -> int | None:
    """A MIG instance ID of event data; None for NO_INSTANCE (the event concerns the whole GPU)."""
    return None if int(value) == NO_INSTANCE else int(value)
