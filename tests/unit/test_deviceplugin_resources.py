"""Which resources the device plugin offers, with which IDs and placements (dra.deviceplugin.resources)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dra.deviceplugin.config import MigStrategy, SharedResource, TimeSlicing
from dra.deviceplugin.resources import (
    ResourceError,
    changes,
    check_resource_name,
    device_id,
    mig_resource_name,
    numa_node,
    placements,
    resources,
    socket_name,
    unshared,
)
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile, parse_profile
from dra.gpu.discovery import discover
from dra.model.devices import Gpu, Inventory, MigDevice


def node(profile: str) -> Inventory:
    return discover(FakeGpuLibrary(load_profile(profile), "node-a"))


def test_full_gpus_only() -> None:
    [gpu] = resources(node("mixed"))
    assert gpu.name == "nvidia.com/gpu"
    assert [d.name for d in gpu.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert gpu.socket_name == "dra-gpu-nvidia.com-gpu.sock"


def test_mig_devices_are_offered_per_profile() -> None:
    offered = {r.name: r.devices for r in resources(node("h100x8-mig"))}
    assert list(offered) == [
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ]
    assert len(offered["nvidia.com/gpu"]) == 4
    assert len(offered["nvidia.com/mig-1g.10gb"]) == 8
    assert all(isinstance(d, MigDevice) and d.profile == "3g.40gb" for d in offered["nvidia.com/mig-3g.40gb"])


def test_all_mig_node_still_offers_the_gpu_resource_empty() -> None:
    offered = resources(node("a100x4-mig"), "example.com/gpu")
    assert offered[0].name == "example.com/gpu"
    assert offered[0].devices == ()
    assert "example.com/mig-7g.40gb" in [r.name for r in offered]


@pytest.mark.parametrize(
    ("profile", "name"),
    [("1g.10gb", "nvidia.com/mig-1g.10gb"), ("1g.5gb+me", "nvidia.com/mig-1g.5gb.me"), ("1c.3g.20gb", None)],
)
def test_mig_resource_names_are_valid(profile: str, name: str | None) -> None:
    result = mig_resource_name("nvidia.com/gpu", profile)
    assert check_resource_name(result) == result
    if name is not None:
        assert result == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gpu", "must be <domain>/<name>"),
        ("/gpu", "must be <domain>/<name>"),
        ("Nvidia.com/gpu", "is not a DNS subdomain"),
        ("kubernetes.io/gpu", "reserved for Kubernetes"),
        ("x.kubernetes.io/gpu", "reserved for Kubernetes"),
        ("nvidia.com/-gpu", "must be at most 63"),
        ("nvidia.com/" + "g" * 64, "must be at most 63"),
    ],
)
def test_bad_resource_names(name: str, message: str) -> None:
    with pytest.raises(ResourceError, match=message):
        check_resource_name(name)


def test_device_ids_are_uuids_of_at_most_63_characters() -> None:
    gpu = next(d for d in node("mixed") if isinstance(d, Gpu))
    assert device_id(gpu) == gpu.uuid
    assert len(gpu.uuid) <= 63
    with pytest.raises(ResourceError, match="1 to 63 characters"):
        device_id(replace(gpu, uuid="GPU-" + "0" * 60))
    with pytest.raises(ResourceError, match="gpu-0"):
        resources(
            Inventory(devices=(replace(gpu, uuid=""),), driver_version=None, cuda_driver_version="12.4.0")
        )


def test_socket_names_have_no_slash() -> None:
    assert socket_name("example.com/mig-1g.5gb") == "dra-gpu-example.com-mig-1g.5gb.sock"


def test_placements_and_numa_follow_the_parent_gpu() -> None:
    inventory = node("h100x8-mig")
    mig = next(d for d in inventory if isinstance(d, MigDevice))
    table = placements(inventory.devices)
    parent = mig.parent
    assert table[mig.uuid].groups == (
        f"gpu:{parent.uuid}",
        f"pcie:{parent.pcie_root}",
        f"numa:{parent.numa_node}",
    )
    assert numa_node(mig) == parent.numa_node == 1
    gpu = inventory.devices[0]
    assert isinstance(gpu, Gpu)
    assert table[gpu.uuid].order == 0
    bare = replace(gpu, pcie_root=None, numa_node=None)
    assert placements([bare])[gpu.uuid].groups == (f"gpu:{gpu.uuid}", None, None)
    assert numa_node(bare) is None


def shared(*entries: SharedResource, rename: bool = False, one: bool = False) -> TimeSlicing:
    return TimeSlicing(rename_by_default=rename, fail_requests_greater_than_one=one, resources=entries)


def test_mig_strategy_none_offers_full_gpus_only() -> None:
    [gpu] = resources(node("h100x8-mig"), mig_strategy=MigStrategy.NONE)
    assert gpu.name == "nvidia.com/gpu"
    assert [d.name for d in gpu.devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_mig_strategy_single_offers_the_mig_devices_as_the_gpu_resource() -> None:
    layout = {"gpus": [{"model": "a100-sxm4-40gb", "count": 2, "mig": ["1g.5gb"] * 7}]}
    inventory = discover(FakeGpuLibrary(parse_profile(layout, "single"), "node-a"))
    [gpu] = resources(inventory, mig_strategy=MigStrategy.SINGLE)
    assert gpu.name == "nvidia.com/gpu"
    assert len(gpu.devices) == 14
    assert all(isinstance(d, MigDevice) and d.profile == "1g.5gb" for d in gpu.devices)
    # No GPU in MIG mode: single is the full GPUs.
    [whole] = resources(node("mixed"), mig_strategy=MigStrategy.SINGLE)
    assert len(whole.devices) == 4


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (
            "a100x4-mig",
            "MIG strategy single needs one MIG profile on the node, found 5 (1g.5gb on gpu-0, gpu-1; "
            "2g.10gb on gpu-0; 3g.20gb on gpu-0, gpu-2; 4g.20gb on gpu-2; 7g.40gb on gpu-3); "
            "use the mixed strategy",
        ),
        (
            "h100x8-mig",
            "MIG strategy single: gpu-4, gpu-5, gpu-6, gpu-7 in MIG mode but gpu-0, gpu-1, gpu-2, gpu-3 not; "
            "put every GPU in MIG mode with one profile, or use the mixed strategy",
        ),
    ],
)
def test_mig_strategy_single_refuses_mixed_layouts(profile: str, message: str) -> None:
    with pytest.raises(ResourceError) as raised:
        resources(node(profile), mig_strategy=MigStrategy.SINGLE)
    assert str(raised.value).startswith(message)


def test_time_slicing_advertises_replicas_of_each_gpu() -> None:
    inventory = node("mixed")
    [gpu] = resources(inventory, time_slicing=shared(SharedResource("nvidia.com/gpu", 4)))
    assert (gpu.name, gpu.replicas, gpu.advertised, gpu.one_per_container) == ("nvidia.com/gpu", 4, 16, False)
    ids = gpu.device_ids()
    first = inventory.devices[0]
    assert list(ids)[:4] == [f"{first.uuid}::{n}" for n in range(4)]
    assert {d.uuid for d in ids.values()} == {d.uuid for d in inventory}
    assert all(len(i) <= 63 for i in ids)


def test_time_slicing_renames_and_shares_mig_resources() -> None:
    config = shared(
        SharedResource("nvidia.com/gpu", 2),
        SharedResource("nvidia.com/mig-1g.10gb", 3, rename="nvidia.com/mig-small"),
        rename=True,
        one=True,
    )
    offered = {r.name: r for r in resources(node("h100x8-mig"), time_slicing=config)}
    assert sorted(offered) == [
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
        "nvidia.com/mig-small",
    ]
    assert offered["nvidia.com/mig-small"].advertised == 24
    assert offered["nvidia.com/gpu.shared"].one_per_container
    assert not offered["nvidia.com/mig-2g.20gb"].shared
    # One replica is no sharing: nothing to refuse.
    [single] = resources(node("mixed"), time_slicing=shared(SharedResource("nvidia.com/gpu", 1), one=True))
    assert not single.one_per_container
    assert list(single.device_ids()) == [d.uuid for d in node("mixed")]


def test_time_slicing_refuses_two_resources_of_one_name_and_reports_absent_ones() -> None:
    clash = shared(SharedResource("nvidia.com/mig-1g.10gb", 2, rename="nvidia.com/gpu"))
    with pytest.raises(ResourceError, match=r"two resources would be named nvidia\.com/gpu; rename one"):
        resources(node("h100x8-mig"), time_slicing=clash)
    absent = shared(SharedResource("nvidia.com/mig-1g.5gb", 2), SharedResource("nvidia.com/gpu", 2))
    assert unshared(resources(node("mixed"), time_slicing=absent), absent) == ["nvidia.com/mig-1g.5gb"]


def test_changes_between_two_mig_layouts_by_resource_name() -> None:
    small = {"model": "a100-sxm4-40gb", "mig": ["1g.5gb"] * 7}
    large = {"model": "a100-sxm4-40gb", "mig": ["3g.20gb", "4g.20gb"]}
    t4 = {"model": "t4"}
    before = resources(discover(FakeGpuLibrary(parse_profile({"gpus": [small, t4]}, "t"), "node-a")))
    after = resources(discover(FakeGpuLibrary(parse_profile({"gpus": [large, t4]}, "t"), "node-a")))
    diff = changes(before, after)
    assert [r.name for r in diff.added] == ["nvidia.com/mig-3g.20gb", "nvidia.com/mig-4g.20gb"]
    assert [r.name for r in diff.removed] == ["nvidia.com/mig-1g.5gb"]
    assert diff.changed == (), "the T4 is the same device under nvidia.com/gpu"
    assert not changes(after, after)


def test_more_replicas_change_a_resource_in_place() -> None:
    inventory = node("mixed")
    [one] = resources(inventory)
    [four] = resources(inventory, time_slicing=TimeSlicing(resources=(SharedResource("nvidia.com/gpu", 4),)))
    diff = changes([one], [four])
    assert (diff.added, diff.removed) == ((), ())
    assert diff.changed == (four,)
    assert diff.changed[0].advertised == 16
