"""ResourceSlices built from the inventory: the attribute contract, API limits, and splitting a pool."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
from typing import Any

import pytest

from dra.core import deviceentries
from dra.core.deviceentries import (
    DEPRECATED_ATTRIBUTES,
    DEPRECATED_ATTRIBUTES_REMOVED_IN,
    NUMA_NODE_ATTRIBUTE,
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    SliceError,
    binary_quantity,
    device_entry,
    partition_entry,
)
from dra.core.slices import MAX_DEVICES_PER_SLICE, build_slices, slice_name
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.gpu.library import ERROR_NOT_SUPPORTED, GpuHandle, GpuLibraryError
from dra.model.devices import Gpu, Inventory, MigDevice
from dra.model.migmode import parse_mig_modes
from tests.unit.helpers import DRIVER, NODE, inventory, named, profile

MIB = 1024**2
GIB = 1024**3
PROFILES = ["h100x8", "h100x8-mig", "a100x4-mig", "mixed"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# semver 2.0.0, as the API server checks `version` attributes.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


def _entries(name: str) -> dict[str, Any]:
    inv = inventory(name)
    return {d.name: device_entry(d, inv) for d in inv}


# -- the attribute contract ------------------------------------------------------------


def test_gpu_attributes_and_types() -> None:
    inv = inventory("h100x8")
    gpu = inv.gpus[3]
    entry = device_entry(gpu, inv)
    assert entry["name"] == "gpu-3"
    assert entry["attributes"] == {
        "architecture": {"string": "Hopper"},
        "brand": {"string": "Nvidia"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "driverVersion": {"version": "550.54.15"},
        "index": {"int": 3},
        "minor": {"int": 3},
        "pcieBusID": {"string": "00000000:40:00.0"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "addressingMode": {"string": "HMM"},
        PCI_BUS_ID_ATTRIBUTE: {"string": "0000:40:00.0"},
        PCIE_ROOT_ATTRIBUTE: {"string": "pci0000:30"},
        NUMA_NODE_ATTRIBUTE: {"int": 0},
        "type": {"string": "gpu"},
        "uuid": {"string": gpu.uuid},
    }
    assert entry["capacity"] == {"memory": {"value": "81559Mi"}}


def test_mig_attributes_and_types() -> None:
    inv = inventory("h100x8-mig")
    mig = inv.get("gpu-5-mig-3g40gb-1-0")
    assert mig is not None
    entry = device_entry(mig, inv)
    assert entry["attributes"] == {
        "architecture": {"string": "Hopper"},
        "brand": {"string": "Nvidia"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "driverVersion": {"version": "550.54.15"},
        "parentIndex": {"int": 5},
        "parentUUID": {"string": inv.gpus[5].uuid},
        "pcieBusID": {"string": "00000000:60:00.0"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "profile": {"string": "3g.40gb"},
        "addressingMode": {"string": "HMM"},
        PCI_BUS_ID_ATTRIBUTE: {"string": "0000:60:00.0"},
        PCIE_ROOT_ATTRIBUTE: {"string": "pci0000:50"},
        NUMA_NODE_ATTRIBUTE: {"int": 1},
        "type": {"string": "mig"},
        "uuid": {"string": mig.uuid},
    }
    assert entry["capacity"] == {
        "copyEngines": {"value": "3"},
        "decoders": {"value": "3"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "3"},
        "memory": {"value": "40192Mi"},
        # The memory slices its GPU instance occupies (placement 4, size 4), as NVIDIA's driver has them.
        **{f"memorySlice{i}": {"value": "1"} for i in range(4, 8)},
        "multiprocessors": {"value": "60"},
        "ofaEngines": {"value": "0"},
    }
    # Attributes that only full GPUs carry.
    assert "index" not in entry["attributes"]
    assert "minor" not in entry["attributes"]


#: What NVIDIA's DRA driver publishes (2026 releases), numaNode and addressingMode where known.
NVIDIA_GPU_ATTRIBUTES = {
    "architecture",
    "brand",
    "cudaComputeCapability",
    "cudaDriverVersion",
    "driverVersion",
    "productName",
    PCI_BUS_ID_ATTRIBUTE,
    PCIE_ROOT_ATTRIBUTE,
    "type",
    "uuid",
    "addressingMode",
    NUMA_NODE_ATTRIBUTE,
}
NVIDIA_MIG_ATTRIBUTES = NVIDIA_GPU_ATTRIBUTES | {"parentUUID", "profile"}


@pytest.mark.parametrize("name", PROFILES)
def test_every_device_publishes_what_nvidia_publishes_plus_only_deprecated_names(name: str) -> None:
    inv = inventory(name)
    for device in inv:
        published = set(device_entry(device, inv)["attributes"])
        nvidia = NVIDIA_MIG_ATTRIBUTES if isinstance(device, MigDevice) else NVIDIA_GPU_ATTRIBUTES
        assert nvidia <= published, device.name
        assert published - nvidia <= set(DEPRECATED_ATTRIBUTES), device.name


def test_the_deprecated_attributes_are_still_published_until_their_release() -> None:
    inv = inventory("h100x8-mig")
    published = {key for device in inv for key in device_entry(device, inv)["attributes"]}
    assert set(DEPRECATED_ATTRIBUTES) <= published
    # The docs promise their removal in that release: bumping the version to it fails here first.
    version = tuple(int(part) for part in importlib.metadata.version("dra-gpu").split(".")[:3])
    removed_in = tuple(int(part) for part in DEPRECATED_ATTRIBUTES_REMOVED_IN.split("."))
    assert version < removed_in, "remove DEPRECATED_ATTRIBUTES (and their docs) in this release"


class UnknownNuma(FakeGpuLibrary):
    """A host (a VM, say) where neither NVML nor sysfs knows the GPUs' NUMA node."""

    def numa_node(self, gpu: GpuHandle) -> int:
        raise GpuLibraryError(ERROR_NOT_SUPPORTED, "no NUMA node")


