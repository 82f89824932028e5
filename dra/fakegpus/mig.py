"""The MIG half of a fake GPU library: GPU and compute instances on fake GPUs, as NVML makes them.

MIG instances are made and destroyed through the same calls as on NVML, with
the placements of dra.gpu.migtables, and fail the way NVML fails (nvml.h):
MIG mode off or a profile the model lacks -> NOT_SUPPORTED; a placement the
profile cannot take -> INVALID_ARGUMENT; a placement overlapping an instance
that exists, or one instance too many -> INSUFFICIENT_RESOURCES; destroying a
GPU instance that still has compute instances -> IN_USE; an unknown ID ->
NOT_FOUND. The instances live in a small JSON file when one is given (as they
live on the GPU, so that a restarted driver finds them), else in memory; the
instances a profile lists under `mig` are there from the start, at the first
placements where they all fit. A file written for another profile (another
MIG layout) counts as absent, as a re-partitioned GPU would. set_mig_mode
turns MIG on or off (recorded in the same file), refused with IN_USE while
the GPU has instances; a GPU the profile gives no `mig` starts with MIG off.
Per architecture, after NVIDIA's MIG User Guide ("Deployment Considerations":
setting MIG mode on the A100/A30 requires a GPU reset) and nvml.h
(nvmlDeviceSetMigMode resets the GPU itself where it can, else its activation
status is RESET_REQUIRED): on Hopper and later the change is current at once;
on Ampere too, since NVML resets the GPU, unless the profile marks the GPU
`migResetBlocked`, where it stays pending until `reset_gpu`. With
on_mig_change set, each new MIG device is announced (with a root,
dra.fakegpus.node then makes its device nodes).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from dra import documents
from dra.fakegpus.profiles import FakeGpu, Profile
from dra.gpu import migtables
from dra.gpu.library import (
    ERROR_IN_USE,
    ERROR_INSUFFICIENT_RESOURCES,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_UNKNOWN,
    ComputeInstanceHandle,
    GpuHandle,
    GpuInstanceHandle,
    GpuInstanceInfo,
    GpuInstanceProfileInfo,
    GpuLibraryError,
    MigAttributes,
    MigHandle,
    Placement,
)
from dra.gpu.migtables import GpuInstanceProfile

#: What to do about a state file that cannot be read: a GPU whose instances are gone starts again.
_MOVE_AWAY = "move it away: the fake GPUs start again from their profile's MIG devices"
#: nvmlDeviceArchitecture_t of Ampere: the one that needs a GPU reset to change MIG mode.
AMPERE = 7


@dataclass(frozen=True)
class FakeMigDevice:
    """A fake MIG device handle: which GPU, slot, profile and instances it is."""

    gpu_index: int
    slot: int
    profile: str
    gpu_instance_id: int
    compute_instance_id: int = 0
    #: 0 for the instances of the profile; a creation counter for those made later.
    serial: int = 0


@dataclass(frozen=True)
class _FakeGi:
    gpu_index: int
    gpu_instance_id: int


@dataclass(frozen=True)
class _FakeCi:
    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass
class FakeInstance:
    """A GPU instance on a fake GPU, as the state file records it."""

    gpu_instance_id: int
    profile: str
    start: int
    size: int
    compute_instances: list[int] = field(default_factory=list)
    serial: int = 0


class FakeMigPartitions:
    """The MIG calls of GpuLibrary over a profile's GPUs; FakeGpuLibrary adds the rest."""

    def __init__(self, profile: Profile, mig_state: Path | None = None) -> None:
        self.profile = profile
        self._mig_state = mig_state
        self._memory: dict[int, list[FakeInstance]] | None = None
        #: The state file's bytes as last read or written, and what they hold: a call re-parses the
        #: file only when another process (or test) changed it, as NVML reads no file at all.
        self._known: tuple[bytes, dict[int, list[FakeInstance]]] | None = None
        #: What the profile says of each GPU's MIG: a state file written for another profile is void.
        self._layout: list[list[object]] = [
            [g.model.product_name, None if g.mig is None else list(g.mig)] for g in profile.gpus
        ]
        #: MIG modes set through set_mig_mode, by GPU index; the others are the profile's.
        self._modes: dict[int, int] = {}
        #: MIG modes asked for that wait for a GPU reset, by GPU index.
        self._pending: dict[int, int] = {}
        #: Called after MIG devices appear or go (outside the lock): with a root, their device nodes follow.
        self.on_mig_change: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def _gpu(self, handle: GpuHandle | MigHandle) -> FakeGpu:
        index = handle.gpu_index if isinstance(handle, FakeMigDevice) else handle
        assert isinstance(index, int)
        return self.profile.gpus[index]

    def mig_mode(self, gpu: GpuHandle) -> tuple[int, int]:
        """MIG on where set_mig_mode turned it on or the profile lists MIG devices; NOT_SUPPORTED without MIG.

        They differ while a change waits for a GPU reset (an Ampere GPU NVML cannot reset).
        """
        fake = self._gpu(gpu)
        if not fake.model.mig_profiles:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "MIG not supported")
        mode = 1 if self._mig_on(gpu) else 0
        assert isinstance(gpu, int)
        with self._lock:
            return mode, self._pending.get(gpu, mode)

    def reset_gpu(self, index: int) -> None:
        """A GPU reset: a MIG mode change that waited for it becomes current."""
        with self._lock:
            state = self._load()
            mode = self._pending.pop(index, None)
            if mode is not None:
                self._modes[index] = mode
                self._save(state)

    def _mig_on(self, gpu: GpuHandle) -> bool:
        assert isinstance(gpu, int)
        with self._lock:
            self._load()
            mode = self._modes.get(gpu)
        return self.profile.gpus[gpu].mig is not None if mode is None else mode == 1

    def set_mig_mode(self, gpu: GpuHandle, mode: int) -> None:
        """Turn MIG on or off (pending where an Ampere GPU cannot be reset); IN_USE while it has instances."""
        assert isinstance(gpu, int)
        fake = self._gpu(gpu)
        if not fake.model.mig_profiles:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"{fake.model.product_name} does not support MIG")
        if mode not in (0, 1):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no MIG mode {mode}")
        with self._lock:
            state = self._load()
            if state.get(gpu):
                raise GpuLibraryError(ERROR_IN_USE, f"GPU {gpu} has MIG instances: destroy them first")
            current = self._modes.get(gpu, 1 if fake.mig is not None else 0)
            self._pending.pop(gpu, None)
            if fake.mig_reset_blocked and fake.model.architecture == AMPERE and mode != current:
                self._pending[gpu] = mode
            else:
                self._modes[gpu] = mode
            self._save(state)

    def max_mig_device_count(self, gpu: GpuHandle) -> int:
        """Seven slots on MIG-capable GPUs in MIG mode; 0 otherwise, as NVML answers."""
        fake = self._gpu(gpu)
        return fake.model.mig_slices if fake.model.mig_profiles and self._mig_on(gpu) else 0

    def mig_device_by_index(self, gpu: GpuHandle, index: int) -> MigHandle:
        """The index-th compute instance of the GPU, by GPU instance ID then compute instance ID."""
        assert isinstance(gpu, int)
        devices = [
            (gi, ci)
            for gi in sorted(self._instances(gpu), key=lambda i: i.gpu_instance_id)
            for ci in sorted(gi.compute_instances)
        ]
        if index >= len(devices):
            raise GpuLibraryError(ERROR_NOT_FOUND, "no MIG device in this slot")
        gi, ci = devices[index]
        return MigHandle(FakeMigDevice(gpu, index, gi.profile, gi.gpu_instance_id, ci, gi.serial))

    # -- MIG management ----------------------------------------------------

    def _table(self, gpu: GpuHandle, mig_off: bool = False) -> tuple[GpuInstanceProfile, ...]:
        """The GPU's profiles; `mig_off`: also while MIG mode is off (NVML describes them then too)."""
        fake = self._gpu(gpu)
        if not fake.model.mig_table:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"{fake.model.product_name} does not support MIG")
        if not mig_off and not self._mig_on(gpu):
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"MIG mode is disabled on GPU {gpu}")
        return fake.model.mig_table

    def _premade(self, index: int) -> list[FakeInstance]:
        """The profile's MIG devices, at the first placements where all of them fit."""
        fake = self.profile.gpus[index]
        table = {p.name: p for p in fake.model.mig_table}
        names = list(fake.mig or ())

        def place(made: list[FakeInstance]) -> list[FakeInstance] | None:
            if len(made) == len(names):
                return made
            p = table[names[len(made)]]
            for start in p.starts:
                if not _overlaps(made, start, p.memory_slices):
                    found = place([*made, FakeInstance(len(made) + 1, p.name, start, p.memory_slices, [0])])
                    if found is not None:
                        return found
            return None

        # The profile's own check counts compute slices only; memory placements may still clash.
        placed = place([])
        if placed is None:
            raise GpuLibraryError(
                ERROR_INSUFFICIENT_RESOURCES, f"GPU {index}: the profile's MIG devices do not fit"
            )
        return placed

    def _read(self) -> bytes | None:
        """The state file's bytes; None without a file."""
        if self._mig_state is None:
            return None
        try:
            return documents.read_file(self._mig_state, "fake GPU MIG state")
        except documents.MissingFileError:
            return None
        except documents.DocumentError as err:
            raise GpuLibraryError(ERROR_UNKNOWN, f"{err}; {_MOVE_AWAY}") from None

    def _load(self) -> dict[int, list[FakeInstance]]:
        raw = self._read()
        if raw is not None:
            if self._known is not None and raw == self._known[0]:
                return self._known[1]
            assert self._mig_state is not None
            try:
                data = documents.load_json(raw, f"fake GPU MIG state {self._mig_state}")
                if isinstance(data, dict) and data.get("profile") == self._layout:
                    self._modes = {int(k): int(v) for k, v in data.get("migMode", {}).items()}
                    self._pending = {int(k): int(v) for k, v in data.get("migPending", {}).items()}
                    state = {int(k): [FakeInstance(**i) for i in v] for k, v in data["gpus"].items()}
                    self._known = (raw, state)
                    return state
            except documents.DocumentError as err:
                raise GpuLibraryError(ERROR_UNKNOWN, f"{err}; {_MOVE_AWAY}") from None
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                raise GpuLibraryError(
                    ERROR_UNKNOWN, f"fake GPU MIG state {self._mig_state} is not one; {_MOVE_AWAY}"
                ) from None
        if self._memory is None:
            self._memory = {i: self._premade(i) for i in range(len(self.profile.gpus))}
        return self._memory

    def _save(self, state: dict[int, list[FakeInstance]]) -> None:
        self._memory = state
        if self._mig_state is None:
            return
        # vars, not asdict's recursive copy: every change writes every GPU's instances.
        gpus = {
            str(k): [dict(vars(i), compute_instances=list(i.compute_instances)) for i in v]
            for k, v in sorted(state.items())
        }
        modes = {str(k): v for k, v in sorted(self._modes.items())}
        pending = {str(k): v for k, v in sorted(self._pending.items())}
        raw = json.dumps(
            {"profile": self._layout, "gpus": gpus, "migMode": modes, "migPending": pending}
        ).encode()
        # Atomically, as the real GPU changes: a reader never sees half a state, and a killed driver
        # finds the instances it made. Not fsynced: GPU instances do not outlive a power loss either
        # (the MIG User Guide: they are lost on a GPU reset or reboot), and the fsync was most of a
        # MIG unprepare's time in bench_scale.
        tmp = self._mig_state.with_name(f".{self._mig_state.name}.tmp")
        self._known = None
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(raw)
        os.replace(tmp, self._mig_state)
        self._known = (raw, state)

    def _instances(self, gpu: GpuHandle) -> list[FakeInstance]:
        assert isinstance(gpu, int)
        with self._lock:
            return self._load().get(gpu, [])

    def instances(self) -> dict[int, list[FakeInstance]]:
        """Every GPU instance on every GPU (for tests and the admin's eyes), a copy later changes leave."""
        with self._lock:
            return {
                gpu: [replace(i, compute_instances=list(i.compute_instances)) for i in found]
                for gpu, found in self._load().items()
            }

    def gpu_instance_profile_info(self, gpu: GpuHandle, profile: int) -> GpuInstanceProfileInfo:
        """The migtables row of this profile enumerator, whatever the MIG mode (a real H200 on driver 580)."""
        if not 0 <= profile < migtables.PROFILE_COUNT:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no GPU instance profile {profile}")
        p = migtables.by_nvml_profile(self._table(gpu, mig_off=True), profile)
        if p is None:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"GPU {gpu} has no GPU instance profile {profile}")
        return GpuInstanceProfileInfo(
            id=p.id,
            slice_count=p.slices,
            instance_count=p.instance_count,
            engines=p.engines,
            memory_mib=p.memory_mib,
            name=f"MIG {p.name}",
        )

    def _profile(self, gpu: GpuHandle, profile_id: int, mig_off: bool = False) -> GpuInstanceProfile:
        p = migtables.by_id(self._table(gpu, mig_off), profile_id)
        if p is None:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no GPU instance profile ID {profile_id}")
        return p

    def gpu_instance_possible_placements(self, gpu: GpuHandle, profile_id: int) -> list[Placement]:
        """The table's placements of the profile, whatever the MIG mode."""
        p = self._profile(gpu, profile_id, mig_off=True)
        return [Placement(start, p.memory_slices) for start in p.starts]

    def create_gpu_instance_with_placement(
        self, gpu: GpuHandle, profile_id: int, placement: Placement
    ) -> GpuInstanceHandle:
        """A new GPU instance at the placement, with the lowest free ID."""
        assert isinstance(gpu, int)
        p = self._profile(gpu, profile_id)
        if placement.start not in p.starts or placement.size != p.memory_slices:
            raise GpuLibraryError(
                ERROR_INVALID_ARGUMENT, f"{p.name} cannot be placed at {placement.start}:{placement.size}"
            )
        with self._lock:
            state = self._load()
            existing = state.setdefault(gpu, [])
            same = sum(1 for i in existing if i.profile == p.name)
            used = sum(self._slices(gpu, i.profile) for i in existing)
            if (
                _overlaps(existing, placement.start, placement.size)
                or same >= p.instance_count
                or used + p.slices > migtables.COMPUTE_SLICES
            ):
                raise GpuLibraryError(
                    ERROR_INSUFFICIENT_RESOURCES,
                    f"GPU {gpu}: no room for {p.name} at {placement.start}:{placement.size}",
                )
            ids = {i.gpu_instance_id for i in existing}
            gi = next(n for n in range(1, 64) if n not in ids)
            # Never reused, even after every instance is gone: a re-made MIG device has a new UUID.
            serial = time.time_ns()
            existing.append(FakeInstance(gi, p.name, placement.start, placement.size, [], serial))
            self._save(state)
        return GpuInstanceHandle(_FakeGi(gpu, gi))

    def _slices(self, gpu: GpuHandle, name: str) -> int:
        return next(p.slices for p in self._gpu(gpu).model.mig_table if p.name == name)

    def gpu_instances(self, gpu: GpuHandle, profile_id: int) -> list[GpuInstanceHandle]:
        """The GPU instances of the profile (none while MIG mode is off)."""
        assert isinstance(gpu, int)
        name = self._profile(gpu, profile_id, mig_off=True).name
        return [
            GpuInstanceHandle(_FakeGi(gpu, i.gpu_instance_id))
            for i in self._instances(gpu)
            if i.profile == name
        ]

    def gpu_instance_by_id(self, gpu: GpuHandle, gpu_instance_id: int) -> GpuInstanceHandle:
        """The GPU instance of this ID; NOT_FOUND when there is none."""
        assert isinstance(gpu, int)
        self._table(gpu)
        if not any(i.gpu_instance_id == gpu_instance_id for i in self._instances(gpu)):
            raise GpuLibraryError(ERROR_NOT_FOUND, f"GPU {gpu} has no GPU instance {gpu_instance_id}")
        return GpuInstanceHandle(_FakeGi(gpu, gpu_instance_id))

    def _gi(self, state: dict[int, list[FakeInstance]], gi: GpuInstanceHandle) -> FakeInstance:
        assert isinstance(gi, _FakeGi)
        found = next(
            (i for i in state.get(gi.gpu_index, []) if i.gpu_instance_id == gi.gpu_instance_id), None
        )
        if found is None:
            raise GpuLibraryError(ERROR_NOT_FOUND, f"GPU instance {gi.gpu_instance_id} does not exist")
        return found

    def gpu_instance_info(self, gi: GpuInstanceHandle) -> GpuInstanceInfo:
        """ID, profile ID and placement."""
        assert isinstance(gi, _FakeGi)
        with self._lock:
            instance = self._gi(self._load(), gi)
        profile = next(
            p for p in self._gpu(GpuHandle(gi.gpu_index)).model.mig_table if p.name == instance.profile
        )
        return GpuInstanceInfo(instance.gpu_instance_id, profile.id, Placement(instance.start, instance.size))

    def create_compute_instance(self, gi: GpuInstanceHandle, profile: int) -> ComputeInstanceHandle:
        """A compute instance with the lowest free ID, if the GPU instance has the slices left."""
        assert isinstance(gi, _FakeGi)
        slices = migtables.SLICES_BY_COMPUTE_PROFILE.get(profile)
        if slices is None:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no compute instance profile {profile}")
        with self._lock:
            state = self._load()
            instance = self._gi(state, gi)
            own = self._slices(GpuHandle(gi.gpu_index), instance.profile)
            if slices > own or (instance.compute_instances and slices == own):
                raise GpuLibraryError(
                    ERROR_INSUFFICIENT_RESOURCES,
                    f"GPU instance {gi.gpu_instance_id} has no {slices} slices free",
                )
            ci = next(n for n in range(64) if n not in instance.compute_instances)
            instance.compute_instances.append(ci)
            self._save(state)
        if self.on_mig_change is not None:
            self.on_mig_change()
        return ComputeInstanceHandle(_FakeCi(gi.gpu_index, gi.gpu_instance_id, ci))

    def compute_instances(self, gi: GpuInstanceHandle) -> list[ComputeInstanceHandle]:
        """The compute instances of the GPU instance."""
        assert isinstance(gi, _FakeGi)
        with self._lock:
            instance = self._gi(self._load(), gi)
        return [
            ComputeInstanceHandle(_FakeCi(gi.gpu_index, gi.gpu_instance_id, ci))
            for ci in sorted(instance.compute_instances)
        ]

    def compute_instance_info_id(self, ci: ComputeInstanceHandle) -> int:
        """Its ID."""
        assert isinstance(ci, _FakeCi)
        return ci.compute_instance_id

    def destroy_compute_instance(self, ci: ComputeInstanceHandle) -> None:
        """Remove it from its GPU instance."""
        assert isinstance(ci, _FakeCi)
        with self._lock:
            state = self._load()
            instance = self._gi(state, GpuInstanceHandle(_FakeGi(ci.gpu_index, ci.gpu_instance_id)))
            if ci.compute_instance_id not in instance.compute_instances:
                raise GpuLibraryError(
                    ERROR_NOT_FOUND, f"compute instance {ci.compute_instance_id} does not exist"
                )
            instance.compute_instances.remove(ci.compute_instance_id)
            self._save(state)

    def destroy_gpu_instance(self, gi: GpuInstanceHandle) -> None:
        """Remove it; IN_USE while it has compute instances."""
        assert isinstance(gi, _FakeGi)
        with self._lock:
            state = self._load()
            instance = self._gi(state, gi)
            if instance.compute_instances:
                raise GpuLibraryError(
                    ERROR_IN_USE, f"GPU instance {gi.gpu_instance_id} still has compute instances"
                )
            state[gi.gpu_index].remove(instance)
            self._save(state)

    def _mig(self, mig: MigHandle) -> FakeMigDevice:
        assert isinstance(mig, FakeMigDevice)
        return mig

    def mig_attributes(self, mig: MigHandle) -> MigAttributes:
        """Sizes from the model's MIG profile table."""
        fake = self._mig(mig)
        p = self._gpu(mig).model.mig_profiles[fake.profile]
        return MigAttributes(
            engines=p.engines,
            gpu_instance_slices=p.gpu_instance_slices,
            compute_instance_slices=p.gpu_instance_slices,
            memory_mib=p.memory_mib,
        )

    def gpu_instance_id(self, mig: MigHandle) -> int:
        """Assigned in profile order, from 1."""
        return self._mig(mig).gpu_instance_id

    def compute_instance_id(self, mig: MigHandle) -> int:
        """The compute instance the MIG device is."""
        return self._mig(mig).compute_instance_id


def _overlaps(instances: list[FakeInstance], start: int, size: int) -> bool:
    return any(i.start < start + size and start < i.start + i.size for i in instances)
