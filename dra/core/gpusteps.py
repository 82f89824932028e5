"""The GPU's steps: NVML's MIG calls, each a method of a GpuRunner.

Dynamic MIG (dra.core.migdevices) calls them among the steps of prepare, unprepare and the
start-up repair; static MIG layouts (dra.core.miglayout) are programs of them alone, run on a
runner that has the GPU library and nothing else (dra.kubeletplugin.miglayout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dra.core.runner import Logs
from dra.model.devices import Gpu, MigDevice

#: NVML_ERROR_NOT_SUPPORTED (nvml.h): the GPU has no MIG.
NVML_NOT_SUPPORTED = 3
#: NVML_ERROR_INSUFFICIENT_RESOURCES (nvml.h): NVML refused a GPU instance for lack of room, so the
#: placement is taken on the GPU, whatever the checkpoint says.
NVML_INSUFFICIENT_RESOURCES = 23


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


class GpuRunner(Logs, Protocol):
    """What runs the GPU's steps over a GPU library: NVML's MIG calls, one method per kind of step,
    each raising StepError when it fails; `point` names the crash point passed right after the step."""

    def read_gpus(self) -> tuple[GpuIdentity, ...]:
        """Every GPU of the node, by index."""

    def list_instance_profiles(self, gpu_index: int) -> tuple[InstanceProfile, ...]:
        """The GPU's GPU-instance profiles with their placements, by profile ID (MIG mode must be on)."""

    def list_gpu_instances(self, gpu_index: int) -> tuple[GpuInstanceAt, ...]:
        """Every GPU instance on the GPU, by ID."""

    def has_compute_instance(self, gpu_index: int, gpu_instance_id: int) -> bool:
        """Whether the GPU instance has a compute instance (else a kill came between the two)."""

    def create_gpu_instance(
        self, gpu_index: int, profile_id: int, start: int, size: int, *, point: str = ""
    ) -> int:
        """Make a GPU instance of the profile at memory slices start..start+size-1; its ID."""

    def create_compute_instance(
        self, gpu_index: int, gpu_instance_id: int, slices: int, *, point: str = ""
    ) -> int:
        """Make the compute instance spanning the whole GPU instance (shared engines); its ID."""

    def read_mig_mode(self, gpu_index: int) -> tuple[int, int]:
        """The GPU's (current, pending) MIG mode, 1 on and 0 off; they differ while a change awaits
        a reset."""

    def set_mig_mode(self, gpu_index: int, mode: int, *, point: str = "") -> bool:
        """Ask for MIG mode on (1) or off (0); whether it is current now (False: pending until a GPU
        reset)."""

    def find_mig_device(self, gpu: Gpu, gpu_instance_id: int, compute_instance_id: int) -> MigDevice:
        """The MIG device a GPU instance and compute instance make, as discovery reads it."""

    def destroy_gpu_instance(self, gpu_index: int, gpu_instance_id: int, *, point: str = "") -> None:
        """Destroy a GPU instance's compute instances, then the GPU instance; gone already is fine."""