def test_no_numa_node_or_addressing_mode_attribute_where_they_are_unknown() -> None:
    fake = UnknownNuma(
        profile(
            {"model": "a100-sxm4-40gb", "addressingMode": "unsupported", "mig": ["7g.40gb"]}, {"model": "t4"}
        ),
        NODE,
    )
    inv = discover(fake)
    for device in inv:
        attributes = device_entry(device, inv)["attributes"]
        assert NUMA_NODE_ATTRIBUTE not in attributes
        assert ("addressingMode" in attributes) == (device.name == "gpu-1")


@pytest.mark.parametrize("mode", ["None", "ATS", "HMM"])
def test_the_addressing_mode_is_published_as_nvidia_smi_names_it(mode: str) -> None:
    inv = inventory(profile({"model": "h100-sxm5-80gb", "addressingMode": mode.lower()}))
    assert device_entry(inv.gpus[0], inv)["attributes"]["addressingMode"] == {"string": mode}


@pytest.mark.parametrize(
    ("device", "memory"),
    [
        ("gpu-0-mig-1g5gb-3-0", "4864Mi"),
        ("gpu-3-mig-7g40gb-1-0", "40192Mi"),
        ("gpu-2-mig-4g20gb-1-0", "19968Mi"),
    ],
)
def test_a100_mig_memory(device: str, memory: str) -> None:
    assert _entries("a100x4-mig")[device]["capacity"]["memory"] == {"value": memory}


@pytest.mark.parametrize("name", PROFILES)
def test_every_device_respects_the_api_limits(name: str) -> None:
    for device_name, entry in _entries(name).items():
        assert _DNS_LABEL.match(device_name)
        assert len(device_name) <= 63
        attributes, capacity = entry["attributes"], entry["capacity"]
        assert len(attributes) + len(capacity) <= 32
        for key in [*attributes, *capacity]:
            domain, _, identifier = key.rpartition("/")
            assert _C_IDENTIFIER.match(identifier)
            assert len(identifier) <= 32
            assert not domain or (_DNS_SUBDOMAIN.match(domain) and len(domain) <= 63)
        for key, value in attributes.items():
            assert len(value) == 1, key
            ((kind, raw),) = value.items()
            assert kind in ("int", "bool", "string", "version"), key
            if kind == "int":
                assert type(raw) is int, key
            elif kind == "bool":
                assert type(raw) is bool, key
            else:
                assert isinstance(raw, str), key
                assert len(raw) <= 64, key
                assert kind == "string" or _SEMVER.match(raw), (key, raw)
        for key, value in capacity.items():
            assert set(value) == {"value"}
            assert isinstance(value["value"], str), key


