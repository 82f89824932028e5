"""Unhealthy devices as ResourceSlice taints: the entry, when it is published, that a steady
health writes nothing, and the admin's clear (refused while the device still fails)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio
import pytest

from dra.cli.parser import parse_args
from dra.core import slices
from dra.core.taints import DeviceTaint, Effect, parse_effect, taint_value, unhealthy_taint
from dra.core.versions import ApiFeatures
from dra.daemon.health import APPLICATION_XIDS, ClearRefusedError, HealthTracker, gpu_failure, parse_xids
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.library import GpuLibraryError, XidEvent
from dra.kubeletplugin.healthctl import HealthControl, HealthControlError, clear
from dra.kubeletplugin.publisher import SlicePublisher
from dra.model.devices import Device
from tests.unit.helpers import DRIVER, NODE, inventory
from tests.unit.test_publisher import FakeKube
from tests.unit.test_slices import _many

TAINTS_ON = ApiFeatures(34, device_taints=True)
#: 2026-11-23T12:00:00Z
NOON = 1795435200


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _devices(objs: list[slices.Obj]) -> dict[str, slices.Obj]:
    return {d["name"]: d for s in objs for d in s["spec"]["devices"]}


def test_the_taint_entry_is_what_the_api_stores() -> None:
    taint = unhealthy_taint(DRIVER, "XID 79", Effect.NO_SCHEDULE, NOON)
    assert taint.entry() == {
        "key": "gpu.nvidia.com/unhealthy",
        "value": "XID-79",
        "effect": "NoSchedule",
        "timeAdded": "2026-11-23T12:00:00Z",
    }


@pytest.mark.parametrize(
    ("reason", "value"),
    [
        ("XID-79", "XID-79"),
        ("waiting for XID events failed: NVML error 15", "waiting-for-XID-events-failed-NVML-error-15"),
        ("  ", "unknown"),
        ("x" * 80, "x" * 63),
    ],
)
def test_a_reason_becomes_a_valid_taint_value(reason: str, value: str) -> None:
    assert taint_value(reason) == value


def test_a_bad_effect_names_the_valid_ones() -> None:
    assert parse_effect("NoExecute") is Effect.NO_EXECUTE
    with pytest.raises(ValueError, match="'Evict' is not a taint effect: expected NoSchedule or NoExecute"):
        parse_effect("Evict")


def test_taints_are_published_only_where_the_server_keeps_them() -> None:
    inv = inventory("mixed")
    taint = {"gpu-1": DeviceTaint("gpu.nvidia.com/unhealthy", "XID-79", Effect.NO_EXECUTE, NOON)}
    published = _devices(slices.build_slices(inv, DRIVER, NODE, None, 1, TAINTS_ON, taint))
    assert published["gpu-1"]["taints"] == [taint["gpu-1"].entry()]
    assert [n for n, d in published.items() if "taints" in d] == ["gpu-1"]
    # A server that drops taints gets the device as before, untainted.
    plain = _devices(slices.build_slices(inv, DRIVER, NODE, None, 1, ApiFeatures(34), taint))
    assert "taints" not in plain["gpu-1"]


def test_with_taints_a_slice_holds_at_most_64_devices() -> None:
    # The API's lower limit once a device has taints; applied whether or not one has one now.
    assert [len(s["spec"]["devices"]) for s in slices.build_slices(_many(130), DRIVER, NODE, None, 1)] == [
        128,
        2,
    ]
    cut = slices.build_slices(_many(130), DRIVER, NODE, None, 1, TAINTS_ON)
    assert [len(s["spec"]["devices"]) for s in cut] == [64, 64, 2]


def test_the_tracker_taints_each_unhealthy_device_from_when_it_became_unhealthy() -> None:
    tracker = HealthTracker(inventory("mixed"))
    tracker.mark_gpus_unhealthy([inventory("mixed").gpus[2].uuid], "lost", "GPU-lost")
    since = tracker.snapshot()["gpu-2"].since
    assert tracker.taints(DRIVER, Effect.NO_SCHEDULE) == {
        "gpu-2": DeviceTaint("gpu.nvidia.com/unhealthy", "GPU-lost", Effect.NO_SCHEDULE, since)
    }
    # Reported again: still the same taint, added at the same time.
    tracker.mark_unhealthy(["gpu-2"], "XID 79", "XID-79")
    assert tracker.taints(DRIVER, Effect.NO_SCHEDULE)["gpu-2"].time_added == since


@pytest.mark.anyio
async def test_a_taint_is_one_update_under_the_same_generation_and_then_nothing() -> None:
    kube = FakeKube()
    clock = _Clock()
    tracker = HealthTracker(inventory("mixed"), clock)
    publisher = SlicePublisher(
        kube,  # type: ignore[arg-type]
        DRIVER,
        NODE,
        inventory("mixed"),
        TAINTS_ON,
        lambda: tracker.taints(DRIVER, Effect.NO_SCHEDULE),
    )
    assert (await publisher.reconcile()).generation == 1
    tracker.mark_unhealthy(["gpu-0"], "XID 79", "XID-79")
    plan = await publisher.reconcile()
    assert (len(plan.update), plan.generation) == (1, 1)
    assert _devices(kube.server.list())["gpu-0"]["taints"][0]["value"] == "XID-79"
    assert (await publisher.reconcile()).writes == 0, "a steady taint is not rewritten"
    clock.now += 300
    assert tracker.recover(300) == ["gpu-0"]
    plan = await publisher.reconcile()
    assert (len(plan.update), plan.generation) == (1, 1)
    assert "taints" not in _devices(kube.server.list())["gpu-0"]


def _fine(_: Device) -> str | None:
    return None


def test_a_clear_is_refused_within_the_quiet_period_and_done_after() -> None:
    clock = _Clock()
    tracker = HealthTracker(inventory("mixed"), clock)
    tracker.mark_unhealthy(["gpu-1"], "XID 79", "XID-79")
    clock.now += 100
    with pytest.raises(ClearRefusedError) as refused:
        tracker.clear("gpu-1", 300, _fine)
    assert str(refused.value) == (
        "gpu-1 reported XID 79 100s ago, within the quiet period of 300s (--health-recovery-period); "
        "it is healthy again 200s after the last report"
    )
    # With no automatic recovery (period 0), the admin's word is what ends it.
    assert tracker.clear("gpu-1", 0, _fine) == "gpu-1 is healthy again (was: XID 79)"
    assert tracker.snapshot()["gpu-1"].healthy
    assert tracker.clear("gpu-1", 0, _fine) == "gpu-1 is healthy: nothing to clear"


def test_a_clear_is_refused_while_nvml_cannot_reach_the_gpu_or_the_device_is_unknown() -> None:
    inv = inventory("mixed")
    tracker = HealthTracker(inv)
    tracker.mark_unhealthy(["gpu-0"], "waiting for XID events failed: NVML error 15", "GPU-lost")

    class Lost(FakeGpuLibrary):
        def uuid(self, gpu: object) -> str:
            raise GpuLibraryError(15, "GPU is lost")

    lib = Lost(load_profile("mixed"), NODE)
    lib.init()
    with pytest.raises(ClearRefusedError, match=r"gpu-0 still fails: NVML cannot reach .* NVML error 15"):
        tracker.clear("gpu-0", 0, lambda d: gpu_failure(lib, d))
    with pytest.raises(ClearRefusedError, match=r"no device gpu-9 on this node \(devices: gpu-0, gpu-1"):
        tracker.clear("gpu-9", 0, _fine)


def test_nvml_answering_as_the_gpu_is_no_failure() -> None:
    lib = FakeGpuLibrary(load_profile("mixed"), NODE)
    lib.init()
    assert gpu_failure(lib, inventory("mixed").gpus[2]) is None


@pytest.mark.anyio
async def test_the_command_gets_the_drivers_answer_over_the_socket(tmp_path: Path) -> None:
    tracker = HealthTracker(inventory("mixed"))
    tracker.mark_unhealthy(["gpu-3"], "XID 79", "XID-79")
    lib = FakeGpuLibrary(load_profile("mixed"), NODE)
    lib.init()
    changed: list[list[str]] = []
    control = HealthControl(tmp_path / "health.sock", tracker, lib, 0, changed.append)
    async with anyio.create_task_group() as group:
        group.start_soon(control.run)
        with anyio.fail_after(5):
            while not control.path.exists():  # noqa: ASYNC110 (the listener says nothing when it binds)
                await anyio.sleep(0.01)
        assert await clear(control.path, "gpu-3") == "gpu-3 is healthy again (was: XID 79)"
        with pytest.raises(HealthControlError, match="no device gpu-7 on this node"):
            await clear(control.path, "gpu-7")
        group.cancel_scope.cancel()
    assert changed == [["gpu-3"]]
    assert not control.path.exists()
    assert control.answer(b"clear gpu-3") == {"ok": False, "message": 'expected {"clear": "<device name>"}'}
    assert json.loads(json.dumps(control.answer(b'{"clear": "gpu-3"}')))["ok"]


@pytest.mark.anyio
async def test_without_a_driver_the_command_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(HealthControlError, match=r"cannot ask the driver through .*health\.sock"):
        await clear(tmp_path / "health.sock", "gpu-0")


def test_a_refused_clear_is_logged(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    tracker = HealthTracker(inventory("mixed"))
    tracker.mark_unhealthy(["gpu-3"], "XID 79", "XID-79")
    lib = FakeGpuLibrary(load_profile("mixed"), NODE)
    control = HealthControl(tmp_path / "health.sock", tracker, lib, 300, lambda _: None)
    with caplog.at_level(logging.WARNING, logger="dra.kubeletplugin.healthctl"):
        assert control.answer(b'{"clear": "gpu-3"}')["ok"] is False
    assert "clearing the unhealthy mark of gpu-3 refused: gpu-3 reported XID 79" in caplog.text


def test_ignored_xids_replace_the_application_set() -> None:
    assert parse_xids("") == frozenset()
    assert parse_xids(" 13, 79 ,") == {13, 79}
    with pytest.raises(ValueError, match="'abc' is not an XID"):
        parse_xids("13,abc")
    tracker = HealthTracker(inventory("mixed"), ignored_xids=parse_xids("79"))
    uuid = inventory("mixed").gpus[0].uuid
    assert tracker.apply(XidEvent(uuid, 79)) == []
    assert tracker.apply(XidEvent(uuid, 13)) == ["gpu-0"], "13 is no longer ignored"


def test_a_bad_xid_list_is_one_startup_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["kubelet-plugin", "--node-name=n", "--ignored-xids=13,x"])
    assert exited.value.code == 2
    assert "argument --ignored-xids: 'x' is not an XID" in capsys.readouterr().err
    assert parse_args(["kubelet-plugin", "--node-name=n"]).ignored_xids == APPLICATION_XIDS
