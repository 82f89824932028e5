"""From the inventory to resource.k8s.io/v1 ResourceSlices. Pure.

`device_entry` decides the attribute names and types selectors rely on (types are part of the
contract: docs/attributes.md), NVIDIA's own driver's plus DEPRECATED_ATTRIBUTES for one more
release; `build_slices` splits the node's pool over slices within the API limits, with each
dynamic-MIG GPU's counter set laid out as the server's release wants it (docs/mig.md).
Converging on the server's slices is dra.core.sliceplan's.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dra.core.taints import DeviceTaint
from dra.core.versions import ApiFeatures
from dra.model.devices import Device, Gpu, Inventory, MigDevice, MigEngines, MigPartition, vfio_twin_name

Obj = dict[str, Any]

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
#: The lower limit once any device of a slice has taints (or consumes counters).
MAX_TAINTED_DEVICES_PER_SLICE = 64
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

# Limits of resource.k8s.io/v1 on slices with shared counters. 1.35 set these (ResourceSliceMaxCounterSets,
# ...MaxCountersPerCounterSet, ...MaxDevicesWithTaintsOrConsumesCounters); 1.34's alpha allowed as much or
# more, so the lower figures are kept for every release.
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_SET = 32
MAX_DEVICES_WITH_COUNTERS = 64
#: 1.34 (counter sets beside devices) also caps a slice's counters in total, over all its sets
#: (ResourceSliceMaxSharedCounters) and over all its devices' consumption
#: (ResourceSliceMaxDeviceCountersPerSlice).
MAX_SHARED_COUNTERS_PER_SLICE_V134 = 32
MAX_DEVICE_COUNTERS_PER_SLICE_V134 = 1024
#: Counter names (also DNS labels and C identifiers, which every release accepts).
COMPUTE_COUNTER = "compute"
MEMORY_COUNTER = "memory"


def memory_slice_counter(index: int) -> str:
    """The counter of one memory slice: memslice0..memslice7. One each makes placements exclusive."""
    return f"memslice{index}"


def counter_set_name(gpu: Gpu) -> str:
    """The counter set of a dynamic-MIG GPU, or of a GPU and its passthrough twin: gpu0."""
    return f"gpu{gpu.index}"


#: How the devices of a pool are ordered in its slices. The scheduler gives each request the first
#: device in slice order that satisfies it (docs/mig.md, "Publishing order"), so this order is its
#: choice among fitting devices. `packing` (the default, chosen by tests/bench/bench_packing.py): the
#: smallest device first, a dynamic-MIG GPU's offers before the GPU whole; `discovery`: as discovery
#: lists them (the GPU whole, then the largest profile first), the order of earlier releases, kept
#: so that the benchmark measures it beside the default.
DeviceOrder = Literal["packing", "discovery"]
DEVICE_ORDERS: tuple[DeviceOrder, ...] = ("packing", "discovery")


def _smallest_first(device: Device) -> tuple[int, int, int, int, str]:
    """Where a device without counters goes in `packing` order: least memory, then fewest multiprocessors.

    A MIG device before a whole GPU of the same memory, then by GPU, so that equal devices fill the
    lowest GPUs first.
    """
    if isinstance(device, MigDevice):
        return (device.memory_bytes, device.engines.multiprocessors, 0, device.parent.index, device.name)
    return (device.memory_bytes, 0, 1, device.index, device.name)


def _offer_first(partition: MigPartition, memory_slices: int) -> tuple[int, int, int, int]:
    """Where a dynamic-MIG offer goes among its GPU's in `packing` order: the fewest compute slices, the
    least memory, the fewest engines (a 1g.10gb before a 1g.10gb+me, which takes the GPU's one OFA) first.

    Profiles smaller than half the GPU take placements from the lowest memory slice up, those of half
    or more from the highest down: on an H100 the 1g and 2g devices then fill slices 0 to 3 while a
    3g.40gb goes to 4-7, the one placement that leaves the others room for four more compute slices
    (from 0 it would strand slice 7, which no 1g.10gb or 2g.20gb placement covers).
    """
    half = 2 * partition.placement_size >= memory_slices
    start = -partition.placement_start if half else partition.placement_start
    e = partition.engines
    engines = e.copy_engines + e.decoders + e.encoders + e.jpeg_engines + e.ofa_engines
    return (partition.slices, partition.memory_bytes, engines, start)


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
        "pcieBusID": _string(gpu.nvml_bus_id),
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

#: The first release known to charge a shared device's counters once, whoever holds it (1.37.2:
#: `skipCounterCheck` and `IsDeviceAllocated` in k8s.io/dynamic-resource-allocation's allocator;
#: 1.34.12 charges them at each allocation in a scheduling cycle and not at all once allocated).
SHARED_OFFERS_MINOR = 37

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
    if not _DNS_LABEL.match(device.name):
        raise SliceError(f"device name {device.name!r} is not a DNS label")
    if isinstance(device, MigDevice):
        attributes: dict[str, Obj] = {
            "type": _string("mig"),
            "uuid": _string(device.uuid),
            "parentUUID": _string(device.parent.uuid),
            "parentIndex": {"int": device.parent.index},
            "profile": _string(device.profile),
            **_shared_attributes(device.parent, inventory, lists),
        }
        capacity = {
            "memory": binary_quantity(device.memory_bytes),
            **_engine_capacity(device.engines),
            # The memory slices it occupies, as NVIDIA's driver publishes a MIG device's.
            **{
                f"memorySlice{index}": "1"
                for index in range(device.placement_start, device.placement_start + device.placement_size)
                if device.placement_start >= 0
            },
        }
    else:
        attributes = {
            "type": _string("gpu"),
            "uuid": _string(device.uuid),
            "index": {"int": device.index},
            "minor": {"int": device.minor},
            **_shared_attributes(device, inventory, lists),
        }
        capacity = {"memory": binary_quantity(device.memory_bytes)}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise SliceError(f"device {device.name} has more than {MAX_ATTRIBUTES_AND_CAPACITIES} attributes")
    entry: Obj = {
        "name": device.name,
        "attributes": dict(sorted(attributes.items())),
        "capacity": {key: {"value": value} for key, value in sorted(capacity.items())},
    }
    if shareable:
        _share(entry, device.memory_bytes, share_mode)
    return entry


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


def _counter_values(counters: Mapping[str, int]) -> Obj:
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

    A shareable offer's MIG device is made once and shared by the claims given it, as `share_mode`
    divides it; it consumes its GPU's counters once, however many claims hold it.
    """
    if not _DNS_LABEL.match(partition.name):
        raise SliceError(f"device name {partition.name!r} is not a DNS label")
    gpu = partition.parent
    attributes: dict[str, Obj] = {
        "type": _string("mig"),
        "parentUUID": _string(gpu.uuid),
        "parentIndex": {"int": gpu.index},
        "profile": _string(partition.profile),
        "placementStart": {"int": partition.placement_start},
        "placementSize": {"int": partition.placement_size},
        **_shared_attributes(gpu, inventory, lists),
    }
    capacity = {"memory": binary_quantity(partition.memory_bytes), **_engine_capacity(partition.engines)}
    entry: Obj = {
        "name": partition.name,
        "attributes": dict(sorted(attributes.items())),
        "capacity": {key: {"value": value} for key, value in sorted(capacity.items())},
        "consumesCounters": [
            {"counterSet": counter_set_name(gpu), "counters": _counter_values(partition_counters(partition))}
        ],
    }
    if shareable:
        _share(entry, partition.memory_bytes, share_mode)
    return entry


@dataclass(frozen=True)
class _Group:
    """One GPU with a counter set (dynamic MIG, passthrough twin): the set and the devices that consume it."""

    counter_set: Obj
    devices: list[Obj]


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


def _consumes(entry: Obj, gpu: Gpu, counters: Mapping[str, int]) -> Obj:
    entry["consumesCounters"] = [{"counterSet": counter_set_name(gpu), "counters": _counter_values(counters)}]
    return entry


def _gpu_groups(
    inventory: Inventory,
    shared: Collection[str] = (),
    share_mode: ShareMode = "memory",
    lists: bool = False,
    vfio: bool = False,
    order: DeviceOrder = "packing",
) -> list[_Group]:
    """A counter set per GPU whose devices exclude each other: dynamic-MIG GPUs, and with `vfio` every twin's.

    The whole GPU and its twin consume all of it, so the scheduler gives a GPU to one of them at a time.
    In `packing` order the GPU's offers come first, smallest first (`_offer_first`), then the GPU whole.
    """
    twins = {g.name for g in inventory.vfio_twins} if vfio else set()
    groups = []
    for gpu in inventory.gpus:
        offers = [p for p in inventory.partitions if p.parent == gpu]
        if not offers and gpu.name not in twins:
            continue
        if order == "packing":
            memory_slices = max((p.placement_start + p.placement_size for p in offers), default=0)
            offers.sort(key=lambda p: _offer_first(p, memory_slices))
        counters = gpu_counters(gpu, offers) if offers else {MEMORY_COUNTER: gpu.memory_bytes}
        if len(counters) > MAX_COUNTERS_PER_SET:
            raise SliceError(f"{gpu.name} needs {len(counters)} counters, more than {MAX_COUNTERS_PER_SET}")
        # Not offered whole while its MIG mode waits for a reset to turn off (dra.gpu.discovery);
        # shared whole only where the scheduler charges a shared device's counters once.
        wholes = (
            [device_entry(gpu, inventory, gpu.name in shared and not offers, share_mode, lists=lists)]
            if inventory.get(gpu.name) is not None
            else []
        )
        if gpu.name in twins:
            wholes.append(vfio_twin_entry(gpu, lists))
        groups.append(
            _Group(
                {"name": counter_set_name(gpu), "counters": _counter_values(counters)},
                _ordered(
                    [_consumes(w, gpu, counters) for w in wholes],
                    [
                        partition_entry(p, inventory, p.name in shared, share_mode, lists=lists)
                        for p in offers
                    ],
                    order,
                ),
            )
        )
    return groups


def _ordered(wholes: list[Obj], offers: list[Obj], order: DeviceOrder) -> list[Obj]:
    # A request that both would satisfy gets a partition, not the GPU it is cut from.
    return [*offers, *wholes] if order == "packing" else [*wholes, *offers]


def _shared_counters(counter_sets: Iterable[Obj]) -> int:
    return sum(len(c["counters"]) for c in counter_sets)


def _device_counters(devices: Iterable[Obj]) -> int:
    return sum(len(c["counters"]) for d in devices for c in d["consumesCounters"])


def _pack(groups: list[_Group]) -> list[tuple[list[Obj], list[Obj]]]:
    """1.34: each GPU's counter set in the slice of the devices consuming it, within the slice limits."""
    packed: list[tuple[list[Obj], list[Obj]]] = []
    for group in groups:
        if len(group.devices) > MAX_DEVICES_WITH_COUNTERS:
            raise SliceError(
                f"a GPU offers {len(group.devices)} devices, more than {MAX_DEVICES_WITH_COUNTERS}"
            )
        if (
            not packed
            or len(packed[-1][0]) >= MAX_COUNTER_SETS_PER_SLICE
            or len(packed[-1][1]) + len(group.devices) > MAX_DEVICES_WITH_COUNTERS
            or _shared_counters([*packed[-1][0], group.counter_set]) > MAX_SHARED_COUNTERS_PER_SLICE_V134
            or _device_counters([*packed[-1][1], *group.devices]) > MAX_DEVICE_COUNTERS_PER_SLICE_V134
        ):
            packed.append(([], []))
        packed[-1][0].append(group.counter_set)
        packed[-1][1].extend(group.devices)
    return packed


def _chunks(items: list[Obj], size: int) -> list[list[Obj]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def slice_name(node_name: str, driver: str, index: int) -> str:
    """A stable, valid object name for the index-th slice of this node and driver."""
    name = f"{node_name}-{driver}-{index}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{node_name}/{driver}".encode()).hexdigest()[:10]
    # Cut at a dot, the name would go on with a label starting with "-", which is invalid.
    return f"{node_name[:200].rstrip('.')}-{digest}-{index}"


def build_slices(
    inventory: Inventory,
    driver: str,
    node_name: str,
    node_uid: str | None,
    generation: int,
    features: ApiFeatures | None = None,
    taints: Mapping[str, DeviceTaint] | None = None,
    shareable: Collection[str] = (),
    share_mode: ShareMode = "memory",
    vfio: bool = False,
    order: DeviceOrder = "packing",
) -> list[Obj]:
    """The node's pool as ResourceSlices: at most 128 devices each, one generation, owned by the Node.

    Dynamic-MIG GPUs come with their counter sets where the server accepts them
    (`features.partitionable_devices`), else whole only: beside their devices in
    the same slices on 1.34, in slices of their own from 1.35.
    `taints` (device name to taint) are published only where the server keeps
    them (`features.device_taints`; no features: the oldest supported server's,
    no gated fields); elsewhere the devices go out untainted. `shareable` names
    the devices (full GPUs, MIG devices, dynamic-MIG offers) published for several
    claims at once, where the server keeps consumable capacity
    (`features.consumable_capacity`), divided as `share_mode` says; elsewhere they
    go out exclusive. Offers are shared only from SHARED_OFFERS_MINOR. A GPU as close
    to several NUMA nodes gets them all in `numaNode` where the server keeps lists
    (`features.list_attributes`). With `vfio` (--vfio) each GPU offered whole also gets its
    passthrough twin (`vfio_twin_entry`), sharing a counter set with it, where counters are
    accepted; a GPU with a twin is shared only from SHARED_OFFERS_MINOR, as offers are.
    `order` (DeviceOrder) lists the devices without counters smallest first (`_smallest_first`),
    and each GPU with a counter set as `_gpu_groups` says, the GPUs in index order.
    """
    features = features or ApiFeatures()
    lists = features.list_attributes
    shared = shareable if features.consumable_capacity else ()
    offers = shared if features.minor >= SHARED_OFFERS_MINOR else ()
    groups = (
        _gpu_groups(inventory, offers, share_mode, lists, vfio, order)
        if features.partitionable_devices
        else []
    )
    grouped = {d["name"] for g in groups for d in g.devices}
    ungrouped = [device for device in inventory if device.name not in grouped]
    if order == "packing":
        ungrouped.sort(key=_smallest_first)
    entries = [
        device_entry(device, inventory, device.name in shared, share_mode, lists=lists)
        for device in ungrouped
    ]
    consuming = [d for g in groups for d in g.devices]
    names = [e["name"] for e in (*entries, *consuming)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SliceError(f"device names are not unique: {duplicates}")
    per_slice = MAX_DEVICES_PER_SLICE
    if features.device_taints:
        # The lower limit whether or not a device is tainted right now, so that a GPU turning
        # unhealthy changes one device entry rather than how the pool is cut into slices.
        per_slice = MAX_TAINTED_DEVICES_PER_SLICE
        for entry in (*entries, *consuming):
            if taints and entry["name"] in taints:
                entry["taints"] = [taints[entry["name"]].entry()]
    contents: list[tuple[list[Obj], list[Obj]]] = [([], c) for c in _chunks(entries, per_slice)]
    if features.counters_in_own_slice:
        sets = [g.counter_set for g in groups]
        contents += [(c, []) for c in _chunks(sets, MAX_COUNTER_SETS_PER_SLICE)]
        contents += [([], c) for c in _chunks(consuming, MAX_DEVICES_WITH_COUNTERS)]
    else:
        contents += _pack(groups)
    # An empty pool is still published, so consumers see that the node has no devices.
    contents = contents or [([], [])]
    slices = []
    for index, (counter_sets, devices) in enumerate(contents):
        metadata: Obj = {"name": slice_name(node_name, driver, index)}
        if node_uid:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
            ]
        slices.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": metadata,
                "spec": {
                    "driver": driver,
                    "nodeName": node_name,
                    "pool": {
                        "name": node_name,
                        "generation": generation,
                        "resourceSliceCount": len(contents),
                    },
                    **({"sharedCounters": counter_sets} if counter_sets else {}),
                    **({"devices": devices} if devices or not counter_sets else {}),
                },
            }
        )
    return slices
