"""Device health from XID errors, for the kubelet (DRA health stream, device plugin) to see.

An XID an application causes on its own context (--ignored-xids) says nothing about the device;
any other marks it unhealthy (on a GPU in MIG mode, the MIG devices it concerns) until a quiet
--health-recovery-period passes, and a failed wait for events marks the GPUs it lost. The
rules: docs/operations.md ("Device health").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from dra.core.assignment import describe
from dra.core.taints import DeviceTaint, Effect, unhealthy_taint
from dra.gpu.library import ERROR_GPU_IS_LOST, GpuHandle, GpuLibrary, GpuLibraryError, XidEvent
from dra.model.devices import Device, Gpu, Inventory, MigDevice, device_uuids

log = logging.getLogger(__name__)

#: XIDs caused by an application, not by the device.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

#: How long one NVML wait blocks, in milliseconds.
WAIT_MS = 500
#: How long stop() waits for the thread: longer than one wait and the work after it.
STOP_TIMEOUT_S = 5.0
#: Backoff between retries of a failing wait (seconds, doubling).
RETRY_MIN_S = 0.5
RETRY_MAX_S = 30.0


@dataclass(frozen=True)
class DeviceHealth:
    """Health of one device and when it last changed (Unix seconds)."""

    healthy: bool
    since: int
    reason: str = ""
    #: The reason in a word or two ("XID-79", "GPU-lost"), for a device taint's value.
    short: str = ""


def parse_xids(text: str) -> frozenset[int]:
    """--ignored-xids: comma-separated XID numbers ("" for none); ValueError naming a bad entry."""
    xids = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if not item.isdigit() or int(item) == 0:
            raise ValueError(
                f"{item!r} is not an XID (a positive number, as in 'XID 79'); expected e.g. 13,31,43"
            )
        xids.add(int(item))
    return frozenset(xids)


class ClearRefusedError(Exception):
    """An admin asked to clear a device's unhealthy mark that must stay; the message says why."""


