"""One device of a ResourceSlice: its typed attributes, capacities, counters and share policies. Pure.

`device_entry` (a GPU or MIG device), `partition_entry` (a dynamic-MIG offer) and `vfio_twin_entry`
(a GPU's passthrough twin) decide the attribute names and types selectors rely on (types are part
of the contract: docs/attributes.md), NVIDIA's own driver's plus DEPRECATED_ATTRIBUTES for one more
release on GPUs and made MIG devices (not on dynamic-MIG offers, which carry NVIDIA's, the NUMA
node and their placement); the counters say what a dynamic-MIG offer consumes of its GPU, the share
policies how a shareable device is divided. How entries are ordered and cut into slices is dra.core.slices'.

Rule: one entry at a time, from the model; nothing here knows of slices or of the API server.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from dra.model.devices import Device, Gpu, Inventory, MigDevice, MigEngines, MigPartition, vfio_twin_name

Obj = dict[str, Any]

MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING_ATTRIBUTE = 64
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
NUMA_NODE_ATTRIBUTE = "resource.kubernetes.io/numaNode"

#: Attributes NVIDIA's driver does not publish (indexes and minors change across reboots; the bus ID
#: has a standard name now), each with what to select on instead. Published until this release:
DEPRECATED_ATTRIBUTES_REMOVED_IN = "0.3.0"
DEPRECATED_ATTRIBUTES = {
    "index": f"uuid, or {PCI_BUS_ID_ATTRIBUTE}",
    "minor": f"uuid, or {PCI_BUS_ID_ATTRIBUTE}",
    "pcieBusID": f"{PCI_BUS_ID_ATTRIBUTE} (lower case, 4-digit domain: 0000:3b:00.0)",
    "parentIndex": "parentUUID",
}

#: Counter names (also DNS labels and C identifiers, which every release accepts).
COMPUTE_COUNTER = "compute"
MEMORY_COUNTER = "memory"


def memory_slice_counter(index: int) -> str:
    """The counter of one memory slice: memslice0..memslice7. One each makes placements exclusive."""
    return f"memslice{index}"


def counter_set_name(gpu: Gpu) -> str:
    """The counter set of a dynamic-MIG GPU, or of a GPU and its passthrough twin: gpu0."""
    return f"gpu{gpu.index}"


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")


class SliceError(ValueError):
    """The inventory cannot be published as it is (a name or value the API would reject)."""


def binary_quantity(value: int) -> str:
    """A byte count in the canonical form the API server stores ("81559Mi", "80Gi", "1500", "1k")."""
    if value < 0:
        raise SliceError(f"negative quantity {value}")
    exponent = 0
    while value and value % 1024 == 0 and exponent < len(_BINARY_SUFFIXES) - 1:
        value //= 1024
        exponent += 1
    if exponent:
        return f"{value}{_BINARY_SUFFIXES[exponent]}"
    # Without a binary suffix the server reads a decimal SI quantity and stores it with the
    # largest power-of-1000 suffix that keeps it whole ("1000" comes back as "1k").
    while value and value % 1000 == 0 and exponent < len(_DECIMAL_SUFFIXES) - 1:
        value //= 1000
        exponent += 1
    return f"{value}{_DECIMAL_SUFFIXES[exponent]}"


def _string(value: str) -> Obj:
    # Attribute strings are capped at 64 characters; product names fit, but a custom profile might not.
    return {"string": value[:MAX_STRING_ATTRIBUTE]}


def _shared_attributes(gpu: Gpu, inventory: Inventory, lists: bool) -> dict[str, Obj]:
    attributes: dict[str, Obj] = {
        "productName": _string(gpu.product_name),
        "brand": _string(gpu.brand),
        "architecture": _string(gpu.architecture),
        "cudaComputeCapability": {"version": gpu.cuda_compute_capability},
        "cudaDriverVersion": {"version": inventory.cuda_driver_version},
        PCI_BUS_ID_ATTRIBUTE: _string(gpu.pci_bus_id),
    }
    if inventory.driver_version is not None:
        attributes["driverVersion"] = {"version": inventory.driver_version}
    if gpu.pcie_root is not None:
        attributes[PCIE_ROOT_ATTRIBUTE] = _string(gpu.pcie_root)
    _add_numa_node(attributes, gpu, lists)
    if gpu.addressing_mode is not None:
        attributes["addressingMode"] = _string(gpu.addressing_mode)
    return attributes


#: Shareable devices are allocated in whole multiples of this much memory (KEP-5075 validRange
#: step): 1 MiB, as NVIDIA's driver publishes it.
SHARE_MEMORY_STEP = 1024**2

#: How a shareable GPU is divided, as NVIDIA's --consumable-shares names it: by memory, without a
#: limit (memory asked is only recorded), or into this many equal shares (capacity `shares`).
ShareMode = Literal["memory", "unlimited"] | int


def parse_share_mode(text: str) -> ShareMode:
    """memory, unlimited or a positive number of shares; ValueError naming the choices."""
    if text in ("memory", "unlimited"):
        return "memory" if text == "memory" else "unlimited"
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ValueError(f"{text!r}: expected memory, unlimited or a positive number of shares")


def _share_capacity(memory_bytes: int, mode: ShareMode) -> dict[str, Obj]:
    """The request policies of a shareable device's capacities.

    Memory is in whole MiB: the API wants default and max on the step grid, so the max is the
    memory rounded down to a MiB (the remainder, under 1 MiB, is never handed out). By memory,
    a claim that asks none gets the whole GPU; unlimited and counted, it gets none (any number
    of claims fit) and may ask some, which is recorded, not reserved. Counted, each claim takes
    one of the GPU's shares unless it asks more (capacity.requests.shares).
    """
    usable = binary_quantity(memory_bytes // SHARE_MEMORY_STEP * SHARE_MEMORY_STEP)
    step = binary_quantity(SHARE_MEMORY_STEP)
    if mode == "memory":
        return {"memory": {"default": usable, "validRange": {"min": step, "max": usable, "step": step}}}
    memory = {"default": "0", "validRange": {"min": "0", "max": usable, "step": step}}
    if mode == "unlimited":
        return {"memory": memory}
    return {
        "memory": memory,
        "shares": {"default": "1", "validRange": {"min": "1", "max": str(mode), "step": "1"}},
    }


def device_entry(
    device: Device,
    inventory: Inventory,
    shareable: bool = False,
    share_mode: ShareMode = "memory",
    *,
    lists: bool = False,
) -> Obj:
    """One device of a slice: name, typed attributes, quantity capacities.

    A shareable device (a full GPU or a MIG device) may be allocated to several claims at once,
    each consuming part of its capacity as `share_mode` divides it (allowMultipleAllocations,
    DRAConsumableCapacity). `lists`: the server keeps list-typed attributes (DRAListTypeAttributes).
    """
    if isinstance(device, MigDevice):
        attributes, capacity = _mig(device, device.parent, inventory, lists)
        attributes["uuid"] = _string(device.uuid)
        attributes["parentIndex"] = {"int": device.parent.index}
        attributes["pcieBusID"] = _string(device.parent.nvml_bus_id)
        # The memory slices it occupies, as NVIDIA's driver publishes a MIG device's.
        if device.placement_start >= 0:
            end = device.placement_start + device.placement_size
            capacity.update({f"memorySlice{index}": "1" for index in range(device.placement_start, end)})
    else:
        attributes = {
            "type": _string("gpu"),
            "uuid": _string(device.uuid),
            "index": {"int": device.index},
            "minor": {"int": device.minor},
            "pcieBusID": _string(device.nvml_bus_id),
            **_shared_attributes(device, inventory, lists),
        }
        capacity = {"memory": binary_quantity(device.memory_bytes)}
    entry = _entry(device.name, attributes, capacity)
    if shareable:
        _share(entry, device.memory_bytes, share_mode)
    return entry


def _mig(
    mig: MigDevice | MigPartition, gpu: Gpu, inventory: Inventory, lists: bool
) -> tuple[dict[str, Obj], dict[str, str]]:
    """What a made MIG device and a dynamic-MIG offer both publish: NVIDIA's MIG attributes and capacities."""
    attributes: dict[str, Obj] = {
        "type": _string("mig"),
        "parentUUID": _string(gpu.uuid),
        "profile": _string(mig.profile),
        **_shared_attributes(gpu, inventory, lists),
    }
    return attributes, {"memory": binary_quantity(mig.memory_bytes), **_engine_capacity(mig.engines)}


