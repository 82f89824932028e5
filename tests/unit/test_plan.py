"""sliceplan.plan: the fewest writes that bring the server's ResourceSlices to the desired pool."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import pytest

from dra.core import slices
from dra.core.sliceplan import Plan, plan
from dra.core.slices import build_slices
from dra.model.devices import Inventory
from tests.unit.helpers import DRIVER, NODE, inventory, profile

Obj = dict[str, Any]
NODE_UID = "6c1f0e52-node-uid"


class FakeServer:
    """Just enough of the API server: stores slices the way it returns them, checks resourceVersions."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self._version = 1000

    def store(self, obj: Obj, generation: int | None = None) -> None:
        stored = copy.deepcopy(obj)
        if generation is not None:
            stored["spec"]["pool"]["generation"] = generation
        # Empty lists are omitted on the wire; the server adds its own metadata.
        if not stored["spec"].get("devices"):
            stored["spec"].pop("devices", None)
        self._version += 1
        meta = stored["metadata"]
        meta.pop("resourceVersion", None)
        meta.update(
            uid=self.objects.get(meta["name"], {}).get("metadata", {}).get("uid", f"uid-{meta['name']}"),
            resourceVersion=str(self._version),
            creationTimestamp="2026-11-21T12:00:00Z",
            managedFields=[{"manager": "dra-gpu", "operation": "Update"}],
        )
        self.objects[meta["name"]] = stored

    def publish(self, slices: Iterable[Obj], generation: int) -> None:
        for obj in slices:
            self.store(obj, generation)

    def list(self) -> list[Obj]:
        return [copy.deepcopy(self.objects[name]) for name in sorted(self.objects)]

    def apply(self, result: Plan) -> None:
        for obj in result.create:
            assert obj["metadata"]["name"] not in self.objects, "create of an existing slice"
            assert "resourceVersion" not in obj["metadata"]
            self.store(obj)
        for obj in result.update:
            current = self.objects[obj["metadata"]["name"]]
            assert obj["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"], (
                "stale update"
            )
            self.store(obj)
        for obj in result.delete:
            del self.objects[obj["metadata"]["name"]]

    def generations(self) -> set[int]:
        return {obj["spec"]["pool"]["generation"] for obj in self.objects.values()}


def _desired(inv: Inventory) -> list[Obj]:
    # As the publisher does: the desired slices carry no meaningful generation.
    return build_slices(inv, DRIVER, NODE, NODE_UID, generation=0)


def _t4s(count: int) -> Inventory:
    return inventory(profile({"model": "t4", "count": count}))


