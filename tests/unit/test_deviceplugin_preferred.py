"""GetPreferredAllocation's choice (dra.deviceplugin.preferred), on literal placements and fake nodes.

The fake h100x8 node: GPUs in pairs behind one PCIe root (0-1, 2-3, 4-5, 6-7),
GPUs 0-3 on NUMA node 0 and 4-7 on NUMA node 1.
"""

from __future__ import annotations

import itertools

import pytest

from dra.deviceplugin.preferred import Placement, preferred_allocation, spread_allocation
from dra.deviceplugin.resources import placements
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Inventory, MigDevice


def node(profile: str) -> Inventory:
    return discover(FakeGpuLibrary(load_profile(profile), "node-a"))


@pytest.fixture(scope="module")
def h100() -> Inventory:
    return node("h100x8")


def ids(inventory: Inventory, *indexes: int) -> list[str]:
    return [inventory.devices[i].uuid for i in indexes]


def choose(inventory: Inventory, available: list[int], size: int, must: tuple[int, ...] = ()) -> list[int]:
    """The preferred allocation, as GPU indexes."""
    index = {d.uuid: i for i, d in enumerate(inventory.devices)}
    chosen = preferred_allocation(
        ids(inventory, *available), ids(inventory, *must), size, placements(inventory.devices)
    )
    return [index[c] for c in chosen]


def test_a_pair_behind_one_pcie_root(h100: Inventory) -> None:
    assert choose(h100, list(range(8)), 2) == [0, 1]


def test_an_intact_pair_rather_than_two_halves(h100: Inventory) -> None:
    assert choose(h100, [0, 2, 3, 4, 6, 7], 2) == [2, 3]


def test_a_single_gpu_comes_from_a_broken_pair(h100: Inventory) -> None:
    # 1 and 5 are taken: 0 and 4 are alone behind their roots; pairs 2-3 and 6-7 stay whole.
    assert choose(h100, [0, 2, 3, 4, 6, 7], 1) == [0]
    assert choose(h100, [2, 3, 4, 6, 7], 1) == [4]


def test_four_gpus_on_one_numa_node(h100: Inventory) -> None:
    assert choose(h100, list(range(8)), 4) == [0, 1, 2, 3]
    assert choose(h100, [0, 2, 4, 5, 6, 7], 4) == [4, 5, 6, 7]


def test_more_than_a_numa_node_spans_whole_pairs(h100: Inventory) -> None:
    assert choose(h100, list(range(8)), 6) == [0, 1, 2, 3, 4, 5]


def test_must_include_is_kept_and_its_neighbour_preferred(h100: Inventory) -> None:
    assert choose(h100, list(range(8)), 2, must=(3,)) == [3, 2]
    # 0 (next to 1) and 7 (next to 6) are equally close to the must-include devices: node order decides.
    assert choose(h100, list(range(8)), 3, must=(6, 1)) == [6, 1, 0]
    assert choose(h100, [0, 1, 2, 3, 4], 2, must=(4,)) == [4, 0]


def test_must_include_alone_fills_the_request(h100: Inventory) -> None:
    assert choose(h100, list(range(8)), 2, must=(5, 2)) == [5, 2]


def test_never_more_than_available(h100: Inventory) -> None:
    assert choose(h100, [1, 6], 3) == [1, 6]
    assert choose(h100, [], 2) == []


def test_answer_is_a_subset_of_available_of_the_asked_size(h100: Inventory) -> None:
    for available in itertools.combinations(range(8), 5):
        for size in range(1, 6):
            chosen = choose(h100, list(available), size)
            assert len(chosen) == size
            assert len(set(chosen)) == size
            assert set(chosen) <= set(available)


def test_two_mig_devices_of_one_gpu() -> None:
    inventory = node("h100x8-mig")
    small = [d for d in inventory if isinstance(d, MigDevice) and d.profile == "1g.10gb"]
    table = placements(small)
    # GPU 4 has one left, GPU 5 both: the pair comes from GPU 5.
    available = [d.uuid for d in small[1:]]
    chosen = preferred_allocation(available, [], 2, table)
    parents = {d.uuid: d.parent.index for d in small}
    assert [parents[c] for c in chosen] == [5, 5]
    # One device: the lone one on GPU 4, keeping GPU 5's pair whole.
    assert [parents[c] for c in preferred_allocation(available, [], 1, table)] == [4]


def test_unknown_ids_and_unknown_groups() -> None:
    table = {
        "a": Placement(0, ("gpu:a", None, None)),
        "b": Placement(1, ("gpu:b", None, "numa:0")),
        "c": Placement(2, ("gpu:c", None, "numa:0")),
    }
    assert preferred_allocation(["x", "a", "b", "c"], [], 2, table) == ["b", "c"]
    assert preferred_allocation(["x", "a"], [], 2, table) == ["a", "x"]
    assert preferred_allocation(["y", "x"], ["z"], 2, {}) == ["z", "x"]
    assert preferred_allocation(["b", "b", "c"], [], 3, table) == ["b", "c"]


def test_replicas_spread_over_gpus_least_shared_first() -> None:
    parents = {f"{gpu}::{n}": gpu for gpu in ("A", "B", "C") for n in range(4)}
    # A has 1 free replica, B 3, C 2 (other containers hold the rest).
    available = ["A::3", "B::1", "B::2", "B::3", "C::2", "C::3"]
    assert spread_allocation(available, [], 1, parents) == ["B::1"]
    assert spread_allocation(available, [], 3, parents) == ["B::1", "C::2", "A::3"]
    # Only when every GPU holds one does a container get a second replica of one.
    assert spread_allocation(available, [], 4, parents) == ["B::1", "C::2", "A::3", "B::2"]
    assert spread_allocation(available, ["C::3"], 2, parents) == ["C::3", "B::1"]
    assert spread_allocation(available, [], 9, parents) == [
        "B::1", "C::2", "A::3", "B::2", "C::3", "B::3"
    ]  # fmt: skip
