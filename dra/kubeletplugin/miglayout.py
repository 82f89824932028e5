"""Static MIG layouts (NVIDIA mig-parted's format) applied to the GPUs: the GPU side.

Parsed by dra.core.migconfig; which layout, and when, is dra.kubeletplugin.miglabel's. Per GPU,
three phases: MIG mode on, a plan made without touching anything (kept, never-destroyed and new
instances), then destroy and create; a failure undoes the attempt. Every phase reads the GPU as
it is, so a start after a kill at any point converges. The phases and the states: docs/mig.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from dra import documents
from dra.adapters import faults
from dra.core.migconfig import (
    LayoutEntry,
    MigConfigError,
    MigConfigs,
    Slot,
    parse_mig_configs,
    place,
)
from dra.core.migconfig import select_gpus as select_entries
from dra.daemon.bootstrap import DaemonSettings, StartupError
from dra.gpu import dynamic
from dra.gpu.discovery import discover, profile_infos
from dra.gpu.library import ERROR_NOT_SUPPORTED, GpuLibrary, GpuLibraryError, Placement
from dra.model.devices import MigDevice
from dra.model.migmode import DYNAMIC, STATIC, MigModes
from dra.model.prepared import MIG_CREATE, DeviceAction, PreparedClaim

log = logging.getLogger(__name__)


class MigLayoutError(StartupError):
    """The layout cannot be applied; nothing of this attempt is left. The driver exits with status 2."""

    exit_code = 2


@dataclass(frozen=True)
class Profile:
    """A GPU-instance profile as NVML lists it for one GPU (dra.core.migconfig.ProfileShape)."""

    name: str
    id: int
    slices: int
    memory_slices: int
    starts: tuple[int, ...]
    instance_count: int


@dataclass(frozen=True)
class Existing:
    """A GPU instance on the GPU, and whether its compute instance exists."""

    gpu_instance_id: int
    profile: Profile
    start: int
    complete: bool


@dataclass(frozen=True)
class GpuPlan:
    """What the layout does to one GPU."""

    index: int
    uuid: str
    label: str
    entry: LayoutEntry
    keep: tuple[Existing, ...] = ()
    destroy: tuple[Existing, ...] = ()
    #: Unwanted instances a prepared claim uses: kept until the claim ends.
    held: tuple[Existing, ...] = ()
    create: tuple[tuple[Profile, int], ...] = ()
    #: MIG mode to set once the instances are gone (0: the entry disables MIG).
    mode_after: int | None = None
    #: Why the GPU is left as it is (a pending MIG mode change); "" when applied.
    skipped: str = ""

    def describe(self) -> str:
        """One line for the log and `discover`."""
        if self.skipped:
            return f"{self.label}: {self.skipped}"
        if not self.entry.mig_enabled:
            return f"{self.label}: MIG off ({self.entry.where})"
        have = sorted(
            [*((e.start, e.profile.name) for e in self.keep), *((s, p.name) for p, s in self.create)]
        )
        shown = ", ".join(f"{n} at {s}" for s, n in have) or "no MIG devices"
        return f"{self.label}: {shown} ({self.entry.where})"


@dataclass
class Applied:
    """What a layout did: the GPUs it manages (published as static MIG) and what to tell the admin."""

    layout: str
    plans: list[GpuPlan] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def uuids(self) -> list[str]:
        """The GPUs the layout selects."""
        return [p.uuid for p in self.plans]


def load_configs(path: Path) -> MigConfigs:
    """Read and validate a layout file; MigLayoutError naming the file and the fault."""
    try:
        data = documents.load_yaml(
            documents.read_file(path, "--mig-config-file"), f"--mig-config-file {path}"
        )
    except documents.DocumentError as err:
        raise MigLayoutError(str(err)) from None
    try:
        return parse_mig_configs(data, str(path))
    except MigConfigError as err:
        raise MigLayoutError(str(err)) from None


def held_instances(
    lib: GpuLibrary, claims: Iterable[PreparedClaim], actions: Sequence[DeviceAction]
) -> set[tuple[int, int]]:
    """(GPU index, GPU instance ID) of every MIG device a prepared claim uses, by UUID or name."""
    claims = list(claims)
    inventory = discover(lib, MigModes(STATIC))
    held = {
        (m.parent.index, m.gpu_instance_id)
        for m in inventory.devices
        if isinstance(m, MigDevice) and any(c.holds(m.name, m.uuid) for c in claims)
    }
    by_uuid = {g.uuid: g.index for g in inventory.gpus}
    for action in actions:
        gpu = by_uuid.get(str(action.params.get("gpu", "")))
        if action.kind == MIG_CREATE and action.done and gpu is not None:
            held.add((gpu, int(action.result["gpuInstance"])))
    return held


def apply_layout(
    lib: GpuLibrary,
    configs: MigConfigs,
    name: str,
    held: set[tuple[int, int]],
    modes: MigModes,
    dry_run: bool = False,
) -> Applied:
    """Make the GPUs match the layout; MigLayoutError (nothing of this attempt left) when it cannot.

    With dry_run nothing is changed: the plan is what would be done (a GPU
    whose MIG mode is off is planned only once it is on).
    """
    try:
        entries = configs.layout(name)
        count = lib.device_count()
        gpus = [(i, lib.pci_device_id(lib.device_by_index(i))) for i in range(count)]
        chosen = select_entries(entries, gpus)
    except MigConfigError as err:
        raise MigLayoutError(str(err)) from None
    except GpuLibraryError as err:
        raise MigLayoutError(f"MIG layout {name!r}: cannot read the GPUs: {err}") from None
    for index, entry in sorted(chosen.items()):
        uuid = lib.uuid(lib.device_by_index(index))
        if modes.of(index, uuid) == DYNAMIC:
            raise MigLayoutError(
                f"GPU {index} ({uuid}) is dynamic in --mig-mode and {entry.where} gives it a static "
                "layout; choose one: drop it from the layout, or make it static in --mig-mode"
            )
    applied = Applied(name)
    undo = _Undo(lib)
    try:
        ready = _turn_mig_on(lib, chosen, undo, applied, dry_run)
        plans = [_plan(lib, index, entry, held, index in ready) for index, entry in sorted(chosen.items())]
        applied.plans = plans
        for plan in plans:
            applied.warnings.extend(_held_warning(plan))
        if not dry_run:
            for plan in plans:
                _execute(lib, plan, undo, applied)
    except (MigConfigError, GpuLibraryError) as err:
        undone = "nothing of it was applied" if undo.run() else "undoing it failed in part (see the log)"
        raise MigLayoutError(f"cannot apply MIG layout {name!r}: {err}; {undone}") from None
    return applied


def _turn_mig_on(
    lib: GpuLibrary, chosen: Mapping[int, LayoutEntry], undo: _Undo, applied: Applied, dry_run: bool
) -> set[int]:
    """Phase 1; the GPUs whose MIG mode is now as their entry wants it on."""
    ready: set[int] = set()
    for index, entry in sorted(chosen.items()):
        handle = lib.device_by_index(index)
        try:
            current, pending = lib.mig_mode(handle)
        except GpuLibraryError as err:
            if err.code != ERROR_NOT_SUPPORTED:
                raise
            if entry.mig_enabled:
                raise MigConfigError(
                    f"{entry.where}: GPU {index} ({lib.name(handle)}) does not support MIG"
                ) from None
            continue
        if not entry.mig_enabled or current == 1:
            ready.add(index)
            continue
        if dry_run:
            continue
        lib.set_mig_mode(handle, 1)
        undo.modes.append((index, current))
        faults.point("miglayout.mode-set")
        current, pending = lib.mig_mode(handle)
        if current == 1:
            ready.add(index)
        else:
            applied.warnings.append(_pending(index, lib.name(handle), pending))
    return ready


def _pending(index: int, product: str, pending: int) -> str:
    return (
        f"GPU {index} ({product}): MIG mode {'on' if pending else 'off'} is pending until the GPU is reset "
        f"(nvidia-smi -i {index} -r, with no process on it, or a reboot); the layout is applied at the "
        "next start after that, and the GPU is published as it is until then"
    )


def profiles(lib: GpuLibrary, index: int) -> dict[int, Profile]:
    """The GPU's GPU-instance profiles by profile ID, as NVML lists them (MIG mode must be on)."""
    handle = lib.device_by_index(index)
    found: dict[int, Profile] = {}
    for info in profile_infos(lib, handle):
        placements = lib.gpu_instance_possible_placements(handle, info.id)
        found[info.id] = Profile(
            info.name.removeprefix("MIG ").strip(),
            info.id,
            info.slice_count,
            placements[0].size if placements else 0,
            tuple(p.start for p in placements),
            info.instance_count,
        )
    return found