def _names(objs: Iterable[Obj]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


def _slice(index: int) -> str:
    return f"{NODE}-{DRIVER}-{index}"


@pytest.fixture(autouse=True)
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four devices per slice, so that a pool of ten GPUs spans three slices (4, 4, 2) and tests stay fast."""
    monkeypatch.setattr(slices, "MAX_DEVICES_PER_SLICE", 4)


POOL = 10


@pytest.fixture
def server() -> FakeServer:
    """A server that holds the ten-GPU pool (three slices) at generation 5."""
    s = FakeServer()
    s.publish(_desired(_t4s(POOL)), generation=5)
    return s


# -- converging ----------------------------------------------------------------------------


@pytest.mark.parametrize("count", [0, 3, POOL])
def test_first_publication_creates_every_slice_at_generation_1(count: int) -> None:
    s = FakeServer()
    desired = _desired(_t4s(count) if count else Inventory((), "550.54.15", "12.4.0"))
    result = plan(desired, [], None)
    assert result.generation == 1
    assert _names(result.create) == _names(desired)
    assert (result.update, result.delete) == ([], [])
    assert all(o["spec"]["pool"]["generation"] == 1 for o in result.create)
    s.apply(result)
    # Then nothing to do, in this process or after a restart (which adopts generation 1).
    assert plan(desired, s.list(), 1).writes == 0
    again = plan(desired, s.list(), None)
    assert (again.generation, again.writes) == (1, 0)


def test_no_writes_when_the_server_already_matches(server: FakeServer) -> None:
    result = plan(_desired(_t4s(POOL)), server.list(), 5)
    assert (result.generation, result.writes) == (5, 0)


def test_start_up_adopts_the_generation_already_published(server: FakeServer) -> None:
    result = plan(_desired(_t4s(POOL)), server.list(), None)
    assert (result.generation, result.writes) == (5, 0)


def test_a_device_change_bumps_the_generation_and_rewrites_every_slice(server: FakeServer) -> None:
    # The last GPU is replaced: only the third slice's content differs, yet all must move to generation 6.
    changed = _desired(inventory(profile({"model": "t4", "count": POOL - 1}, {"model": "l40s"})))
    before = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in server.list()}
    result = plan(changed, server.list(), None)
    assert result.generation == 6
    assert _names(result.update) == [_slice(0), _slice(1), _slice(2)]
    assert (result.create, result.delete) == ([], [])
    for obj in result.update:
        assert obj["metadata"]["resourceVersion"] == before[obj["metadata"]["name"]]
        assert obj["spec"]["pool"] == {"name": NODE, "generation": 6, "resourceSliceCount": 3}
    server.apply(result)
    assert server.generations() == {6}
    assert plan(changed, server.list(), 6).writes == 0


def test_a_smaller_pool_updates_the_first_slice_and_deletes_the_rest(server: FakeServer) -> None:
    result = plan(_desired(_t4s(3)), server.list(), None)
    assert result.generation == 6
    assert _names(result.update) == [_slice(0)]
    assert _names(result.delete) == [_slice(1), _slice(2)]
    assert result.create == []
    assert result.update[0]["spec"]["pool"]["resourceSliceCount"] == 1
    server.apply(result)
    assert _names(server.list()) == [_slice(0)]


def test_a_larger_pool_updates_existing_slices_and_creates_new_ones() -> None:
    s = FakeServer()
    s.publish(_desired(_t4s(3)), generation=2)
    result = plan(_desired(_t4s(POOL)), s.list(), None)
    assert result.generation == 3
    assert _names(result.update) == [_slice(0)]
    assert _names(result.create) == [_slice(1), _slice(2)]
    s.apply(result)
    assert s.generations() == {3}
    assert all(o["spec"]["pool"]["resourceSliceCount"] == 3 for o in s.list())


def test_start_up_with_drift_moves_to_a_new_generation(server: FakeServer) -> None:
    server.objects[_slice(1)]["spec"]["devices"][0]["attributes"]["productName"] = {"string": "edited"}
    result = plan(_desired(_t4s(POOL)), server.list(), None)
    assert result.generation == 6
    assert _names(result.update) == [_slice(0), _slice(1), _slice(2)]


def test_start_up_with_mixed_generations_moves_past_the_highest(server: FakeServer) -> None:
    server.objects[_slice(2)]["spec"]["pool"]["generation"] = 9
    result = plan(_desired(_t4s(POOL)), server.list(), None)
    assert result.generation == 10
    assert result.writes == 3


# -- repairs under the published generation ------------------------------------------------------


def _repair(server: FakeServer) -> Plan:
    result = plan(_desired(_t4s(POOL)), server.list(), 5)
    assert result.generation == 5
    return result


def test_an_edited_device_is_repaired_in_its_slice_only(server: FakeServer) -> None:
    device = server.objects[_slice(1)]["spec"]["devices"][3]
    device["attributes"]["productName"] = {"string": "Tesla T4 (edited)"}
    version = server.objects[_slice(1)]["metadata"]["resourceVersion"]
    result = _repair(server)
    assert (_names(result.update), result.create, result.delete) == ([_slice(1)], [], [])
    assert result.update[0]["metadata"]["resourceVersion"] == version
    assert result.update[0]["spec"]["devices"][3]["attributes"]["productName"] == {"string": "Tesla T4"}
    server.apply(result)
    assert _repair(server).writes == 0


def test_a_deleted_slice_is_created_again_under_the_same_generation(server: FakeServer) -> None:
    del server.objects[_slice(2)]
    result = _repair(server)
    assert (_names(result.create), result.update, result.delete) == ([_slice(2)], [], [])
    assert result.create[0]["spec"]["pool"]["generation"] == 5


@pytest.mark.parametrize("generation", [4, 9])
def test_a_tampered_generation_is_set_back(server: FakeServer, generation: int) -> None:
    server.objects[_slice(0)]["spec"]["pool"]["generation"] = generation
    result = _repair(server)
    assert (_names(result.update), result.create, result.delete) == ([_slice(0)], [], [])
    assert result.update[0]["spec"]["pool"]["generation"] == 5


def test_an_extra_slice_is_deleted(server: FakeServer) -> None:
    stray = copy.deepcopy(server.objects[_slice(2)])
    stray["metadata"]["name"] = _slice(3)
    server.store(stray)
    result = _repair(server)
    assert (_names(result.delete), result.create, result.update) == ([_slice(3)], [], [])
    assert result.delete[0]["metadata"]["uid"] == f"uid-{_slice(3)}"


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda o: o["metadata"].pop("ownerReferences"), id="owner reference removed"),
        pytest.param(lambda o: o["spec"]["pool"].update(resourceSliceCount=2), id="slice count"),
        pytest.param(lambda o: o["spec"].update(nodeName="node-b"), id="node name"),
        pytest.param(lambda o: o["spec"]["devices"].pop(), id="device removed"),
        pytest.param(
            lambda o: o["spec"]["devices"][0]["capacity"].update(memory={"value": "1Gi"}), id="capacity"
        ),
        pytest.param(
            lambda o: o["spec"]["devices"][0].update(taints=[{"key": "k", "effect": "NoSchedule"}]),
            id="foreign non-empty field",
        ),
    ],
)
def test_any_drift_in_what_the_driver_owns_is_repaired(server: FakeServer, edit: Any) -> None:
    edit(server.objects[_slice(1)])
    result = _repair(server)
    assert (_names(result.update), result.create, result.delete) == ([_slice(1)], [], [])
    server.apply(result)
    assert _repair(server).writes == 0


def test_fields_the_server_adds_empty_or_default_are_not_drift(server: FakeServer) -> None:
    for obj in server.objects.values():
        obj["metadata"]["labels"] = {}
        obj["metadata"]["annotations"] = {"kept": "by the server"}
        obj["spec"]["allNodes"] = False
        obj["spec"]["nodeSelector"] = None
        obj["spec"]["sharedCounters"] = []
        for device in obj["spec"]["devices"]:
            device["taints"] = []
            device["consumesCounters"] = []
            device["bindsToNode"] = False
    assert _repair(server).writes == 0
    assert plan(_desired(_t4s(POOL)), server.list(), None).writes == 0


def test_update_bodies_are_the_desired_slices_with_the_servers_resource_version(server: FakeServer) -> None:
    server.objects[_slice(0)]["spec"]["devices"][0]["attributes"]["uuid"] = {"string": "GPU-edited"}
    (update,) = _repair(server).update
    desired = {**_desired(_t4s(POOL))[0]}
    assert update["metadata"] == {
        "name": _slice(0),
        "ownerReferences": desired["metadata"]["ownerReferences"],
        "resourceVersion": server.objects[_slice(0)]["metadata"]["resourceVersion"],
    }
    assert update["spec"]["devices"] == desired["spec"]["devices"]


def test_the_desired_slices_are_not_modified() -> None:
    desired = _desired(_t4s(8))
    snapshot = copy.deepcopy(desired)
    plan(desired, [], None)
    assert desired == snapshot
