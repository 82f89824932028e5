"""SlicePublisher against an in-memory adapter: the generation it records follows the inventory."""

from __future__ import annotations

from typing import Any

import pytest

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


def _publisher(kube: FakeKube, inv: Inventory) -> SlicePublisher:
    return SlicePublisher(kube, DRIVER, NODE, inv)  # type: ignore[arg-type]


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
