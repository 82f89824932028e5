"""NVML's C interface as nvml.h defines it, for the NVML stand-in (fakenvml.standin).

The return codes, buffer sizes, structures and structure versions of the
calls dra.gpu.nvml makes, transcribed from the header rather than from pynvml
(tests/unit/test_nvml_standin.py checks pynvml's structures against these),
and reading and writing through a caller's pointers the way the C library
does.
"""

from __future__ import annotations

import ctypes
from typing import Any

from dra.gpu.library import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_IN_USE,
    ERROR_INSUFFICIENT_RESOURCES,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    GpuLibraryError,
)

# nvmlReturn_t values (nvml.h) that only the stand-in answers; the others are dra.gpu.library's.
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INSUFFICIENT_SIZE = 7
ERROR_RESET_REQUIRED = 16

# Buffer sizes of nvml.h.
_PCI_BUS_ID_LEGACY = 16  # NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
_PCI_BUS_ID = 32  # NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
_NAME_V2 = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE

# nvml.h's unsigned int and unsigned long long.
uint = ctypes.c_uint
ull = ctypes.c_ulonglong
#: A pointer or handle, as the C ABI passes it: an address.
ptr = ctypes.c_void_p


class PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (the v3 layout, with busId at the end)."""

    _fields_ = (
        ("busIdLegacy", ctypes.c_char * _PCI_BUS_ID_LEGACY),
        ("domain", uint),
        ("bus", uint),
        ("device", uint),
        ("pciDeviceId", uint),
        ("pciSubSystemId", uint),
        ("busId", ctypes.c_char * _PCI_BUS_ID),
    )


class Memory(ctypes.Structure):
    """nvmlMemory_t (v1, unversioned)."""

    _fields_ = (("total", ull), ("free", ull), ("used", ull))


class Utilization(ctypes.Structure):
    """nvmlUtilization_t."""

    _fields_ = (("gpu", uint), ("memory", uint))


class ProcessInfo(ctypes.Structure):
    """nvmlProcessInfo_t (the v2 layout, which nvmlDeviceGetComputeRunningProcesses_v3 fills)."""

    _fields_ = (("pid", uint), ("usedGpuMemory", ull), ("gpuInstanceId", uint), ("computeInstanceId", uint))


class ProcessUtilizationSample(ctypes.Structure):
    """nvmlProcessUtilizationSample_t."""

    _fields_ = (
        ("pid", uint),
        ("timeStamp", ull),
        ("smUtil", uint),
        ("memUtil", uint),
        ("encUtil", uint),
        ("decUtil", uint),
    )


class GpmSupport(ctypes.Structure):
    """nvmlGpmSupport_t (its version is NVML_GPM_SUPPORT_VERSION, 1, not a sized version)."""

    _fields_ = (("version", uint), ("isSupportedDevice", uint))


class GpmMetricInfo(ctypes.Structure):
    """The metricInfo member of nvmlGpmMetric_t."""

    _fields_ = (("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p))


class GpmMetric(ctypes.Structure):
    """nvmlGpmMetric_t."""

    _fields_ = (
        ("metricId", uint),
        ("nvmlReturn", ctypes.c_int),
        ("value", ctypes.c_double),
        ("metricInfo", GpmMetricInfo),
    )


#: NVML_GPM_METRICS_GET_VERSION and NVML_GPM_SUPPORT_VERSION: plain 1, unlike the sized struct versions.
GPM_VERSION = 1
#: NVML_GPM_METRIC_GRAPHICS_UTIL.
GPM_METRIC_GRAPHICS_UTIL = 1


class GpmMetricsGetHead(ctypes.Structure):
    """nvmlGpmMetricsGet_t up to its metrics[NVML_GPM_METRIC_MAX] array, whose length headers differ in.

    The caller's array follows at `metrics_offset`, and only its first numMetrics entries are read.
    """

    _fields_ = (("version", uint), ("numMetrics", uint), ("sample1", ptr), ("sample2", ptr))


def gpm_metrics(address: int, count: int) -> Any:
    """The first `count` entries of an nvmlGpmMetricsGet_t's metrics array (aligned as a GpmMetric)."""
    offset = ctypes.sizeof(GpmMetricsGetHead)
    align = ctypes.alignment(GpmMetric)
    offset = (offset + align - 1) // align * align
    return (GpmMetric * count).from_address(address + offset)


class DeviceAttributes(ctypes.Structure):
    """nvmlDeviceAttributes_t."""

    _fields_ = (
        ("multiprocessorCount", uint),
        ("sharedCopyEngineCount", uint),
        ("sharedDecoderCount", uint),
        ("sharedEncoderCount", uint),
        ("sharedJpegCount", uint),
        ("sharedOfaCount", uint),
        ("gpuInstanceSliceCount", uint),
        ("computeInstanceSliceCount", uint),
        ("memorySizeMB", ull),
    )


class AddressingMode(ctypes.Structure):
    """nvmlDeviceAddressingMode_v1_t."""

    _fields_ = (("version", uint), ("value", uint))


class GpuInstancePlacement(ctypes.Structure):
    """nvmlGpuInstancePlacement_t (also nvmlComputeInstancePlacement_t: the same two fields)."""

    _fields_ = (("start", uint), ("size", uint))