def _existing(lib: GpuLibrary, index: int, table: Mapping[int, Profile]) -> list[Existing]:
    handle = lib.device_by_index(index)
    found = []
    for instance in dynamic.instances(lib, index):
        gi = lib.gpu_instance_by_id(handle, instance.gpu_instance_id)
        found.append(
            Existing(
                instance.gpu_instance_id,
                table[instance.profile_id],
                instance.placement.start,
                bool(lib.compute_instances(gi)),
            )
        )
    return found


def _plan(
    lib: GpuLibrary, index: int, entry: LayoutEntry, held: set[tuple[int, int]], ready: bool
) -> GpuPlan:
    """Phase 2 for one GPU: nothing is changed."""
    handle = lib.device_by_index(index)
    label = f"GPU {index} ({lib.name(handle)})"
    uuid = lib.uuid(handle)
    if entry.mig_enabled and not ready:
        return GpuPlan(index, uuid, label, entry, skipped="MIG mode is off; the layout turns it on first")
    try:
        current, _ = lib.mig_mode(handle)
    except GpuLibraryError as err:
        if err.code != ERROR_NOT_SUPPORTED:
            raise
        return GpuPlan(index, uuid, label, entry)
    if current != 1:
        return GpuPlan(index, uuid, label, entry)
    table = profiles(lib, index)
    existing = _existing(lib, index, table)
    is_held = [e for e in existing if (index, e.gpu_instance_id) in held]
    if not entry.mig_enabled:
        gone = tuple(e for e in existing if e not in is_held)
        return GpuPlan(index, uuid, label, entry, destroy=gone, held=tuple(is_held), mode_after=0)
    wanted = dict(entry.mig_devices)
    keep: list[Existing] = []
    # Held instances first: of a profile with more instances than wanted, those are the ones to keep.
    for e in sorted(existing, key=lambda e: (e not in is_held, e.gpu_instance_id)):
        if e.complete and sum(k.profile.name == e.profile.name for k in keep) < wanted.get(e.profile.name, 0):
            keep.append(e)
    extra_held = [e for e in is_held if e not in keep]
    shapes = list(table.values())
    # What can never fit this GPU is an error, whatever it holds now.
    place(shapes, entry.mig_devices, [], label, entry.where)
    keep, made = _place_best(shapes, entry, label, keep, [e for e in keep if e in is_held], extra_held)
    by_name = {p.name: p for p in shapes}
    return GpuPlan(
        index,
        uuid,
        label,
        entry,
        keep=tuple(keep),
        destroy=tuple(e for e in existing if e not in keep and e not in is_held),
        held=tuple(extra_held),
        create=tuple((by_name[s.profile], s.start) for s in made),
    )


