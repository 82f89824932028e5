"""GpuLibrary (dra.gpu.library) on the real NVIDIA driver through pynvml, and the host.

This is the only module that imports pynvml.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from dra.gpu import numa
from dra.gpu.library import (
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_INVALID_ARGUMENT,
    ERROR_LIBRARY_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    ERROR_UNKNOWN,
    EVENT_XID_CRITICAL,
    NO_INSTANCE,
    ComputeInstanceHandle,
    GpmSample,
    GpuHandle,
    GpuInstanceHandle,
    GpuInstanceInfo,
    GpuInstanceProfileInfo,
    GpuLibraryError,
    MigAttributes,
    MigHandle,
    Placement,
    ProcessMemory,
    ProcessUtilization,
    XidEvent,
    sysfs_bus_id,
)
from dra.model.devices import MigEngines
from dra.model.pci import PCIE_ROOT

#: NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: a compute instance shares its GPU instance's engines.
_ENGINE_PROFILE_SHARED = 0
#: Enough room for every placement and GPU instance of one profile (at most 8 on current GPUs).
_MAX_INSTANCES = 32

#: Seconds nvidia-smi may take to change a setting before the driver gives up on it.
NVIDIA_SMI_TIMEOUT = 30.0

# A PCI root bus directory in sysfs: pci<domain>:<bus>.


class NvmlLibrary:
    """GpuLibrary on the real NVIDIA driver, through pynvml."""

    def __init__(
        self,
        sysfs: Path = Path("/sys"),
        procfs: Path = Path("/proc"),
        dev: Path = Path("/"),
        library: Path | None = None,
    ) -> None:
        #: The libnvidia-ml.so.1 to load (a driver root's); None: the one the dynamic loader finds.
        self.library = library
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
        if self.library is not None and not pynvml._nvmlLib_refcount:
            try:
                self._load(ctypes.CDLL(str(self.library)))
            except OSError as err:
                raise GpuLibraryError(ERROR_LIBRARY_NOT_FOUND, f"cannot load {self.library}: {err}") from None
        try:
            self._call("nvmlInit")
        except GpuLibraryError:
            self._unload()
            raise

    def _load(self, library: ctypes.CDLL | None) -> None:
        """Give pynvml `library` as the one it loaded, forgetting the functions it looked up before.

        This is pynvml's C boundary: the handle its _LoadNvmlLibrary fills with
        CDLL("libnvidia-ml.so.1"), its cache of the functions found there, and
        its count of nvmlInit calls not yet shut down. A process has one NVML:
        while that count is above 0 the library in use stays, whatever library
        another NvmlLibrary was given (so a daemon's second library, as for a
        re-discovery, shares the first one's handles and event set). None lets
        the next nvmlInit look for libnvidia-ml.so.1 by name again.
        """
        with self._nvml.libLoadLock:
            self._nvml.nvmlLib = library
            self._nvml._nvmlGetFunctionPointer_cache.clear()

    def shutdown(self) -> None:
        """Free the event set if still there and shut NVML down, even when freeing the set fails."""
        try:
            self.unwatch_xid_events()
        finally:
            try:
                self._call("nvmlShutdown")
            finally:
                self._unload()

    def _unload(self) -> None:
        """Take back the library this one handed to pynvml once no NVML is open in the process."""
        if self.library is not None and not self._nvml._nvmlLib_refcount:
            self._load(None)

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
            return self._pci_numa_node(gpu)

    def _pci_numa_node(self, gpu: GpuHandle) -> int:
        path = self._sysfs / "bus/pci/devices" / sysfs_bus_id(self.pci_bus_id(gpu)) / "numa_node"
        try:
            node = int(path.read_text().strip())
        except (OSError, ValueError) as err:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"no NUMA node for {path}") from err
        if node < 0:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "the GPU is not attached to a NUMA node") from None
        return node

    def numa_nodes(self, gpu: GpuHandle) -> tuple[int, ...]:
        """From sysfs as Kubernetes' deviceattribute reads them: the PCI device's node, then its socket's."""
        try:
            node = self._pci_numa_node(gpu)
        except GpuLibraryError:
            return ()
        return numa.same_socket_nodes(self._sysfs, node)

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
            engines=MigEngines(
                multiprocessors=int(a.multiprocessorCount),
                copy_engines=int(a.sharedCopyEngineCount),
                decoders=int(a.sharedDecoderCount),
                encoders=int(a.sharedEncoderCount),
                jpeg_engines=int(a.sharedJpegCount),
                ofa_engines=int(a.sharedOfaCount),
            ),
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
            engines=MigEngines(
                multiprocessors=int(i.multiprocessorCount),
                copy_engines=int(i.copyEngineCount),
                decoders=int(i.decoderCount),
                encoders=int(i.encoderCount),
                jpeg_engines=int(i.jpegCount),
                ofa_engines=int(i.ofaCount),
            ),
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
        return next((part for part in Path(resolved).parts if PCIE_ROOT.fullmatch(part)), None)

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

    def memory_used(self, device: GpuHandle | MigHandle) -> int:
        """nvmlDeviceGetMemoryInfo().used."""
        return int(self._call("nvmlDeviceGetMemoryInfo", device).used)

    def utilization(self, gpu: GpuHandle) -> int:
        """nvmlDeviceGetUtilizationRates().gpu."""
        return int(self._call("nvmlDeviceGetUtilizationRates", gpu).gpu)

    def running_processes(self, device: GpuHandle | MigHandle) -> list[ProcessMemory]:
        """nvmlDeviceGetComputeRunningProcesses (pynvml's wrapper sizes the array and retries)."""
        return [
            ProcessMemory(
                int(p.pid),
                None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                _instance(p.gpuInstanceId),
                _instance(p.computeInstanceId),
            )
            for p in self._call("nvmlDeviceGetComputeRunningProcesses", device)
        ]

    def process_utilization(self, gpu: GpuHandle, since_us: int) -> list[ProcessUtilization]:
        """nvmlDeviceGetProcessUtilization."""
        return [
            ProcessUtilization(int(s.pid), int(s.timeStamp), int(s.smUtil))
            for s in self._call("nvmlDeviceGetProcessUtilization", gpu, since_us)
        ]

    def gpm_supported(self, gpu: GpuHandle) -> bool:
        """nvmlGpmQueryDeviceSupport().isSupportedDevice."""
        return bool(self._call("nvmlGpmQueryDeviceSupport", gpu).isSupportedDevice)

    def gpm_sample(self, gpu: GpuHandle, gpu_instance_id: int | None) -> GpmSample:
        """nvmlGpmSampleAlloc, then nvmlGpmSampleGet or nvmlGpmMigSampleGet (freed when that fails)."""
        sample = self._call("nvmlGpmSampleAlloc")
        try:
            if gpu_instance_id is None:
                self._call("nvmlGpmSampleGet", gpu, sample)
            else:
                self._call("nvmlGpmMigSampleGet", gpu, gpu_instance_id, sample)
        except GpuLibraryError:
            self.gpm_free(GpmSample(sample))
            raise
        return GpmSample(sample)

    def gpm_graphics_utilization(self, first: GpmSample, second: GpmSample) -> float:
        """nvmlGpmMetricsGet of NVML_GPM_METRIC_GRAPHICS_UTIL; the metric's own return code when it fails."""
        request = self._nvml.c_nvmlGpmMetricsGet_t()
        request.version = self._nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = self._nvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        metric = self._call("nvmlGpmMetricsGet", request).metrics[0]
        if metric.nvmlReturn:
            raise GpuLibraryError(int(metric.nvmlReturn), "nvmlGpmMetricsGet: graphics utilization")
        return float(metric.value)

    def gpm_free(self, sample: GpmSample) -> None:
        """nvmlGpmSampleFree."""
        self._call("nvmlGpmSampleFree", sample)


def _instance(value: int) -> int | None:
    """A MIG instance ID of event data; None for NO_INSTANCE (the event concerns the whole GPU)."""
    return None if int(value) == NO_INSTANCE else int(value)