def _entry(name: str, attributes: dict[str, Obj], capacity: dict[str, str]) -> Obj:
    """A device entry, refused as the API server would refuse it (its name, its count of attributes)."""
    if not _DNS_LABEL.match(name):
        raise SliceError(f"device name {name!r} is not a DNS label")
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise SliceError(f"device {name} has more than {MAX_ATTRIBUTES_AND_CAPACITIES} attributes")
    return {
        "name": name,
        "attributes": dict(sorted(attributes.items())),
        "capacity": {key: {"value": value} for key, value in sorted(capacity.items())},
    }


def _share(entry: Obj, memory_bytes: int, share_mode: ShareMode) -> None:
    """Publish a device entry for several claims at once, its capacity divided as `share_mode` says."""
    entry["allowMultipleAllocations"] = True
    policies = _share_capacity(memory_bytes, share_mode)
    for name, policy in policies.items():
        entry["capacity"].setdefault(name, {"value": str(share_mode)})["requestPolicy"] = policy
    for name, value in entry["capacity"].items():
        if name not in policies:
            # Without a policy the scheduler charges each allocation the whole value, so a MIG
            # device's second share would not fit: its engines serve every share, none reserves any.
            value["requestPolicy"] = {"default": "0", "validValues": ["0"]}


def _engine_capacity(engines: MigEngines) -> dict[str, str]:
    """A MIG device's (or offer's) capacity in multiprocessors and engines."""
    return {
        "multiprocessors": str(engines.multiprocessors),
        "copyEngines": str(engines.copy_engines),
        "decoders": str(engines.decoders),
        "encoders": str(engines.encoders),
        "jpegEngines": str(engines.jpeg_engines),
        "ofaEngines": str(engines.ofa_engines),
    }


