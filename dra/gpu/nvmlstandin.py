"""An NVML stand-in at pynvml's C boundary: the functions of libnvidia-ml.so.1 over fake GPUs.

pynvml (nvidia-ml-py) loads libnvidia-ml.so.1 with ctypes and looks every
NVML function up by name on it. `NvmlStandIn` is what it finds instead: each
attribute is a ctypes.CFUNCTYPE callable with the C signature nvml.h gives
the function (pointers as plain addresses, as the C ABI passes them), so
pynvml's own wrappers marshal real ctypes values, pointers to their
structures and arrays through libffi into it. It reads and writes through
those pointers with this module's structures, transcribed from nvml.h
rather than from pynvml: a field pynvml lays out differently from the header
shows up as a wrong value, and a versioned structure whose version field
pynvml does not set is refused with ARGUMENT_VERSION_MISMATCH, as NVML
refuses it. A function the stand-in lacks (or is told the driver lacks, with
`lacks`) is no attribute, so pynvml answers FUNCTION_NOT_FOUND, as with a
driver older than the call.

What the functions answer is a FakeGpuLibrary's (dra.gpu.fake): the same
profile, MIG state, refusals and XID events file drive both, so the real
adapter (dra.gpu.nvml.NvmlLibrary) over the stand-in and the fake alone
cannot drift apart (tests/unit/test_nvml_differential.py runs both). Only
what the fake has no notion of is the stand-in's own, each from nvml.h:
handles as opaque pointers that a destroyed instance invalidates, calls
before nvmlInit answering UNINITIALIZED, strings that do not fit the caller's
buffer answering INSUFFICIENT_SIZE, events only for the GPUs registered in
the set waited on, a MIG mode change left pending until `reset_gpu` on GPUs
named in `reset_required` (nvmlDeviceSetMigMode's activation status is then
RESET_REQUIRED), and compute-instance profile information. docs/testing.md
says what it cannot vouch for without a GPU.

dra.gpu.nvml is the only importer of pynvml; this module does not import it.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from dra.gpu import migtables
from dra.gpu.discovery import mig_handles
from dra.gpu.fake import FakeGpuLibrary
from dra.gpu.library import (
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_IN_USE,
    ERROR_INSUFFICIENT_RESOURCES,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    ERROR_UNKNOWN,
    EVENT_XID_CRITICAL,
    NO_INSTANCE,
    ComputeInstanceHandle,
    GpuHandle,
    GpuInstanceHandle,
    GpuLibraryError,
    MigHandle,
    Placement,
    sysfs_bus_id,
)

# nvmlReturn_t values (nvml.h) that only the stand-in answers.
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INSUFFICIENT_SIZE = 7
ERROR_RESET_REQUIRED = 16
ERROR_ARGUMENT_VERSION_MISMATCH = 25

# Buffer sizes of nvml.h.
_PCI_BUS_ID_LEGACY = 16  # NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
_PCI_BUS_ID = 32  # NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
_NAME_V2 = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE

_uint = ctypes.c_uint
_ull = ctypes.c_ulonglong
_ptr = ctypes.c_void_p


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (the v3 layout, with busId at the end)."""

    _fields_ = (
        ("busIdLegacy", ctypes.c_char * _PCI_BUS_ID_LEGACY),
        ("domain", _uint),
        ("bus", _uint),
        ("device", _uint),
        ("pciDeviceId", _uint),
        ("pciSubSystemId", _uint),
        ("busId", ctypes.c_char * _PCI_BUS_ID),
    )


class Memory(ctypes.Structure):
    """nvmlMemory_t (v1, unversioned)."""

    _fields_ = (("total", _ull), ("free", _ull), ("used", _ull))


