"""Device health from XID errors, for the kubelet (DRA health stream, device plugin) to see.

NVML reports XID errors per GPU. Errors an application causes on its own
context (XID 13, 31, 43, 45, 68, 109, the same set NVIDIA's device plugin
ignores) say nothing about the device; any other XID marks the device (and,
for a GPU error, each of its MIG devices) unhealthy until the driver restarts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import anyio.from_thread
import anyio.lowlevel

from dra.devices import Inventory, device_uuids
from dra.nvml import GpuLibrary, GpuLibraryError, XidEvent

log = logging.getLogger(__name__)

#: XIDs caused by an application, not by the device.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class DeviceHealth:
    """Health of one device and when it last changed (Unix seconds)."""

    healthy: bool
    since: int
    reason: str = ""


class HealthTracker:
    """Health of every device of the inventory; subscribers see each change."""

    def __init__(self, inventory: Inventory) -> None:
        now = int(time.time())
        self._inventory = inventory
        self._health = {device.name: DeviceHealth(True, now) for device in inventory}
        self._changed = anyio.Event()

    def set_inventory(self, inventory: Inventory) -> None:
        """Follow a changed inventory: new devices start healthy, gone ones are forgotten."""
        now = int(time.time())
        self._inventory = inventory
        self._health = {d.name: self._health.get(d.name, DeviceHealth(True, now)) for d in inventory}
        self._changed.set()
        self._changed = anyio.Event()

    def snapshot(self) -> dict[str, DeviceHealth]:
        """Health of every device by name."""
        return dict(self._health)

    def mark_unhealthy(self, names: list[str], reason: str) -> list[str]:
        """Mark devices unhealthy; return those that changed."""
        now = int(time.time())
        changed = [n for n in names if n in self._health and self._health[n].healthy]
        for name in changed:
            self._health[name] = DeviceHealth(False, now, reason)
            log.warning("device %s is unhealthy: %s", name, reason)
        if changed:
            self._changed.set()
            self._changed = anyio.Event()
        return changed

    def apply(self, event: XidEvent) -> list[str]:
        """Account for one XID event; return the devices whose health changed."""
        if event.xid in APPLICATION_XIDS:
            log.info("XID %d on %s is an application error; device health unchanged", event.xid, event.uuid)
            return []
        affected = [d.name for d in self._inventory if event.uuid in device_uuids(d)]
        if not affected:
            log.warning("XID %d on %s, which is not a published device", event.xid, event.uuid)
        return self.mark_unhealthy(affected, f"XID {event.xid}")

    def next_change(self) -> anyio.Event:
        """An event that is set at the next change of any device's health."""
        return self._changed

    async def watch(self) -> AsyncIterator[dict[str, DeviceHealth]]:
        """The current health, then the new health after every change."""
        while True:
            changed = self._changed
            yield self.snapshot()
            await changed.wait()


class HealthMonitor:
    """Waits for NVML XID events in a daemon thread and feeds them to the tracker."""

    def __init__(self, lib: GpuLibrary, tracker: HealthTracker, inventory: Inventory) -> None:
        self._lib = lib
        self._tracker = tracker
        self._inventory = inventory
        self._stop = threading.Event()

    def start(self, on_change: Callable[[list[str]], None] | None = None) -> None:
        """Begin watching; call from the event loop. Errors in NVML end the watch with a log line."""
        token = anyio.lowlevel.current_token()
        handles = [self._lib.device_by_index(gpu.index) for gpu in self._inventory.gpus]

        def loop() -> None:
            try:
                self._lib.watch_xid_events(handles)
                while not self._stop.is_set():
                    event = self._lib.wait_xid_event(500)
                    if event is None:
                        continue
                    changed = anyio.from_thread.run_sync(self._tracker.apply, event, token=token)
                    if changed and on_change is not None:
                        anyio.from_thread.run_sync(on_change, changed, token=token)
            except GpuLibraryError as err:
                log.error("GPU health monitoring stopped: NVML error %d: %s", err.code, err)
            except anyio.RunFinishedError:
                pass

        threading.Thread(target=loop, name="xid-events", daemon=True).start()

    def stop(self) -> None:
        """Ask the thread to end at its next wake-up."""
        self._stop.set()