def test_a_long_product_name_is_truncated_not_rejected() -> None:
    long_name = ("NVIDIA Engineering Sample " * 4)[:80]
    assert len(long_name) == 80
    inv = inventory(
        named(
            profile({"productName": "x", "memoryMiB": 1024}, {"model": "a100-sxm4-40gb", "mig": ["7g.40gb"]}),
            long_name,
        )
    )
    for device in inv:
        assert device_entry(device, inv)["attributes"]["productName"] == {"string": long_name[:64]}


def test_no_driver_version_attribute_when_the_driver_version_is_not_numeric() -> None:
    inv = inventory(profile({"model": "t4"}, driverVersion="open-dev"))
    assert "driverVersion" not in device_entry(inv.devices[0], inv)["attributes"]


class NoPcieRoot(FakeGpuLibrary):
    """A host where sysfs tells nothing about PCIe topology."""

    def pcie_root(self, pci_bus_id: str) -> str | None:
        return None


def test_no_pcie_root_attribute_when_it_is_unknown() -> None:
    inv = discover(NoPcieRoot(load_profile("h100x8-mig"), NODE))
    for device in inv:
        assert PCIE_ROOT_ATTRIBUTE not in device_entry(device, inv)["attributes"]


def test_the_attribute_limit_is_enforced(monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inventory("h100x8")
    # A GPU has 15 attributes and 1 capacity.
    monkeypatch.setattr(deviceentries, "MAX_ATTRIBUTES_AND_CAPACITIES", 15)
    with pytest.raises(SliceError, match="device gpu-0 has more than 15 attributes"):
        device_entry(inv.gpus[0], inv)
    monkeypatch.setattr(deviceentries, "MAX_ATTRIBUTES_AND_CAPACITIES", 16)
    device_entry(inv.gpus[0], inv)


def test_the_attribute_limit_holds_for_a_mig_device_and_an_offer_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = inventory("h100x8-mig")
    offers = discover(FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE), parse_mig_modes("dynamic"))
    mig = next(d for d in made if isinstance(d, MigDevice))
    offer = offers.partitions[0]
    monkeypatch.setattr(deviceentries, "MAX_ATTRIBUTES_AND_CAPACITIES", 8)
    with pytest.raises(SliceError, match=f"device {mig.name} has more than 8 attributes"):
        device_entry(mig, made)
    with pytest.raises(SliceError, match=f"device {offer.name} has more than 8 attributes"):
        partition_entry(offer, offers)


def test_a_device_name_that_is_not_a_dns_label_is_refused() -> None:
    inv = inventory("mixed")
    bad = dataclasses.replace(inv.gpus[0], name="GPU_0")
    with pytest.raises(SliceError, match="device name 'GPU_0' is not a DNS label"):
        device_entry(bad, inv)


# -- quantities ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (1, "1"),
        (999, "999"),
        (1023, "1023"),
        (1024, "1Ki"),
        (1536, "1536"),
        (1025 * 1024, "1025Ki"),
        (1000 * 1024, "1000Ki"),
        (81559 * MIB, "81559Mi"),
        (40192 * MIB, "40192Mi"),
        (80 * GIB, "80Gi"),
        (15 * GIB, "15Gi"),
        (1024**4, "1Ti"),
        (3 * 1024**5, "3Pi"),
        (1024**6, "1Ei"),
        (2048 * 1024**6, "2048Ei"),
        # Not a multiple of 1024: the server stores such a number in decimal SI form ("1000" -> "1k").
        (1000, "1k"),
        (12000, "12k"),
        (1500, "1500"),
        (1_000_000, "1M"),
        (1_500_000, "1500k"),
        (5_000_000_000, "5G"),
        # A multiple of 1024 is sent, and so stored, in binary form.
        (16_000_000_000, "15625000Ki"),
        (81559 * MIB + 1000, "85520810984"),
    ],
)
def test_binary_quantity_canonical_forms(value: int, text: str) -> None:
    assert binary_quantity(value) == text


