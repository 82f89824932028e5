"""Device health from XID errors: which errors count, which devices they hit, and the watch stream."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from dra.daemon import health
from dra.daemon.health import APPLICATION_XIDS, DeviceHealth, HealthMonitor, HealthTracker
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.library import (
    ERROR_GPU_IS_LOST,
    ERROR_NOT_SUPPORTED,
    GpuHandle,
    GpuLibraryError,
    MigHandle,
    XidEvent,
)
from dra.model.devices import Gpu, Inventory, MigDevice
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


def test_an_xid_in_one_mig_instance_hits_that_mig_device_only() -> None:
    inv = inventory("h100x8-mig")
    tracker = HealthTracker(inv)
    gpu = inv.gpus[6].uuid
    assert tracker.apply(XidEvent(gpu, 79, gpu_instance_id=2, compute_instance_id=0)) == [
        "gpu-6-mig-2g20gb-2-0"
    ]
    # A GPU instance without a compute instance: every MIG device of that GPU instance.
    assert tracker.apply(XidEvent(gpu, 79, gpu_instance_id=3)) == ["gpu-6-mig-1g10gb-3-0"]
    assert _unhealthy(tracker) == ["gpu-6-mig-1g10gb-3-0", "gpu-6-mig-2g20gb-2-0"]
    # The same instance IDs on another GPU are other MIG devices.
    assert tracker.apply(XidEvent(inv.gpus[7].uuid, 48, 2, 0)) == ["gpu-7-mig-2g20gb-2-0"]


def test_an_xid_in_an_instance_that_is_not_published_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inv = inventory("h100x8-mig")
    tracker = HealthTracker(inv)
    with caplog.at_level(logging.WARNING, logger="dra.daemon.health"):
        assert tracker.apply(XidEvent(inv.gpus[6].uuid, 79, gpu_instance_id=9, compute_instance_id=0)) == []
        assert tracker.apply(XidEvent(inv.gpus[6].uuid, 79, gpu_instance_id=2, compute_instance_id=1)) == []
    assert f"XID 79 on {inv.gpus[6].uuid} GPU instance 9 compute instance 0, which is not" in caplog.text
    assert _unhealthy(tracker) == []


def test_instance_ids_on_a_gpu_published_whole_still_hit_the_gpu() -> None:
    # NVML should not place an XID in a MIG instance of a GPU not in MIG mode; if it does, the
    # error is still on that GPU, which is one device.
    inv = inventory("h100x8-mig")
    tracker = HealthTracker(inv)
    assert tracker.apply(XidEvent(inv.gpus[1].uuid, 79, gpu_instance_id=1, compute_instance_id=0)) == [
        "gpu-1"
    ]


def test_an_application_xid_in_a_mig_instance_changes_nothing() -> None:
    inv = inventory("h100x8-mig")
    tracker = HealthTracker(inv)
    assert tracker.apply(XidEvent(inv.gpus[6].uuid, 43, gpu_instance_id=2, compute_instance_id=0)) == []
    assert _unhealthy(tracker) == []


def test_an_xid_on_an_unknown_device_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    tracker = HealthTracker(inventory("h100x8"))
    with caplog.at_level(logging.WARNING, logger="dra.daemon.health"):
        assert tracker.apply(XidEvent("GPU-00000000-0000-0000-0000-000000000000", 79)) == []
    assert "which is not a published device" in caplog.text
    assert _unhealthy(tracker) == []


def test_mark_gpus_unhealthy_hits_each_gpu_or_its_mig_devices() -> None:
    inv = inventory("h100x8-mig")
    tracker = HealthTracker(inv)
    changed = tracker.mark_gpus_unhealthy([inv.gpus[0].uuid, inv.gpus[4].uuid], "lost")
    assert changed == ["gpu-0", *(d.name for d in inv if d.name.startswith("gpu-4-mig-"))]
    assert tracker.snapshot()["gpu-0"].reason == "lost"


def test_mark_unhealthy_ignores_unknown_names() -> None:
    tracker = HealthTracker(inventory("mixed"))
    assert tracker.mark_unhealthy(["gpu-9", "gpu-1"], "fell off the bus") == ["gpu-1"]
    assert tracker.snapshot()["gpu-1"].reason == "fell off the bus"


def test_follow_yields_the_snapshot_then_each_change() -> None:
    inv = inventory("h100x8")
    tracker = HealthTracker(inv)
    stream = tracker.follow(lambda: True, poll=0.01)
    first = next(stream)
    assert all(h.healthy for h in first.values())
    # A change made before the follower asks again is not lost.
    tracker.apply(XidEvent(inv.gpus[1].uuid, 79))
    second = next(stream)
    assert not second["gpu-1"].healthy
    assert first["gpu-1"].healthy  # snapshots are copies

    # A waiting follower (the health stream's thread) wakes on the next change.
    timer = threading.Timer(0.05, tracker.apply, (XidEvent(inv.gpus[2].uuid, 48),))
    timer.start()
    started = time.monotonic()
    third = next(stream)
    timer.join()
    assert [n for n, h in third.items() if not h.healthy] == ["gpu-1", "gpu-2"]
    assert time.monotonic() - started < 2


def test_follow_sends_nothing_while_nothing_changes_and_ends_when_inactive() -> None:
    tracker = HealthTracker(inventory("mixed"))
    asked: list[float] = []

    def active() -> bool:
        asked.append(time.monotonic())
        return len(asked) < 4

    # Asked every poll while nothing changes; no second snapshot; over once inactive.
    assert len(list(tracker.follow(active, poll=0.01))) == 1
    assert len(asked) == 4


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
        assert await monitor.stop()
    assert reported == [["gpu-7-mig-1g10gb-3-0"]]
    assert _unhealthy(tracker) == ["gpu-7-mig-1g10gb-3-0"]


Step = XidEvent | GpuLibraryError


class ScriptedNvml(FakeGpuLibrary):
    """Fake GPUs whose event waits follow a script, some of which cannot be watched or are lost.

    Each wait takes the next step: an XidEvent is returned, a GpuLibraryError raised; once the
    script is done, waits time out and `drained` is set. `lost` GPUs answer GPU_IS_LOST when
    asked for their UUID, as NVML does for a GPU that fell off the bus.
    """

    def __init__(
        self,
        profile: str,
        steps: list[Step],
        unwatchable: tuple[int, ...] = (),
        lost: tuple[int, ...] = (),
    ) -> None:
        super().__init__(load_profile(profile), NODE)
        self.steps = list(steps)
        # Fake GPU handles are indexes.
        self.unwatchable = {str(i) for i in unwatchable}
        self.lost = {str(i) for i in lost}
        self.waits = 0
        self.drained = threading.Event()
        self.watched: list[str] = []
        self.freed_by: list[str] = []

    def watch_xid_events(self, gpu: GpuHandle) -> None:
        if str(gpu) in self.unwatchable:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "nvmlDeviceRegisterEvents: Not Supported")
        self.watched.append(str(gpu))

    def uuid(self, gpu: GpuHandle | MigHandle) -> str:
        if str(gpu) in self.lost:
            raise GpuLibraryError(ERROR_GPU_IS_LOST, "nvmlDeviceGetUUID: GPU is lost")
        return super().uuid(gpu)

    def wait_xid_event(self, timeout_ms: int) -> XidEvent | None:
        self.waits += 1
        if not self.steps:
            self.drained.set()
            time.sleep(0.005)
            return None
        step = self.steps.pop(0)
        if isinstance(step, GpuLibraryError):
            raise step
        return step

    def unwatch_xid_events(self) -> None:
        self.freed_by.append(threading.current_thread().name)


class Collect(logging.Handler):
    """Collects records from any thread."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def at(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == level]


