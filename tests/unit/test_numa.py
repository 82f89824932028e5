"""numaNode as a list (KEP-5491): sysfs read as 1.37's deviceattribute does, the fake, the stand-in, slices.

Expected lists follow k8s.io/dynamic-resource-allocation/deviceattribute/numa_linux.go at v0.37.2:
the device's node first, then the same-socket nodes at the minimum SLIT distance, ascending.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakenvml.adapter import over
from fakenvml.host import host_tree
from fakenvml.standin import NvmlStandIn

from dra.core.deviceentries import NUMA_NODE_ATTRIBUTE
from dra.core.slices import build_slices
from dra.core.versions import ApiFeatures
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import ProfileError
from dra.gpu.discovery import discover
from dra.gpu.numa import same_socket_nodes
from dra.model.devices import Inventory
from tests.unit.helpers import DRIVER, NODE, profile

#: Two sockets with sub-NUMA clustering (SNC2): nodes 0 and 1 on socket 0, 2 and 3 on socket 1,
#: node 4 memory only (no CPUs) as close to node 0 as node 1 is.
_DISTANCES = {
    0: "10 11 21 21 11",
    1: "11 10 21 21 21",
    2: "21 21 10 11 21",
    3: "21 21 11 10 21",
    4: "11 21 21 21 10",
}
_CPUS = {0: "0-3", 1: "4-7", 2: "8-11", 3: "12-15", 4: ""}


def _sysfs(root: Path, distances: dict[int, str] = _DISTANCES) -> Path:
    for node, row in distances.items():
        directory = root / f"devices/system/node/node{node}"
        directory.mkdir(parents=True)
        (directory / "distance").write_text(row + "\n")
        (directory / "cpulist").write_text(_CPUS[node] + "\n")
    for cpu in range(16):
        topology = root / f"devices/system/cpu/cpu{cpu}/topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{cpu // 8}\n")
    return root


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        # Its socket's other node, and the memory-only node whose socket nobody can tell.
        (0, (0, 1, 4)),
        # Node 0 is closest; node 4 is not at that distance.
        (1, (1, 0)),
        (3, (3, 2)),
    ],
)
def test_the_device_node_first_then_its_sockets_nodes_as_close(
    tmp_path: Path, node: int, expected: tuple[int, ...]
) -> None:
    assert same_socket_nodes(_sysfs(tmp_path), node) == expected


def test_a_node_alone_where_sysfs_has_no_distances_or_one_node(tmp_path: Path) -> None:
    assert same_socket_nodes(tmp_path, 2) == (2,)
    assert same_socket_nodes(_sysfs(tmp_path / "one", {0: "10"}), 0) == (0,)
    assert same_socket_nodes(_sysfs(tmp_path / "bad", {0: "10 x"}), 0) == (0,)


def test_a_node_of_another_socket_at_the_same_distance_is_left_out(tmp_path: Path) -> None:
    # Node 2 is as close to 0 as node 1, but on socket 1.
    rows = {0: "10 11 11", 1: "11 10 21", 2: "11 21 10"}
    sysfs = _sysfs(tmp_path, rows)
    assert same_socket_nodes(sysfs, 0) == (0, 1)


SNC = profile(
    {"model": "h100-sxm5-80gb", "count": 2, "numaNode": [0, 1]},
    {"model": "h100-sxm5-80gb", "count": 2, "numaNode": 1},
    {"model": "h100-sxm5-80gb", "count": 2, "numaNode": 2},
)


def test_a_profile_names_the_nodes_of_a_gpus_socket_and_the_stand_in_host_says_the_same(
    tmp_path: Path,
) -> None:
    fake = FakeGpuLibrary(SNC, NODE)
    behind = FakeGpuLibrary(SNC, NODE)
    sysfs, procfs = host_tree(behind, tmp_path)
    nvml = over(NvmlStandIn(behind), sysfs=sysfs, procfs=procfs, dev=tmp_path)
    nvml.init()
    try:
        on_nvml = discover(nvml)
    finally:
        nvml.shutdown()
    on_fake = discover(fake)
    assert on_nvml == on_fake
    assert [g.numa_nodes for g in on_fake.gpus] == [(0, 1), (0, 1), (1, 0), (1, 0), (2,), (2,)]
    assert [g.numa_node for g in on_fake.gpus] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("bad", [[], [0, 0], [0, "1"], [2000]])
def test_a_bad_numa_list_is_refused_naming_the_key(bad: object) -> None:
    with pytest.raises(ProfileError, match=r"gpus\[0\]\.numaNode"):
        profile({"model": "h100-sxm5-80gb", "numaNode": bad})


def _numa(inventory: Inventory, features: ApiFeatures) -> dict[str, object]:
    [slice_] = build_slices(inventory, DRIVER, NODE, None, 1, features)
    return {d["name"]: d["attributes"][NUMA_NODE_ATTRIBUTE] for d in slice_["spec"]["devices"]}


def test_a_gpu_close_to_several_nodes_gets_them_all_where_the_server_keeps_lists() -> None:
    inventory = discover(FakeGpuLibrary(SNC, NODE))
    assert _numa(inventory, ApiFeatures(37, list_attributes=True)) == {
        "gpu-0": {"ints": [0, 1]},
        "gpu-1": {"ints": [0, 1]},
        "gpu-2": {"ints": [1, 0]},
        "gpu-3": {"ints": [1, 0]},
        # One node stays an int, so that `numaNode == 2` selectors keep matching.
        "gpu-4": {"int": 2},
        "gpu-5": {"int": 2},
    }
    # Where the server drops lists: the GPU's own node.
    assert _numa(inventory, ApiFeatures(37)) == {
        f"gpu-{i}": {"int": node} for i, node in enumerate((0, 0, 1, 1, 2, 2))
    }
