"""SlicePublisher against an in-memory adapter: the generation it records follows the inventory,
and its watch (a task beside the reconcile loop) repairs what changes on the server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import anyio
import pytest

from dra.adapters.kube import ConflictError, KubeError
from dra.core.versions import ApiFeatures
from dra.daemon import metrics
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


async def test_a_retry_of_pending_pods_changes_one_slices_annotation_once() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    await publisher.reconcile()
    before = kube.server.list()
    writes = metrics.SLICE_WRITES.labels("retry")._value.get()

    publisher.retry_pending_pods()
    plan = await publisher.reconcile()
    after = kube.server.list()
    key = f"{DRIVER}/{RETRY_ANNOTATION}"
    assert plan.writes == 0, "the driver's content is unchanged: no plan write"
    touched = [s for s in after if key in (s["metadata"].get("annotations") or {})]
    assert len(touched) == 1
    assert [s["spec"] for s in after] == [s["spec"] for s in before]
    assert touched[0]["metadata"]["resourceVersion"] != before[0]["metadata"]["resourceVersion"]
    assert metrics.SLICE_WRITES.labels("retry")._value.get() == writes + 1

    # Once done, a reconcile writes nothing; a second retry changes the annotation's value.
    assert (await publisher.reconcile()).writes == 0
    assert kube.server.list() == after
    publisher.retry_pending_pods()
    await publisher.reconcile()
    [again] = [s for s in kube.server.list() if key in (s["metadata"].get("annotations") or {})]
    assert again["metadata"]["annotations"][key] != touched[0]["metadata"]["annotations"][key]


async def test_a_retry_asked_while_the_plan_writes_needs_no_touch_of_its_own() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    publisher.retry_pending_pods()
    plan = await publisher.reconcile()
    assert plan.writes > 0
    assert not any(s["metadata"].get("annotations") for s in kube.server.list())
    assert (await publisher.reconcile()).writes == 0
    assert not any(s["metadata"].get("annotations") for s in kube.server.list())


async def test_a_retry_whose_touch_fails_is_made_on_the_next_reconcile() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    await publisher.reconcile()
    publisher.retry_pending_pods()
    replace = kube.replace_resource_slice

    async def conflict(obj: dict[str, Any]) -> dict[str, Any]:
        raise ConflictError("the object has been modified", 409)

    kube.replace_resource_slice = conflict  # type: ignore[method-assign]
    with pytest.raises(ConflictError):
        await publisher.reconcile()
    kube.replace_resource_slice = replace  # type: ignore[method-assign]
    await publisher.reconcile()
    assert any(s["metadata"].get("annotations") for s in kube.server.list())


async def test_only_a_claim_holding_a_share_has_pending_pods_tried_again() -> None:
    kube = FakeKube()
    publisher = _publisher(kube, inventory("h100x8"))
    await publisher.reconcile()
    whole = PreparedDevice(("gpu",), NODE, "gpu-0", ("x",))
    publisher.claim_prepared(PreparedClaim("uid-a", "team-a", "whole", (whole,)))
    await publisher.reconcile()
    assert not any(s["metadata"].get("annotations") for s in kube.server.list())

    share = replace(whole, share_id="6a1925dd-b024-4f8d-af9a-b59c1e07d445")
    publisher.claim_prepared(PreparedClaim("uid-b", "team-a", "shared", (whole, share)))
    await publisher.reconcile()
    assert any(s["metadata"].get("annotations") for s in kube.server.list())
