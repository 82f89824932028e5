"""Static MIG layouts (NVIDIA mig-parted's format) applied to the GPUs, as a program of GPU steps.

Parsed and placed by dra.core.migconfig; run over the GPU library by dra.kubeletplugin.miglayout
(which layout, and when, is dra.kubeletplugin.miglabel's). Per GPU, three phases: MIG mode on, a
plan made without changing anything (kept, held, destroyed and new instances), then destroy and
create; a failure undoes the attempt, step by step. Every phase reads the GPU as it is, so a start
after a kill at any step converges. The phases and the states: docs/mig.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from functools import partial

from dra.core.gpusteps import NVML_NOT_SUPPORTED, GpuIdentity, GpuRunner, InstanceProfile
from dra.core.migconfig import LayoutEntry, MigConfigError, MigConfigs, Slot, place, select_gpus
from dra.model.migmode import DYNAMIC, MigModes
from dra.model.node import StepError


@dataclass(frozen=True)
class Existing:
    """A GPU instance on the GPU, and whether its compute instance exists."""

    gpu_instance_id: int
    profile: InstanceProfile
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
    create: tuple[tuple[InstanceProfile, int], ...] = ()
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


@dataclass
class _Undo:
    """What this attempt changed, to put back on a failure (in reverse order)."""

    created: list[tuple[int, int]] = field(default_factory=list)
    destroyed: list[tuple[int, Existing]] = field(default_factory=list)
    modes: list[tuple[int, int]] = field(default_factory=list)


def apply_layout(
    steps: GpuRunner,
    configs: MigConfigs,
    name: str,
    held: Set[tuple[int, int]],
    modes: MigModes,
    dry_run: bool = False,
) -> Applied:
    """Make the GPUs match the layout; MigConfigError (nothing of this attempt left) when it cannot.

    `held`: (GPU index, GPU instance ID) of the MIG devices prepared claims use, never destroyed.
    With dry_run nothing is changed: the plan is what would be done (a GPU whose MIG mode is off is
    planned only once it is on).
    """
    entries = configs.layout(name)
    try:
        gpus = {g.index: g for g in steps.read_gpus()}
    except StepError as err:
        raise MigConfigError(f"MIG layout {name!r}: cannot read the GPUs: {err}") from None
    chosen = select_gpus(entries, [(g.index, g.pci_device_id) for g in gpus.values()])
    for index, entry in sorted(chosen.items()):
        uuid = gpus[index].uuid
        if modes.of(index, uuid) == DYNAMIC:
            raise MigConfigError(
                f"GPU {index} ({uuid}) is dynamic in --mig-mode and {entry.where} gives it a static "
                "layout; choose one: drop it from the layout, or make it static in --mig-mode"
            )
    applied = Applied(name)
    undo = _Undo()
    try:
        ready = _turn_mig_on(steps, chosen, gpus, undo, applied, dry_run)
        for index, entry in sorted(chosen.items()):
            applied.plans.append(_plan(steps, gpus[index], entry, held, index in ready))
        for plan in applied.plans:
            applied.warnings.extend(_held_warning(plan))
        if not dry_run:
            for plan in applied.plans:
                _execute(steps, plan, undo, applied)
    except (MigConfigError, StepError) as err:
        whole = _undo(steps, undo)
        undone = "nothing of it was applied" if whole else "undoing it failed in part (see the log)"
        raise MigConfigError(f"cannot apply MIG layout {name!r}: {err}; {undone}") from None
    return applied


def _label(gpu: GpuIdentity) -> str:
    return f"GPU {gpu.index} ({gpu.name})"


def _turn_mig_on(
    steps: GpuRunner,
    chosen: Mapping[int, LayoutEntry],
    gpus: Mapping[int, GpuIdentity],
    undo: _Undo,
    applied: Applied,
    dry_run: bool,
) -> set[int]:
    """Phase 1; the GPUs whose MIG mode is now as their entry wants it on."""
    ready: set[int] = set()
    for index, entry in sorted(chosen.items()):
        try:
            current, _ = steps.read_mig_mode(index)
        except StepError as err:
            if err.code != NVML_NOT_SUPPORTED:
                raise
            if entry.mig_enabled:
                raise MigConfigError(f"{entry.where}: {_label(gpus[index])} does not support MIG") from None
            continue
        if not entry.mig_enabled or current == 1:
            ready.add(index)
            continue
        if dry_run:
            continue
        now = steps.set_mig_mode(index, 1, point="miglayout.mode-set")
        undo.modes.append((index, current))
        if now:
            ready.add(index)
        else:
            applied.warnings.append(_pending(_label(gpus[index]), index, 1))
    return ready


def _pending(label: str, index: int, mode: int) -> str:
    """The warning for MIG mode `mode`, asked for and left pending by NVML."""
    return (
        f"{label}: MIG mode {'on' if mode else 'off'} is pending until the GPU is reset "
        f"(nvidia-smi -i {index} -r, with no process on it, or a reboot); the layout is applied at the "
        "next start after that, and the GPU is published as it is until then"
    )


def _existing(steps: GpuRunner, index: int, table: Mapping[int, InstanceProfile]) -> list[Existing]:
    found = []
    for instance in steps.list_gpu_instances(index):
        complete = steps.has_compute_instance(index, instance.gpu_instance_id)
        found.append(Existing(instance.gpu_instance_id, table[instance.profile_id], instance.start, complete))
    return found


def _plan(
    steps: GpuRunner, gpu: GpuIdentity, entry: LayoutEntry, held: Set[tuple[int, int]], ready: bool
) -> GpuPlan:
    """Phase 2 for one GPU: nothing is changed."""
    index, uuid, label = gpu.index, gpu.uuid, _label(gpu)
    if entry.mig_enabled and not ready:
        return GpuPlan(index, uuid, label, entry, skipped="MIG mode is off; the layout turns it on first")
    try:
        current, _ = steps.read_mig_mode(index)
    except StepError as err:
        if err.code != NVML_NOT_SUPPORTED:
            raise
        return GpuPlan(index, uuid, label, entry)
    if current != 1:
        return GpuPlan(index, uuid, label, entry)
    table = {p.id: p for p in steps.list_instance_profiles(index)}
    existing = _existing(steps, index, table)
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
    shapes: Sequence[InstanceProfile],
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
    wanted: Sequence[tuple[str, int]], shapes: Sequence[InstanceProfile]
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


def _execute(steps: GpuRunner, plan: GpuPlan, undo: _Undo, applied: Applied) -> None:
    """Phase 3 for one GPU."""
    for e in plan.destroy:
        steps.destroy_gpu_instance(plan.index, e.gpu_instance_id, point="miglayout.destroyed")
        if e.complete:
            undo.destroyed.append((plan.index, e))
    for profile, start in plan.create:
        gi = steps.create_gpu_instance(
            plan.index, profile.id, start, profile.memory_slices, point="miglayout.gpu-instance-created"
        )
        undo.created.append((plan.index, gi))
        steps.create_compute_instance(
            plan.index, gi, profile.slices, point="miglayout.compute-instance-created"
        )
    if plan.mode_after is not None and not plan.held:
        current, _ = steps.read_mig_mode(plan.index)
        if current != plan.mode_after:
            now = steps.set_mig_mode(plan.index, plan.mode_after, point="miglayout.mode-set")
            undo.modes.append((plan.index, current))
            if not now:
                applied.warnings.append(_pending(plan.label, plan.index, plan.mode_after))


def _undo(steps: GpuRunner, undo: _Undo) -> bool:
    """Best effort: each step that fails is logged, and the rest still run; whether all went back."""
    whole = True
    for index, gi in reversed(undo.created):
        whole &= _attempt(
            steps,
            f"destroy GPU instance {gi} made on GPU {index}",
            partial(steps.destroy_gpu_instance, index, gi),
        )
    for index, e in reversed(undo.destroyed):
        whole &= _attempt(
            steps,
            f"make {e.profile.name} at {e.start} on GPU {index} again",
            partial(_remake, steps, index, e),
        )
    for index, mode in reversed(undo.modes):
        whole &= _attempt(
            steps, f"set MIG mode {mode} on GPU {index} again", partial(steps.set_mig_mode, index, mode)
        )
    return whole


def _attempt(steps: GpuRunner, what: str, undo_steps: Callable[[], object]) -> bool:
    """Whether the steps ran; a failure is logged and the undo goes on."""
    try:
        undo_steps()
    except StepError as err:
        steps.log("error", f"undoing the MIG layout: cannot {what}: {err}")
        return False
    return True


def _remake(steps: GpuRunner, index: int, e: Existing) -> None:
    gi = steps.create_gpu_instance(index, e.profile.id, e.start, e.profile.memory_slices)
    steps.create_compute_instance(index, gi, e.profile.slices)