class DeviceAttributes(ctypes.Structure):
    """nvmlDeviceAttributes_t."""

    _fields_ = (
        ("multiprocessorCount", _uint),
        ("sharedCopyEngineCount", _uint),
        ("sharedDecoderCount", _uint),
        ("sharedEncoderCount", _uint),
        ("sharedJpegCount", _uint),
        ("sharedOfaCount", _uint),
        ("gpuInstanceSliceCount", _uint),
        ("computeInstanceSliceCount", _uint),
        ("memorySizeMB", _ull),
    )


class AddressingMode(ctypes.Structure):
    """nvmlDeviceAddressingMode_v1_t."""

    _fields_ = (("version", _uint), ("value", _uint))


class GpuInstancePlacement(ctypes.Structure):
    """nvmlGpuInstancePlacement_t (also nvmlComputeInstancePlacement_t: the same two fields)."""

    _fields_ = (("start", _uint), ("size", _uint))


class GpuInstanceProfileInfoV2(ctypes.Structure):
    """nvmlGpuInstanceProfileInfo_v2_t."""

    _fields_ = (
        ("version", _uint),
        ("id", _uint),
        ("isP2pSupported", _uint),
        ("sliceCount", _uint),
        ("instanceCount", _uint),
        ("multiprocessorCount", _uint),
        ("copyEngineCount", _uint),
        ("decoderCount", _uint),
        ("encoderCount", _uint),
        ("jpegCount", _uint),
        ("ofaCount", _uint),
        ("memorySizeMB", _ull),
        ("name", ctypes.c_char * _NAME_V2),
    )


class GpuInstanceInfo(ctypes.Structure):
    """nvmlGpuInstanceInfo_t."""

    _fields_ = (("device", _ptr), ("id", _uint), ("profileId", _uint), ("placement", GpuInstancePlacement))


class ComputeInstanceProfileInfoV2(ctypes.Structure):
    """nvmlComputeInstanceProfileInfo_v2_t."""

    _fields_ = (
        ("version", _uint),
        ("id", _uint),
        ("sliceCount", _uint),
        ("instanceCount", _uint),
        ("multiprocessorCount", _uint),
        ("sharedCopyEngineCount", _uint),
        ("sharedDecoderCount", _uint),
        ("sharedEncoderCount", _uint),
        ("sharedJpegCount", _uint),
        ("sharedOfaCount", _uint),
        ("name", ctypes.c_char * _NAME_V2),
    )


class ComputeInstanceInfo(ctypes.Structure):
    """nvmlComputeInstanceInfo_t."""

    _fields_ = (
        ("device", _ptr),
        ("gpuInstance", _ptr),
        ("id", _uint),
        ("profileId", _uint),
        ("placement", GpuInstancePlacement),
    )


class EventData(ctypes.Structure):
    """nvmlEventData_t."""

    _fields_ = (
        ("device", _ptr),
        ("eventType", _ull),
        ("eventData", _ull),
        ("gpuInstanceId", _uint),
        ("computeInstanceId", _uint),
    )


def struct_version(structure: type[ctypes.Structure], version: int) -> int:
    """NVML_STRUCT_VERSION: the structure's size with the version in the top byte."""
    return ctypes.sizeof(structure) | version << 24


_ERROR_STRINGS = {
    SUCCESS: b"Success",
    ERROR_UNINITIALIZED: b"Uninitialized",
    ERROR_INVALID_ARGUMENT: b"Invalid Argument",
    ERROR_NOT_SUPPORTED: b"Not Supported",
    ERROR_NOT_FOUND: b"Not Found",
    ERROR_INSUFFICIENT_SIZE: b"Insufficient Size",
    ERROR_TIMEOUT: b"Timeout",
    ERROR_FUNCTION_NOT_FOUND: b"Function Not Found",
    ERROR_GPU_IS_LOST: b"GPU is lost",
    ERROR_RESET_REQUIRED: b"GPU requires restart",
    ERROR_IN_USE: b"In use",
    ERROR_INSUFFICIENT_RESOURCES: b"Insufficient resources",
    ERROR_ARGUMENT_VERSION_MISMATCH: b"Argument version mismatch",
}
# nvmlErrorString returns pointers to static strings: these buffers live as long as the process.
_STRING_BUFFERS = {code: ctypes.create_string_buffer(text) for code, text in _ERROR_STRINGS.items()}
_UNKNOWN_STRING = ctypes.create_string_buffer(b"Unknown Error")

