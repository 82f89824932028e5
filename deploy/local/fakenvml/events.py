"""The NVML stand-in's event functions (nvmlEventSet*, nvmlDeviceRegisterEvents), over its fake's XID events.

fakenvml.standin.NvmlStandIn answers these through EventCalls, with its handles: a set waits
only for the GPUs registered in it, a MIG device's event is its GPU's with its instances, and a
freed set's handle is invalid.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from dra.gpu.discovery import mig_handles
from dra.gpu.library import (
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    EVENT_XID_CRITICAL,
    NO_INSTANCE,
    GpuLibraryError,
)
from fakenvml.abi import EVENT_SET, GPU, EventData, at, ptr

if TYPE_CHECKING:
    from fakenvml.standin import NvmlStandIn


class EventCalls:
    """nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2 and nvmlEventSetFree."""

    def __init__(self, lib: NvmlStandIn) -> None:
        self._lib = lib
        #: Each set's registered GPU handles.
        self._sets: dict[int, set[int]] = {}

    def event_set_create(self, out: int) -> None:
        """nvmlEventSetCreate."""
        address = self._lib.handle(EVENT_SET, object())
        self._sets[address] = set()
        at(out, ptr).value = address

    def register_events(self, device: int, types: int, event_set: int) -> None:
        """nvmlDeviceRegisterEvents: XID errors only."""
        gpu = self._lib.gpu(device)
        self._lib.lookup(event_set, EVENT_SET)
        if types & ~EVENT_XID_CRITICAL:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"event types {types:#x}: only XID errors are kept")
        self._lib.fake.watch_xid_events(gpu)
        self._sets[event_set].add(device)

    def event_set_wait(self, event_set: int, out: int, timeout_ms: int) -> None:
        """nvmlEventSetWait_v2: the next XID event of a GPU in the set, or TIMEOUT."""
        self._lib.lookup(event_set, EVENT_SET)
        for device in self._sets[event_set]:
            self._lib.gpu(device)
        data = at(out, EventData)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = max(int((deadline - time.monotonic()) * 1000), 0)
            event = self._lib.fake.wait_xid_event(left)
            if event is None:
                raise GpuLibraryError(ERROR_TIMEOUT, "no event")
            device, gpu_instance, compute_instance = self._source(event.uuid)
            if device in self._sets[event_set]:
                break
        data.device, data.eventType, data.eventData = device, EVENT_XID_CRITICAL, event.xid
        if gpu_instance is None:
            gpu_instance, compute_instance = event.gpu_instance_id, event.compute_instance_id
        data.gpuInstanceId = NO_INSTANCE if gpu_instance is None else gpu_instance
        data.computeInstanceId = NO_INSTANCE if compute_instance is None else compute_instance

    def _source(self, uuid: str) -> tuple[int, int | None, int | None]:
        """The GPU handle of an event's device; a MIG device's event is its GPU's, with its instances."""
        for index in range(self._lib.fake.device_count()):
            gpu = self._lib.fake.device_by_index(index)
            if self._lib.fake.uuid(gpu) == uuid:
                return self._lib.handle(GPU, gpu), None, None
            for mig in mig_handles(self._lib.fake, gpu):
                if self._lib.fake.uuid(mig) == uuid:
                    ids = self._lib.fake.gpu_instance_id(mig), self._lib.fake.compute_instance_id(mig)
                    return self._lib.handle(GPU, gpu), ids[0], ids[1]
        return 0, None, None

    def event_set_free(self, event_set: int) -> None:
        """nvmlEventSetFree."""
        self._lib.lookup(event_set, EVENT_SET)
        del self._sets[event_set]
        self._lib.forget(event_set)
        if not self._sets:
            self._lib.fake.unwatch_xid_events()
