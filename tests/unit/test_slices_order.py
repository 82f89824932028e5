"""The order devices are published in, which decides what the scheduler gives a claim several devices fit."""

from __future__ import annotations

from typing import Any

import pytest

from dra.core.slices import DEVICE_ORDERS, DeviceOrder, build_slices
from dra.core.versions import ApiFeatures
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.migmode import MigModes
from dra.model.migoffer import ALL, COMMON, MigOffer

NODE = "node-a"


def _names(
    profile: str,
    order: DeviceOrder = "packing",
    mode: str = "static",
    offer: str = COMMON,
    minor: int = 34,
) -> list[str]:
    inventory = discover(
        FakeGpuLibrary(load_profile(profile), NODE),
        MigModes(default=mode, offer=MigOffer(frozenset({offer}))),
    )
    features = ApiFeatures(minor=minor, partitionable_devices=True)
    slices = build_slices(inventory, "gpu.nvidia.com", NODE, None, 1, features, order=order)
    return [d["name"] for s in slices for d in s["spec"].get("devices") or []]


def _kinds(names: list[str]) -> tuple[list[str], list[str]]:
    """The whole GPUs and the MIG offers, each in publishing order."""
    return [n for n in names if "-mig-" not in n], [n for n in names if "-mig-" in n]


def test_a_slice_lists_its_gpus_whole_first_then_each_gpus_smallest_offers_first() -> None:
    names = _names("h100x8-dynamic-mig", mode="dynamic")
    # Whole first: no MIG request matches them, and a whole-GPU request then finds a free GPU of the
    # slice without a selector evaluated on the offers of a busy one (what the scheduler spends
    # most on per pod, docs/mig.md). 1.34 holds two GPUs of common offers to a slice.
    assert names[:2] == ["gpu-0", "gpu-1"]
    assert names[2:15] == [
        *(f"gpu-0-mig-1g10gb-at{start}" for start in range(7)),
        "gpu-0-mig-2g20gb-at0",
        "gpu-0-mig-2g20gb-at2",
        "gpu-0-mig-2g20gb-at4",
        # Half the GPU from the top: memory slices 4-7 leave 0-3 to four 1g or two 2g devices.
        "gpu-0-mig-3g40gb-at4",
        "gpu-0-mig-3g40gb-at0",
        "gpu-0-mig-7g80gb-at0",
    ]
    # Each kind GPU by GPU, in index order, so that the first GPU with room is filled first.
    for kind in _kinds(names):
        gpus = [n.split("-mig-")[0] for n in kind]
        assert gpus == sorted(gpus, key=lambda g: int(g.split("-")[1]))


@pytest.mark.parametrize("minor", [34, 37])
def test_each_kind_keeps_its_order_whichever_layout_the_release_wants(minor: int) -> None:
    # 1.37 fits four GPUs of common offers to a slice, 1.34 two: the slices differ, the order of
    # the whole GPUs and of the offers, all a request of either kind can get, does not.
    assert _kinds(_names("h100x8-dynamic-mig", mode="dynamic", minor=minor)) == _kinds(
        _names("h100x8-dynamic-mig", mode="dynamic", minor=34)
    )


def test_no_gpu_is_split_over_two_slices() -> None:
    inventory = discover(
        FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE),
        MigModes(default="dynamic", offer=MigOffer(frozenset({ALL}))),
    )
    for minor in (34, 37):
        features = ApiFeatures(minor=minor, partitionable_devices=True)
        slices = build_slices(inventory, "gpu.nvidia.com", NODE, None, 1, features)
        gpus = [{d["name"].split("-mig-")[0] for d in s["spec"].get("devices") or []} for s in slices]
        assert sum(len(g) for g in gpus) == 8


def test_every_profile_a_dynamic_gpu_offers_goes_by_compute_memory_then_engines() -> None:
    names = [n for n in _names("h100x8-dynamic-mig", mode="dynamic", offer=ALL) if n.startswith("gpu-0")]
    assert names[0] == "gpu-0"
    profiles = list(dict.fromkeys(n.removeprefix("gpu-0-mig-").split("-at")[0] for n in names[1:]))
    # A 1g.10gb+me takes the GPU's one OFA and JPEG units: after the plain 1g.10gb, which does not.
    assert profiles == ["1g10gb", "1g10gbme", "1g20gb", "2g20gb", "3g40gb", "4g40gb", "7g80gb"]


def test_an_a100_takes_its_half_gpu_profile_from_the_top_too() -> None:
    names = _names("a100x4-dynamic-mig", mode="dynamic")
    threes = [n for n in names if n.startswith("gpu-0-mig-3g")]
    assert [n.rsplit("-at", 1)[1] for n in threes] == ["4", "0"]


def test_existing_mig_devices_go_smallest_first_across_gpus_and_whole_gpus_last() -> None:
    names = _names("h100x8-mig")
    assert names[:4] == [
        "gpu-4-mig-1g10gb-3-0",
        "gpu-4-mig-1g10gb-4-0",
        "gpu-5-mig-1g10gb-3-0",
        "gpu-5-mig-1g10gb-4-0",
    ]
    profiles = [n.split("-mig-")[1].split("-")[0] if "-mig-" in n else "gpu" for n in names]
    assert profiles == ["1g10gb"] * 8 + ["2g20gb"] * 4 + ["3g40gb"] * 4 + ["gpu"] * 4
    assert names[-4:] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_whole_gpus_of_several_models_go_least_memory_first() -> None:
    # mixed: two L40S (46068Mi), then two T4 (15Gi).
    assert _names("mixed") == ["gpu-2", "gpu-3", "gpu-0", "gpu-1"]


def test_discovery_order_is_the_order_of_earlier_releases() -> None:
    names = _names("h100x8-dynamic-mig", "discovery", mode="dynamic")
    assert [n for n in names if n.startswith("gpu-0")][:5] == [
        "gpu-0",
        "gpu-0-mig-7g80gb-at0",
        "gpu-0-mig-3g40gb-at0",
        "gpu-0-mig-3g40gb-at4",
        "gpu-0-mig-2g20gb-at0",
    ]
    assert _names("mixed", "discovery") == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


@pytest.mark.parametrize(("profile", "mode"), [("h100x8-dynamic-mig", "dynamic"), ("h100x8-mig", "static")])
def test_only_the_order_differs_so_claims_naming_a_device_or_profile_get_the_same(
    profile: str, mode: str
) -> None:
    def devices(order: DeviceOrder) -> dict[str, Any]:
        inventory = discover(FakeGpuLibrary(load_profile(profile), NODE), MigModes(default=mode))
        features = ApiFeatures(partitionable_devices=True)
        slices = build_slices(inventory, "gpu.nvidia.com", NODE, None, 1, features, order=order)
        return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}

    first, *others = (devices(order) for order in DEVICE_ORDERS)
    assert all(other == first for other in others)