def test_a_negative_quantity_is_refused() -> None:
    with pytest.raises(SliceError, match="negative quantity -1"):
        binary_quantity(-1)


# -- slices ---------------------------------------------------------------------------------


def test_one_slice_for_a_small_node() -> None:
    (only,) = build_slices(inventory("h100x8"), DRIVER, NODE, None, generation=4)
    assert only["apiVersion"] == "resource.k8s.io/v1"
    assert only["kind"] == "ResourceSlice"
    assert only["metadata"] == {"name": f"{NODE}-{DRIVER}-0"}
    spec = only["spec"]
    assert spec["driver"] == DRIVER
    assert spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 4, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]


def _many(count: int) -> Inventory:
    return inventory(profile({"model": "t4", "count": count}))


@pytest.mark.parametrize(
    ("count", "sizes"), [(128, [128]), (129, [128, 1]), (300, [128, 128, 44]), (384, [128] * 3)]
)
def test_a_large_pool_is_split_into_slices_of_at_most_128_devices(count: int, sizes: list[int]) -> None:
    inv = _many(count)
    published = build_slices(inv, DRIVER, NODE, None, generation=2)
    assert [len(s["spec"]["devices"]) for s in published] == sizes
    assert all(len(s["spec"]["devices"]) <= MAX_DEVICES_PER_SLICE for s in published)
    assert [s["metadata"]["name"] for s in published] == [f"{NODE}-{DRIVER}-{i}" for i in range(len(sizes))]
    for s in published:
        assert s["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": len(sizes)}
        assert s["spec"]["nodeName"] == NODE
    assert [d["name"] for s in published for d in s["spec"]["devices"]] == [d.name for d in inv]


def test_rebuilding_gives_byte_identical_slices() -> None:
    first = json.dumps(build_slices(_many(300), DRIVER, NODE, "uid-1", generation=1))
    again = json.dumps(build_slices(_many(300), DRIVER, NODE, "uid-1", generation=1))
    assert first == again


def test_slices_are_owned_by_the_node_when_its_uid_is_known() -> None:
    for s in build_slices(_many(200), DRIVER, NODE, "0f2c-node-uid", generation=1):
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "0f2c-node-uid", "controller": True}
        ]
    for s in build_slices(_many(200), DRIVER, NODE, None, generation=1):
        assert "ownerReferences" not in s["metadata"]


def test_an_empty_inventory_still_publishes_one_empty_slice() -> None:
    empty = Inventory(devices=(), driver_version="550.54.15", cuda_driver_version="12.4.0")
    (only,) = build_slices(empty, DRIVER, NODE, None, generation=1)
    assert only["spec"]["devices"] == []
    assert only["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}


def test_duplicate_device_names_are_refused() -> None:
    inv = inventory("mixed")
    twin: Gpu = dataclasses.replace(inv.gpus[1], name="gpu-0")
    clash = Inventory(devices=(inv.gpus[0], twin), driver_version=None, cuda_driver_version="12.4.0")
    with pytest.raises(SliceError, match=r"device names are not unique: \['gpu-0'\]"):
        build_slices(clash, DRIVER, NODE, None, generation=1)


def test_slice_names_are_stable_and_valid_object_names() -> None:
    assert slice_name("node-a", DRIVER, 0) == "node-a-gpu.nvidia.com-0"
    assert slice_name("worker-17.gpu.example.com", DRIVER, 2) == "worker-17.gpu.example.com-gpu.nvidia.com-2"


_LONG_NODES = [
    ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61]),
    ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 60]),
    # The 200th character, where a shortened name is cut, is a dot or a hyphen.
    ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 7, "e" * 50]),
    ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 7 + "-" + "e" * 50]),
]


@pytest.mark.parametrize("node", _LONG_NODES)
def test_slice_names_of_very_long_node_names_stay_valid_and_distinct(node: str) -> None:
    names = [slice_name(node, DRIVER, i) for i in range(3)]
    assert len(set(names)) == 3
    for name in names:
        assert len(name) <= 253
        assert _DNS_SUBDOMAIN.match(name), name
    assert slice_name(node, DRIVER, 0) == names[0]
    others = {slice_name(other, DRIVER, 0) for other in _LONG_NODES}
    assert len(others) == len(_LONG_NODES)