def _place_best(
    shapes: Sequence[Profile],
    entry: LayoutEntry,
    label: str,
    keep: list[Existing],
    keep_held: list[Existing],
    extra_held: list[Existing],
) -> tuple[list[Existing], list[Slot]]:
    """The instances to keep and where the missing ones go: around all that matches, else around the
    held ones only (the matching instances may sit where the layout needs room). With instances a
    claim holds in the way, as much of the layout as fits, smallest profiles dropped first.
    """

    def slots(kept: Sequence[Existing]) -> list[Slot]:
        return [Slot(e.profile.name, e.start) for e in kept]

    failure: MigConfigError | None = None
    for wanted in _shrinking(entry.mig_devices, shapes) if extra_held else [entry.mig_devices]:
        for kept in (keep, keep_held):
            try:
                return kept, place(shapes, wanted, slots([*kept, *extra_held]), label, entry.where)
            except MigConfigError as err:
                failure = failure or err
    assert failure is not None
    raise failure


def _shrinking(
    wanted: Sequence[tuple[str, int]], shapes: Sequence[Profile]
) -> list[tuple[tuple[str, int], ...]]:
    """The wanted instances, then with one fewer at a time, the smallest profile first to go."""
    size = {p.name: p.slices for p in shapes}
    flat = sorted((name for name, count in wanted for _ in range(count)), key=lambda n: -size[n])
    found = []
    for n in range(len(flat), -1, -1):
        counts: dict[str, int] = {}
        for name in flat[:n]:
            counts[name] = counts.get(name, 0) + 1
        found.append(tuple(counts.items()))
    return found


