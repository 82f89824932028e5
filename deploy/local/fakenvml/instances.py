"""The NVML stand-in's GPU-instance and compute-instance functions (nvml.h), over its fake GPUs.

fakenvml.standin.NvmlStandIn answers these through InstanceCalls, with its
handles: a GPU instance's handle names its GPU's, a compute instance's its
GPU instance's, and a destroyed instance's handle is invalid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dra.gpu import migtables
from dra.gpu.library import (
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ComputeInstanceHandle,
    GpuInstanceHandle,
    GpuLibraryError,
    Placement,
)
from fakenvml.abi import (
    CI,
    GI,
    ComputeInstanceInfo,
    ComputeInstanceProfileInfo,
    ComputeInstanceProfileInfoV2,
    GpuInstanceInfo,
    GpuInstancePlacement,
    GpuInstanceProfileInfo,
    GpuInstanceProfileInfoV2,
    at,
    ptr,
    set_uint,
    versioned,
)

if TYPE_CHECKING:
    from fakenvml.standin import NvmlStandIn


class InstanceCalls:
    """nvmlDevice*GpuInstance*, nvmlGpuInstance* and nvmlComputeInstance* over a stand-in's fake."""

    def __init__(self, lib: NvmlStandIn) -> None:
        self._lib = lib

    def gpu_instance_profile_info(self, device: int, profile: int, out: int) -> None:
        """nvmlDeviceGetGpuInstanceProfileInfoV."""
        info = versioned(out, GpuInstanceProfileInfoV2, 2)
        info.name = self._gpu_instance_profile(info, device, profile).encode()

    def gpu_instance_profile_info_v1(self, device: int, profile: int, out: int) -> None:
        """nvmlDeviceGetGpuInstanceProfileInfo: the same without a version or a name."""
        self._gpu_instance_profile(at(out, GpuInstanceProfileInfo), device, profile)

    def _gpu_instance_profile(self, info: Any, device: int, profile: int) -> str:
        """Fill the fields both layouts share; the profile's name."""
        p = self._lib.fake.gpu_instance_profile_info(self._lib.gpu(device), profile)
        info.id, info.isP2pSupported = p.id, 0
        info.sliceCount, info.instanceCount = p.slice_count, p.instance_count
        e = p.engines
        info.multiprocessorCount, info.copyEngineCount = e.multiprocessors, e.copy_engines
        info.decoderCount, info.encoderCount, info.jpegCount = e.decoders, e.encoders, e.jpeg_engines
        info.ofaCount, info.memorySizeMB = e.ofa_engines, p.memory_mib
        return p.name

    def possible_placements(self, device: int, profile_id: int, placements: int | None, count: int) -> None:
        """nvmlDeviceGetGpuInstancePossiblePlacements_v2."""
        found = self._lib.fake.gpu_instance_possible_placements(self._lib.gpu(device), profile_id)
        # nvml.h: placements may be NULL, to learn the count first.
        if placements:
            array = at(placements, GpuInstancePlacement * len(found))
            for slot, placement in zip(array, found, strict=True):
                slot.start, slot.size = placement.start, placement.size
        set_uint(count, len(found))

    def create_gpu_instance(self, device: int, profile_id: int, placement: int, out: int) -> None:
        """nvmlDeviceCreateGpuInstanceWithPlacement."""
        where = at(placement, GpuInstancePlacement)
        gi = self._lib.fake.create_gpu_instance_with_placement(
            self._lib.gpu(device), profile_id, Placement(where.start, where.size)
        )
        at(out, ptr).value = self._lib.handle(GI, gi, device)

    def gpu_instances(self, device: int, profile_id: int, out: int, count: int) -> None:
        """nvmlDeviceGetGpuInstances."""
        found = self._lib.fake.gpu_instances(self._lib.gpu(device), profile_id)
        if found:
            array = at(out, ptr * len(found))
            for slot, gi in enumerate(found):
                array[slot] = self._lib.handle(GI, gi, device)
        set_uint(count, len(found))

    def gpu_instance_by_id(self, device: int, gpu_instance_id: int, out: int) -> None:
        """nvmlDeviceGetGpuInstanceById."""
        gi = self._lib.fake.gpu_instance_by_id(self._lib.gpu(device), gpu_instance_id)
        at(out, ptr).value = self._lib.handle(GI, gi, device)

    def _gi(self, address: int | None) -> tuple[GpuInstanceHandle, int]:
        """A GPU instance that still exists (a destroyed one's handle is invalid)."""
        gi, parent = self._lib.lookup(address, GI)
        try:
            self._lib.fake.gpu_instance_info(GpuInstanceHandle(gi))
        except GpuLibraryError as err:
            if err.code == ERROR_NOT_FOUND:
                raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "this GPU instance is gone") from None
            raise
        return GpuInstanceHandle(gi), parent

    def _ci(self, address: int | None) -> tuple[ComputeInstanceHandle, int]:
        ci, gi = self._lib.lookup(address, CI)
        return ComputeInstanceHandle(ci), gi

    def gpu_instance_info(self, address: int, out: int) -> None:
        """nvmlGpuInstanceGetInfo."""
        gi, parent = self._gi(address)
        details = self._lib.fake.gpu_instance_info(gi)
        info = at(out, GpuInstanceInfo)
        info.device, info.id, info.profileId = parent, details.id, details.profile_id
        info.placement.start, info.placement.size = details.placement.start, details.placement.size

    def destroy_gpu_instance(self, address: int) -> None:
        """nvmlGpuInstanceDestroy."""
        self._lib.fake.destroy_gpu_instance(self._gi(address)[0])

    def _gi_slices(self, address: int | None) -> tuple[GpuInstanceHandle, int]:
        gi, parent = self._gi(address)
        info = self._lib.fake.gpu_instance_info(gi)
        table = self._lib.fake.profile.gpus[int(str(self._lib.gpu(parent)))].model.mig_table
        return gi, next(p.slices for p in table if p.id == info.profile_id)

    def compute_instance_profile_info(self, address: int, profile: int, engines: int, out: int) -> None:
        """nvmlGpuInstanceGetComputeInstanceProfileInfoV."""
        info = versioned(out, ComputeInstanceProfileInfoV2, 2)
        info.name = self._compute_instance_profile(info, address, profile, engines).encode()

    def compute_instance_profile_info_v1(self, address: int, profile: int, engines: int, out: int) -> None:
        """nvmlGpuInstanceGetComputeInstanceProfileInfo: the same without a version or a name."""
        self._compute_instance_profile(at(out, ComputeInstanceProfileInfo), address, profile, engines)

    def _compute_instance_profile(self, info: Any, address: int, profile: int, engines: int) -> str:
        """Fill the fields both layouts share; the profile's name."""
        _, own = self._gi_slices(address)
        slices = migtables.SLICES_BY_COMPUTE_PROFILE.get(profile)
        if profile >= 9 or engines != 0:  # NVML_COMPUTE_INSTANCE_PROFILE_COUNT, ..._ENGINE_PROFILE_COUNT
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no compute instance profile {profile}/{engines}")
        if slices is None or slices > own:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"a {own}-slice GPU instance has no profile {profile}")
        # The fake keeps no compute-instance profile table: the multiprocessors and engines of a
        # compute instance are a share of its GPU instance's, which the driver never reads.
        info.id, info.sliceCount, info.instanceCount = profile, slices, own // slices
        return f"{slices}c" if slices < own else f"{own}g"

    def create_compute_instance(self, address: int, profile_id: int, out: int) -> None:
        """nvmlGpuInstanceCreateComputeInstance."""
        ci = self._lib.fake.create_compute_instance(self._gi(address)[0], profile_id)
        at(out, ptr).value = self._lib.handle(CI, ci, address)

    def compute_instances(self, address: int, profile_id: int, out: int, count: int) -> None:
        """nvmlGpuInstanceGetComputeInstances."""
        gi, own = self._gi_slices(address)
        # The fake records no compute instance's profile; it makes only whole-instance ones, so
        # every compute instance is listed under the profile spanning its GPU instance.
        found = (
            self._lib.fake.compute_instances(gi)
            if profile_id == migtables.COMPUTE_PROFILE_BY_SLICES[own]
            else []
        )
        if found:
            array = at(out, ptr * len(found))
            for slot, ci in enumerate(found):
                array[slot] = self._lib.handle(CI, ci, address)
        set_uint(count, len(found))

    def compute_instance_by_id(self, address: int, compute_instance_id: int, out: int) -> None:
        """nvmlGpuInstanceGetComputeInstanceById."""
        gi, _ = self._gi(address)
        for ci in self._lib.fake.compute_instances(gi):
            if self._lib.fake.compute_instance_info_id(ci) == compute_instance_id:
                at(out, ptr).value = self._lib.handle(CI, ci, address)
                return
        raise GpuLibraryError(
            ERROR_NOT_FOUND, f"no compute instance {compute_instance_id} in this GPU instance"
        )

    def compute_instance_info(self, address: int, out: int) -> None:
        """nvmlComputeInstanceGetInfo_v2."""
        ci, gi_address = self._ci(address)
        gi, own = self._gi_slices(gi_address)
        if ci not in self._lib.fake.compute_instances(gi):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "the compute instance of this handle is gone")
        info = at(out, ComputeInstanceInfo)
        info.device, info.gpuInstance = self._lib.lookup(gi_address, GI)[1], gi_address
        info.id = self._lib.fake.compute_instance_info_id(ci)
        info.profileId = migtables.COMPUTE_PROFILE_BY_SLICES[own]
        info.placement.start, info.placement.size = 0, own

    def destroy_compute_instance(self, address: int) -> None:
        """nvmlComputeInstanceDestroy."""
        self._lib.fake.destroy_compute_instance(self._ci(address)[0])
