"""MIG through a GpuLibrary: make, find and destroy MIG instances, one NVML step each.

Dynamic MIG makes the MIG devices of claims with them, static layouts their instances. The steps
are separate so that the programs that yield them (run by dra.kubeletplugin.state) can record
their progress, and pass a crash point, between them. Destroying tolerates what is already gone,
so that undoing a half-done step and retrying an unprepare both converge.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra.gpu import migtables
from dra.gpu.discovery import mig_devices, profile_infos
from dra.gpu.library import ERROR_INVALID_ARGUMENT, ERROR_NOT_FOUND, GpuLibrary, GpuLibraryError, Placement
from dra.model.devices import Gpu, MigDevice


@dataclass(frozen=True)
class Instance:
    """A GPU instance that exists on a GPU."""

    gpu_instance_id: int
    profile_id: int
    placement: Placement


def create_gpu_instance(lib: GpuLibrary, gpu_index: int, profile_id: int, placement: Placement) -> int:
    """Make a GPU instance at the placement; its ID. GpuLibraryError as NVML answers."""
    gi = lib.create_gpu_instance_with_placement(lib.device_by_index(gpu_index), profile_id, placement)
    return lib.gpu_instance_info(gi).id


def create_compute_instance(lib: GpuLibrary, gpu_index: int, gpu_instance_id: int, slices: int) -> int:
    """Make the compute instance spanning the whole GPU instance (shared engines); its ID."""
    gi = lib.gpu_instance_by_id(lib.device_by_index(gpu_index), gpu_instance_id)
    profile = migtables.COMPUTE_PROFILE_BY_SLICES.get(slices)
    if profile is None:
        raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no compute-instance profile of {slices} slices")
    return lib.compute_instance_info_id(lib.create_compute_instance(gi, profile))


def destroy(lib: GpuLibrary, gpu_index: int, gpu_instance_id: int) -> None:
    """Destroy a GPU instance's compute instances, then the GPU instance; gone already is fine.

    Gone is the GPU instance, or the GPU itself: a GPU past the count (NVML
    calls its index an invalid argument) holds no instance any more.
    """
    if gpu_index >= lib.device_count():
        return
    try:
        gi = lib.gpu_instance_by_id(lib.device_by_index(gpu_index), gpu_instance_id)
    except GpuLibraryError as err:
        if err.code == ERROR_NOT_FOUND:
            return
        raise
    for ci in lib.compute_instances(gi):
        lib.destroy_compute_instance(ci)
    lib.destroy_gpu_instance(gi)


def mig_mode(lib: GpuLibrary, gpu_index: int) -> tuple[int, int]:
    """The GPU's (current, pending) MIG mode."""
    return lib.mig_mode(lib.device_by_index(gpu_index))


def set_mig_mode(lib: GpuLibrary, gpu_index: int, mode: int) -> bool:
    """Ask for a MIG mode; whether it is current now. NVML leaves it pending where the GPU needs a reset."""
    handle = lib.device_by_index(gpu_index)
    lib.set_mig_mode(handle, mode)
    current, _pending = lib.mig_mode(handle)
    return current == mode


def instances(lib: GpuLibrary, gpu_index: int) -> list[Instance]:
    """Every GPU instance on a GPU, of every profile it has."""
    gpu = lib.device_by_index(gpu_index)
    found: list[Instance] = []
    for info in profile_infos(lib, gpu):
        for gi in lib.gpu_instances(gpu, info.id):
            details = lib.gpu_instance_info(gi)
            found.append(Instance(details.id, details.profile_id, details.placement))
    return sorted(found, key=lambda i: i.gpu_instance_id)


def find_mig_device(
    lib: GpuLibrary, parent: Gpu, gpu_instance_id: int, compute_instance_id: int
) -> MigDevice:
    """The MIG device a GPU and compute instance make, as discovery reads it (UUID, device nodes)."""
    for device in mig_devices(lib, parent):
        if (device.gpu_instance_id, device.compute_instance_id) == (gpu_instance_id, compute_instance_id):
            return device
    raise GpuLibraryError(
        ERROR_NOT_FOUND,
        f"GPU {parent.index} shows no MIG device for instance {gpu_instance_id}/{compute_instance_id}",
    )