def _engines(partition: MigPartition) -> dict[str, int]:
    engines = partition.engines
    return {
        "decoders": engines.decoders,
        "encoders": engines.encoders,
        "jpegengines": engines.jpeg_engines,
        "ofaengines": engines.ofa_engines,
    }


def gpu_counters(gpu: Gpu, partitions: Sequence[MigPartition]) -> dict[str, int]:
    """What a dynamic-MIG GPU has: compute slices, memory bytes, each memory slice, and its media engines.

    The engines are those of the profile spanning the GPU, the largest count of each: they keep
    two media-extension (+me) profiles, which share the GPU's one OFA unit, apart.
    """
    compute = max(p.slices for p in partitions)
    memory_slices = max(p.placement_start + p.placement_size for p in partitions)
    counters = {COMPUTE_COUNTER: compute, MEMORY_COUNTER: gpu.memory_bytes}
    counters.update({memory_slice_counter(i): 1 for i in range(memory_slices)})
    for name in _engines(partitions[0]):
        most = max(_engines(p)[name] for p in partitions)
        if most:
            counters[name] = most
    return counters


def partition_counters(partition: MigPartition) -> dict[str, int]:
    """What one MIG profile at one placement consumes of its GPU's counters."""
    counters = {COMPUTE_COUNTER: partition.slices, MEMORY_COUNTER: partition.memory_bytes}
    counters.update({memory_slice_counter(i): 1 for i in partition.memory_slices})
    counters.update({name: n for name, n in _engines(partition).items() if n})
    return counters


def counter_values(counters: Mapping[str, int]) -> Obj:
    return {
        name: {"value": binary_quantity(value) if name == MEMORY_COUNTER else str(value)}
        for name, value in sorted(counters.items())
    }


def partition_entry(
    partition: MigPartition,
    inventory: Inventory,
    shareable: bool = False,
    share_mode: ShareMode = "memory",
    *,
    lists: bool = False,
) -> Obj:
    """One dynamic-MIG offer as a device: NVIDIA's MIG attributes without a uuid, plus its placement.

    `placementStart` is the one way a claim can ask for a placement, so it stays (with its size);
    the deprecated `parentIndex` and `pcieBusID` are left out of offers (docs/migration.md). A
    shareable offer's MIG device is made once and shared by the claims given it, as `share_mode`
    divides it; it consumes its GPU's counters once, however many claims hold it.
    """
    gpu = partition.parent
    attributes, capacity = _mig(partition, gpu, inventory, lists)
    attributes["placementStart"] = {"int": partition.placement_start}
    attributes["placementSize"] = {"int": partition.placement_size}
    entry = _entry(partition.name, attributes, capacity)
    entry["consumesCounters"] = [
        {"counterSet": counter_set_name(gpu), "counters": counter_values(partition_counters(partition))}
    ]
    if shareable:
        _share(entry, partition.memory_bytes, share_mode)
    return entry


def vfio_twin_entry(gpu: Gpu, lists: bool = False) -> Obj:
    """A GPU's passthrough twin (type vfio, NVIDIA's PassthroughSupport device): the GPU bound to vfio-pci.

    Its attributes are those NVIDIA's driver gives it that the inventory knows (not the PCI vendor
    and device IDs, IOMMUFD support or the BAR size); its UUID is NVIDIA's, derived from the PCI
    address (a name-based SHA-1 UUID in the DNS namespace), not the GPU's.
    """
    attributes: dict[str, Obj] = {
        "type": _string("vfio"),
        "uuid": _string(str(uuid.uuid5(uuid.NAMESPACE_DNS, gpu.pci_bus_id))),
        "productName": _string(gpu.product_name),
        PCI_BUS_ID_ATTRIBUTE: _string(gpu.pci_bus_id),
    }
    if gpu.pcie_root is not None:
        attributes[PCIE_ROOT_ATTRIBUTE] = _string(gpu.pcie_root)
    _add_numa_node(attributes, gpu, lists)
    return {"name": vfio_twin_name(gpu), "attributes": dict(sorted(attributes.items()))}


def _add_numa_node(attributes: dict[str, Obj], gpu: Gpu, lists: bool) -> None:
    if lists and len(gpu.numa_nodes) > 1:
        # KEP-5491's list form: the GPU's node first, then the nodes of its socket as close to it.
        # One node stays an int, so that `numaNode == 0` selectors keep working; matchAttribute
        # takes a scalar as a list of one.
        attributes[NUMA_NODE_ATTRIBUTE] = {"ints": list(gpu.numa_nodes)}
    elif gpu.numa_node is not None:
        attributes[NUMA_NODE_ATTRIBUTE] = {"int": gpu.numa_node}
