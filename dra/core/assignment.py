"""Which GPUs each path advertises: DRA (ResourceSlices) or the device plugin (nvidia.com/gpu). Pure.

Selectors (``all | none | <index>,GPU-<uuid>,MIG-<uuid>,model=<product name>``, the same for
--dra-gpus and --device-plugin-gpus) are parsed, matched against the inventory, and the GPUs
split: a MIG device follows its GPU, and a GPU given to both paths is refused by name. A GPU
also stays with DRA while a prepared claim holds it (`held_gpus`). The defaults and the rest:
docs/device-plugin.md ("One inventory, two paths").
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from dra.model.devices import MAX_GPUS, Device, Gpu, Inventory, MigDevice, gpu_index, gpu_of
from dra.model.prepared import PreparedClaim, PreparedDevice
from dra.model.quoting import quote

#: GPU-<uuid>, MIG-<uuid>, and the older MIG-GPU-<uuid>/<gi>/<ci> form.
_UUID = re.compile(
    r"(GPU|MIG)-([0-9a-f]{8}-[0-9a-f-]+|GPU-[0-9a-f]{8}-[0-9a-f-]+/[0-9]+/[0-9]+)", re.IGNORECASE
)
_DEVICE_NAME = re.compile(r"^gpu-\d+")


class SelectorError(ValueError):
    """A selector does not parse; the message says what is wrong."""


class AssignmentError(ValueError):
    """The selectors give one GPU to both paths; the message names it."""


class GpuPath(enum.Enum):
    """The two ways a GPU can reach pods."""

    DRA = "dra"
    DEVICE_PLUGIN = "device-plugin"

    @property
    def title(self) -> str:
        """How messages name the path."""
        return "the DRA kubelet-plugin" if self is GpuPath.DRA else "the device plugin"

    @property
    def command(self) -> str:
        """The command that serves this path."""
        return "dra-gpu kubelet-plugin" if self is GpuPath.DRA else "dra-gpu device-plugin"

    @property
    def flag(self) -> str:
        """The flag that selects this path's GPUs."""
        return "--dra-gpus" if self is GpuPath.DRA else "--device-plugin-gpus"

    @property
    def other(self) -> GpuPath:
        """The other path."""
        return GpuPath.DEVICE_PLUGIN if self is GpuPath.DRA else GpuPath.DRA


@dataclass(frozen=True)
class Selector:
    """A parsed GPU selector."""

    text: str
    everything: bool = False
    indexes: frozenset[int] = frozenset()
    uuids: frozenset[str] = frozenset()  # lower case
    models: frozenset[str] = frozenset()  # case-folded product names

    def __str__(self) -> str:
        return self.text


def parse_selector(text: str) -> Selector:
    """`all`, `none`, or comma-separated indexes, GPU-/MIG- UUIDs and model=<product name>."""
    stripped = text.strip()
    if stripped.lower() == "all":
        return Selector(text=stripped, everything=True)
    if stripped.lower() == "none":
        return Selector(text=stripped)
    if not stripped:
        raise SelectorError(
            "empty GPU selector: use all, none, or a list such as 0,2,GPU-<uuid>,model=<name>"
        )
    indexes: set[int] = set()
    uuids: set[str] = set()
    models: set[str] = set()
    for raw in stripped.split(","):
        item = raw.strip()
        index = gpu_index(item)
        if index is not None:
            indexes.add(index)
        elif _UUID.fullmatch(item):
            uuids.add(item.lower())
        elif item.lower().startswith("model=") and item[6:].strip():
            models.add(item[6:].strip().casefold())
        elif item.lower() in ("all", "none"):
            raise SelectorError(f"{quote(item)} cannot be combined with other items in {quote(stripped)}")
        else:
            hint = " (device names are not selectors: use the GPU index)" if _DEVICE_NAME.match(item) else ""
            raise SelectorError(
                f"{quote(item)} in {quote(stripped)} is not a GPU index (0 to {MAX_GPUS - 1}), a GPU-/MIG- "
                f"UUID or model=<product name>{hint}"
            )
    return Selector(
        text=stripped, indexes=frozenset(indexes), uuids=frozenset(uuids), models=frozenset(models)
    )


