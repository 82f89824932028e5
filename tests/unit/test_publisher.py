"""SlicePublisher against an in-memory adapter: the generation it records follows the inventory,
and its watch (a task beside the reconcile loop) repairs what changes on the server."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import anyio
import pytest

from dra.adapters.kube import KubeError, NotFoundError
from dra.core.versions import ApiFeatures
from dra.daemon import metrics
from dra.kubeletplugin import publisher as publisher_module
from dra.kubeletplugin.publisher import RETRY_ANNOTATION, SlicePublisher
from dra.model.devices import Inventory
from dra.model.prepared import PreparedClaim, PreparedDevice
from tests.unit.helpers import DRIVER, NODE, inventory
from tests.unit.test_plan import FakeServer

pytestmark = pytest.mark.anyio


class FakeKube:
    """The calls the publisher makes, on a FakeServer; `on_create` runs during each create."""

    def __init__(self) -> None:
        self.server = FakeServer()
        self.on_create: list[Any] = []
        # What the server's watch sends: (type, object) events, or a KubeError that ends the watch.
        self.send_event, self._events = anyio.create_memory_object_stream[tuple[str, Any] | KubeError](10)
        self.watches = 0
        self.patches = 0
        #: How many annotation patches fail before they succeed again.
        self.fail_patches = 0

    async def get_node(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "uid": "node-uid"}}

    async def list_resource_slices(self, driver: str, node_name: str) -> tuple[list[dict[str, Any]], str]:
        return self.server.list(), "1"

    async def create_resource_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        for hook in self.on_create:
            hook()
        self.server.store(obj)
        return obj

    async def replace_resource_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.server.store(obj)
        return obj

    async def delete_resource_slice(self, name: str, uid: str | None = None) -> None:
        self.server.objects.pop(name, None)

    async def annotate_resource_slice(self, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        self.patches += 1
        if self.fail_patches:
            self.fail_patches -= 1
            raise KubeError("500 etcd is down", 500)
        if name not in self.server.objects:
            raise NotFoundError(f"resourceslices {name} not found", 404)
        obj = copy.deepcopy(self.server.objects[name])
        obj["metadata"]["annotations"] = {**(obj["metadata"].get("annotations") or {}), **annotations}
        self.server.store(obj)
        return copy.deepcopy(self.server.objects[name])

    async def watch_resource_slices(
        self, driver: str, node_name: str, resource_version: str, timeout_seconds: int = 300
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watches += 1
        async for event in self._events:
            if isinstance(event, KubeError):
                raise event
            yield event


def _publisher(kube: FakeKube, inv: Inventory) -> SlicePublisher:
    return SlicePublisher(kube, DRIVER, NODE, inv, ApiFeatures())  # type: ignore[arg-type]


async def test_an_inventory_changed_during_a_reconcile_gets_a_new_generation() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    changed = inventory("mixed")
    kube.on_create.append(lambda: publisher.set_inventory(changed))
    first = await publisher.reconcile()
    assert first.generation == 1
    kube.on_create.clear()

    second = await publisher.reconcile()
    assert second.generation == 2, "the new inventory must not be published under the old generation"
    assert kube.server.generations() == {2}
    assert sorted(d["name"] for s in kube.server.list() for d in s["spec"]["devices"]) == [
        f"gpu-{i}" for i in range(4)
    ]


async def test_a_reconcile_without_change_keeps_the_generation() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    await publisher.reconcile()
    assert (await publisher.reconcile()).writes == 0


async def _until(check: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not check():  # noqa: ASYNC110 (the fake has nothing to wait on)
            await anyio.sleep(0.01)


async def test_a_slice_deleted_on_the_server_is_restored_when_the_watch_tells() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    async with anyio.create_task_group() as group:
        group.start_soon(publisher.run)
        await publisher.published.wait()
        [name] = kube.server.objects
        del kube.server.objects[name]
        await kube.send_event.send(("DELETED", {"metadata": {"name": name}}))
        await _until(lambda: name in kube.server.objects)
        group.cancel_scope.cancel()


async def test_an_expired_watch_is_restarted_at_once_and_a_failed_one_after_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    async with anyio.create_task_group() as group:
        group.start_soon(publisher.run)
        await _until(lambda: kube.watches == 1)
        await kube.send_event.send(KubeError("too old resource version", 410))
        await _until(lambda: kube.watches == 2)
        assert "watching ResourceSlices failed" not in caplog.text

        await kube.send_event.send(KubeError("GET ...: 500 etcd is down", 500))
        await _until(lambda: kube.watches == 3)
        assert "watching ResourceSlices failed, retrying in 0.5s: GET ...: 500 etcd is down" in caplog.text
        group.cancel_scope.cancel()


def _touched(kube: FakeKube) -> list[dict[str, Any]]:
    key = f"{DRIVER}/{RETRY_ANNOTATION}"
    return [s for s in kube.server.list() if key in (s["metadata"].get("annotations") or {})]


async def test_a_retry_of_pending_pods_patches_one_annotation_and_no_spec() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    await publisher.reconcile()
    before = kube.server.list()
    writes = metrics.SLICE_WRITES.labels("retry")._value.get()
    async with anyio.create_task_group() as group:
        group.start_soon(publisher._retries)
        publisher.retry_pending_pods()
        await _until(lambda: len(_touched(kube)) == 1)
        group.cancel_scope.cancel()
    after = kube.server.list()
    [touched] = _touched(kube)
    assert touched["metadata"]["name"] == before[0]["metadata"]["name"]
    assert [s["spec"] for s in after] == [s["spec"] for s in before]
    assert kube.patches == 1
    assert metrics.SLICE_WRITES.labels("retry")._value.get() == writes + 1
    assert (await publisher.reconcile()).writes == 0, "the driver's content is unchanged"


async def test_retries_asked_in_a_burst_make_one_touch_now_and_one_after_the_spacing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(publisher_module, "RETRY_SPACING_S", 0.3)
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    await publisher.reconcile()
    async with anyio.create_task_group() as group:
        group.start_soon(publisher._retries)
        publisher.retry_pending_pods()
        await _until(lambda: kube.patches == 1)
        first = _touched(kube)[0]["metadata"]["annotations"]
        for _ in range(5):
            publisher.retry_pending_pods()
        await anyio.sleep(0.1)
        assert kube.patches == 1, "within the spacing: no second touch yet"
        await _until(lambda: kube.patches == 2)
        await anyio.sleep(0.5)
        assert kube.patches == 2, "the five asked during the spacing made one touch, after it"
        group.cancel_scope.cancel()
    assert _touched(kube)[0]["metadata"]["annotations"] != first


async def test_the_watch_leaves_this_instances_touches_alone() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    await publisher.reconcile()
    reconciles = 0
    reconcile = publisher.reconcile

    async def counted() -> Any:
        nonlocal reconciles
        reconciles += 1
        return await reconcile()

    publisher.reconcile = counted  # type: ignore[method-assign]
    async with anyio.create_task_group() as group:
        group.start_soon(publisher.run)
        await _until(lambda: reconciles == 1 and kube.watches == 1)
        publisher.retry_pending_pods()
        await _until(lambda: kube.patches == 1)
        [touched] = _touched(kube)
        await kube.send_event.send(("MODIFIED", touched))
        await anyio.sleep(0.1)
        assert reconciles == 1, "its own touch needs no reconcile"
        # Anyone else's change, though, even of the same slice.
        edited = {**touched, "metadata": {**touched["metadata"], "resourceVersion": "edited"}}
        await kube.send_event.send(("MODIFIED", edited))
        await _until(lambda: reconciles == 2)
        group.cancel_scope.cancel()


async def test_a_touch_that_fails_is_tried_again_and_one_of_a_missing_slice_is_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(publisher_module, "RETRY_SPACING_S", 0.05)
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    async with anyio.create_task_group() as group:
        group.start_soon(publisher._retries)
        # Nothing published yet: the slice is missing, and the reconcile's create will requeue pods.
        publisher.retry_pending_pods()
        await _until(lambda: kube.patches == 1)
        await anyio.sleep(0.2)
        assert kube.patches == 1
        assert not _touched(kube)

        await publisher.reconcile()
        kube.fail_patches = 2
        publisher.retry_pending_pods()
        await _until(lambda: len(_touched(kube)) == 1)
        assert kube.patches == 4
        assert (
            "could not have the scheduler retry pending pods, trying again: 500 etcd is down" in caplog.text
        )

        # Whatever else goes wrong, the task goes on.
        original = kube.annotate_resource_slice

        async def broken(name: str, annotations: dict[str, str]) -> dict[str, Any]:
            kube.annotate_resource_slice = original  # type: ignore[method-assign]
            raise ValueError("a surprise")

        kube.annotate_resource_slice = broken  # type: ignore[method-assign]
        publisher.retry_pending_pods()
        await _until(lambda: kube.patches == 5)
        assert "asking the scheduler to retry pending pods failed unexpectedly" in caplog.text
        group.cancel_scope.cancel()


async def test_only_a_claim_holding_a_share_has_pending_pods_tried_again() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    await publisher.reconcile()
    async with anyio.create_task_group() as group:
        group.start_soon(publisher._retries)
        whole = PreparedDevice(("gpu",), NODE, "gpu-0", ("x",))
        publisher.claim_prepared(PreparedClaim("uid-a", "team-a", "whole", (whole,)))
        await anyio.sleep(0.1)
        assert kube.patches == 0

        share = replace(whole, share_id="6a1925dd-b024-4f8d-af9a-b59c1e07d445")
        publisher.claim_prepared(PreparedClaim("uid-b", "team-a", "shared", (whole, share)))
        await _until(lambda: kube.patches == 1)
        group.cancel_scope.cancel()
