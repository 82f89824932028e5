"""The GPU's steps: NVML's MIG calls as plain data, each run by one method of a GpuRunner.

Dynamic MIG (dra.core.migdevices) yields them among the steps of prepare, unprepare and the
start-up repair; static MIG layouts (dra.core.miglayout) are programs of them alone, run by
an executor that has the GPU library and nothing else (dra.kubeletplugin.miglayout).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from dra.core.steps import Logger, Query, Step
from dra.model.devices import Gpu, MigDevice

T = TypeVar("T")

#: NVML_ERROR_NOT_SUPPORTED (nvml.h): the GPU has no MIG.
NVML_NOT_SUPPORTED = 3
#: NVML_ERROR_INSUFFICIENT_RESOURCES (nvml.h): NVML refused a GPU instance for lack of room, so the
#: placement is taken on the GPU, whatever the checkpoint says.
NVML_INSUFFICIENT_RESOURCES = 23


class GpuRunner(Logger, Protocol):
    """What runs the GPU's steps over a GPU library: one method per kind, each step's `run`."""

    def read_gpus(self, step: ReadGpus) -> tuple[GpuIdentity, ...]: ...
    def list_instance_profiles(self, step: ListInstanceProfiles) -> tuple[InstanceProfile, ...]: ...
    def list_gpu_instances(self, step: ListGpuInstances) -> tuple[GpuInstanceAt, ...]: ...
    def has_compute_instance(self, step: HasComputeInstance) -> bool: ...
    def create_gpu_instance(self, step: CreateGpuInstance) -> int: ...
    def create_compute_instance(self, step: CreateComputeInstance) -> int: ...
    def read_mig_mode(self, step: ReadMigMode) -> tuple[int, int]: ...
    def set_mig_mode(self, step: SetMigMode) -> bool: ...
    def find_mig_device(self, step: FindMigDevice) -> MigDevice: ...
    def destroy_gpu_instance(self, step: DestroyGpuInstance) -> None: ...


#: A program of GPU steps (and log lines): runs on a GpuRunner, and within every larger program.
GpuProgram = Generator[Step[GpuRunner], Any, T]


@dataclass(frozen=True)
class GpuIdentity:
    """What a static MIG layout selects a GPU by, and names it with."""

    index: int
    #: nvmlPciInfo_t.pciDeviceId: device ID in the upper 16 bits, vendor ID in the lower.
    pci_device_id: int
    uuid: str
    #: The product name, "NVIDIA H100 80GB HBM3".
    name: str


@dataclass(frozen=True)
class InstanceProfile:
    """A GPU-instance profile as NVML lists it for one GPU (a dra.core.migconfig.ProfileShape)."""

    #: nvidia-smi's name, 1g.10gb.
    name: str
    id: int
    #: Compute slices.
    slices: int
    #: Memory slices of each placement.
    memory_slices: int
    #: Start memory slice of each possible placement.
    starts: tuple[int, ...]
    #: How many instances of it one GPU can hold.
    instance_count: int


@dataclass(frozen=True)
class GpuInstanceAt:
    """A GPU instance that exists on a GPU, its profile, and the memory slices it takes."""

    gpu_instance_id: int
    profile_id: int
    start: int
    size: int


@dataclass(frozen=True)
class ReadGpus(Query[GpuRunner, tuple[GpuIdentity, ...]]):
    """Every GPU of the node, by index."""

    def run(self, runner: GpuRunner) -> tuple[GpuIdentity, ...]:
        return runner.read_gpus(self)


@dataclass(frozen=True)
class ListInstanceProfiles(Query[GpuRunner, tuple[InstanceProfile, ...]]):
    """The GPU's GPU-instance profiles with their placements, by profile ID (MIG mode must be on)."""

    gpu_index: int

    def run(self, runner: GpuRunner) -> tuple[InstanceProfile, ...]:
        return runner.list_instance_profiles(self)


@dataclass(frozen=True)
class ListGpuInstances(Query[GpuRunner, tuple[GpuInstanceAt, ...]]):
    """Every GPU instance on the GPU, by ID."""

    gpu_index: int

    def run(self, runner: GpuRunner) -> tuple[GpuInstanceAt, ...]:
        return runner.list_gpu_instances(self)


@dataclass(frozen=True)
class HasComputeInstance(Query[GpuRunner, bool]):
    """Whether the GPU instance has a compute instance (else a kill came between the two)."""

    gpu_index: int
    gpu_instance_id: int

    def run(self, runner: GpuRunner) -> bool:
        return runner.has_compute_instance(self)


@dataclass(frozen=True)
class CreateGpuInstance(Query[GpuRunner, int]):
    """Make a GPU instance of the profile at memory slices start..start+size-1; its ID."""

    gpu_index: int
    profile_id: int
    start: int
    size: int

    def run(self, runner: GpuRunner) -> int:
        return runner.create_gpu_instance(self)


@dataclass(frozen=True)
class CreateComputeInstance(Query[GpuRunner, int]):
    """Make the compute instance spanning the whole GPU instance (shared engines); its ID."""

    gpu_index: int
    gpu_instance_id: int
    slices: int

    def run(self, runner: GpuRunner) -> int:
        return runner.create_compute_instance(self)


@dataclass(frozen=True)
class ReadMigMode(Query[GpuRunner, tuple[int, int]]):
    """The GPU's (current, pending) MIG mode, 1 on and 0 off; they differ while a change awaits a reset."""

    gpu_index: int

    def run(self, runner: GpuRunner) -> tuple[int, int]:
        return runner.read_mig_mode(self)


@dataclass(frozen=True)
class SetMigMode(Query[GpuRunner, bool]):
    """Ask for MIG mode on (1) or off (0); whether it is current now (False: pending until a GPU reset)."""

    gpu_index: int
    mode: int

    def run(self, runner: GpuRunner) -> bool:
        return runner.set_mig_mode(self)


@dataclass(frozen=True)
class FindMigDevice(Query[GpuRunner, MigDevice]):
    """The MIG device a GPU instance and compute instance make, as discovery reads it."""

    gpu: Gpu
    gpu_instance_id: int
    compute_instance_id: int

    def run(self, runner: GpuRunner) -> MigDevice:
        return runner.find_mig_device(self)


@dataclass(frozen=True)
class DestroyGpuInstance(Step[GpuRunner]):
    """Destroy a GPU instance's compute instances, then the GPU instance; gone already is fine."""

    gpu_index: int
    gpu_instance_id: int

    def run(self, runner: GpuRunner) -> None:
        return runner.destroy_gpu_instance(self)