ALL = Selector(text="all", everything=True)
NONE = Selector(text="none")


def _mig_parents(inventory: Inventory) -> dict[str, str]:
    return {d.uuid.lower(): d.parent.uuid for d in inventory if isinstance(d, MigDevice)}


def select(selector: Selector, inventory: Inventory) -> tuple[list[Gpu], list[str]]:
    """The GPUs a selector picks, in index order, and its items that match no GPU of this node."""
    if selector.everything:
        return list(inventory.gpus), []
    parents = _mig_parents(inventory)
    chosen: set[str] = set()
    unmatched: list[str] = []
    by_index = {gpu.index: gpu for gpu in inventory.gpus}
    by_uuid = {gpu.uuid.lower(): gpu for gpu in inventory.gpus}
    for index in sorted(selector.indexes):
        if index in by_index:
            chosen.add(by_index[index].uuid)
        else:
            unmatched.append(str(index))
    for uuid in sorted(selector.uuids):
        if uuid in by_uuid:
            chosen.add(by_uuid[uuid].uuid)
        elif uuid in parents:
            chosen.add(parents[uuid])
        else:
            unmatched.append(uuid)
    for model in sorted(selector.models):
        matching = [gpu.uuid for gpu in inventory.gpus if gpu.product_name.casefold() == model]
        if matching:
            chosen.update(matching)
        else:
            unmatched.append(f"model={model}")
    return [gpu for gpu in inventory.gpus if gpu.uuid in chosen], unmatched


def describe(gpu: Gpu) -> str:
    """How messages name a GPU: index, UUID and model."""
    return f"GPU {gpu.index} ({gpu.uuid}, {gpu.product_name})"


@dataclass(frozen=True)
class Assignment:
    """The node's GPUs split between the paths."""

    dra: tuple[Gpu, ...]
    device_plugin: tuple[Gpu, ...]
    unassigned: tuple[Gpu, ...] = ()
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def gpus(self, path: GpuPath) -> tuple[Gpu, ...]:
        """The GPUs one path advertises."""
        return self.dra if path is GpuPath.DRA else self.device_plugin


def _text(selector: Selector | None) -> str:
    return selector.text if selector is not None else ""


def assign(
    inventory: Inventory,
    dra: Selector | None,
    device_plugin: Selector | None,
    running: GpuPath,
) -> Assignment:
    """Split the node's GPUs; AssignmentError when a GPU would be advertised by both paths.

    `None` is a selector that was not given: it takes whatever the other one
    leaves, and when both are missing the running command's path takes all.
    """
    if dra is None and device_plugin is None:
        dra, device_plugin = (ALL, NONE) if running is GpuPath.DRA else (NONE, ALL)
    warnings: list[str] = []
    chosen: dict[GpuPath, set[str]] = {}
    for path, selector in ((GpuPath.DRA, dra), (GpuPath.DEVICE_PLUGIN, device_plugin)):
        if selector is None:
            continue
        gpus, unmatched = select(selector, inventory)
        chosen[path] = {gpu.uuid for gpu in gpus}
        if unmatched:
            warnings.append(
                f"{path.flag}={selector.text}: no GPU of this node matches {', '.join(unmatched)}"
            )
    if GpuPath.DRA not in chosen:
        chosen[GpuPath.DRA] = {gpu.uuid for gpu in inventory.gpus} - chosen[GpuPath.DEVICE_PLUGIN]
    if GpuPath.DEVICE_PLUGIN not in chosen:
        chosen[GpuPath.DEVICE_PLUGIN] = {gpu.uuid for gpu in inventory.gpus} - chosen[GpuPath.DRA]
    both = [gpu for gpu in inventory.gpus if gpu.uuid in chosen[GpuPath.DRA] & chosen[GpuPath.DEVICE_PLUGIN]]
    if both:
        # Only two given selectors can overlap: a missing one takes the rest.
        raise AssignmentError(
            f"{describe(both[0])} is selected by both --dra-gpus={_text(dra)} and "
            f"--device-plugin-gpus={_text(device_plugin)}: a GPU can be advertised by one path only"
            + (f" ({len(both) - 1} more GPU(s) overlap)" if len(both) > 1 else "")
        )
    unassigned = tuple(
        gpu
        for gpu in inventory.gpus
        if gpu.uuid not in chosen[GpuPath.DRA] and gpu.uuid not in chosen[GpuPath.DEVICE_PLUGIN]
    )
    for gpu in unassigned:
        warnings.append(f"{describe(gpu)} is selected by neither --dra-gpus nor --device-plugin-gpus")
    return Assignment(
        dra=tuple(g for g in inventory.gpus if g.uuid in chosen[GpuPath.DRA]),
        device_plugin=tuple(g for g in inventory.gpus if g.uuid in chosen[GpuPath.DEVICE_PLUGIN]),
        unassigned=unassigned,
        warnings=tuple(warnings),
    )


