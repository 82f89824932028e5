"""An NVML stand-in at pynvml's C boundary: the functions of libnvidia-ml.so.1 over fake GPUs.

pynvml (nvidia-ml-py) loads libnvidia-ml.so.1 with ctypes and looks every
NVML function up by name on it. `NvmlStandIn` is what it finds instead: each
attribute is a ctypes.CFUNCTYPE callable with the C signature nvml.h gives
the function (pointers as plain addresses, as the C ABI passes them), so
pynvml's own wrappers marshal real ctypes values, pointers to their
structures and arrays through libffi into it. It reads and writes through
those pointers with fakenvml.abi's structures, transcribed from nvml.h
rather than from pynvml: a field pynvml lays out differently from the header
shows up as a wrong value, and a versioned structure whose version field
pynvml does not set is refused with ARGUMENT_VERSION_MISMATCH, as NVML
refuses it. A function the stand-in lacks (or is told the driver lacks, with
`lacks`) is no attribute, so pynvml answers FUNCTION_NOT_FOUND, as with a
driver older than the call.

What the functions answer is a FakeGpuLibrary's (dra.fakegpus.library): the same
profile, MIG state, refusals and XID events file drive both, so the real
adapter (dra.gpu.nvml.NvmlLibrary) over the stand-in and the fake alone
cannot drift apart (tests/unit/test_nvml_differential.py runs both). Only
what the fake has no notion of is the stand-in's own, each from nvml.h:
handles as opaque pointers that a destroyed instance invalidates, calls
before nvmlInit answering UNINITIALIZED, strings that do not fit the caller's
buffer answering INSUFFICIENT_SIZE, events only for the GPUs registered in
the set waited on, a MIG mode change left pending until `reset_gpu` on GPUs
named in `reset_required` (nvmlDeviceSetMigMode's activation status is then
RESET_REQUIRED), GPUs fallen off the bus (`lost`), and compute-instance
profile information. The GPU- and compute-instance functions are
fakenvml.instances's, the event functions fakenvml.events's, utilization,
processes and GPM fakenvml.usage's. docs/testing.md says what the stand-in cannot
vouch for without a GPU.

dra.gpu.nvml is the only importer of pynvml; the stand-in does not import it.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

from dra.fakegpus.library import FakeGpuLibrary
from dra.gpu.discovery import mig_handles
from dra.gpu.library import (
    ERROR_GPU_IS_LOST,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_UNKNOWN,
    GpuHandle,
    GpuLibraryError,
    MigHandle,
)
from fakenvml.abi import (
    ERROR_RESET_REQUIRED,
    ERROR_UNINITIALIZED,
    GPU,
    MIG,
    SUCCESS,
    AddressingMode,
    DeviceAttributes,
    Memory,
    PciInfo,
    at,
    error_string,
    ptr,
    set_string,
    set_uint,
    uint,
    ull,
    versioned,
)
from fakenvml.events import EventCalls
from fakenvml.instances import InstanceCalls
from fakenvml.usage import UsageCalls


class NvmlStandIn:
    """libnvidia-ml.so.1 for pynvml, over a FakeGpuLibrary.

    `lacks`: NVML functions to leave out, as a driver older than them has no such symbol.
    `reset_required`: GPU indexes whose MIG mode change waits for `reset_gpu`.
    `lost`: GPU indexes fallen off the bus: every call on them, and a wait on a set holding one,
    answers GPU_IS_LOST (a test may add to it while the library is in use).
    Exceptions inside a function (a stand-in bug) answer NVML_ERROR_UNKNOWN and are kept in `faults`.
    """

    def __init__(
        self,
        fake: FakeGpuLibrary,
        lacks: Collection[str] = (),
        reset_required: Collection[int] = (),
        lost: Collection[int] = (),
    ) -> None:
        self.fake = fake
        self.lacks = frozenset(lacks)
        self.reset_required = set(reset_required)
        self.lost = set(lost)
        self.faults: list[str] = []
        #: Told of each fault as it happens (a process that serves the stand-in logs them).
        self.on_fault: Callable[[str], None] | None = None
        #: How often pynvml called each function (for tests to see what ran; a daemon's grow no list).
        self.calls: Counter[str] = Counter()
        self._initialised = 0
        self._pending: dict[int, int] = {}
        self._functions: dict[str, Any] = {}
        self._addresses = itertools.count(0x1000, 0x10)
        self._handles: dict[int, tuple[str, object, int]] = {}
        self._by_key: dict[tuple[str, object], int] = {}
        self._lock = threading.Lock()
        self._instances = InstanceCalls(self)
        self._events = EventCalls(self)
        self._usage = UsageCalls(self)
        self._signatures = self._table()

    # -- the library as pynvml sees it --------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """The C function `name`, as CDLL gives it; AttributeError where there is none."""
        signatures = self.__dict__.get("_signatures", {})
        if name not in signatures or name in self.lacks:
            raise AttributeError(name)
        function = self._functions.get(name)
        if function is None:
            function = self._functions[name] = self._c_function(name, *signatures[name])
        return function

    def c_address(self, name: str) -> int | None:
        """The address of C function `name` (a slot of the fake NVML library); None where there is none."""
        function = getattr(self, name, None)
        return None if function is None else ctypes.cast(function, ctypes.c_void_p).value

    def _c_function(self, name: str, argtypes: tuple[Any, ...], impl: Callable[..., int | None]) -> Any:
        if name == "nvmlErrorString":
            return ctypes.CFUNCTYPE(ptr, ctypes.c_int)(error_string)

        def call(*args: Any) -> int:
            self.calls[name] += 1
            if not self._initialised and name not in ("nvmlInitWithFlags", "nvmlInit_v2"):
                return ERROR_UNINITIALIZED
            try:
                return impl(*args) or SUCCESS
            except GpuLibraryError as err:
                return err.code
            except Exception as err:  # a bug here must not pass for NVML's success
                self.faults.append(f"{name}: {err!r}")
                if self.on_fault is not None:
                    self.on_fault(self.faults[-1])
                return ERROR_UNKNOWN

        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(call)

    def _table(self) -> dict[str, tuple[tuple[Any, ...], Callable[..., int | None]]]:
        p, u, i = ptr, uint, ctypes.c_int
        mig, events, usage = self._instances, self._events, self._usage
        return {
            "nvmlErrorString": ((i,), error_string),
            "nvmlInitWithFlags": ((u,), self._init),
            # go-nvml's Init (nvml.h maps nvmlInit to it).
            "nvmlInit_v2": ((), lambda: self._init(0)),
            "nvmlShutdown": ((), self._shutdown),
            "nvmlSystemGetDriverVersion": ((p, u), self._driver_version),
            "nvmlSystemGetCudaDriverVersion_v2": ((p,), self._cuda_version),
            "nvmlSystemGetCudaDriverVersion": ((p,), self._cuda_version),
            "nvmlDeviceGetCount_v2": ((p,), self._count),
            "nvmlDeviceGetHandleByIndex_v2": ((u, p), self._by_index),
            "nvmlDeviceGetHandleByUUID": ((p, p), self._by_uuid),
            "nvmlDeviceGetHandleByPciBusId_v2": ((p, p), self._by_pci_bus_id),
            "nvmlDeviceGetName": ((p, p, u), self._name),
            "nvmlDeviceGetUUID": ((p, p, u), self._uuid),
            "nvmlDeviceGetBrand": ((p, p), self._gpu_uint(lambda g: self.fake.brand(g))),
            "nvmlDeviceGetArchitecture": ((p, p), self._gpu_uint(lambda g: self.fake.architecture(g))),
            "nvmlDeviceGetMinorNumber": ((p, p), self._gpu_uint(lambda g: self.fake.minor_number(g))),
            # NVML_GPU_VIRTUALIZATION_MODE_NONE: the fake GPUs are bare metal, no vGPU, no passthrough host.
            "nvmlDeviceGetVirtualizationMode": ((p, p), self._gpu_uint(lambda g: 0)),
            "nvmlDeviceGetCudaComputeCapability": ((p, p, p), self._compute_capability),
            "nvmlDeviceGetMemoryInfo": ((p, p), self._memory),
            "nvmlDeviceGetPciInfo_v3": ((p, p), self._pci_info),
            "nvmlDeviceGetNumaNodeId": ((p, p), self._numa_node),
            "nvmlDeviceGetAddressingMode": ((p, p), self._addressing_mode),
            "nvmlDeviceGetMigMode": ((p, p, p), self._mig_mode),
            "nvmlDeviceSetMigMode": ((p, u, p), self._set_mig_mode),
            "nvmlDeviceGetMaxMigDeviceCount": ((p, p), self._gpu_uint(self.fake.max_mig_device_count)),
            "nvmlDeviceGetMigDeviceHandleByIndex": ((p, u, p), self._mig_by_index),
            "nvmlDeviceIsMigDeviceHandle": ((p, p), self._is_mig),
            "nvmlDeviceGetIndex": ((p, p), self._index),
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": ((p, p), self._parent),
            "nvmlDeviceGetAttributes_v2": ((p, p), self._attributes),
            "nvmlDeviceGetGpuInstanceId": ((p, p), self._mig_uint(self.fake.gpu_instance_id)),
            "nvmlDeviceGetComputeInstanceId": ((p, p), self._mig_uint(self.fake.compute_instance_id)),
            "nvmlDeviceGetGpuInstanceProfileInfoV": ((p, u, p), mig.gpu_instance_profile_info),
            "nvmlDeviceGetGpuInstanceProfileInfo": ((p, u, p), mig.gpu_instance_profile_info_v1),
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2": (
                (p, u, p, p),
                mig.possible_placements,
            ),
            "nvmlDeviceCreateGpuInstanceWithPlacement": ((p, u, p, p), mig.create_gpu_instance),
            "nvmlDeviceGetGpuInstances": ((p, u, p, p), mig.gpu_instances),
            "nvmlDeviceGetGpuInstanceById": ((p, u, p), mig.gpu_instance_by_id),
            "nvmlGpuInstanceGetInfo": ((p, p), mig.gpu_instance_info),
            "nvmlGpuInstanceDestroy": ((p,), mig.destroy_gpu_instance),
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV": (
                (p, u, u, p),
                mig.compute_instance_profile_info,
            ),
            "nvmlGpuInstanceGetComputeInstanceProfileInfo": (
                (p, u, u, p),
                mig.compute_instance_profile_info_v1,
            ),
            "nvmlGpuInstanceCreateComputeInstance": ((p, u, p), mig.create_compute_instance),
            "nvmlGpuInstanceGetComputeInstanceById": ((p, u, p), mig.compute_instance_by_id),
            "nvmlGpuInstanceGetComputeInstances": ((p, u, p, p), mig.compute_instances),
            "nvmlComputeInstanceGetInfo_v2": ((p, p), mig.compute_instance_info),
            "nvmlComputeInstanceDestroy": ((p,), mig.destroy_compute_instance),
            "nvmlEventSetCreate": ((p,), events.event_set_create),
            "nvmlDeviceRegisterEvents": ((p, ull, p), events.register_events),
            "nvmlEventSetWait_v2": ((p, p, u), events.event_set_wait),
            "nvmlEventSetFree": ((p,), events.event_set_free),
            "nvmlDeviceGetUtilizationRates": ((p, p), usage.utilization),
            "nvmlDeviceGetComputeRunningProcesses_v3": ((p, p, p), usage.running_processes),
            "nvmlDeviceGetProcessUtilization": ((p, p, p, ull), usage.process_utilization),
            "nvmlGpmQueryDeviceSupport": ((p, p), usage.gpm_support),
            "nvmlGpmSampleAlloc": ((p,), usage.gpm_alloc),
            "nvmlGpmSampleFree": ((p,), usage.gpm_free),
            "nvmlGpmSampleGet": ((p, p), usage.gpm_sample),
            "nvmlGpmMigSampleGet": ((p, u, p), usage.gpm_mig_sample),
            "nvmlGpmMetricsGet": ((p,), usage.gpm_metrics),
        }

    # -- what only the stand-in knows --------------------------------------------------------

    def reset_gpu(self, index: int) -> None:
        """A GPU reset: a pending MIG mode becomes the current one (the fake's own pending one too)."""
        mode = self._pending.pop(index, None)
        if mode is not None:
            self.fake.set_mig_mode(GpuHandle(index), mode)
        self.fake.reset_gpu(index)

    # -- handles -------------------------------------------------------------------------------

    def handle(self, kind: str, fake_handle: object, parent: int = 0) -> int:
        """The opaque pointer NVML hands out for a device or instance: one per thing, stable."""
        with self._lock:
            key = (kind, fake_handle)
            address = self._by_key.get(key)
            if address is None:
                address = self._by_key[key] = next(self._addresses)
                self._handles[address] = (kind, fake_handle, parent)
            return address

    def lookup(self, address: int | None, *kinds: str) -> tuple[object, int]:
        """What a handle names and its parent's handle (0 for a GPU); INVALID_ARGUMENT unless of `kinds`."""
        entry = self._handles.get(address or 0)
        if entry is None or entry[0] not in kinds:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"not a handle of a {' or '.join(kinds)}")
        return entry[1], entry[2]

    def forget(self, address: int) -> None:
        """A handle freed (an event set, a GPM sample buffer): no longer valid."""
        with self._lock:
            kind, fake_handle, _ = self._handles.pop(address)
            self._by_key.pop((kind, fake_handle), None)

    def gpu(self, address: int | None) -> GpuHandle:
        """The fake's GPU of a GPU handle; GPU_IS_LOST for a GPU fallen off the bus."""
        handle = self.lookup(address, GPU)[0]
        if handle in self.lost:
            raise GpuLibraryError(ERROR_GPU_IS_LOST, f"GPU {handle} has fallen off the bus")
        return GpuHandle(handle)

    def device(self, address: int | None) -> GpuHandle | MigHandle:
        """A GPU or a MIG device that still exists (a destroyed one's handle is invalid)."""
        handle, parent = self.lookup(address, GPU, MIG)
        if not parent:
            return self.gpu(address)
        if MigHandle(handle) not in mig_handles(self.fake, self.gpu(parent)):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "the MIG device of this handle is gone")
        return MigHandle(handle)

    def _gpu_uint(self, query: Callable[[GpuHandle], int]) -> Callable[[int, int], None]:
        return lambda device, out: set_uint(out, query(self.gpu(device)))

    def _mig_uint(self, query: Callable[[MigHandle], int]) -> Callable[[int, int], None]:
        def answer(device: int, out: int) -> None:
            handle = self.device(device)
            if not self._handles[device][2]:
                raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "not a MIG device handle")
            set_uint(out, query(MigHandle(handle)))

        return answer

    # -- system -----------------------------------------------------------------------------

    def _init(self, flags: int) -> None:
        self._initialised += 1

    def _shutdown(self) -> None:
        self._initialised -= 1

    def _driver_version(self, out: int, length: int) -> None:
        set_string(out, length, self.fake.driver_version())

    def _cuda_version(self, out: int) -> None:
        at(out, ctypes.c_int).value = self.fake.cuda_driver_version()

    def _count(self, out: int) -> None:
        set_uint(out, self.fake.device_count())

    def _by_index(self, index: int, out: int) -> None:
        at(out, ptr).value = self.handle(GPU, self.fake.device_by_index(index))

    def _by_uuid(self, uuid: int, out: int) -> None:
        wanted = ctypes.string_at(uuid).decode(errors="replace") if uuid else ""
        for index in range(self.fake.device_count()):
            gpu = self.fake.device_by_index(index)
            if self.fake.uuid(gpu) == wanted:
                at(out, ptr).value = self.handle(GPU, gpu)
                return
            for mig in mig_handles(self.fake, gpu):
                if self.fake.uuid(mig) == wanted:
                    at(out, ptr).value = self.handle(MIG, mig, self.handle(GPU, gpu))
                    return
        raise GpuLibraryError(ERROR_NOT_FOUND, f"no device with UUID {wanted!r}")

    def _by_pci_bus_id(self, bus_id: int, out: int) -> None:
        wanted = ctypes.string_at(bus_id).decode(errors="replace") if bus_id else ""
        for index in range(self.fake.device_count()):
            gpu = self.fake.device_by_index(index)
            if _same_bus(wanted, self.fake.pci_bus_id(gpu)):
                at(out, ptr).value = self.handle(GPU, gpu)
                return
        raise GpuLibraryError(ERROR_NOT_FOUND, f"no GPU at PCI bus ID {wanted!r}")

    # -- devices ----------------------------------------------------------------------------

    def _name(self, device: int, out: int, length: int) -> None:
        set_string(out, length, self.fake.name(self.device(device)))

    def _uuid(self, device: int, out: int, length: int) -> None:
        set_string(out, length, self.fake.uuid(self.device(device)))

    def _compute_capability(self, device: int, major: int, minor: int) -> None:
        cc = self.fake.cuda_compute_capability(self.gpu(device))
        at(major, ctypes.c_int).value, at(minor, ctypes.c_int).value = cc

    def _memory(self, device: int, out: int) -> None:
        handle = self.device(device)
        if isinstance(handle, int):
            total = self.fake.memory_total(GpuHandle(handle))
        else:
            total = self.fake.mig_attributes(MigHandle(handle)).memory_mib * 1024 * 1024
        memory = at(out, Memory)
        memory.total, memory.used = total, self.fake.memory_used(handle)
        memory.free = total - memory.used

    def _pci_info(self, device: int, out: int) -> None:
        gpu = self.gpu(device)
        bus_id = self.fake.pci_bus_id(gpu)
        domain, bus, rest = bus_id.split(":")
        info = at(out, PciInfo)
        info.busId = bus_id.encode()
        # The legacy field holds the bus ID with a 4-digit domain (NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT).
        info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
        info.domain, info.bus = int(domain, 16), int(bus, 16)
        info.device = int(rest.partition(".")[0], 16)
        info.pciDeviceId = self.fake.pci_device_id(gpu)
        info.pciSubSystemId = 0

    def _numa_node(self, device: int, out: int) -> None:
        # nvml.h: "This only applies to platforms where the GPUs are NUMA nodes" (GPU memory onlined
        # as a node, as on Grace Hopper); the catalog's GPUs sit on PCIe or SXM under x86, whose NUMA
        # node the kernel gives (host_tree writes it), so NVML has none to say.
        self.gpu(device)
        raise GpuLibraryError(ERROR_NOT_SUPPORTED, "the GPU is not a NUMA node")

    def _addressing_mode(self, device: int, out: int) -> None:
        mode = versioned(out, AddressingMode, 1)
        mode.value = self.fake.addressing_mode(self.gpu(device))

    # -- MIG mode and MIG devices -------------------------------------------------------------

    def _mig_mode(self, device: int, current: int, pending: int) -> None:
        gpu = self.gpu(device)
        now, waiting = self.fake.mig_mode(gpu)
        set_uint(current, now)
        assert isinstance(gpu, int)
        set_uint(pending, self._pending.get(gpu, waiting))

    def _set_mig_mode(self, device: int, mode: int, status: int) -> None:
        gpu = self.gpu(device)
        assert isinstance(gpu, int)
        if gpu not in self.reset_required:
            self.fake.set_mig_mode(gpu, mode)
            # An Ampere GPU the fake cannot reset leaves the change pending, as NVML says in the status.
            now, _ = self.fake.mig_mode(gpu)
            set_uint(status, SUCCESS if now == mode else ERROR_RESET_REQUIRED)
            return
        current, _ = self.fake.mig_mode(gpu)  # NOT_SUPPORTED without MIG, as the fake answers
        if mode not in (0, 1):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no MIG mode {mode}")
        if mode == current:
            self._pending.pop(gpu, None)
        else:
            self._pending[gpu] = mode
        # The change is accepted (SUCCESS); applying it now failed, which the activation status says.
        set_uint(status, SUCCESS if mode == current else ERROR_RESET_REQUIRED)

    def _mig_by_index(self, device: int, index: int, out: int) -> None:
        gpu = self.gpu(device)
        mig = self.fake.mig_device_by_index(gpu, index)
        at(out, ptr).value = self.handle(MIG, mig, device)

    def _index(self, device: int, out: int) -> None:
        # nvml.h: a MIG device's index is the one nvmlDeviceGetMigDeviceHandleByIndex takes.
        handle = self.device(device)
        parent = self._handles[device][2]
        if not parent:
            set_uint(out, int(str(handle)))
            return
        gpu = self.gpu(parent)
        for slot in range(self.fake.max_mig_device_count(gpu)):
            try:
                if self.fake.mig_device_by_index(gpu, slot) == handle:
                    set_uint(out, slot)
                    return
            except GpuLibraryError:
                continue
        raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "the MIG device of this handle is gone")

    def _is_mig(self, device: int, out: int) -> None:
        self.device(device)
        set_uint(out, int(bool(self._handles[device][2])))

    def _parent(self, device: int, out: int) -> None:
        self.device(device)
        parent = self._handles[device][2]
        if not parent:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "not a MIG device handle")
        at(out, ptr).value = parent

    def _attributes(self, device: int, out: int) -> None:
        handle = self.device(device)
        if not self._handles[device][2]:
            # nvml.h: "NVML_ERROR_NOT_SUPPORTED if this query is not supported by the device" (a GPU).
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "attributes of a GPU, not of a MIG device")
        a = self.fake.mig_attributes(MigHandle(handle))
        e = a.engines
        attributes = at(out, DeviceAttributes)
        attributes.multiprocessorCount, attributes.sharedCopyEngineCount = e.multiprocessors, e.copy_engines
        attributes.sharedDecoderCount, attributes.sharedEncoderCount = e.decoders, e.encoders
        attributes.sharedJpegCount, attributes.sharedOfaCount = e.jpeg_engines, e.ofa_engines
        attributes.gpuInstanceSliceCount = a.gpu_instance_slices
        attributes.computeInstanceSliceCount = a.compute_instance_slices
        attributes.memorySizeMB = a.memory_mib


def _same_bus(asked: str, bus_id: str) -> bool:
    """Whether two PCI bus IDs name one device: nvml.h takes a 4- or 8-digit domain, in either case."""
    (domain, _, rest), (own_domain, _, own_rest) = asked.partition(":"), bus_id.partition(":")
    try:
        return int(domain, 16) == int(own_domain, 16) and rest.lower() == own_rest.lower()
    except ValueError:
        return False
