"""Static MIG layouts in NVIDIA mig-parted's config format: parsing, GPU selection, placement. Pure.

The format is mig-parted's v1 spec, so one file serves this driver and NVIDIA's tools; stricter
where this driver needs it (unknown keys, overlapping entries, compute-instance profiles).
`place` is deterministic: largest profiles first, each at the lowest start that leaves room for
the rest. The format, the differences and the placement rule: docs/mig.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dra.model.quoting import quote

VERSION = "v1"
#: The node label that names the layout, as NVIDIA's MIG manager reads it.
LAYOUT_LABEL = "nvidia.com/mig.config"
#: The node label that says how applying it went, with the MIG manager's values, so that
#: automation written for the GPU Operator (wait for "success") works unchanged.
STATE_LABEL = "nvidia.com/mig.config.state"
#: Being applied, or applied only in part until a GPU reset or a claim's end (an Event says which).
STATE_PENDING = "pending"
STATE_SUCCESS = "success"
#: The layout cannot be applied; nothing of the attempt is left and the driver exits with status 2.
STATE_FAILED = "failed"

_TOP_KEYS = ("version", "mig-configs")
_ENTRY_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
_PROFILE = re.compile(r"^(?:(\d+)c\.)?\d+g\.\d+gb(?:\+[a-z]+)*$")
_DEVICE_ID = re.compile(r"^0[xX][0-9a-fA-F]{1,8}$")
#: Far more than a node has GPUs or models: bounds the work a file can ask for.
MAX_ENTRIES = 1024
MAX_GPU_INDEX = 1023
MAX_DEVICE_FILTERS = 64


class MigConfigError(ValueError):
    """The layout file or a layout is invalid, or cannot be applied; the message names the path."""


@dataclass(frozen=True)
class LayoutEntry:
    """One entry of a layout: which GPUs, MIG on or off, and the MIG devices each gets."""

    #: Where the entry is in the file, for messages: mig-configs.<name>[<i>].
    where: str
    #: GPU indexes; None: all.
    devices: tuple[int, ...] | None
    #: PCI device IDs as NVML gives them (nvmlPciInfo_t.pciDeviceId: device ID in the upper 16 bits,
    #: NVIDIA's vendor ID 0x10DE in the lower, 0x233010DE for an H100 SXM5); empty: any.
    device_filter: tuple[int, ...]
    mig_enabled: bool
    #: (profile, count), in the file's order.
    mig_devices: tuple[tuple[str, int], ...] = ()

    def selects(self, index: int, device_id: int) -> bool:
        """Whether this entry is for the GPU of this index and PCI device ID."""
        return (self.devices is None or index in self.devices) and (
            not self.device_filter or device_id in self.device_filter
        )


@dataclass(frozen=True)
class MigConfigs:
    """A parsed layout file: layout name -> its entries."""

    source: str
    layouts: Mapping[str, tuple[LayoutEntry, ...]]

    def layout(self, name: str) -> tuple[LayoutEntry, ...]:
        """The entries of a layout; MigConfigError listing the file's layouts when there is none."""
        found = self.layouts.get(name)
        if found is None:
            known = ", ".join(sorted(self.layouts))
            raise MigConfigError(
                f"{self.source}: no MIG layout named {quote(name)} under mig-configs; it has {known}"
            )
        return found


def parse_mig_configs(data: object, source: str) -> MigConfigs:
    """Validate a loaded layout file (YAML already parsed); MigConfigError naming the path of the fault."""
    if not isinstance(data, dict):
        raise MigConfigError(f"{source}: expected a mapping with `version: v1` and `mig-configs`")
    _no_unknown(data, _TOP_KEYS, source)
    if data.get("version") != VERSION:
        raise MigConfigError(f"{source}: version: expected {VERSION!r}, got {quote(data.get('version'))}")
    configs = data.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise MigConfigError(
            f"{source}: mig-configs: expected a mapping of at least one layout name to entries"
        )
    layouts: dict[str, tuple[LayoutEntry, ...]] = {}
    for name, entries in configs.items():
        if not isinstance(name, str):
            # The nvidia.com/mig.config label names a layout, and a label value is a string.
            raise MigConfigError(
                f"{source}: mig-configs: a layout's name is a string, got {quote(name)} (quote it)"
            )
        where = f"{source}: mig-configs.{name}"
        if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_ENTRIES:
            raise MigConfigError(f"{where}: expected a list of 1 to {MAX_ENTRIES} entries")
        parsed = tuple(_entry(entry, f"{where}[{i}]") for i, entry in enumerate(entries))
        overlap = _first_overlap(parsed)
        if overlap is not None:
            first, second = overlap
            raise MigConfigError(
                f"{second.where}: selects GPUs that {first.where} selects too; "
                "give each GPU one entry (disjoint devices or device-filter)"
            )
        layouts[name] = parsed
    return MigConfigs(source, layouts)


