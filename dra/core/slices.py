"""From the inventory to resource.k8s.io/v1 ResourceSlices. Pure.

`build_slices` orders the node's devices (the scheduler takes the first that fits, so the order is
its choice among fitting devices: DeviceOrder) and splits the pool over slices within the API
limits, with each dynamic-MIG GPU's counter set laid out as the server's release wants it
(docs/mig.md). Each device's entry is dra.core.deviceentries'; converging on the server's slices
is dra.core.sliceplan's.

Rule: the pool's layout only; what a device says of itself is decided in deviceentries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dra.core.deviceentries import (
    MEMORY_COUNTER,
    ShareMode,
    SliceError,
    counter_set_name,
    counter_values,
    device_entry,
    gpu_counters,
    partition_entry,
    vfio_twin_entry,
)
from dra.core.taints import DeviceTaint
from dra.core.versions import ApiFeatures
from dra.model.devices import Device, Gpu, Inventory, MigDevice, MigPartition

Obj = dict[str, Any]

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
#: The lower limit once any device of a slice has taints (or consumes counters).
MAX_TAINTED_DEVICES_PER_SLICE = 64
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
#: How the devices of a pool are ordered in its slices. The scheduler gives each request the first
#: device in slice order that satisfies it (docs/mig.md, "Publishing order"), so this order is its
#: choice among fitting devices. `packing` (the default, chosen by tests/bench/bench_packing.py): the
#: smallest device first, a dynamic-MIG GPU whole and then its offers smallest first; `discovery`: as
#: discovery lists them (the GPU whole, then the largest profile first), the order of earlier
#: releases, kept so that the benchmark measures it beside the default.
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


#: The first release known to charge a shared device's counters once, whoever holds it (1.37.2:
#: `skipCounterCheck` and `IsDeviceAllocated` in k8s.io/dynamic-resource-allocation's allocator;
#: 1.34.12 charges them at each allocation in a scheduling cycle and not at all once allocated).
SHARED_OFFERS_MINOR = 37


@dataclass(frozen=True)
class _Group:
    """One GPU with a counter set (dynamic MIG, passthrough twin): the set and the devices that consume it."""

    counter_set: Obj
    #: The GPU whole and its passthrough twin, where offered.
    wholes: list[Obj]
    offers: list[Obj]

    @property
    def devices(self) -> list[Obj]:
        return [*self.wholes, *self.offers]


def _consumes(entry: Obj, gpu: Gpu, counters: Mapping[str, int]) -> Obj:
    entry["consumesCounters"] = [{"counterSet": counter_set_name(gpu), "counters": counter_values(counters)}]
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
    The offers in `packing` order smallest first (`_offer_first`), in `discovery` order largest first.
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
                {"name": counter_set_name(gpu), "counters": counter_values(counters)},
                [_consumes(w, gpu, counters) for w in wholes],
                [partition_entry(p, inventory, p.name in shared, share_mode, lists=lists) for p in offers],
            )
        )
    return groups


def _shared_counters(counter_sets: Iterable[Obj]) -> int:
    return sum(len(c["counters"]) for c in counter_sets)


def _device_counters(devices: Iterable[Obj]) -> int:
    return sum(len(c["counters"]) for d in devices for c in d["consumesCounters"])


def _fits(groups: list[_Group], counters_beside: bool) -> bool:
    """Whether these GPUs' devices fit one slice (and, on 1.34, their counter sets beside them)."""
    devices = [d for g in groups for d in g.devices]
    if len(devices) > MAX_DEVICES_WITH_COUNTERS:
        return False
    sets = [g.counter_set for g in groups]
    return not counters_beside or (
        len(sets) <= MAX_COUNTER_SETS_PER_SLICE
        and _shared_counters(sets) <= MAX_SHARED_COUNTERS_PER_SLICE_V134
        and _device_counters(devices) <= MAX_DEVICE_COUNTERS_PER_SLICE_V134
    )


def _pack(groups: list[_Group], counters_beside: bool) -> list[list[_Group]]:
    """GPUs with counter sets, as many to a slice as fit, a GPU's devices never split over two slices.

    `counters_beside` (1.34): each GPU's counter set goes in the slice of the devices consuming it,
    within that release's limits on a slice's counters.
    """
    packed: list[list[_Group]] = []
    for group in groups:
        if len(group.devices) > MAX_DEVICES_WITH_COUNTERS:
            raise SliceError(
                f"a GPU offers {len(group.devices)} devices, more than {MAX_DEVICES_WITH_COUNTERS}"
            )
        if not packed or not _fits([*packed[-1], group], counters_beside):
            packed.append([])
        packed[-1].append(group)
    return packed


def _slice_devices(groups: list[_Group]) -> list[Obj]:
    """The devices of one slice: every GPU whole first, then each GPU's offers, GPU by GPU.

    The scheduler walks a node's slices in no set order and each slice's devices in order,
    evaluating the request's selectors on each until one fits (docs/mig.md, "What dynamic MIG costs
    the scheduler"). No MIG request can have a GPU whole, nor a whole-GPU request an offer (each class
    selects one type), so this is the order of each kind as before, and a whole-GPU request finds
    a free GPU of the slice without a selector evaluated on the offers of its busy neighbours.
    """
    return [*(w for g in groups for w in g.wholes), *(o for g in groups for o in g.offers)]


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
        contents += [([], _slice_devices(p)) for p in _pack(groups, counters_beside=False)]
    else:
        contents += [
            ([g.counter_set for g in p], _slice_devices(p)) for p in _pack(groups, counters_beside=True)
        ]
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