def _held_warning(plan: GpuPlan) -> list[str]:
    if not plan.held:
        return []
    shown = ", ".join(f"{e.profile.name} at {e.start} (GPU instance {e.gpu_instance_id})" for e in plan.held)
    what = "MIG stays on" if plan.mode_after == 0 else "they stay beside the layout's instances"
    return [
        f"{plan.label}: {shown} not in layout {plan.entry.where} but used by a prepared claim: "
        f"{what}; the next start after the claim ends completes the layout"
    ]


def _execute(lib: GpuLibrary, plan: GpuPlan, undo: _Undo, applied: Applied) -> None:
    """Phase 3 for one GPU."""
    for e in plan.destroy:
        dynamic.destroy(lib, plan.index, e.gpu_instance_id)
        if e.complete:
            undo.destroyed.append((plan.index, e))
        faults.point("miglayout.destroyed")
    for profile, start in plan.create:
        gi = dynamic.create_gpu_instance(lib, plan.index, profile.id, Placement(start, profile.memory_slices))
        undo.created.append((plan.index, gi))
        faults.point("miglayout.gpu-instance-created")
        dynamic.create_compute_instance(lib, plan.index, gi, profile.slices)
        faults.point("miglayout.compute-instance-created")
    if plan.mode_after is not None and not plan.held:
        handle = lib.device_by_index(plan.index)
        current, _ = lib.mig_mode(handle)
        if current != plan.mode_after:
            lib.set_mig_mode(handle, plan.mode_after)
            undo.modes.append((plan.index, current))
            faults.point("miglayout.mode-set")
            current, pending = lib.mig_mode(handle)
            if current != plan.mode_after:
                applied.warnings.append(_pending(plan.index, lib.name(handle), pending))


@dataclass
class _Undo:
    """What this attempt changed, to put back on a failure (in reverse order)."""

    lib: GpuLibrary
    created: list[tuple[int, int]] = field(default_factory=list)
    destroyed: list[tuple[int, Existing]] = field(default_factory=list)
    modes: list[tuple[int, int]] = field(default_factory=list)

    def run(self) -> bool:
        """Best effort: each step that fails is logged, and the rest still run; whether all went back."""
        done = [
            self._try(f"destroy GPU instance {gi} made on GPU {index}", dynamic.destroy, self.lib, index, gi)
            for index, gi in reversed(self.created)
        ]
        done += [
            self._try(f"make {e.profile.name} at {e.start} on GPU {index} again", self._remake, index, e)
            for index, e in reversed(self.destroyed)
        ]
        done += [
            self._try(
                f"set MIG mode {mode} on GPU {index} again",
                self.lib.set_mig_mode,
                self.lib.device_by_index(index),
                mode,
            )
            for index, mode in reversed(self.modes)
        ]
        return all(done)

    def _remake(self, index: int, e: Existing) -> None:
        gi = dynamic.create_gpu_instance(
            self.lib, index, e.profile.id, Placement(e.start, e.profile.memory_slices)
        )
        dynamic.create_compute_instance(self.lib, index, gi, e.profile.slices)

    @staticmethod
    def _try(what: str, step: Callable[..., object], *args: object) -> bool:
        try:
            step(*args)
        except GpuLibraryError as err:
            log.error("undoing the MIG layout: cannot %s: %s", what, err)
            return False
        return True


def static_modes(modes: MigModes, applied: Applied) -> MigModes:
    """The MIG modes with every GPU the layout manages static."""
    layout = dict.fromkeys(applied.uuids, STATIC)
    kept = tuple((key, mode) for key, mode in modes.overrides if key not in layout)
    return replace(modes, overrides=(*kept, *layout.items()))


def apply_with_own_library(
    settings: DaemonSettings,
    configs: MigConfigs,
    name: str,
    modes: MigModes,
    claims: Iterable[PreparedClaim],
    actions: Sequence[DeviceAction],
) -> Applied:
    """apply_layout through a GPU library of its own, keeping what these claims hold; MigLayoutError."""
    lib = settings.library()
    try:
        lib.init()
        return apply_layout(lib, configs, name, held_instances(lib, claims, actions), modes)
    except GpuLibraryError as err:
        raise MigLayoutError(f"MIG layout {name!r}: cannot read the GPUs: {err}") from None
    finally:
        lib.shutdown()
