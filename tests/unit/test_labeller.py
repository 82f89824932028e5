"""The node labeller against an in-memory Node: it writes only what changed, and only its own labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from dra.adapters.kube import KubeError
from dra.core.labels import AdminTemplate, Sharing
from dra.daemon.health import HealthTracker
from dra.labeller import daemon
from dra.labeller.daemon import Labeller, LabellerSettings, label_changes
from dra.model.devices import Inventory
from tests.unit.helpers import NODE, inventory

pytestmark = pytest.mark.anyio


class FakeKube:
    """One Node's labels, and the patches made to them."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = dict(labels)
        self.patches: list[tuple[dict[str, str], list[str]]] = []
        self.fail: KubeError | None = None
        #: Set at the next patch (replace it to wait for another).
        self.patched = anyio.Event()

    async def get_node(self, name: str) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        return {"metadata": {"name": name, "labels": dict(self.labels)}}

    async def patch_node_labels(self, name: str, labels: dict[str, str], remove: list[str]) -> dict[str, Any]:
        self.patches.append((labels, list(remove)))
        for key in remove:
            self.labels.pop(key, None)
        self.labels.update(labels)
        self.patched.set()
        return {"metadata": {"name": name, "labels": dict(self.labels)}}


def _labeller(kube: FakeKube, inv: Inventory, **settings: Any) -> tuple[Labeller, HealthTracker]:
    tracker = HealthTracker(inv)
    options = LabellerSettings(
        driver_name="gpu.nvidia.com",
        node_name=NODE,
        kubelet_root=Path("/var/lib/kubelet"),
        cdi_root=Path("/var/run/cdi"),
        state_dir=None,
        **settings,
    )
    return Labeller(kube, options, inv, tracker), tracker  # type: ignore[arg-type]


async def test_labels_are_written_once_and_others_are_left_alone() -> None:
    kube = FakeKube({"kubernetes.io/hostname": NODE, "nvidia.com/device-plugin.config": "a"})
    labeller, _ = _labeller(kube, inventory("h100x8"), admin=AdminTemplate({"gpu-type": "{model}"}))
    assert await labeller.sync()
    assert kube.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert kube.labels["gpu-type"] == "h100"
    assert kube.labels["kubernetes.io/hostname"] == NODE
    assert kube.labels["nvidia.com/device-plugin.config"] == "a"
    assert labeller.synced.is_set()
    await labeller.sync()
    assert len(kube.patches) == 1  # nothing changed: nothing written


async def test_an_unhealthy_gpu_changes_the_count() -> None:
    kube = FakeKube({})
    labeller, tracker = _labeller(kube, inventory("h100x8"))
    await labeller.sync()
    tracker.mark_unhealthy(["gpu-0"], "XID 79")
    await labeller.sync()
    assert kube.labels["nvidia.com/gpu.count"] == "7"
    assert kube.patches[-1] == ({"nvidia.com/gpu.count": "7"}, [])


async def test_labels_that_no_longer_apply_are_removed() -> None:
    kube = FakeKube({"nvidia.com/mig-1g.10gb.count": "2", "nvidia.com/mig.config": "all-1g.10gb"})
    labeller, _ = _labeller(kube, inventory("h100x8"), sharing=Sharing(mig_strategy="mixed"))
    await labeller.sync()
    assert "nvidia.com/mig-1g.10gb.count" not in kube.labels
    assert kube.labels["nvidia.com/mig.config"] == "all-1g.10gb"  # not the labeller's


async def test_an_api_error_is_retried_later_without_raising() -> None:
    kube = FakeKube({})
    kube.fail = KubeError("GET /api/v1/nodes/node-a: 403 forbidden", 403)
    labeller, _ = _labeller(kube, inventory("h100x8"))
    assert not await labeller.sync()
    assert not labeller.synced.is_set()
    kube.fail = None
    assert await labeller.sync()


def test_changes_touch_only_owned_keys() -> None:
    current = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "1", "team": "a", "gpu-type": "x"}
    wanted = {"nvidia.com/gpu.count": "8", "nvidia.com/gpu.product": "P"}
    changed, stale = label_changes(current, wanted, frozenset({"gpu-type"}))
    assert changed == {"nvidia.com/gpu.product": "P"}
    assert stale == ["gpu-type", "nvidia.com/gpu.memory"]


async def test_an_admin_label_that_renders_illegal_is_left_out_and_gfds_still_written() -> None:
    kube = FakeKube({"gpu-type": "old"})
    labeller, tracker = _labeller(kube, inventory("h100x8"), admin=AdminTemplate({"gpu-type": "{model} x"}))
    tracker.mark_unhealthy(["gpu-0"], "XID 79")
    assert await labeller.sync()
    assert "gpu-type" not in kube.labels
    assert kube.labels["nvidia.com/gpu.count"] == "7"


async def test_a_failed_write_is_retried_before_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon, "RETRY_MIN_S", 0.05)
    kube = FakeKube({})
    kube.fail = KubeError("API server unreachable")
    labeller, _ = _labeller(kube, inventory("h100x8"), interval=3600.0)
    async with anyio.create_task_group() as group:
        group.start_soon(labeller.run)
        await anyio.sleep(0.2)
        kube.fail = None
        with anyio.fail_after(2):
            await labeller.synced.wait()
        group.cancel_scope.cancel()
    assert kube.labels["nvidia.com/gpu.count"] == "8"


async def test_a_health_change_relabels_at_once() -> None:
    kube = FakeKube({})
    labeller, tracker = _labeller(kube, inventory("h100x8"), interval=3600.0)
    async with anyio.create_task_group() as group:
        group.start_soon(labeller.run)
        await labeller.synced.wait()
        kube.patched = anyio.Event()
        tracker.mark_unhealthy(["gpu-2"], "XID 48")
        with anyio.fail_after(2):
            await kube.patched.wait()
        group.cancel_scope.cancel()
    assert kube.labels["nvidia.com/gpu.count"] == "7"
