"""SlicePublisher against an in-memory adapter: the generation it records follows the inventory,
and its watch (a task beside the reconcile loop) repairs what changes on the server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from dra.adapters.kube import KubeError
from dra.core.versions import ApiFeatures
from dra.kubeletplugin.publisher import SlicePublisher
from dra.model.devices import Inventory
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