class GpuInstanceProfileInfo(ctypes.Structure):
    """nvmlGpuInstanceProfileInfo_t (unversioned: go-nvml's GetGpuInstanceProfileInfo)."""

    _fields_ = (
        ("id", uint),
        ("isP2pSupported", uint),
        ("sliceCount", uint),
        ("instanceCount", uint),
        ("multiprocessorCount", uint),
        ("copyEngineCount", uint),
        ("decoderCount", uint),
        ("encoderCount", uint),
        ("jpegCount", uint),
        ("ofaCount", uint),
        ("memorySizeMB", ull),
    )


class GpuInstanceProfileInfoV2(ctypes.Structure):
    """nvmlGpuInstanceProfileInfo_v2_t."""

    _fields_ = (
        ("version", uint),
        ("id", uint),
        ("isP2pSupported", uint),
        ("sliceCount", uint),
        ("instanceCount", uint),
        ("multiprocessorCount", uint),
        ("copyEngineCount", uint),
        ("decoderCount", uint),
        ("encoderCount", uint),
        ("jpegCount", uint),
        ("ofaCount", uint),
        ("memorySizeMB", ull),
        ("name", ctypes.c_char * _NAME_V2),
    )


class GpuInstanceInfo(ctypes.Structure):
    """nvmlGpuInstanceInfo_t."""

    _fields_ = (("device", ptr), ("id", uint), ("profileId", uint), ("placement", GpuInstancePlacement))


class ComputeInstanceProfileInfo(ctypes.Structure):
    """nvmlComputeInstanceProfileInfo_t (unversioned: go-nvml's GetComputeInstanceProfileInfo)."""

    _fields_ = (
        ("id", uint),
        ("sliceCount", uint),
        ("instanceCount", uint),
        ("multiprocessorCount", uint),
        ("sharedCopyEngineCount", uint),
        ("sharedDecoderCount", uint),
        ("sharedEncoderCount", uint),
        ("sharedJpegCount", uint),
        ("sharedOfaCount", uint),
    )


class ComputeInstanceProfileInfoV2(ctypes.Structure):
    """nvmlComputeInstanceProfileInfo_v2_t."""

    _fields_ = (
        ("version", uint),
        ("id", uint),
        ("sliceCount", uint),
        ("instanceCount", uint),
        ("multiprocessorCount", uint),
        ("sharedCopyEngineCount", uint),
        ("sharedDecoderCount", uint),
        ("sharedEncoderCount", uint),
        ("sharedJpegCount", uint),
        ("sharedOfaCount", uint),
        ("name", ctypes.c_char * _NAME_V2),
    )


class ComputeInstanceInfo(ctypes.Structure):
    """nvmlComputeInstanceInfo_t."""

    _fields_ = (
        ("device", ptr),
        ("gpuInstance", ptr),
        ("id", uint),
        ("profileId", uint),
        ("placement", GpuInstancePlacement),
    )


class EventData(ctypes.Structure):
    """nvmlEventData_t."""

    _fields_ = (
        ("device", ptr),
        ("eventType", ull),
        ("eventData", ull),
        ("gpuInstanceId", uint),
        ("computeInstanceId", uint),
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


# What each handle type of nvml.h names, as the stand-in tells its handles apart: nvmlDevice_t is a
# GPU or a MIG device; nvmlGpuInstance_t, nvmlComputeInstance_t, nvmlEventSet_t.
GPU, MIG, GI, CI, EVENT_SET = "gpu", "mig", "gpu instance", "compute instance", "event set"
#: nvmlGpmSample_t.
GPM_SAMPLE = "gpm sample"


def error_string(code: int) -> int | None:
    """nvmlErrorString: the address of a static string naming the code."""
    return ctypes.addressof(_STRING_BUFFERS.get(code, _UNKNOWN_STRING))


def at(address: int | None, ctype: Any) -> Any:
    """The caller's object at `address`, as nvml.h lays it out; a NULL pointer is INVALID_ARGUMENT."""
    if not address:
        raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "NULL output pointer")
    return ctype.from_address(address)


def set_uint(address: int | None, value: int) -> None:
    """Write an unsigned int through the caller's pointer."""
    at(address, uint).value = value


def set_string(address: int | None, length: int, text: str) -> None:
    """Write a NUL-terminated string into the caller's buffer of `length` bytes; INSUFFICIENT_SIZE."""
    data = text.encode()
    if len(data) + 1 > length:
        raise GpuLibraryError(ERROR_INSUFFICIENT_SIZE, f"{length} bytes cannot hold {text!r}")
    at(address, ctypes.c_char * (len(data) + 1)).raw = data + b"\0"


def versioned(address: int | None, structure: type[ctypes.Structure], version: int) -> Any:
    """The caller's versioned structure; ARGUMENT_VERSION_MISMATCH unless its version field is this one."""
    info = at(address, structure)
    if info.version != struct_version(structure, version):
        raise GpuLibraryError(
            ERROR_ARGUMENT_VERSION_MISMATCH,
            f"{structure.__name__} version {info.version:#x}, "
            f"expected {struct_version(structure, version):#x}",
        )
    return info
