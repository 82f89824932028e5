"""Passthrough twins in the slices (--vfio): NVIDIA's `gpu-vfio-<index>`, kept from its GPU by counters."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from dra.core.slices import build_slices
from dra.core.versions import ApiFeatures
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Inventory
from dra.model.migmode import parse_mig_modes

NODE = "node-a"


def _inventory(profile: str = "h100x8", modes: str = "static") -> Inventory:
    return discover(FakeGpuLibrary(load_profile(profile), NODE), parse_mig_modes(modes))


def _slices(inventory: Inventory, features: ApiFeatures, **more: Any) -> list[dict[str, Any]]:
    return build_slices(inventory, "gpu.nvidia.com", NODE, None, 1, features, **more)


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def _counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for s in slices for c in s["spec"].get("sharedCounters", [])}


@pytest.mark.parametrize("minor", [34, 37])
def test_each_gpu_and_its_twin_consume_one_counter_set_whole(minor: int) -> None:
    inventory = _inventory()
    slices = _slices(inventory, ApiFeatures(minor=minor, partitionable_devices=True), vfio=True)
    devices = _devices(slices)
    sets = _counter_sets(slices)
    assert sorted(devices) == sorted([*(f"gpu-{i}" for i in range(8)), *(f"gpu-vfio-{i}" for i in range(8))])
    gpu = inventory.gpus[3]
    assert sets["gpu3"]["counters"] == {"memory": {"value": devices["gpu-3"]["capacity"]["memory"]["value"]}}
    wanted = [{"counterSet": "gpu3", "counters": sets["gpu3"]["counters"]}]
    assert devices["gpu-3"]["consumesCounters"] == wanted
    assert devices["gpu-vfio-3"]["consumesCounters"] == wanted
    assert devices["gpu-vfio-3"]["attributes"] == {
        "type": {"string": "vfio"},
        "uuid": {"string": str(uuid.uuid5(uuid.NAMESPACE_DNS, gpu.pci_bus_id))},
        "productName": {"string": gpu.product_name},
        "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
        "resource.kubernetes.io/pcieRoot": {"string": gpu.pcie_root},
        "resource.kubernetes.io/numaNode": {"int": gpu.numa_node},
    }
    for s in slices:
        spec = s["spec"]
        if minor >= 35:
            assert not (spec.get("sharedCounters") and spec.get("devices"))
        else:
            # 1.34: a device's counter set is in its own slice.
            own = {c["name"] for c in spec.get("sharedCounters", [])}
            assert {c["counterSet"] for d in spec.get("devices", []) for c in d["consumesCounters"]} <= own


def test_without_vfio_or_counters_no_twin_is_published() -> None:
    inventory = _inventory()
    plain = _slices(inventory, ApiFeatures(minor=37, partitionable_devices=True))
    assert sorted(_devices(plain)) == [f"gpu-{i}" for i in range(8)]
    assert not _counter_sets(plain)
    # Without counters the scheduler could give a GPU and its twin to two claims.
    gateless = _slices(inventory, ApiFeatures(minor=34, partitionable_devices=False), vfio=True)
    assert _devices(gateless) == _devices(plain)


def test_a_dynamic_mig_gpus_twin_consumes_every_counter_as_the_whole_gpu() -> None:
    inventory = _inventory("h100x8-dynamic-mig", "dynamic")
    devices = _devices(_slices(inventory, ApiFeatures(minor=37, partitionable_devices=True), vfio=True))
    assert devices["gpu-vfio-0"]["consumesCounters"] == devices["gpu-0"]["consumesCounters"]
    assert len(devices) == 8 * 27


def test_a_gpu_in_static_mig_mode_has_no_twin() -> None:
    inventory = _inventory("h100x8-dynamic-mig", "static")
    assert not inventory.vfio_twins
    devices = _devices(_slices(inventory, ApiFeatures(minor=37, partitionable_devices=True), vfio=True))
    assert not [n for n in devices if n.startswith("gpu-vfio-")]


@pytest.mark.parametrize(("minor", "shared"), [(34, False), (37, True)])
def test_a_shareable_gpu_with_a_twin_is_shared_where_counters_are_charged_once(
    minor: int, shared: bool
) -> None:
    inventory = _inventory()
    features = ApiFeatures(minor=minor, partitionable_devices=True, consumable_capacity=True)
    devices = _devices(_slices(inventory, features, vfio=True, shareable={"gpu-0"}))
    assert devices["gpu-0"].get("allowMultipleAllocations", False) is shared
    assert "allowMultipleAllocations" not in devices["gpu-vfio-0"]