def restrict(inventory: Inventory, gpus: Iterable[Gpu]) -> Inventory:
    """The part of the inventory on these GPUs: the GPUs themselves, their MIG devices and offers."""
    keep = {gpu.uuid for gpu in gpus}
    # replace(): the node-wide facts (control nodes, driver files, ...) stay whole.
    return replace(
        inventory,
        devices=tuple(d for d in inventory if gpu_of(d).uuid in keep),
        gpus=tuple(g for g in inventory.gpus if g.uuid in keep),
        partitions=tuple(p for p in inventory.partitions if p.parent.uuid in keep),
        instances=tuple(m for m in inventory.instances if m.parent.uuid in keep),
    )


@dataclass(frozen=True)
class RecordedGpu:
    """A GPU as another process recorded it in the host's assignment record."""

    uuid: str
    index: int
    product_name: str


def conflict(
    path: GpuPath,
    mine: Sequence[Gpu],
    theirs: Sequence[RecordedGpu],
    where: str = "",
) -> str | None:
    """The refusal message when the other, running path already advertises one of my GPUs; else None."""
    taken = {g.uuid: g for g in theirs}
    overlap = [gpu for gpu in mine if gpu.uuid in taken]
    if not overlap:
        return None
    more = f" ({len(overlap) - 1} more GPU(s) overlap)" if len(overlap) > 1 else ""
    return (
        f"{describe(overlap[0])} is already advertised by {path.other.title} on this node{more}"
        f"{where}: give both commands the same --dra-gpus / --device-plugin-gpus so that "
        "each GPU goes to one path"
    )


def recorded(gpus: Sequence[Gpu]) -> list[dict[str, object]]:
    """The record entries for GPUs (what `conflict` reads back)."""
    return [{"uuid": g.uuid, "index": g.index, "productName": g.product_name} for g in gpus]


def parse_recorded(entries: object) -> list[RecordedGpu]:
    """Record entries back to RecordedGpu; ValueError when they are not what `recorded` writes."""
    if not isinstance(entries, list):
        raise ValueError("expected a list of GPUs")
    result = []
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("uuid"), str):
            raise ValueError(f"bad GPU entry {entry!r}")
        result.append(
            RecordedGpu(
                uuid=str(entry["uuid"]),
                index=int(entry.get("index", -1)),
                product_name=str(entry.get("productName", "")),
            )
        )
    return result


@dataclass(frozen=True)
class HeldGpu:
    """A GPU that a prepared DRA claim uses, through one of the claim's devices (the GPU or a MIG device)."""

    gpu: Gpu
    device: str
    claim: PreparedClaim