def _first_overlap(entries: Sequence[LayoutEntry]) -> tuple[LayoutEntry, LayoutEntry] | None:
    """Two entries (in file order) that could select the same GPU, if any.

    Linear in the (GPU index, device ID) pairs the entries name, not in pairs of entries:
    entries for every index (`devices: all`) are met by each index through one lookup.
    """
    order = {id(e): i for i, e in enumerate(entries)}

    def pair(a: LayoutEntry, b: LayoutEntry) -> tuple[LayoutEntry, LayoutEntry]:
        return (a, b) if order[id(a)] < order[id(b)] else (b, a)

    def meet(
        group: Sequence[LayoutEntry], seen: dict[int | None, LayoutEntry]
    ) -> tuple[LayoutEntry, LayoutEntry] | None:
        # `seen`: device ID (None: any) -> an entry already selecting it at this index.
        for entry in group:
            if entry.device_filter:
                other = seen.get(None) or next((seen[i] for i in entry.device_filter if i in seen), None)
            else:
                other = next(iter(seen.values()), None)
            if other is not None:
                return pair(other, entry)
            for device_id in entry.device_filter or (None,):
                seen[device_id] = entry
        return None

    everywhere = [e for e in entries if e.devices is None]
    all_seen: dict[int | None, LayoutEntry] = {}
    found = meet(everywhere, all_seen)
    if found is not None:
        return found
    by_index: dict[int, list[LayoutEntry]] = {}
    for entry in entries:
        for index in entry.devices or ():
            by_index.setdefault(index, []).append(entry)
    for group in by_index.values():
        found = meet(group, dict(all_seen))
        if found is not None:
            return found
    return None


def _no_unknown(data: Mapping[object, object], allowed: Sequence[str], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise MigConfigError(f"{where}: unknown key {', '.join(unknown)}; allowed: {', '.join(allowed)}")


def _entry(data: object, where: str) -> LayoutEntry:
    if not isinstance(data, dict):
        raise MigConfigError(f"{where}: expected a mapping with devices, mig-enabled and mig-devices")
    _no_unknown(data, _ENTRY_KEYS, where)
    for required in ("devices", "mig-enabled"):
        if required not in data:
            raise MigConfigError(f"{where}: missing required key {required}")
    enabled = data["mig-enabled"]
    if not isinstance(enabled, bool):
        raise MigConfigError(f"{where}.mig-enabled: expected true or false, got {quote(enabled)}")
    if enabled and "mig-devices" not in data:
        raise MigConfigError(f"{where}: mig-devices is required when mig-enabled is true ({{}} for none)")
    mig_devices = _mig_devices(data.get("mig-devices") or {}, f"{where}.mig-devices")
    if not enabled and mig_devices:
        raise MigConfigError(f"{where}.mig-devices: must be empty when mig-enabled is false")
    return LayoutEntry(
        where,
        _devices(data["devices"], f"{where}.devices"),
        _device_filter(data.get("device-filter"), f"{where}.device-filter"),
        enabled,
        mig_devices,
    )


def _devices(value: object, where: str) -> tuple[int, ...] | None:
    if value == "all":
        return None
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= MAX_GPU_INDEX for i in value)
    ):
        raise MigConfigError(
            f"{where}: expected `all` or a non-empty list of GPU indexes 0-{MAX_GPU_INDEX}, "
            f"got {quote(value)}"
        )
    if len(set(value)) != len(value):
        raise MigConfigError(f"{where}: GPU indexes listed twice in {quote(value)}")
    return tuple(value)


