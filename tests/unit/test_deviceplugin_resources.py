"""Which resources the device plugin offers, with which IDs and placements (dra.deviceplugin.resources)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dra.deviceplugin.resources import (
    ResourceError,
    check_resource_name,
    device_id,
    mig_resource_name,
    numa_node,
    placements,
    resources,
    socket_name,
)
from dra.gpu.discovery import discover
from dra.gpu.fake import FakeGpuLibrary
from dra.gpu.profiles import load_profile
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