# What a handle points at, as the stand-in tells them apart.
_GPU, _MIG, _GI, _CI, _EVENT_SET = "gpu", "mig", "gpu instance", "compute instance", "event set"


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
        #: How often pynvml called each function (for tests to see what ran; a daemon's grow no list).
        self.calls: Counter[str] = Counter()
        self._initialised = 0
        self._pending: dict[int, int] = {}
        self._functions: dict[str, Any] = {}
        self._addresses = itertools.count(0x1000, 0x10)
        self._handles: dict[int, tuple[str, object, int]] = {}
        self._by_key: dict[tuple[str, object], int] = {}
        self._event_sets: dict[int, set[int]] = {}
        self._lock = threading.Lock()
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

    def _c_function(self, name: str, argtypes: tuple[Any, ...], impl: Callable[..., int | None]) -> Any:
        if name == "nvmlErrorString":
            return ctypes.CFUNCTYPE(_ptr, ctypes.c_int)(self._error_string)

        def call(*args: Any) -> int:
            self.calls[name] += 1
            if not self._initialised and name != "nvmlInitWithFlags":
                return ERROR_UNINITIALIZED
            try:
                return impl(*args) or SUCCESS
            except GpuLibraryError as err:
                return err.code
            except Exception as err:  # a bug here must not pass for NVML's success
                self.faults.append(f"{name}: {err!r}")
                return ERROR_UNKNOWN

        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(call)

    @staticmethod
    def _error_string(code: int) -> int | None:
        return ctypes.addressof(_STRING_BUFFERS.get(code, _UNKNOWN_STRING))

    def _table(self) -> dict[str, tuple[tuple[Any, ...], Callable[..., int | None]]]:
        p, u, i = _ptr, _uint, ctypes.c_int
        return {
            "nvmlErrorString": ((i,), self._error_string),
            "nvmlInitWithFlags": ((u,), self._init),
            "nvmlShutdown": ((), self._shutdown),
            "nvmlSystemGetDriverVersion": ((p, u), self._driver_version),
            "nvmlSystemGetCudaDriverVersion_v2": ((p,), self._cuda_version),
            "nvmlDeviceGetCount_v2": ((p,), self._count),
            "nvmlDeviceGetHandleByIndex_v2": ((u, p), self._by_index),
            "nvmlDeviceGetName": ((p, p, u), self._name),
            "nvmlDeviceGetUUID": ((p, p, u), self._uuid),
            "nvmlDeviceGetBrand": ((p, p), self._gpu_uint(lambda g: self.fake.brand(g))),
            "nvmlDeviceGetArchitecture": ((p, p), self._gpu_uint(lambda g: self.fake.architecture(g))),
            "nvmlDeviceGetMinorNumber": ((p, p), self._gpu_uint(lambda g: self.fake.minor_number(g))),
            "nvmlDeviceGetCudaComputeCapability": ((p, p, p), self._compute_capability),
            "nvmlDeviceGetMemoryInfo": ((p, p), self._memory),
            "nvmlDeviceGetPciInfo_v3": ((p, p), self._pci_info),
            "nvmlDeviceGetNumaNodeId": ((p, p), self._numa_node),
            "nvmlDeviceGetAddressingMode": ((p, p), self._addressing_mode),
            "nvmlDeviceGetMigMode": ((p, p, p), self._mig_mode),
            "nvmlDeviceSetMigMode": ((p, u, p), self._set_mig_mode),
            "nvmlDeviceGetMaxMigDeviceCount": ((p, p), self._gpu_uint(self.fake.max_mig_device_count)),
            "nvmlDeviceGetMigDeviceHandleByIndex": ((p, u, p), self._mig_by_index),
            "nvmlDeviceGetAttributes_v2": ((p, p), self._attributes),
            "nvmlDeviceGetGpuInstanceId": ((p, p), self._mig_uint(self.fake.gpu_instance_id)),
            "nvmlDeviceGetComputeInstanceId": ((p, p), self._mig_uint(self.fake.compute_instance_id)),
            "nvmlDeviceGetGpuInstanceProfileInfoV": ((p, u, p), self._gi_profile_info),
            "nvmlDeviceGetGpuInstancePossiblePlacements_v2": ((p, u, p, p), self._placements),
            "nvmlDeviceCreateGpuInstanceWithPlacement": ((p, u, p, p), self._create_gi),
            "nvmlDeviceGetGpuInstances": ((p, u, p, p), self._gpu_instances),
            "nvmlDeviceGetGpuInstanceById": ((p, u, p), self._gi_by_id),
            "nvmlGpuInstanceGetInfo": ((p, p), self._gi_info),
            "nvmlGpuInstanceDestroy": ((p,), self._destroy_gi),
            "nvmlGpuInstanceGetComputeInstanceProfileInfoV": ((p, u, u, p), self._ci_profile_info),
            "nvmlGpuInstanceCreateComputeInstance": ((p, u, p), self._create_ci),
            "nvmlGpuInstanceGetComputeInstances": ((p, u, p, p), self._compute_instances),
            "nvmlComputeInstanceGetInfo_v2": ((p, p), self._ci_info),
            "nvmlComputeInstanceDestroy": ((p,), self._destroy_ci),
            "nvmlEventSetCreate": ((p,), self._event_set_create),
            "nvmlDeviceRegisterEvents": ((p, _ull, p), self._register_events),
            "nvmlEventSetWait_v2": ((p, p, u), self._event_set_wait),
            "nvmlEventSetFree": ((p,), self._event_set_free),
        }

    # -- what only the stand-in knows --------------------------------------------------------

    def reset_gpu(self, index: int) -> None:
        """A GPU reset: a pending MIG mode becomes the current one."""
        mode = self._pending.pop(index, None)
        if mode is not None:
            self.fake.set_mig_mode(GpuHandle(index), mode)

    # -- handles -------------------------------------------------------------------------------

    def _handle(self, kind: str, fake_handle: object, parent: int = 0) -> int:
        """The opaque pointer NVML hands out for a device or instance: one per thing, stable."""
        with self._lock:
            key = (kind, fake_handle)
            address = self._by_key.get(key)
            if address is None:
                address = self._by_key[key] = next(self._addresses)
                self._handles[address] = (kind, fake_handle, parent)
            return address

    def _lookup(self, address: int | None, *kinds: str) -> tuple[object, int]:
        entry = self._handles.get(address or 0)
        if entry is None or entry[0] not in kinds:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"not a handle of a {' or '.join(kinds)}")
        return entry[1], entry[2]

    def _gpu(self, address: int | None) -> GpuHandle:
        handle = self._lookup(address, _GPU)[0]
        if handle in self.lost:
            raise GpuLibraryError(ERROR_GPU_IS_LOST, f"GPU {handle} has fallen off the bus")
        return GpuHandle(handle)

    def _device(self, address: int | None) -> GpuHandle | MigHandle:
        """A GPU or a MIG device that still exists (a destroyed one's handle is invalid)."""
        handle, parent = self._lookup(address, _GPU, _MIG)
        if not parent:
            return self._gpu(address)
        if MigHandle(handle) not in mig_handles(self.fake, self._gpu(parent)):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "the MIG device of this handle is gone")
        return MigHandle(handle)

    # -- writing through the caller's pointers ---------------------------------------------

    @staticmethod
    def _out(address: int | None, ctype: Any) -> Any:
        """The caller's object at `address`, as nvml.h lays it out; a NULL pointer is INVALID_ARGUMENT."""
        if not address:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "NULL output pointer")
        return ctype.from_address(address)

    def _set_uint(self, address: int | None, value: int) -> None:
        self._out(address, _uint).value = value

    def _set_string(self, address: int | None, length: int, text: str) -> None:
        data = text.encode()
        if len(data) + 1 > length:
            raise GpuLibraryError(ERROR_INSUFFICIENT_SIZE, f"{length} bytes cannot hold {text!r}")
        self._out(address, ctypes.c_char * (len(data) + 1)).raw = data + b"\0"

    @staticmethod
    def _versioned(address: int | None, structure: type[ctypes.Structure], version: int) -> Any:
        info = NvmlStandIn._out(address, structure)
        if info.version != struct_version(structure, version):
            raise GpuLibraryError(
                ERROR_ARGUMENT_VERSION_MISMATCH,
                f"{structure.__name__} version {info.version:#x}, "
                f"expected {struct_version(structure, version):#x}",
            )
        return info

    def _gpu_uint(self, query: Callable[[GpuHandle], int]) -> Callable[[int, int], None]:
        return lambda device, out: self._set_uint(out, query(self._gpu(device)))

    def _mig_uint(self, query: Callable[[MigHandle], int]) -> Callable[[int, int], None]:
        def answer(device: int, out: int) -> None:
            handle = self._device(device)
            if not self._handles[device][2]:
                raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "not a MIG device handle")
            self._set_uint(out, query(MigHandle(handle)))

        return answer

    # -- system -----------------------------------------------------------------------------

    def _init(self, flags: int) -> None:
        self._initialised += 1

    def _shutdown(self) -> None:
        self._initialised -= 1

    def _driver_version(self, out: int, length: int) -> None:
        self._set_string(out, length, self.fake.driver_version())

    def _cuda_version(self, out: int) -> None:
        self._out(out, ctypes.c_int).value = self.fake.cuda_driver_version()

    def _count(self, out: int) -> None:
        self._set_uint(out, self.fake.device_count())

    def _by_index(self, index: int, out: int) -> None:
        self._out(out, _ptr).value = self._handle(_GPU, self.fake.device_by_index(index))

    # -- devices ----------------------------------------------------------------------------

    def _name(self, device: int, out: int, length: int) -> None:
        self._set_string(out, length, self.fake.name(self._device(device)))

    def _uuid(self, device: int, out: int, length: int) -> None:
        self._set_string(out, length, self.fake.uuid(self._device(device)))

    def _compute_capability(self, device: int, major: int, minor: int) -> None:
        cc = self.fake.cuda_compute_capability(self._gpu(device))
        self._out(major, ctypes.c_int).value, self._out(minor, ctypes.c_int).value = cc

    def _memory(self, device: int, out: int) -> None:
        memory = self._out(out, Memory)
        memory.total = memory.free = self.fake.memory_total(self._gpu(device))
        memory.used = 0

    def _pci_info(self, device: int, out: int) -> None:
        gpu = self._gpu(device)
        bus_id = self.fake.pci_bus_id(gpu)
        domain, bus, rest = bus_id.split(":")
        info = self._out(out, PciInfo)
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
        self._gpu(device)
        raise GpuLibraryError(ERROR_NOT_SUPPORTED, "the GPU is not a NUMA node")

    def _addressing_mode(self, device: int, out: int) -> None:
        mode = self._versioned(out, AddressingMode, 1)
        mode.value = self.fake.addressing_mode(self._gpu(device))

    # -- MIG mode and MIG devices -------------------------------------------------------------

    def _mig_mode(self, device: int, current: int, pending: int) -> None:
        gpu = self._gpu(device)
        now, _ = self.fake.mig_mode(gpu)
        self._set_uint(current, now)
        assert isinstance(gpu, int)
        self._set_uint(pending, self._pending.get(gpu, now))

    def _set_mig_mode(self, device: int, mode: int, status: int) -> None:
        gpu = self._gpu(device)
        assert isinstance(gpu, int)
        if gpu not in self.reset_required:
            self.fake.set_mig_mode(gpu, mode)
            self._set_uint(status, SUCCESS)
            return
        current, _ = self.fake.mig_mode(gpu)  # NOT_SUPPORTED without MIG, as the fake answers
        if mode not in (0, 1):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no MIG mode {mode}")
        if mode == current:
            self._pending.pop(gpu, None)
        else:
            self._pending[gpu] = mode
        # The change is accepted (SUCCESS); applying it now failed, which the activation status says.
        self._set_uint(status, SUCCESS if mode == current else ERROR_RESET_REQUIRED)

    def _mig_by_index(self, device: int, index: int, out: int) -> None:
        gpu = self._gpu(device)
        mig = self.fake.mig_device_by_index(gpu, index)
        self._out(out, _ptr).value = self._handle(_MIG, mig, device)

    def _attributes(self, device: int, out: int) -> None:
        handle = self._device(device)
        if not self._handles[device][2]:
            # nvml.h: "NVML_ERROR_NOT_SUPPORTED if this query is not supported by the device" (a GPU).
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "attributes of a GPU, not of a MIG device")
        a = self.fake.mig_attributes(MigHandle(handle))
        e = a.engines
        attributes = self._out(out, DeviceAttributes)
        attributes.multiprocessorCount, attributes.sharedCopyEngineCount = e.multiprocessors, e.copy_engines
        attributes.sharedDecoderCount, attributes.sharedEncoderCount = e.decoders, e.encoders
        attributes.sharedJpegCount, attributes.sharedOfaCount = e.jpeg_engines, e.ofa_engines
        attributes.gpuInstanceSliceCount = a.gpu_instance_slices
        attributes.computeInstanceSliceCount = a.compute_instance_slices
        attributes.memorySizeMB = a.memory_mib

    # -- GPU instances ------------------------------------------------------------------------

    def _gi_profile_info(self, device: int, profile: int, out: int) -> None:
        info = self._versioned(out, GpuInstanceProfileInfoV2, 2)
        p = self.fake.gpu_instance_profile_info(self._gpu(device), profile)
        info.id, info.isP2pSupported = p.id, 0
        info.sliceCount, info.instanceCount = p.slice_count, p.instance_count
        e = p.engines
        info.multiprocessorCount, info.copyEngineCount = e.multiprocessors, e.copy_engines
        info.decoderCount, info.encoderCount, info.jpegCount = e.decoders, e.encoders, e.jpeg_engines
        info.ofaCount, info.memorySizeMB, info.name = e.ofa_engines, p.memory_mib, p.name.encode()

    def _placements(self, device: int, profile_id: int, placements: int | None, count: int) -> None:
        found = self.fake.gpu_instance_possible_placements(self._gpu(device), profile_id)
        # nvml.h: placements may be NULL, to learn the count first.
        if placements:
            array = self._out(placements, GpuInstancePlacement * len(found))
            for slot, placement in zip(array, found, strict=True):
                slot.start, slot.size = placement.start, placement.size
        self._set_uint(count, len(found))

    def _create_gi(self, device: int, profile_id: int, placement: int, out: int) -> None:
        where = self._out(placement, GpuInstancePlacement)
        gi = self.fake.create_gpu_instance_with_placement(
            self._gpu(device), profile_id, Placement(where.start, where.size)
        )
        self._out(out, _ptr).value = self._handle(_GI, gi, device)

    def _gpu_instances(self, device: int, profile_id: int, out: int, count: int) -> None:
        found = self.fake.gpu_instances(self._gpu(device), profile_id)
        if found:
            array = self._out(out, _ptr * len(found))
            for slot, gi in enumerate(found):
                array[slot] = self._handle(_GI, gi, device)
        self._set_uint(count, len(found))

    def _gi_by_id(self, device: int, gpu_instance_id: int, out: int) -> None:
        gi = self.fake.gpu_instance_by_id(self._gpu(device), gpu_instance_id)
        self._out(out, _ptr).value = self._handle(_GI, gi, device)

    def _gi(self, address: int | None) -> tuple[GpuInstanceHandle, int]:
        """A GPU instance that still exists (a destroyed one's handle is invalid)."""
        gi, parent = self._lookup(address, _GI)
        try:
            self.fake.gpu_instance_info(GpuInstanceHandle(gi))
        except GpuLibraryError as err:
            if err.code == ERROR_NOT_FOUND:
                raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "this GPU instance is gone") from None
            raise
        return GpuInstanceHandle(gi), parent

    def _ci(self, address: int | None) -> tuple[ComputeInstanceHandle, int]:
        ci, gi = self._lookup(address, _CI)
        return ComputeInstanceHandle(ci), gi

    def _gi_info(self, address: int, out: int) -> None:
        gi, parent = self._gi(address)
        details = self.fake.gpu_instance_info(gi)
        info = self._out(out, GpuInstanceInfo)
        info.device, info.id, info.profileId = parent, details.id, details.profile_id
        info.placement.start, info.placement.size = details.placement.start, details.placement.size

    def _destroy_gi(self, address: int) -> None:
        self.fake.destroy_gpu_instance(self._gi(address)[0])

    # -- compute instances ----------------------------------------------------------------

    def _gi_slices(self, address: int | None) -> tuple[GpuInstanceHandle, int]:
        gi, parent = self._gi(address)
        info = self.fake.gpu_instance_info(gi)
        table = self.fake.profile.gpus[int(str(self._gpu(parent)))].model.mig_table
        return gi, next(p.slices for p in table if p.id == info.profile_id)

    def _ci_profile_info(self, address: int, profile: int, engines: int, out: int) -> None:
        info = self._versioned(out, ComputeInstanceProfileInfoV2, 2)
        _, own = self._gi_slices(address)
        slices = next((n for n, p in migtables.COMPUTE_PROFILE_BY_SLICES.items() if p == profile), None)
        if profile >= 9 or engines != 0:  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT, ..._ENGINE_PROFILE_COUNT
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no compute instance profile {profile}/{engines}")
        if slices is None or slices > own:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"a {own}-slice GPU instance has no profile {profile}")
        # The fake keeps no compute-instance profile table: the multiprocessors and engines of a
        # compute instance are a share of its GPU instance's, which the driver never reads.
        info.id, info.sliceCount, info.instanceCount = profile, slices, own // slices
        info.name = (f"{slices}c" if slices < own else f"{own}g").encode()

    def _create_ci(self, address: int, profile_id: int, out: int) -> None:
        ci = self.fake.create_compute_instance(self._gi(address)[0], profile_id)
        self._out(out, _ptr).value = self._handle(_CI, ci, address)

    def _compute_instances(self, address: int, profile_id: int, out: int, count: int) -> None:
        gi, own = self._gi_slices(address)
        # The fake records no compute instance's profile; it makes only whole-instance ones, so
        # every compute instance is listed under the profile spanning its GPU instance.
        found = (
            self.fake.compute_instances(gi) if profile_id == migtables.COMPUTE_PROFILE_BY_SLICES[own] else []
        )
        if found:
            array = self._out(out, _ptr * len(found))
            for slot, ci in enumerate(found):
                array[slot] = self._handle(_CI, ci, address)
        self._set_uint(count, len(found))

    def _ci_info(self, address: int, out: int) -> None:
        ci, gi_address = self._ci(address)
        gi, own = self._gi_slices(gi_address)
        if ci not in self.fake.compute_instances(gi):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "the compute instance of this handle is gone")
        info = self._out(out, ComputeInstanceInfo)
        info.device, info.gpuInstance = self._handles[gi_address][2], gi_address
        info.id = self.fake.compute_instance_info_id(ci)
        info.profileId = migtables.COMPUTE_PROFILE_BY_SLICES[own]
        info.placement.start, info.placement.size = 0, own

    def _destroy_ci(self, address: int) -> None:
        self.fake.destroy_compute_instance(self._ci(address)[0])

    # -- events -----------------------------------------------------------------------------

    def _event_set_create(self, out: int) -> None:
        address = self._handle(_EVENT_SET, object())
        self._event_sets[address] = set()
        self._out(out, _ptr).value = address

    def _register_events(self, device: int, types: int, event_set: int) -> None:
        gpu = self._gpu(device)
        self._lookup(event_set, _EVENT_SET)
        if types & ~EVENT_XID_CRITICAL:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"event types {types:#x}: only XID errors are kept")
        self.fake.watch_xid_events(gpu)
        self._event_sets[event_set].add(device)

    def _event_set_wait(self, event_set: int, out: int, timeout_ms: int) -> None:
        self._lookup(event_set, _EVENT_SET)
        for device in self._event_sets[event_set]:
            self._gpu(device)
        data = self._out(out, EventData)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = max(int((deadline - time.monotonic()) * 1000), 0)
            event = self.fake.wait_xid_event(left)
            if event is None:
                raise GpuLibraryError(ERROR_TIMEOUT, "no event")
            device, gpu_instance, compute_instance = self._event_source(event.uuid)
            if device in self._event_sets[event_set]:
                break
        data.device, data.eventType, data.eventData = device, EVENT_XID_CRITICAL, event.xid
        if gpu_instance is None:
            gpu_instance, compute_instance = event.gpu_instance_id, event.compute_instance_id
        data.gpuInstanceId = NO_INSTANCE if gpu_instance is None else gpu_instance
        data.computeInstanceId = NO_INSTANCE if compute_instance is None else compute_instance

    def _event_source(self, uuid: str) -> tuple[int, int | None, int | None]:
        """The GPU handle of an event's device; a MIG device's event is its GPU's, with its instances."""
        for index in range(self.fake.device_count()):
            gpu = self.fake.device_by_index(index)
            if self.fake.uuid(gpu) == uuid:
                return self._handle(_GPU, gpu), None, None
            for mig in mig_handles(self.fake, gpu):
                if self.fake.uuid(mig) == uuid:
                    ids = self.fake.gpu_instance_id(mig), self.fake.compute_instance_id(mig)
                    return self._handle(_GPU, gpu), ids[0], ids[1]
        return 0, None, None

    def _event_set_free(self, event_set: int) -> None:
        self._lookup(event_set, _EVENT_SET)
        del self._event_sets[event_set]
        self._handles.pop(event_set)
        if not self._event_sets:
            self.fake.unwatch_xid_events()


