"""The usage sampler: memory and utilisation of each GPU and MIG device, attributed to claims.

Every --claim-metrics-interval, beside dra_gpu_claim_device_info and off the request path
(NVML is read in a worker thread), it reads through the GPU library:

- a GPU off MIG mode: nvmlDeviceGetMemoryInfo and nvmlDeviceGetUtilizationRates;
- a MIG device: memory from its own handle; utilisation from GPM's graphics activity of its
  GPU instance between this sample and the last (Hopper and newer), else none: NVML
  answers NOT_SUPPORTED for the utilisation of a GPU in MIG mode;
- with per-process attribution on (--usage-processes; needs the host's PIDs): each device's
  processes (nvmlDeviceGetComputeRunningProcesses) and, off MIG mode, their SM utilisation
  since the last sample (nvmlDeviceGetProcessUtilization; NOT_FOUND means every process was
  idle), each process mapped to its pod and container through /proc/<pid>/cgroup and the
  node's pods (listed from the API server when a pod or container is new to the sampler).

dra.core.usage splits the readings among claims; the series are dra.daemon.metrics' USAGE.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio.to_thread

from dra.core.devicestatus import Consumer, DeviceIdentity
from dra.core.usage import DEFAULT_MAX_SERIES, Owner, ProcessUse, Reading, attribute, container_of, holders
from dra.daemon import metrics
from dra.gpu.discovery import mig_handles
from dra.gpu.library import (
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    GpmSample,
    GpuHandle,
    GpuLibrary,
    GpuLibraryError,
    MigHandle,
    ProcessMemory,
)
from dra.model.devices import Gpu, Inventory, MigDevice
from dra.model.prepared import PreparedClaim

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Raw:
    """What NVML said of one device, before its processes have owners."""

    reading: Reading
    processes: Sequence[ProcessMemory] | None
    #: SM utilisation (0..1) by PID; None where NVML has none per process.
    process_busy: Mapping[int, float] | None


class DeviceReader:
    """Reads every GPU and MIG device of an inventory; keeps what the next read needs (GPM, timestamps)."""

    def __init__(self, lib: GpuLibrary, processes: bool) -> None:
        self._lib = lib
        self._processes = processes
        #: The last GPM sample of each (GPU index, GPU instance).
        self._gpm: dict[tuple[int, int], GpmSample] = {}
        #: The newest per-process utilisation timestamp seen, by GPU index.
        self._seen_us: dict[int, int] = {}
        self._failed: set[str] = set()

    def read(self, inventory: Inventory) -> list[_Raw]:
        """One reading per GPU off MIG mode and per MIG device; a device NVML fails on is left out."""
        found: list[_Raw] = []
        migs = _mig_devices(inventory)
        live: set[tuple[int, int]] = set()
        for gpu in inventory.gpus:
            try:
                handle = self._lib.device_by_index(gpu.index)
                if not gpu.mig_enabled:
                    found.append(self._gpu(gpu, handle))
                    continue
                mine = [m for m in migs if m.parent.uuid == gpu.uuid]
                handles = {self._lib.uuid(h): h for h in mig_handles(self._lib, handle)} if mine else {}
                gpm = self._gpm_ok(handle)
            except GpuLibraryError as err:
                self._failure(gpu.uuid, err)
                continue
            for mig in mine:
                if mig.uuid not in handles:
                    continue
                live.add((gpu.index, mig.gpu_instance_id))
                try:
                    found.append(self._mig(gpu, handle, mig, handles[mig.uuid], gpm))
                except GpuLibraryError as err:
                    self._failure(mig.uuid, err)
        for key in self._gpm.keys() - live:
            self._free(self._gpm.pop(key))
        return found

    def close(self) -> None:
        """Free the GPM samples kept."""
        for sample in self._gpm.values():
            self._free(sample)
        self._gpm.clear()

    def _failure(self, uuid: str, err: GpuLibraryError) -> None:
        if uuid not in self._failed:
            self._failed.add(uuid)
            log.warning("cannot read the usage of %s: %s; its usage series are left out", uuid, err)

    def _gpu(self, gpu: Gpu, handle: GpuHandle) -> _Raw:
        memory = self._lib.memory_used(handle)
        try:
            utilization: float | None = self._lib.utilization(handle) / 100
        except GpuLibraryError as err:
            if err.code != ERROR_NOT_SUPPORTED:
                raise
            utilization = None
        processes, busy = None, None
        if self._processes:
            processes = self._lib.running_processes(handle)
            busy = self._process_busy(gpu.index, handle)
        self._failed.discard(gpu.uuid)
        return _Raw(Reading(gpu.uuid, "", memory, utilization), processes, busy)

    def _process_busy(self, index: int, handle: GpuHandle) -> dict[int, float]:
        try:
            samples = self._lib.process_utilization(handle, self._seen_us.get(index, 0))
        except GpuLibraryError as err:
            if err.code != ERROR_NOT_FOUND:
                raise
            return {}  # nvml.h: no sample since then, every process idle
        newest: dict[int, tuple[int, float]] = {}
        for sample in samples:
            if sample.timestamp_us >= newest.get(sample.pid, (-1, 0.0))[0]:
                newest[sample.pid] = (sample.timestamp_us, min(sample.sm_percent / 100, 1.0))
        if newest:  # SUCCESS with no sample at all: nothing newer seen
            self._seen_us[index] = max(t for t, _ in newest.values())
        return {pid: busy for pid, (_, busy) in newest.items()}

    def _gpm_ok(self, handle: GpuHandle) -> bool:
        try:
            return self._lib.gpm_supported(handle)
        except GpuLibraryError:
            return False

    def _mig(self, gpu: Gpu, handle: GpuHandle, mig: MigDevice, mig_handle: MigHandle, gpm: bool) -> _Raw:
        memory = self._lib.memory_used(mig_handle)
        utilization = self._gpm_utilization(gpu.index, handle, mig.gpu_instance_id) if gpm else None
        processes = self._lib.running_processes(mig_handle) if self._processes else None
        self._failed.discard(mig.uuid)
        reading = Reading(gpu.uuid, str(mig.gpu_instance_id), memory, utilization)
        return _Raw(reading, processes, None)

    def _gpm_utilization(self, index: int, handle: GpuHandle, gpu_instance: int) -> float | None:
        """Graphics activity since the last sample of the GPU instance; None at its first."""
        sample = self._lib.gpm_sample(handle, gpu_instance)
        last = self._gpm.get((index, gpu_instance))
        self._gpm[(index, gpu_instance)] = sample
        if last is None:
            return None
        try:
            return min(self._lib.gpm_graphics_utilization(last, sample) / 100, 1.0)
        finally:
            self._free(last)

    def _free(self, sample: GpmSample) -> None:
        try:
            self._lib.gpm_free(sample)
        except GpuLibraryError as err:
            log.debug("nvmlGpmSampleFree: %s", err)


def _mig_devices(inventory: Inventory) -> list[MigDevice]:
    """Every MIG device of the inventory, made beforehand or for a claim, once."""
    found = {d.uuid: d for d in (*inventory.devices, *inventory.instances) if isinstance(d, MigDevice)}
    return list(found.values())


#: Lists the pods of the node (the API server's Pod objects).
PodLister = Callable[[], Awaitable[list[dict[str, Any]]]]


class ProcessOwners:
    """Which pod and container each process runs in: its container ID from /proc/<pid>/cgroup, then
    the node's pods, whose status names each container's ID."""

    def __init__(self, procfs: Path, list_pods: PodLister) -> None:
        self._procfs = procfs
        self._list_pods = list_pods
        #: Container ID -> its pod and container, as the node's pods said last.
        self._owners: dict[str, Owner] = {}
        #: The container ID of each PID of the last sample (None: in no container).
        self._containers: dict[int, str | None] = {}
        #: Container IDs no pod had at the last listing (not a pod's, or gone): not listed again for them.
        self._strangers: set[str] = set()

    async def owners(self, pids: Iterable[int]) -> dict[int, Owner]:
        """The owner of each PID that runs in a container of a pod; others are left out.

        A PID's cgroup is read once while the PID stays on a GPU from one sample to the next: a
        process does not leave its pod, and a PID gone from one sample is read again if it returns.
        """
        known = self._containers
        self._containers = {pid: known[pid] if pid in known else self._container(pid) for pid in set(pids)}
        containers = {pid: found for pid, found in self._containers.items() if found is not None}
        unknown = {c for c in containers.values() if c not in self._owners}
        if unknown - self._strangers:
            await self._refresh()
            self._strangers = {c for c in unknown if c not in self._owners}
        return {pid: self._owners[c] for pid, c in containers.items() if c in self._owners}

    def _container(self, pid: int) -> str | None:
        try:
            return container_of((self._procfs / str(pid) / "cgroup").read_text())
        except OSError:
            return None  # gone, or not visible from this PID namespace

    async def _refresh(self) -> None:
        try:
            pods = await self._list_pods()
        except Exception as err:
            log.warning("cannot list the node's pods to attribute GPU processes: %s", err)
            return
        self._owners = {}
        for pod in pods:
            meta, status = pod.get("metadata") or {}, pod.get("status") or {}
            namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            for kind in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
                for container in status.get(kind) or []:
                    # "containerd://<id>": the ID the runtime gives the container's cgroup.
                    _, _, cid = str(container.get("containerID") or "").partition("://")
                    if cid:
                        self._owners[cid] = Owner(namespace, name, str(container.get("name", "")))


class UsageSampler:
    """Reads the devices, attributes the use and sets the usage series; busy seconds add up over time."""

    def __init__(
        self,
        lib: GpuLibrary,
        owners: ProcessOwners | None = None,
        max_series: int = DEFAULT_MAX_SERIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = DeviceReader(lib, owners is not None)
        self._owners = owners
        self._max_series = max_series
        self._clock = clock
        self._last: float | None = None
        self._busy: dict[tuple[str, ...], float] = {}

    async def sample(
        self,
        inventory: Inventory,
        claims: Mapping[str, tuple[PreparedClaim, tuple[DeviceIdentity, ...]]],
        consumers: Iterable[Consumer],
    ) -> None:
        """One sample: read, attribute, publish."""
        started = time.perf_counter()
        raw = await anyio.to_thread.run_sync(self._reader.read, inventory)
        readings = await self._with_owners(raw)
        usage = attribute(readings, holders(claims, consumers), self._max_series)
        now = self._clock()
        elapsed = 0.0 if self._last is None else now - self._last
        self._last = now
        self._busy = {
            labels: self._busy.get(labels, 0.0) + (value.utilization or 0.0) * elapsed
            for labels, value in usage.claims.items()
        }
        metrics.USAGE.set(usage.claims, usage.unattributed, self._busy)
        if usage.dropped:
            metrics.USAGE_SERIES_DROPPED.inc(usage.dropped)
        metrics.USAGE_SAMPLE_SECONDS.observe(time.perf_counter() - started)

    async def _with_owners(self, raw: list[_Raw]) -> list[Reading]:
        if self._owners is None:
            return [r.reading for r in raw]
        owners = await self._owners.owners(p.pid for r in raw for p in r.processes or ())
        readings = []
        for r in raw:
            processes = tuple(
                ProcessUse(
                    p.pid,
                    p.used_bytes or 0,
                    None if r.process_busy is None else r.process_busy.get(p.pid, 0.0),
                    owners.get(p.pid),
                )
                for p in r.processes or ()
            )
            readings.append(replace(r.reading, processes=processes))
        return readings

    def close(self) -> None:
        """Free what NVML holds for the sampler."""
        self._reader.close()