@pytest.fixture
def health_log() -> Iterator[Collect]:
    collect = Collect()
    logger = logging.getLogger("dra.daemon.health")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(collect)
    try:
        yield collect
    finally:
        logger.removeHandler(collect)
        logger.setLevel(level)


async def _run_script(lib: ScriptedNvml, inv: Inventory) -> tuple[HealthTracker, tuple[Gpu, ...], list[str]]:
    """Run a monitor until the script is done; the tracker, the unwatched GPUs, the changes reported."""
    tracker = HealthTracker(inv)
    monitor = HealthMonitor(lib, tracker, inv, retry=(0.01, 0.02))
    reported: list[str] = []
    try:
        unwatched = monitor.start(reported.extend)
        assert await anyio.to_thread.run_sync(lib.drained.wait, 10)
    finally:
        assert await monitor.stop()
    assert lib.freed_by == ["xid-events"]
    return tracker, unwatched, reported


LOST = GpuLibraryError(ERROR_GPU_IS_LOST, "nvmlEventSetWait_v2: GPU is lost")


@pytest.mark.anyio
async def test_a_gpu_that_cannot_be_watched_is_named_once_and_the_others_are_watched(
    health_log: Collect,
) -> None:
    inv = inventory("mixed")
    lib = ScriptedNvml("mixed", [XidEvent(inv.gpus[3].uuid, 79)], unwatchable=(2,))
    tracker, unwatched, reported = await _run_script(lib, inv)
    assert unwatched == (inv.gpus[2],)
    assert [m for m in health_log.at(logging.WARNING) if "cannot be watched" in m] == [
        f"GPU 2 ({inv.gpus[2].uuid}, Tesla T4) cannot be watched for XID errors (NVML error 3: "
        "nvmlDeviceRegisterEvents: Not Supported): its health is unknown, and its devices are reported "
        "healthy"
    ]
    assert lib.watched == ["0", "1", "3"]
    assert reported == ["gpu-3"]
    assert _unhealthy(tracker) == ["gpu-3"]


