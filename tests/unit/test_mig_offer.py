"""--mig-profiles: which dynamic-MIG offers a GPU publishes; the counters keep overlapping offers apart."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from dra.cli.parser import parse_args
from dra.core.deviceentries import gpu_counters, partition_counters
from dra.core.slices import (
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_COUNTERS_PER_SET,
    MAX_DEVICE_COUNTERS_PER_SLICE_V134,
    MAX_DEVICES_WITH_COUNTERS,
    MAX_SHARED_COUNTERS_PER_SLICE_V134,
    build_slices,
)
from dra.core.versions import ApiFeatures
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import MODELS, load_profile, parse_profile
from dra.gpu import migtables
from dra.gpu.discovery import discover
from dra.model.devices import Gpu, MigPartition
from dra.model.migmode import MigModes
from dra.model.migoffer import ALL, COMMON, MigOffer, parse_mig_offer

NODE = "node-a"


def _offers(model: str, offer: str = ALL) -> list[MigPartition]:
    profile = parse_profile({"gpus": [{"model": model, "mig": []}]}, model)
    modes = MigModes("dynamic", offer=parse_mig_offer(offer))
    return list(discover(FakeGpuLibrary(profile, NODE), modes).partitions)


def _profiles(offers: Sequence[MigPartition]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for p in offers:
        found.setdefault(p.profile, []).append(p.placement_start)
    return {name: sorted(starts) for name, starts in found.items()}


def test_common_offers_the_1g_2g_3g_and_7g_profiles_at_every_placement() -> None:
    assert _profiles(_offers("h100-sxm5-80gb", COMMON)) == {
        "7g.80gb": [0],
        "3g.40gb": [0, 4],
        "2g.20gb": [0, 2, 4],
        "1g.10gb": [0, 1, 2, 3, 4, 5, 6],
    }
    # On an A100 40GB the 1g profile of one memory slice is 1g.5gb, not 1g.10gb (two slices).
    assert set(_profiles(_offers("a100-sxm4-40gb", COMMON))) == {"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}


def test_all_offers_every_profile_and_named_profiles_add_to_common() -> None:
    assert len(_offers("h100-sxm5-80gb", ALL)) == 25
    assert set(_profiles(_offers("h100-sxm5-80gb", "common,4g.40gb,1g.10gb+me"))) == {
        "7g.80gb",
        "4g.40gb",
        "3g.40gb",
        "2g.20gb",
        "1g.10gb",
        "1g.10gb+me",
    }
    assert set(_profiles(_offers("h100-sxm5-80gb", "2g.20gb"))) == {"2g.20gb"}


def test_a_profile_the_gpu_lacks_is_said_and_a_gpu_left_without_offers_is_published_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inventory = discover(
        FakeGpuLibrary(load_profile("a100x4-dynamic-mig"), NODE),
        MigModes("dynamic", offer=parse_mig_offer("3g.40gb,1g.99gb")),
    )
    assert {p.profile for p in inventory.partitions} == {"3g.40gb"}
    assert "GPU 0 (NVIDIA A100-SXM4-80GB) has no MIG profile 1g.99gb (--mig-profiles)" in caplog.text

    inventory = discover(
        FakeGpuLibrary(load_profile("a100x4-dynamic-mig"), NODE),
        MigModes("dynamic", offer=parse_mig_offer("1g.99gb")),
    )
    assert not inventory.partitions
    assert [d.name for d in inventory] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_node_entries_replace_the_default_on_that_node() -> None:
    offer = parse_mig_offer("common,@gpu-node-3=all,@gpu-node-4=2g.20gb,@gpu-node-4=1g.10gb")
    assert offer.for_node("gpu-node-1") == MigOffer(frozenset({COMMON}))
    assert offer.for_node("gpu-node-3") == MigOffer(frozenset({ALL}))
    assert offer.for_node("gpu-node-4") == MigOffer(frozenset({"2g.20gb", "1g.10gb"}))
    modes = MigModes("dynamic", offer=offer).for_node("gpu-node-3")
    assert modes.offer == MigOffer(frozenset({ALL}))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3g", "'3g': expected all, common or a MIG profile name"),
        ("common,@node-a", "'@node-a': a node entry is @<node>=<item>"),
        ("@node-a=all", "name the profiles every other node offers first"),
        ("common,@node-a=most", "'@node-a=most': expected all, common"),
    ],
)
def test_bad_values_are_refused_naming_the_part(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_mig_offer(text)


def test_the_flag_reaches_discovery_through_the_modes_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse_args(["discover", "--node-name", NODE, "--mig-mode", "dynamic", "--mig-profiles", "all"])
    assert args.mig_mode.offer == MigOffer(frozenset({ALL}))
    assert parse_args(["discover", "--node-name", NODE]).mig_mode.offer == MigOffer(frozenset({COMMON}))
    monkeypatch.setenv("DRA_GPU_MIG_PROFILES", "common,@node-a=all")
    args = parse_args(["discover", "--node-name", NODE])
    assert args.mig_mode.for_node(NODE).offer == MigOffer(frozenset({ALL}))


# -- the counters keep physically overlapping offers apart ---------------------


def _fits(
    chosen: Sequence[Mapping[str, int]],
    capacity: Mapping[str, int],
) -> bool:
    """Whether the scheduler could give out these devices together: no counter over its capacity."""
    return all(sum(c.get(name, 0) for c in chosen) <= total for name, total in capacity.items())


def _nvml_allows(chosen: Sequence[MigPartition]) -> bool:
    """Whether NVML makes these GPU instances side by side, by the rules the fake enforces.

    FakeGpuLibrary.create_gpu_instance_with_placement (after the MIG user guide): no two
    placements share a memory slice, at most instanceCount of a profile (one +me), at most
    the GPU's 7 compute slices.
    """
    slices = [s for p in chosen for s in p.memory_slices]
    if len(slices) != len(set(slices)) or sum(p.slices for p in chosen) > migtables.COMPUTE_SLICES:
        return False
    table = {row.name: row for t in _TABLES.values() for row in t}
    return all(sum(q.profile == p.profile for q in chosen) <= table[p.profile].instance_count for p in chosen)


_TABLES = {name: model.mig_table for name, model in MODELS.items() if model.mig_table}


def _sets(
    offers: Sequence[MigPartition],
    ok: Callable[[tuple[MigPartition, ...]], bool],
    start: int = 0,
    chosen: tuple[MigPartition, ...] = (),
) -> Iterator[tuple[MigPartition, ...]]:
    """Every set of offers `ok` accepts; both rules hold for subsets too, so a rejected set ends a branch."""
    yield chosen
    for i in range(start, len(offers)):
        candidate = (*chosen, offers[i])
        if ok(candidate):
            yield from _sets(offers, ok, i + 1, candidate)


def test_every_migtables_table_is_checked() -> None:
    tables = {id(t) for t in _TABLES.values()}
    assert tables == {
        id(t) for t in (migtables.A100_40GB, migtables.A100_80GB, migtables.H100_80GB, migtables.H200_141GB)
    }


@pytest.mark.parametrize("offer", [ALL, COMMON])
@pytest.mark.parametrize("model", sorted(_TABLES))
def test_the_counters_allow_exactly_the_sets_nvml_can_make(model: str, offer: str) -> None:
    offers = _offers(model, offer)
    gpu: Gpu = offers[0].parent
    capacity = gpu_counters(gpu, offers)
    consumed = {p.name: partition_counters(p) for p in offers}

    def counters_fit(chosen: tuple[MigPartition, ...]) -> bool:
        return _fits([consumed[p.name] for p in chosen], capacity)

    by_counters = set(_sets(offers, counters_fit))
    by_nvml = set(_sets(offers, _nvml_allows))
    assert by_counters == by_nvml
    # The whole GPU consumes every counter, so it excludes every offer.
    assert all(not _fits([capacity, c], capacity) for c in consumed.values())
    if offer == ALL:
        # 7x1g, 3x2g+1g, 2x3g... are all in there: the largest sets are a 1g at each of 7 placements.
        assert max(len(s) for s in by_nvml) == 7


@pytest.mark.parametrize("offer", [ALL, COMMON, "1g.10gb"])
@pytest.mark.parametrize("minor", [34, 37])
def test_every_offer_fits_the_servers_slice_limits(offer: str, minor: int) -> None:
    inventory = discover(
        FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE),
        MigModes("dynamic", offer=parse_mig_offer(offer)),
    )
    slices = build_slices(
        inventory, "gpu.nvidia.com", NODE, None, 1, ApiFeatures(minor, partitionable_devices=True)
    )
    published = {d["name"] for s in slices for d in s["spec"].get("devices", [])}
    assert published == {p.name for p in inventory.partitions} | {g.name for g in inventory.gpus}
    for s in slices:
        spec = s["spec"]
        sets = spec.get("sharedCounters", [])
        assert len(sets) <= MAX_COUNTER_SETS_PER_SLICE
        assert all(len(c["counters"]) <= MAX_COUNTERS_PER_SET for c in sets)
        assert len(spec.get("devices", [])) <= MAX_DEVICES_WITH_COUNTERS
        if minor == 34:
            # 1.34 also caps the counters of all sets of a slice together (ResourceSliceMaxSharedCounters),
            # which two H100s (13 counters each) reach whatever few devices they offer.
            assert sum(len(c["counters"]) for c in sets) <= MAX_SHARED_COUNTERS_PER_SLICE_V134
            consumed = sum(len(c["counters"]) for d in spec["devices"] for c in d["consumesCounters"])
            assert consumed <= MAX_DEVICE_COUNTERS_PER_SLICE_V134
