"""The packing benchmark's pure parts: the offline best packing, the workloads' arrivals and the report."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dra.core.versions import ApiFeatures
from dra.explain.report import standard_device_classes
from tests.bench.bench_packing import (
    DYNAMIC_ALL,
    DYNAMIC_MIG,
    MIG_ABOVE_10GI,
    MIXED_GPUS,
    SHARES_COUNT,
    SHARES_MEMORY,
    STATIC_MIG,
    WHOLE,
    WORKLOADS,
    Outcome,
    Workload,
    _share,
    _shares,
    figures,
    retarget,
    table,
)
from tests.bench.bench_scheduler import DRIVER, Layout, node_slices
from tests.bench.packing import Ask, Capacity, Node, Packing, devices_of, fewest_gpus

CLASSES = standard_device_classes(DRIVER)
FEATURES = ApiFeatures(minor=37, partitionable_devices=True, consumable_capacity=True)


def _node(layout: Layout, *asks: Ask) -> Node:
    return Node(node_slices(layout, "node-a", "uid", FEATURES), CLASSES, asks)


def _profile(name: str) -> Ask:
    return Ask(name, "mig.nvidia.com", (f'device.attributes["{DRIVER}"].profile == "{name}"',))


def test_a_request_is_rounded_up_as_the_capacitys_policy_says() -> None:
    memory = Capacity(100, {"default": "100", "validRange": {"min": "4", "max": "100", "step": "4"}})
    assert memory.consumed(None) == 100
    assert memory.consumed("1") == 4
    assert memory.consumed("9") == 12
    assert memory.consumed("101") is None
    assert Capacity(8, {"default": "0", "validValues": ["0"]}).consumed(None) == 0
    assert Capacity(8, {"validValues": ["2", "4"]}).consumed("3") == 4
    assert Capacity(8, {"validValues": ["2", "4"]}).consumed("5") is None
    # Without a policy a claim takes what it asks, or the whole value when it asks nothing.
    assert Capacity(8).consumed("3") == 3
    assert Capacity(8).consumed(None) == 8


def test_one_h100_holds_what_nvml_lets_it() -> None:
    node = _node(DYNAMIC_MIG, _profile("1g.10gb"), _profile("3g.40gb"), WHOLE)
    # 7 x 1g; 4 x 1g beside a 3g at memory slices 4-7; 2 x 3g; or the GPU whole.
    assert sorted(node.gpus[0]) == [(0, 0, 1), (0, 2, 0), (4, 1, 0), (7, 0, 0)]
    assert len(node.gpus) == 8


def test_a_lower_bound_may_take_any_device_above_it() -> None:
    node = _node(DYNAMIC_MIG, MIG_ABOVE_10GI)
    # Three 2g.20gb; a 1g.10gb has 9856Mi, not more than 10Gi.
    assert node.gpus[0] == [(3,)]
    assert node.best([0] * 32) == Packing(24, 8)
    assert node.best([0] * 10) == Packing(10, 4)


def test_shares_by_memory_and_by_count() -> None:
    # An H100 has 81559Mi: three 20Gi shares, not four; a whole GPU asks all of it.
    by_memory = _node(SHARES_MEMORY, _share(20), _share(40), WHOLE)
    assert sorted(by_memory.gpus[0]) == [(0, 0, 1), (1, 1, 0), (3, 0, 0)]
    by_count = _node(SHARES_COUNT, _shares(1), _shares(2), _shares(4))
    assert sorted(by_count.gpus[0]) == [(0, 0, 1), (0, 2, 0), (2, 1, 0), (4, 0, 0)]


def test_existing_mig_devices_and_whole_gpus() -> None:
    node = _node(STATIC_MIG, _profile("1g.10gb"), WHOLE)
    # gpu-0..3 whole; gpu-4..7 each a 3g, a 2g and two 1g.
    assert sorted(map(sorted, [node.gpus[i] for i in range(len(node.gpus))])) == sorted(
        [[(0, 1)]] * 4 + [[(2, 0)]] * 4
    )
    assert node.best([1, 1, 1, 1, 1]) == Packing(4, 4)


def test_the_fewest_gpus_for_a_demand() -> None:
    gpus = [[(7, 0), (4, 1), (0, 2)]] * 3
    assert fewest_gpus((4, 1), gpus) == 1
    assert fewest_gpus((8, 1), gpus) == 2
    assert fewest_gpus((0, 5), gpus) == 3
    assert fewest_gpus((0, 7), gpus) is None
    assert fewest_gpus((0, 0), gpus) == 0


def _brute_force(node: Node, arrivals: list[int]) -> int:
    """The longest prefix that fits, trying every GPU for every claim (small cases only)."""

    def fits(count: int) -> bool:
        demand = [0] * len(node.asks)
        for kind in arrivals[:count]:
            demand[kind] += 1
        for choice in itertools.product(*node.gpus):
            total = [sum(v[k] for v in choice) for k in range(len(demand))]
            if all(t >= d for t, d in zip(total, demand, strict=True)):
                return True
        return False

    return max(count for count in range(len(arrivals) + 1) if fits(count))


@pytest.mark.parametrize("seed", range(4))
def test_the_best_packing_is_what_trying_every_choice_finds(seed: int) -> None:
    layout = Layout("four", "a100x4-dynamic-mig", (), "dynamic", frozenset({"common"}))
    node = _node(layout, _profile("1g.10gb"), _profile("2g.20gb"), _profile("3g.40gb"), WHOLE)
    arrivals = Workload("w", layout, tuple((ask, 1.0) for ask in node.asks), 16).arrivals(seed)
    best = node.best(arrivals)
    assert best.placed == _brute_force(node, arrivals)
    assert 0 < best.gpus <= 4


def test_devices_are_grouped_by_gpu_and_counted_by_their_counters() -> None:
    devices, totals = devices_of(node_slices(DYNAMIC_MIG, "node-a", "uid", FEATURES))
    gpus = {d.gpu for d in devices}
    assert len(gpus) == 8
    assert len(totals) == 8
    whole = next(d for d in devices if d.name == "gpu-0")
    assert ("gpu0", "memslice7", 1) in whole.counters


def test_arrivals_are_seeded_and_follow_the_mix() -> None:
    workload = WORKLOADS["dynamic: lower bounds"]
    assert workload.arrivals(1) == workload.arrivals(1)
    assert workload.arrivals(1) != workload.arrivals(2)
    many = Workload("w", DYNAMIC_MIG, workload.mix, 3000).arrivals(0)
    assert abs(many.count(0) / 3000 - 0.5) < 0.05


def test_the_report() -> None:
    assert figures([Outcome(24, 8), Outcome(23, 7)]) == "23.5 on 7.5"
    assert figures([]) == "-"
    workload = Workload("dynamic: >10 SMs >10Gi", DYNAMIC_MIG, ((MIG_ABOVE_10GI, 1.0),), 32)
    results: dict[tuple[str, str], list[Outcome | Packing]] = {
        (workload.name, "packing"): [Outcome(24, 8)],
        (workload.name, "discovery"): [Outcome(8, 8)],
        (workload.name, "best"): [Packing(24, 8)],
    }
    assert table([workload], ["packing", "discovery", "best", "nvidia"], results).splitlines() == [
        "| workload | pods | packing | discovery | best | nvidia |",
        "|---|---|---|---|---|---|",
        "| dynamic: >10 SMs >10Gi | 32 | 24.0 on 8.0 | 8.0 on 8.0 | 24.0 on 8.0 | - |",
    ]


def test_slices_of_another_node_are_retargeted_in_order() -> None:
    captured: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"0000{i}-gpu.nvidia.com-gpu-node-1-x", "uid": "old"},
            "spec": {
                "driver": DRIVER,
                "nodeName": "gpu-node-1",
                "pool": {"name": "gpu-node-1", "generation": 3},
            },
        }
        for i in range(2)
    ]
    slices = retarget(captured, "pk-001", "uid-1")
    assert [s["metadata"]["name"] for s in slices] == [
        "pk-001-00000-gpu.nvidia.com-gpu-node-1-x",
        "pk-001-00001-gpu.nvidia.com-gpu-node-1-x",
    ]
    assert slices[0]["spec"]["nodeName"] == "pk-001"
    assert slices[0]["spec"]["pool"] == {"name": "pk-001", "generation": 3}
    assert slices[0]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_every_workload_runs_on_a_built_in_profile() -> None:
    assert {w.layout for w in WORKLOADS.values()} == {
        DYNAMIC_MIG,
        DYNAMIC_ALL,
        STATIC_MIG,
        MIXED_GPUS,
        SHARES_MEMORY,
        SHARES_COUNT,
    }
    for workload in WORKLOADS.values():
        node = _node(workload.layout, *workload.asks)
        assert node.best(workload.arrivals(0)).placed > 0, workload.name