def host_tree(fake: FakeGpuLibrary, root: Path) -> tuple[Path, Path]:
    """The host facts NVML does not give, as the kernel shows them, for the fake's GPUs: (sysfs, procfs).

    Under root/sys each GPU's PCI device sits below its PCIe root complex
    (devices/<root>/<bus id>, linked from bus/pci/devices) with its numa_node,
    and under root/proc
    the driver's MIG capability minors (driver/nvidia-caps/mig-minors), so that
    dra.gpu.nvml reads the same PCIe roots and minors the fake answers.
    """
    sysfs, procfs = root / "sys", root / "proc"
    links = sysfs / "bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    for index in range(fake.device_count()):
        bus_id = fake.pci_bus_id(fake.device_by_index(index))
        complex_ = fake.pcie_root(bus_id)
        if complex_ is None:
            continue
        device = sysfs / "devices" / complex_ / sysfs_bus_id(bus_id)
        device.mkdir(parents=True, exist_ok=True)
        (device / "numa_node").write_text(f"{fake.numa_node(fake.device_by_index(index))}\n")
        link = links / device.name
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(device, links))
    caps = procfs / "driver/nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    minors = fake.mig_capability_minors()
    (caps / "mig-minors").write_text("".join(f"{name} {minor}\n" for name, minor in minors.items()))
    return sysfs, procfs