def _device_filter(value: object, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_DEVICE_FILTERS:
        raise MigConfigError(
            f"{where}: expected a PCI device ID such as 0x233010DE, or a list of 1 to {MAX_DEVICE_FILTERS}"
        )
    ids = []
    for item in items:
        if not isinstance(item, str) or not _DEVICE_ID.match(item):
            raise MigConfigError(
                f"{where}: {quote(item)} is not a PCI device ID; write it as mig-parted does, "
                "device and vendor in hex, e.g. 0x233010DE"
            )
        ids.append(int(item, 16))
    return tuple(ids)


def _mig_devices(value: object, where: str) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict):
        raise MigConfigError(f"{where}: expected a mapping of MIG profile to count, e.g. {{1g.10gb: 7}}")
    found = []
    for profile, count in value.items():
        name = str(profile)
        match = _PROFILE.match(name)
        if match is None:
            raise MigConfigError(
                f"{where}: {quote(name)} is not a MIG profile name such as 1g.10gb or 1g.10gb+me"
            )
        if match.group(1) is not None:
            raise MigConfigError(
                f"{where}: {quote(name)} is a compute-instance profile; this driver makes one compute "
                "instance spanning each GPU instance, so name the GPU-instance profile only"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise MigConfigError(f"{where}.{name}: expected a count >= 0, got {quote(count)}")
        if count:
            found.append((name, count))
    return tuple(found)


def select_gpus(entries: Sequence[LayoutEntry], gpus: Sequence[tuple[int, int]]) -> dict[int, LayoutEntry]:
    """GPU index -> its entry, from (index, PCI device ID) of every GPU; GPUs no entry selects are left out.

    MigConfigError for an entry that names a GPU index the node does not have.
    """
    indexes = {index for index, _ in gpus}
    for entry in entries:
        missing = sorted(set(entry.devices or ()) - indexes)
        if missing:
            raise MigConfigError(
                f"{entry.where}.devices: no GPU {', '.join(map(str, missing))} on this node "
                f"(it has {len(gpus)} GPUs)"
            )
    chosen: dict[int, LayoutEntry] = {}
    for index, device_id in gpus:
        first = next((e for e in entries if e.selects(index, device_id)), None)
        if first is not None:
            chosen[index] = first
    return chosen


class ProfileShape(Protocol):
    """What placement needs of a GPU-instance profile (dra.gpu.migtables.GpuInstanceProfile has it)."""

    @property
    def name(self) -> str:
        """nvidia-smi's name, 1g.10gb."""

    @property
    def slices(self) -> int:
        """Compute slices."""

    @property
    def memory_slices(self) -> int:
        """Memory slices of each placement."""

    @property
    def starts(self) -> tuple[int, ...]:
        """Start memory slice of each possible placement."""

    @property
    def instance_count(self) -> int:
        """How many instances of it one GPU can hold."""


@dataclass(frozen=True, order=True)
class Slot:
    """A GPU instance of a profile at a placement start."""

    profile: str
    start: int


def place(
    table: Sequence[ProfileShape],
    wanted: Sequence[tuple[str, int]],
    kept: Sequence[Slot],
    gpu: str,
    where: str,
    compute_slices: int = 7,
) -> list[Slot]:
    """Where to make what `wanted` asks beyond the `kept` instances; MigConfigError naming GPU and profile.

    `gpu` names the GPU for messages ("GPU 2 (NVIDIA H100 80GB HBM3)"), `where`
    the entry. Checks the profiles exist on the model, the per-profile
    instance limits, the compute slices and that the memory placements fit.
    """
    by_name = {p.name: p for p in table}
    for name, count in wanted:
        profile = by_name.get(name)
        if profile is None:
            known = ", ".join(p.name for p in table) or "none: it has no MIG"
            raise MigConfigError(
                f"{where}.mig-devices: {gpu} has no MIG profile {name}; its profiles: {known}"
            )
        if count > profile.instance_count:
            raise MigConfigError(
                f"{where}.mig-devices: {gpu} cannot hold {count} {name}: at most {profile.instance_count}"
            )
    have = {name: sum(1 for k in kept if k.profile == name) for name, _ in wanted}
    todo = [by_name[name] for name, count in wanted for _ in range(max(count - have[name], 0))]
    need = sum(by_name[k.profile].slices for k in kept if k.profile in by_name) + sum(p.slices for p in todo)
    if need > compute_slices:
        around = f" beside the instances kept ({_slots(kept)})" if kept else ""
        raise MigConfigError(
            f"{where}.mig-devices: {gpu} cannot hold {_listing(wanted)}{around}: that needs {need} "
            f"compute slices, it has {compute_slices}"
        )
    # Largest first: they have the fewest placements, the small ones fill the gaps.
    todo.sort(key=lambda p: (-p.slices, -p.memory_slices, p.name))
    taken = [(by_name[k.profile].memory_slices if k.profile in by_name else 1, k) for k in kept]
    occupied = [(k.start, size) for size, k in taken]
    found = _search(todo, occupied)
    if found is None:
        around = f" around the instances kept ({_slots(kept)})" if kept else ""
        first = todo[0].name if todo else "?"
        raise MigConfigError(
            f"{where}.mig-devices: {gpu} has no memory placements for {_listing(wanted)}{around}: "
            f"no placement left for {first} and the rest"
        )
    return found


def _search(todo: Sequence[ProfileShape], occupied: list[tuple[int, int]]) -> list[Slot] | None:
    if not todo:
        return []
    profile, rest = todo[0], todo[1:]
    for start in profile.starts:
        if any(s < start + profile.memory_slices and start < s + size for s, size in occupied):
            continue
        tail = _search(rest, [*occupied, (start, profile.memory_slices)])
        if tail is not None:
            return [Slot(profile.name, start), *tail]
    return None


def _listing(wanted: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{count}x {name}" for name, count in wanted)


def _slots(slots: Sequence[Slot]) -> str:
    return ", ".join(f"{s.profile} at {s.start}" for s in sorted(slots))