@pytest.mark.anyio
async def test_no_watchable_gpu_starts_no_thread(health_log: Collect) -> None:
    inv = inventory("mixed")
    lib = ScriptedNvml("mixed", [], unwatchable=(0, 1, 2, 3))
    monitor = HealthMonitor(lib, HealthTracker(inv), inv)
    assert monitor.start() == inv.gpus
    assert lib.freed_by == ["MainThread"]
    assert await monitor.stop()
    assert lib.waits == 0
    assert len(health_log.at(logging.WARNING)) == 4


@pytest.mark.anyio
async def test_a_lost_gpu_makes_its_devices_unhealthy_and_the_wait_goes_on(health_log: Collect) -> None:
    inv = inventory("h100x8-mig")
    after = XidEvent(inv.gpus[1].uuid, 79)
    lib = ScriptedNvml("h100x8-mig", [LOST, LOST, LOST, after], lost=(5,))
    tracker, _, reported = await _run_script(lib, inv)
    gpu5 = [d.name for d in inv if d.name.startswith("gpu-5-mig-")]
    # The devices of the GPU NVML calls lost, once; then events are seen again.
    assert reported == [*gpu5, "gpu-1"]
    assert _unhealthy(tracker) == sorted(["gpu-1", *gpu5])
    assert tracker.snapshot()[gpu5[0]].reason == "waiting for XID events failed: NVML error 15"
    assert tracker.snapshot()[gpu5[0]].short == "GPU-lost", "the value of its taint"
    assert tracker.snapshot()["gpu-1"].short == "XID-79"
    assert health_log.at(logging.ERROR) == [
        "waiting for XID events failed (NVML error 15: nvmlEventSetWait_v2: GPU is lost): devices of "
        f"{inv.gpus[5].uuid} marked unhealthy; retrying with backoff up to 0.02s"
    ]
    assert health_log.at(logging.INFO)[-1] == "waiting for XID events works again"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error",
    [LOST, GpuLibraryError(999, "nvmlEventSetWait_v2: Unknown Error")],
    ids=["lost-but-nvml-cannot-say-which", "unknown-error"],
)
async def test_a_failed_wait_that_names_no_gpu_makes_every_watched_device_unhealthy(
    error: GpuLibraryError, health_log: Collect
) -> None:
    inv = inventory("mixed")
    lib = ScriptedNvml("mixed", [error, error], unwatchable=(3,))
    tracker, _, reported = await _run_script(lib, inv)
    assert reported == ["gpu-0", "gpu-1", "gpu-2"]
    # A GPU that is not in the event set is not what the wait is about.
    assert _unhealthy(tracker) == ["gpu-0", "gpu-1", "gpu-2"]
    [line] = health_log.at(logging.ERROR)
    assert f"NVML error {error.code}" in line
    assert "devices of every watched GPU marked unhealthy; retrying with backoff" in line


