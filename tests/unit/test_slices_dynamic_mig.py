"""Dynamic-MIG slices: counter sets per GPU, every placement as a device, laid out per server release."""

from __future__ import annotations

from typing import Any

import pytest

from dra.core.slices import MAX_COUNTER_SETS_PER_SLICE, MAX_DEVICES_WITH_COUNTERS, build_slices
from dra.core.versions import ApiFeatures
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.migmode import parse_mig_modes

NODE = "node-a"


def _slices(features: ApiFeatures, modes: str = "dynamic") -> list[dict[str, Any]]:
    inventory = discover(FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE), parse_mig_modes(modes))
    return build_slices(inventory, "gpu.nvidia.com", NODE, None, 1, features)


def _devices(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


@pytest.mark.parametrize("minor", [34, 37])
def test_every_placement_is_a_device_and_the_limits_hold(minor: int) -> None:
    slices = _slices(ApiFeatures(minor=minor, partitionable_devices=True))
    devices = _devices(slices)
    # Per H100: the whole GPU, 7 x 1g.10gb, 7 x 1g.10gb+me, 4 x 1g.20gb, 3 x 2g.20gb, 2 x 3g.40gb,
    # 4g.40gb, 7g.80gb.
    assert len(devices) == 8 * 26
    gpu0 = {d["name"] for d in devices if d["name"].startswith("gpu-0")}
    assert {"gpu-0", "gpu-0-mig-3g40gb-at4", "gpu-0-mig-1g10gb-at6", "gpu-0-mig-7g80gb-at0"} <= gpu0
    for s in slices:
        spec = s["spec"]
        assert len(spec.get("sharedCounters", [])) <= MAX_COUNTER_SETS_PER_SLICE
        assert len(spec.get("devices", [])) <= MAX_DEVICES_WITH_COUNTERS
        assert spec["pool"]["resourceSliceCount"] == len(slices)
        if minor >= 35:
            assert not (spec.get("sharedCounters") and spec.get("devices"))
        else:
            # 1.34: a device's counter set is in its own slice.
            sets = {c["name"] for c in spec.get("sharedCounters", [])}
            assert {c["counterSet"] for d in spec.get("devices", []) for c in d["consumesCounters"]} <= sets


def test_a_mig_offer_has_nvidias_attributes_and_no_uuid() -> None:
    device = next(
        d
        for d in _devices(_slices(ApiFeatures(partitionable_devices=True)))
        if d["name"] == "gpu-1-mig-3g40gb-at4"
    )
    attributes = device["attributes"]
    # NVIDIA's names for an offer (its v0.4.1, tests/e2e/test_nvidia_differential.py), the NUMA node and
    # the placement; not the deprecated parentIndex and pcieBusID.
    assert set(attributes) == {
        "type",
        "profile",
        "parentUUID",
        "productName",
        "brand",
        "architecture",
        "addressingMode",
        "cudaComputeCapability",
        "cudaDriverVersion",
        "driverVersion",
        "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot",
        "resource.kubernetes.io/numaNode",
        "placementStart",
        "placementSize",
    }
    assert attributes["profile"] == {"string": "3g.40gb"}
    assert (attributes["placementStart"], attributes["placementSize"]) == ({"int": 4}, {"int": 4})
    assert attributes["parentUUID"]["string"].startswith("GPU-")
    assert device["capacity"]["memory"] == {"value": "40192Mi"}
    assert device["capacity"]["multiprocessors"] == {"value": "60"}
    [consumed] = device["consumesCounters"]
    assert consumed["counterSet"] == "gpu1"
    assert consumed["counters"] == {
        "compute": {"value": "3"},
        "decoders": {"value": "3"},
        "jpegengines": {"value": "3"},
        "memory": {"value": "40192Mi"},
        **{f"memslice{i}": {"value": "1"} for i in range(4, 8)},
    }


def test_the_whole_gpu_consumes_every_counter() -> None:
    slices = _slices(ApiFeatures(partitionable_devices=True))
    whole = next(d for d in _devices(slices) if d["name"] == "gpu-2")
    counter_set = next(c for s in slices for c in s["spec"].get("sharedCounters", []) if c["name"] == "gpu2")
    assert whole["consumesCounters"] == [{"counterSet": "gpu2", "counters": counter_set["counters"]}]
    assert counter_set["counters"]["compute"] == {"value": "7"}


def test_without_partitionable_devices_dynamic_gpus_are_whole() -> None:
    slices = _slices(ApiFeatures(minor=34, partitionable_devices=False))
    assert [d["name"] for d in _devices(slices)] == [f"gpu-{i}" for i in range(8)]
    assert all("sharedCounters" not in s["spec"] for s in slices)
    assert all("consumesCounters" not in d for d in _devices(slices))


def test_static_and_whole_gpus_publish_no_counters() -> None:
    slices = _slices(ApiFeatures(minor=37, partitionable_devices=True), "whole,0=dynamic")
    counter_sets = [c["name"] for s in slices for c in s["spec"].get("sharedCounters", [])]
    assert counter_sets == ["gpu0"]
    assert len(_devices(slices)) == 7 + 26


def test_media_extension_profiles_share_the_one_ofa_unit() -> None:
    slices = _slices(ApiFeatures(partitionable_devices=True))
    by_name = {d["name"]: d for d in _devices(slices)}
    counter_set = next(c for s in slices for c in s["spec"].get("sharedCounters", []) if c["name"] == "gpu0")
    assert counter_set["counters"]["ofaengines"] == {"value": "1"}
    for name in ("gpu-0-mig-1g10gbme-at0", "gpu-0-mig-1g10gbme-at6", "gpu-0-mig-7g80gb-at0"):
        [consumed] = by_name[name]["consumesCounters"]
        assert consumed["counters"]["ofaengines"] == {"value": "1"}
    [plain] = by_name["gpu-0-mig-1g10gb-at0"]["consumesCounters"]
    assert "ofaengines" not in plain["counters"]