class HealthTracker:
    """Health of every device of the inventory; subscribers see each change."""

    def __init__(
        self,
        inventory: Inventory,
        clock: Callable[[], float] = time.monotonic,
        ignored_xids: frozenset[int] = APPLICATION_XIDS,
    ) -> None:
        now = int(time.time())
        #: XIDs that leave device health alone (--ignored-xids).
        self.ignored_xids = ignored_xids
        self._inventory = inventory
        self._health = {device.name: DeviceHealth(True, now) for device in inventory}
        self._changed = anyio.Event()
        #: Changes counted for the threads that follow them (the DRA health stream's).
        self._version = 0
        self._versioned = threading.Condition()
        self._clock = clock
        #: When each device was last reported bad (clock time), healthy or not at that moment.
        self._last_bad: dict[str, float] = {}
        #: The UUIDs of GPUs passed through (bound to vfio-pci): NVML loses them on purpose.
        self.passed_through: Callable[[], Collection[str]] = frozenset

    def set_inventory(self, inventory: Inventory) -> None:
        """Follow a changed inventory: new devices start healthy, gone ones are forgotten."""
        now = int(time.time())
        self._inventory = inventory
        self._health = {d.name: self._health.get(d.name, DeviceHealth(True, now)) for d in inventory}
        self._changed_now()

    def _changed_now(self) -> None:
        """Wake whoever waits for a change: the event loop's (next_change) and the threads' (follow)."""
        self._changed.set()
        self._changed = anyio.Event()
        with self._versioned:
            self._version += 1
            self._versioned.notify_all()

    def snapshot(self) -> dict[str, DeviceHealth]:
        """Health of every device by name."""
        return dict(self._health)

    def taints(self, driver: str, effect: Effect) -> dict[str, DeviceTaint]:
        """The taint of each unhealthy device, added when it became unhealthy."""
        return {
            name: unhealthy_taint(driver, health.short or health.reason, effect, health.since)
            for name, health in self._health.items()
            if not health.healthy
        }

    def mark_unhealthy(self, names: list[str], reason: str, short: str = "") -> list[str]:
        """Mark devices unhealthy; return those that changed. A new report restarts the quiet period."""
        now = int(time.time())
        reported = self._clock()
        for name in names:
            if name in self._health:
                self._last_bad[name] = reported
        changed = [n for n in names if n in self._health and self._health[n].healthy]
        for name in changed:
            self._health[name] = DeviceHealth(False, now, reason, short)
            log.warning("device %s is unhealthy: %s", name, reason)
        if changed:
            self._changed_now()
        return changed

    def mark_gpus_unhealthy(self, gpu_uuids: list[str], reason: str, short: str = "") -> list[str]:
        """Mark the devices of these GPUs (the GPU or its MIG devices) unhealthy; return those changed."""
        wanted = set(gpu_uuids) - set(self.passed_through())
        return self.mark_unhealthy(
            [d.name for d in self._inventory if wanted.intersection(device_uuids(d))], reason, short
        )

    def concerned(self, event: XidEvent) -> list[Device]:
        """The devices an XID event is about."""
        named = [d for d in self._inventory if d.uuid == event.uuid]
        if named:
            # A GPU published whole (whatever instance NVML names: it is all one device), or a
            # MIG device named by its own UUID.
            return named
        migs = [d for d in self._inventory if isinstance(d, MigDevice) and d.parent.uuid == event.uuid]
        if event.gpu_instance_id is None:
            return list(migs)
        return [
            d
            for d in migs
            if d.gpu_instance_id == event.gpu_instance_id
            and event.compute_instance_id in (None, d.compute_instance_id)
        ]

    def apply(self, event: XidEvent) -> list[str]:
        """Account for one XID event; return the devices whose health changed."""
        where = event.uuid
        if event.gpu_instance_id is not None:
            where += f" GPU instance {event.gpu_instance_id}"
            if event.compute_instance_id is not None:
                where += f" compute instance {event.compute_instance_id}"
        if event.xid in self.ignored_xids:
            log.info("XID %d on %s is an application error; device health unchanged", event.xid, where)
            return []
        affected = [d.name for d in self.concerned(event)]
        if not affected:
            log.warning("XID %d on %s, which is not a published device", event.xid, where)
        return self.mark_unhealthy(affected, f"XID {event.xid}", f"XID-{event.xid}")

    def recover(self, quiet: float) -> list[str]:
        """Mark healthy the devices with no bad report for `quiet` seconds; return those changed."""
        now, wall = self._clock(), int(time.time())
        changed = [
            name
            for name, health in self._health.items()
            if not health.healthy and now - self._last_bad.get(name, now) >= quiet
        ]
        for name in changed:
            log.info(
                "device %s is healthy again: no critical XID or NVML error for %gs (was: %s)",
                name,
                quiet,
                self._health[name].reason,
            )
            self._health[name] = DeviceHealth(True, wall)
            del self._last_bad[name]
        if changed:
            self._changed_now()
        return changed

    def clear(self, name: str, quiet: float, failing: Callable[[Device], str | None]) -> str:
        """Mark one device healthy on an admin's word; say what was done, or ClearRefusedError why not.

        Refused while the device still fails: `failing` (a look at the GPU through
        NVML now) names a failure, or a critical XID or failed NVML wait came in
        within the quiet period. The mark is the driver's own; nothing else clears it.
        """
        device = next((d for d in self._inventory if d.name == name), None)
        if device is None:
            known = ", ".join(d.name for d in self._inventory) or "none"
            raise ClearRefusedError(f"no device {name} on this node (devices: {known})")
        health = self._health[name]
        if health.healthy:
            return f"{name} is healthy: nothing to clear"
        problem = failing(device)
        if problem is not None:
            raise ClearRefusedError(f"{name} still fails: {problem}")
        ago = self._clock() - self._last_bad.get(name, float("-inf"))
        if ago < quiet:
            raise ClearRefusedError(
                f"{name} reported {health.reason} {ago:.0f}s ago, within the quiet period of {quiet:g}s "
                f"(--health-recovery-period); it is healthy again {quiet - ago:.0f}s after the last report"
            )
        log.warning("device %s marked healthy by an admin (was: %s)", name, health.reason)
        self._health[name] = DeviceHealth(True, int(time.time()))
        self._last_bad.pop(name, None)
        self._changed_now()
        return f"{name} is healthy again (was: {health.reason})"

    async def keep_recovering(
        self, quiet: float, on_change: Callable[[list[str]], None] | None = None
    ) -> None:
        """Call recover() often enough that a device comes back within a quarter period (until cancelled)."""
        while True:
            await anyio.sleep(min(quiet / 4, 5.0))
            changed = self.recover(quiet)
            if changed and on_change is not None:
                on_change(changed)

    def next_change(self) -> anyio.Event:
        """An event that is set at the next change of any device's health."""
        return self._changed

    def follow(self, active: Callable[[], bool], poll: float = 1.0) -> Iterator[dict[str, DeviceHealth]]:
        """From a thread of its own: the current health, then the new health after every change, for
        as long as `active()` says (asked at least every `poll` seconds)."""
        seen = -1
        while active():
            version = self._next_version(seen, poll)
            if version != seen:
                seen = version
                yield self.snapshot()

    def _next_version(self, seen: int, timeout: float) -> int:
        """The count of changes once it is past `seen`, or as it is after `timeout` seconds."""
        with self._versioned:
            self._versioned.wait_for(lambda: self._version != seen, timeout)
            return self._version