class StuckWait(FakeGpuLibrary):
    """A wait that does not return until released, longer than stop() waits."""

    def __init__(self) -> None:
        super().__init__(load_profile("mixed"), NODE)
        self.waiting = threading.Event()
        self.release = threading.Event()
        self.in_wait = False
        self.freed_during_wait: list[bool] = []

    def wait_xid_event(self, timeout_ms: int) -> XidEvent | None:
        self.in_wait = True
        self.waiting.set()
        self.release.wait(10)
        self.in_wait = False
        return None

    def unwatch_xid_events(self) -> None:
        self.freed_during_wait.append(self.in_wait)


@pytest.mark.anyio
async def test_stop_waits_for_the_thread_and_never_frees_under_a_wait(
    monkeypatch: pytest.MonkeyPatch, health_log: Collect
) -> None:
    monkeypatch.setattr(health, "STOP_TIMEOUT_S", 0.1)
    inv = inventory("mixed")
    lib = StuckWait()
    monitor = HealthMonitor(lib, HealthTracker(inv), inv)
    monitor.start()
    try:
        assert await anyio.to_thread.run_sync(lib.waiting.wait, 5)
        # Still inside the wait after the timeout: stop says so and nothing is freed.
        assert not await monitor.stop()
        assert lib.freed_during_wait == []
        assert "the XID event thread has not ended after 0.1s; leaving NVML as it is" in health_log.at(
            logging.WARNING
        )
    finally:
        lib.release.set()
    # Once the wait returns, the thread frees the event set itself, and stop() sees it end.
    monkeypatch.setattr(health, "STOP_TIMEOUT_S", 5.0)
    assert await monitor.stop()
    assert lib.freed_during_wait == [False]


@pytest.mark.anyio
async def test_an_unexpected_error_is_logged_and_the_event_set_still_freed(health_log: Collect) -> None:
    inv = inventory("mixed")
    lib = ScriptedNvml("mixed", [XidEvent(inv.gpus[0].uuid, 79)])
    monitor = HealthMonitor(lib, HealthTracker(inv), inv)

    raised = threading.Event()

    def broken(names: list[str]) -> None:
        raised.set()
        raise ValueError("bug")

    monitor.start(broken)
    assert await anyio.to_thread.run_sync(raised.wait, 5)
    assert await monitor.stop()
    assert health_log.at(logging.ERROR) == ["GPU health monitoring stopped by an unexpected error"]
    assert lib.freed_by == ["xid-events"]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_device_is_healthy_again_after_a_quiet_period(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    tracker = HealthTracker(inventory("h100x8"), clock)
    assert tracker.mark_unhealthy(["gpu-3"], "XID 79") == ["gpu-3"]
    clock.now += 299
    assert tracker.recover(300) == []
    clock.now += 1
    with caplog.at_level(logging.INFO, logger="dra.daemon.health"):
        assert tracker.recover(300) == ["gpu-3"]
    assert tracker.snapshot()["gpu-3"] == DeviceHealth(True, tracker.snapshot()["gpu-3"].since)
    assert (
        "device gpu-3 is healthy again: no critical XID or NVML error for 300s (was: XID 79)" in caplog.text
    )
    assert _unhealthy(tracker) == []


def test_every_new_report_restarts_the_quiet_period() -> None:
    clock = _Clock()
    tracker = HealthTracker(inventory("h100x8"), clock)
    tracker.mark_unhealthy(["gpu-1"], "XID 48")
    clock.now += 200
    # Already unhealthy: nothing changes, but the device is not quiet any more.
    assert tracker.mark_unhealthy(["gpu-1"], "XID 48") == []
    clock.now += 200
    assert tracker.recover(300) == []
    clock.now += 100
    assert tracker.recover(300) == ["gpu-1"]


@pytest.mark.anyio
async def test_recovery_wakes_the_watchers() -> None:
    clock = _Clock()
    tracker = HealthTracker(inventory("h100x8"), clock)
    tracker.mark_unhealthy(["gpu-2"], "XID 79")
    changed = tracker.next_change()
    clock.now += 10
    assert tracker.recover(10) == ["gpu-2"]
    assert changed.is_set()


@pytest.mark.anyio
async def test_keep_recovering_reports_what_came_back() -> None:
    tracker = HealthTracker(inventory("h100x8"))
    tracker.mark_unhealthy(["gpu-5"], "XID 79")
    seen: list[list[str]] = []
    with anyio.move_on_after(2):
        await tracker.keep_recovering(0.2, seen.append)
    assert seen == [["gpu-5"]]
    assert _unhealthy(tracker) == []
