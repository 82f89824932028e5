"""The NVML stand-in's usage functions (utilization, running processes, GPM), over its fake's processes.

fakenvml.standin.NvmlStandIn answers these through UsageCalls, with its handles; a GPM sample
buffer is a handle of its own until freed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dra.gpu.library import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_SUPPORTED,
    NO_INSTANCE,
    GpmSample,
    GpuLibraryError,
)
from fakenvml.abi import (
    ERROR_INSUFFICIENT_SIZE,
    GPM_METRIC_GRAPHICS_UTIL,
    GPM_SAMPLE,
    GPM_VERSION,
    SUCCESS,
    GpmMetricsGetHead,
    GpmSupport,
    ProcessInfo,
    ProcessUtilizationSample,
    Utilization,
    at,
    gpm_metrics,
    ptr,
    uint,
)

if TYPE_CHECKING:
    from fakenvml.standin import NvmlStandIn


class UsageCalls:
    """nvmlDeviceGetUtilizationRates, ...GetComputeRunningProcesses_v3, ...GetProcessUtilization, nvmlGpm*."""

    def __init__(self, lib: NvmlStandIn) -> None:
        self._lib = lib

    def utilization(self, device: int, out: int) -> None:
        """nvmlDeviceGetUtilizationRates: the SMs' busy share; no memory bandwidth."""
        utilization = at(out, Utilization)
        utilization.gpu = self._lib.fake.utilization(self._lib.gpu(device))
        # The fake has no notion of memory bandwidth: its processes only keep the SMs busy.
        utilization.memory = 0

    def running_processes(self, device: int, count: int, out: int) -> None:
        """nvmlDeviceGetComputeRunningProcesses_v3."""
        processes = self._lib.fake.running_processes(self._lib.device(device))
        room = at(count, uint)
        wanted, room.value = room.value, len(processes)
        if not processes:
            return
        if wanted < len(processes) or not out:
            # nvml.h: INSUFFICIENT_SIZE with the count needed (a first call with 0 asks for it).
            raise GpuLibraryError(ERROR_INSUFFICIENT_SIZE, f"{len(processes)} processes")
        infos = (ProcessInfo * len(processes)).from_address(out)
        for info, process in zip(infos, processes, strict=True):
            info.pid = process.pid
            info.usedGpuMemory = process.used_bytes or 0
            info.gpuInstanceId = _or_none(process.gpu_instance_id)
            info.computeInstanceId = _or_none(process.compute_instance_id)

    def process_utilization(self, device: int, out: int, count: int, since: int) -> None:
        """nvmlDeviceGetProcessUtilization."""
        samples = self._lib.fake.process_utilization(self._lib.gpu(device), since)
        room = at(count, uint)
        wanted, room.value = room.value, len(samples)
        if wanted < len(samples) or not out:
            raise GpuLibraryError(ERROR_INSUFFICIENT_SIZE, f"{len(samples)} samples")
        written = (ProcessUtilizationSample * len(samples)).from_address(out)
        for entry, sample in zip(written, samples, strict=True):
            entry.pid, entry.timeStamp, entry.smUtil = sample.pid, sample.timestamp_us, sample.sm_percent
            entry.memUtil = entry.encUtil = entry.decUtil = 0

    def gpm_support(self, device: int, out: int) -> None:
        """nvmlGpmQueryDeviceSupport."""
        support = at(out, GpmSupport)
        if support.version != GPM_VERSION:
            raise GpuLibraryError(
                ERROR_ARGUMENT_VERSION_MISMATCH, f"nvmlGpmSupport_t version {support.version}"
            )
        support.isSupportedDevice = int(self._lib.fake.gpm_supported(self._lib.gpu(device)))

    def gpm_alloc(self, out: int) -> None:
        """nvmlGpmSampleAlloc."""
        at(out, ptr).value = self._lib.handle(GPM_SAMPLE, GpmBuffer())

    def _buffer(self, address: int | None) -> GpmBuffer:
        buffer = self._lib.lookup(address, GPM_SAMPLE)[0]
        assert isinstance(buffer, GpmBuffer)
        return buffer

    def gpm_free(self, sample: int) -> None:
        """nvmlGpmSampleFree."""
        self._buffer(sample)
        self._lib.forget(sample)

    def gpm_sample(self, device: int, sample: int) -> None:
        """nvmlGpmSampleGet."""
        self._buffer(sample).sample = self._lib.fake.gpm_sample(self._lib.gpu(device), None)

    def gpm_mig_sample(self, device: int, gpu_instance_id: int, sample: int) -> None:
        """nvmlGpmMigSampleGet."""
        self._buffer(sample).sample = self._lib.fake.gpm_sample(self._lib.gpu(device), gpu_instance_id)

    def gpm_metrics(self, out: int) -> None:
        """nvmlGpmMetricsGet: graphics activity only."""
        request = at(out, GpmMetricsGetHead)
        if request.version != GPM_VERSION:
            raise GpuLibraryError(
                ERROR_ARGUMENT_VERSION_MISMATCH, f"nvmlGpmMetricsGet_t version {request.version}"
            )
        first, second = self._buffer(request.sample1).sample, self._buffer(request.sample2).sample
        if first is None or second is None:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "a GPM sample buffer was never read into")
        for metric in gpm_metrics(out, request.numMetrics):
            # The fake's processes only keep engines busy: graphics activity is all it can say.
            if metric.metricId != GPM_METRIC_GRAPHICS_UTIL:
                metric.nvmlReturn = ERROR_NOT_SUPPORTED
                continue
            try:
                metric.value = self._lib.fake.gpm_graphics_utilization(first, second)
                metric.nvmlReturn = SUCCESS
            except GpuLibraryError as err:
                metric.nvmlReturn = err.code


class GpmBuffer:
    """What an nvmlGpmSample_t points to: empty until a sample is read into it."""

    def __init__(self) -> None:
        self.sample: GpmSample | None = None


def _or_none(instance: int | None) -> int:
    """A MIG instance ID as nvmlProcessInfo_t holds it: 0xFFFFFFFF off MIG mode."""
    return NO_INSTANCE if instance is None else instance