def gpu_failure(lib: GpuLibrary, device: Device) -> str | None:
    """What NVML says is wrong with the device's GPU right now (None: it answers, as itself)."""
    gpu = device.parent if isinstance(device, MigDevice) else device
    try:
        found = lib.uuid(lib.device_by_index(gpu.index))
    except GpuLibraryError as err:
        return f"NVML cannot reach {describe(gpu)}: NVML error {err.code}: {err}"
    if found != gpu.uuid:
        return f"NVML has {found} at index {gpu.index}, not {gpu.uuid}"
    return None


class HealthMonitor:
    """Waits for NVML XID events in a thread and feeds them to the tracker, until stop().

    Each GPU is registered on its own: one that cannot be watched (NOT_SUPPORTED
    on older models) is named in a warning and left out, and its devices stay
    healthy, since the device plugin API has no "unknown". A failing wait never
    ends the thread: the devices it may hide are marked unhealthy, and the wait
    is retried with backoff. The event set belongs to the thread, which frees it
    when it ends; stop() waits for that, so that NVML can be shut down after it
    without freeing memory that a wait still uses.
    """

    def __init__(
        self,
        lib: GpuLibrary,
        tracker: HealthTracker,
        inventory: Inventory,
        retry: tuple[float, float] = (RETRY_MIN_S, RETRY_MAX_S),
    ) -> None:
        self._lib = lib
        self._tracker = tracker
        self._inventory = inventory
        self._retry_min, self._retry_max = retry
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: GPUs whose XID errors cannot be watched (known once start() returned).
        self.unwatched: tuple[Gpu, ...] = ()

    def start(self, on_change: Callable[[list[str]], None] | None = None) -> tuple[Gpu, ...]:
        """Register the GPUs and begin waiting; call from the event loop. Returns the unwatched GPUs."""
        token = anyio.lowlevel.current_token()
        watched = self._register()
        if not watched:
            self._release()
            return self.unwatched

        def run() -> None:
            try:
                self._wait_for_events(watched, token, on_change)
            except anyio.RunFinishedError:
                pass  # the event loop ended before us: the process is exiting
            except Exception:
                # Not NVML (those are retried) but a bug: say so in the log, where health is watched.
                log.exception("GPU health monitoring stopped by an unexpected error")
            finally:
                self._release()

        self._thread = threading.Thread(target=run, name="xid-events", daemon=True)
        self._thread.start()
        return self.unwatched

    async def stop(self) -> bool:
        """End the thread and wait for it; False when it is still inside NVML after STOP_TIMEOUT_S.

        The event loop stays free while waiting: the thread may need it to report a last change.
        """
        self._stop.set()
        thread = self._thread
        if thread is None:
            return True
        await anyio.to_thread.run_sync(thread.join, STOP_TIMEOUT_S)
        if thread.is_alive():
            log.warning("the XID event thread has not ended after %gs; leaving NVML as it is", STOP_TIMEOUT_S)
            return False
        return True

    def _register(self) -> dict[str, GpuHandle]:
        watched: dict[str, GpuHandle] = {}
        unwatched: list[Gpu] = []
        for gpu in self._inventory.gpus:
            try:
                handle = self._lib.device_by_index(gpu.index)
                self._lib.watch_xid_events(handle)
            except GpuLibraryError as err:
                unwatched.append(gpu)
                log.warning(
                    "%s cannot be watched for XID errors (NVML error %d: %s): its health is unknown, "
                    "and its devices are reported healthy",
                    describe(gpu),
                    err.code,
                    err,
                )
                continue
            watched[gpu.uuid] = handle
        self.unwatched = tuple(unwatched)
        return watched

    def _release(self) -> None:
        try:
            self._lib.unwatch_xid_events()
        except GpuLibraryError as err:
            log.warning("freeing the XID event set failed: NVML error %d: %s", err.code, err)

    def _wait_for_events(
        self,
        watched: dict[str, GpuHandle],
        token: anyio.lowlevel.EventLoopToken,
        on_change: Callable[[list[str]], None] | None,
    ) -> None:
        def report(changed: list[str]) -> None:
            if changed and on_change is not None:
                anyio.from_thread.run_sync(on_change, changed, token=token)

        delay = self._retry_min
        failing: int | None = None  # the NVML error of the current run of failed waits
        while not self._stop.is_set():
            try:
                event = self._lib.wait_xid_event(WAIT_MS)
            except GpuLibraryError as err:
                lost = self._lost_gpus(err, watched)
                reason = f"waiting for XID events failed: NVML error {err.code}"
                short = "GPU-lost" if err.code == ERROR_GPU_IS_LOST else f"NVML-error-{err.code}"
                report(
                    anyio.from_thread.run_sync(
                        self._tracker.mark_gpus_unhealthy, lost, reason, short, token=token
                    )
                )
                if err.code != failing:
                    log.error(
                        "waiting for XID events failed (NVML error %d: %s): devices of %s marked "
                        "unhealthy; retrying with backoff up to %gs",
                        err.code,
                        err,
                        "every watched GPU" if len(lost) == len(watched) > 1 else ", ".join(lost),
                        self._retry_max,
                    )
                failing = err.code
                self._stop.wait(delay)
                delay = min(delay * 2, self._retry_max)
                continue
            if failing is not None:
                log.info("waiting for XID events works again")
                failing, delay = None, self._retry_min
            if event is not None:
                report(anyio.from_thread.run_sync(self._tracker.apply, event, token=token))

    def _lost_gpus(self, err: GpuLibraryError, watched: dict[str, GpuHandle]) -> list[str]:
        """The GPUs a failed wait is about: those NVML reports lost, else every watched one."""
        if err.code == ERROR_GPU_IS_LOST:
            # The wait does not say which GPU fell off the bus; asking each one does.
            lost = [uuid for uuid, handle in watched.items() if self._is_lost(handle)]
            if lost:
                return lost
        return list(watched)

    def _is_lost(self, handle: GpuHandle) -> bool:
        try:
            self._lib.uuid(handle)
        except GpuLibraryError as err:
            return err.code == ERROR_GPU_IS_LOST
        return False
