"""Device health from XID errors: which errors count, which devices they hit, and the watch stream."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncGenerator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from dra.devices import Inventory, MigDevice
from dra.fakegpu import FakeGpuLibrary
from dra.fakeprofiles import load_profile
from dra.health import APPLICATION_XIDS, DeviceHealth, HealthMonitor, HealthTracker
from dra.nvml import ERROR_GPU_IS_LOST, GpuLibraryError, XidEvent
from tests.unit.helpers import NODE, inventory


def _unhealthy(tracker: HealthTracker) -> list[str]:
    return sorted(name for name, health in tracker.snapshot().items() if not health.healthy)


def _mig_uuid(inv: Inventory, name: str) -> str:
    device = inv.get(name)
    assert isinstance(device, MigDevice)
    return device.uuid


def test_every_device_starts_healthy() -> None:
    inv = inventory("h100x8-mig")
    snapshot = HealthTracker(inv).snapshot()
    assert list(snapshot) == [d.name for d in inv]
    assert all(h.healthy and h.reason == "" for h in snapshot.values())


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_leave_health_alone(xid: int) -> None:
    inv = inventory("h100x8")
    tracker = HealthTracker(inv)
    assert tracker.apply(XidEvent(inv.gpus[0].uuid, xid)) == []
    assert _unhealthy(tracker) == []


def test_application_xids_are_the_ones_nvidia_ignores() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == APPLICATION_XIDS


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 94, 95, 119])
def test_other_xids_make_the_gpu_unhealthy_once(xid: int) -> None:
    inv = inventory("h100x8")
    tracker = HealthTracker(inv)
    assert tracker.apply(XidEvent(inv.gpus[3].uuid, xid)) == ["gpu-3"]
    health = tracker.snapshot()["gpu-3"]
    assert not health.healthy
    assert health.reason == f"XID {xid}"
    assert health.since > 0
    assert tracker.apply(XidEvent(inv.gpus[3].uuid, xid)) == []
    assert tracker.apply(XidEvent(inv.gpus[3].uuid, 31)) == []
    assert _unhealthy(tracker) == ["gpu-3"]


def test_a_gpu_xid_hits_every_mig_device_of_that_gpu() -> None:
    inv = inventory("h100x8-mig")
    tracker = HealthTracker(inv)
    changed = tracker.apply(XidEvent(inv.gpus[5].uuid, 79))
    assert changed == [d.name for d in inv if d.name.startswith("gpu-5-mig-")]
    assert len(changed) == 4
    assert _unhealthy(tracker) == sorted(changed)


def test_a_mig_xid_hits_that_mig_device_only() -> None:
    inv = inventory("h100x8-mig")
    tracker = HealthTracker(inv)
    name = "gpu-6-mig-2g20gb-2-0"
    assert tracker.apply(XidEvent(_mig_uuid(inv, name), 94)) == [name]
    assert _unhealthy(tracker) == [name]
    # The parent's error still reaches its other MIG devices, and only them.
    assert len(tracker.apply(XidEvent(inv.gpus[6].uuid, 79))) == 3


def test_an_xid_on_an_unknown_device_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    tracker = HealthTracker(inventory("h100x8"))
    with caplog.at_level(logging.WARNING, logger="dra.health"):
        assert tracker.apply(XidEvent("GPU-00000000-0000-0000-0000-000000000000", 79)) == []
    assert "which is not a published device" in caplog.text
    assert _unhealthy(tracker) == []


def test_mark_unhealthy_ignores_unknown_names() -> None:
    tracker = HealthTracker(inventory("mixed"))
    assert tracker.mark_unhealthy(["gpu-9", "gpu-1"], "fell off the bus") == ["gpu-1"]
    assert tracker.snapshot()["gpu-1"].reason == "fell off the bus"


def _watch(tracker: HealthTracker) -> AsyncGenerator[dict[str, DeviceHealth]]:
    stream = tracker.watch()
    assert isinstance(stream, AsyncGenerator)
    return stream


@pytest.mark.anyio
async def test_watch_yields_the_snapshot_then_each_change() -> None:
    inv = inventory("h100x8")
    tracker = HealthTracker(inv)
    stream = _watch(tracker)
    try:
        with anyio.fail_after(2):
            first = await anext(stream)
        assert all(h.healthy for h in first.values())
        # A change made before the consumer asks again is not lost.
        tracker.apply(XidEvent(inv.gpus[1].uuid, 79))
        with anyio.fail_after(2):
            second = await anext(stream)
        assert not second["gpu-1"].healthy
        assert first["gpu-1"].healthy  # snapshots are copies

        # A waiting consumer wakes on the next change.
        async def change_soon() -> None:
            await anyio.sleep(0.01)
            tracker.apply(XidEvent(inv.gpus[2].uuid, 48))

        async with anyio.create_task_group() as group:
            group.start_soon(change_soon)
            with anyio.fail_after(2):
                third = await anext(stream)
        assert [n for n, h in third.items() if not h.healthy] == ["gpu-1", "gpu-2"]
    finally:
        await stream.aclose()


@pytest.mark.anyio
async def test_watch_sends_nothing_while_nothing_changes() -> None:
    tracker = HealthTracker(inventory("mixed"))
    stream = _watch(tracker)
    try:
        await anext(stream)
        with anyio.move_on_after(0.05) as scope:
            await anext(stream)
        assert scope.cancelled_caught
    finally:
        await stream.aclose()


@pytest.mark.anyio
async def test_the_monitor_feeds_xid_events_from_the_library_to_the_tracker(tmp_path: Path) -> None:
    events = tmp_path / "xid-events"
    lib = FakeGpuLibrary(load_profile("h100x8-mig"), NODE, events)
    inv = inventory("h100x8-mig")
    tracker = HealthTracker(inv)
    monitor = HealthMonitor(lib, tracker, inv)
    reported: list[list[str]] = []
    changed = anyio.Event()

    def on_change(names: list[str]) -> None:
        reported.append(names)
        changed.set()

    monitor.start(on_change)
    try:
        events.write_text(f"{inv.gpus[0].uuid} 43\n{_mig_uuid(inv, 'gpu-7-mig-1g10gb-3-0')} 79\n")
        with anyio.fail_after(5):
            await changed.wait()
    finally:
        monitor.stop()
    assert reported == [["gpu-7-mig-1g10gb-3-0"]]
    assert _unhealthy(tracker) == ["gpu-7-mig-1g10gb-3-0"]


class FailingEvents(FakeGpuLibrary):
    """A library whose event wait fails: the GPU fell off the bus."""

    def wait_xid_event(self, timeout_ms: int) -> XidEvent | None:
        raise GpuLibraryError(ERROR_GPU_IS_LOST, "nvmlEventSetWait_v2: GPU is lost")


class Collect(logging.Handler):
    """Collects records from any thread and says when an error arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.error = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if record.levelno >= logging.ERROR:
            self.error.set()


@pytest.mark.anyio
async def test_the_monitor_stops_with_an_error_line_when_nvml_fails() -> None:
    inv = inventory("h100x8")
    monitor = HealthMonitor(FailingEvents(load_profile("h100x8"), NODE), HealthTracker(inv), inv)
    collect = Collect()
    logger = logging.getLogger("dra.health")
    logger.addHandler(collect)
    try:
        monitor.start()
        assert await anyio.to_thread.run_sync(collect.error.wait, 5)
    finally:
        monitor.stop()
        logger.removeHandler(collect)
    assert collect.messages == [
        "GPU health monitoring stopped: NVML error 15: nvmlEventSetWait_v2: GPU is lost"
    ]