def _prepared_device(entry: PreparedDevice, inventory: Inventory) -> Device | None:
    # By UUID where the checkpoint recorded one: names follow NVML indexes, which can shift.
    # Older entries have only the name. A GPU switched into MIG mode is no device, but still a GPU.
    if entry.uuid:
        return inventory.by_uuid(entry.uuid) or next(
            (g for g in inventory.gpus if g.uuid == entry.uuid), None
        )
    return inventory.get(entry.device) or next((g for g in inventory.gpus if g.name == entry.device), None)


def held_gpus(
    claims: Iterable[PreparedClaim], inventory: Inventory, admin_access: bool = False
) -> list[HeldGpu]:
    """The GPUs of `inventory` that prepared claims use, in GPU index order, then claim order.

    A MIG device holds its parent GPU. Devices prepared with admin access are
    looked at only when `admin_access` is set (and then only they): admin access
    shares a device with whoever has it, and never keeps it from being allocated.
    """
    held: list[HeldGpu] = []
    for claim in claims:
        for entry in claim.devices:
            if entry.admin_access != admin_access:
                continue
            device = _prepared_device(entry, inventory)
            if device is not None:
                held.append(HeldGpu(gpu_of(device), entry.device, claim))
    order = {gpu.uuid: n for n, gpu in enumerate(inventory.gpus)}
    return sorted(held, key=lambda h: order[h.gpu.uuid])


def _claim_name(claim: PreparedClaim) -> str:
    return f"ResourceClaim {claim.namespace}/{claim.name} (UID {claim.uid})"


def held_refusal(held: Sequence[HeldGpu], where: str = "") -> str | None:
    """The device plugin's refusal when prepared DRA claims still use GPUs it would advertise; else None."""
    if not held:
        return None
    first = held[0]
    others = len({h.gpu.uuid for h in held}) - 1
    more = f" ({others} more GPU(s) in use by prepared claims)" if others else ""
    via = "" if first.device == first.gpu.name else f" through {first.device}"
    return (
        f"{describe(first.gpu)} is still used by {_claim_name(first.claim)}{via}, prepared for DRA on "
        f"this node{more}{where}: wait until the pods using it end, or drain the node; the device "
        "plugin starts once the kubelet has unprepared the claim"
    )


def stranded_claims(held: Sequence[HeldGpu]) -> list[str]:
    """One warning per prepared claim whose devices are on GPUs DRA no longer has (`held` on those GPUs)."""
    by_claim: dict[str, list[HeldGpu]] = {}
    for h in held:
        by_claim.setdefault(h.claim.uid, []).append(h)
    return [
        f"prepared {_claim_name(entries[0].claim)} uses "
        + ", ".join(f"{h.device} on {describe(h.gpu)}" for h in entries)
        + ", no longer assigned to DRA: the claim stays prepared until its pods end, and the device "
        "plugin refuses to start with the GPU until then"
        for entries in by_claim.values()
    ]


def gpus_behind(devices: Iterable[tuple[str, str]], inventory: Inventory) -> list[Gpu]:
    """The GPUs of the inventory that device-plugin devices, as (resource name, device ID), name.

    An ID is a GPU or MIG UUID, optionally with a time-slicing replica suffix
    (`GPU-...::3`, NVIDIA's form and this project's), or, for a resource in the
    nvidia.com domain only, a GPU index under NVIDIA's `index` ID strategy (`3`,
    or `3:1` for a MIG device of GPU 3). A MIG device names its parent: MIG
    devices go with their GPU. Other IDs (another vendor's plugin) name nothing.
    Resolved as a selector of those indexes and UUIDs would be (`select`).
    """
    indexes: set[int] = set()
    uuids: set[str] = set()
    for resource, raw in devices:
        device_id = raw.split("::", 1)[0]
        index = device_id.split(":", 1)[0]
        if index.isdigit():
            if resource.startswith("nvidia.com/"):
                indexes.add(int(index))
        else:
            uuids.add(device_id.lower())
    chosen, _unmatched = select(
        Selector(text="", indexes=frozenset(indexes), uuids=frozenset(uuids)), inventory
    )
    return chosen
