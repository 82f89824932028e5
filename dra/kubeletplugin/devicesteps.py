"""Each feature's steps run on the node: one runner class per feature, one method per kind of step.

Each feature's steps, and the runner protocol they name, are that feature's module's in dra.core
(the GPU's: dra.core.gpusteps); the executor, the root of every runner (a step run by its kind's
method, and Log) and the runner of a claim's own steps (its spec, its record, the state) are
dra.kubeletplugin.state's, whose `CallSteps` combines these. `GpuSteps` runs the GPU's steps over
the GPU library (NVML's MIG calls), and is what static MIG layouts run on with the root alone
(dra.kubeletplugin.miglayout); `MpsSteps` runs the MPS daemons' over
dra.kubeletplugin.mps, `PassthroughSteps` passthrough's over sysfs, `TimeSliceSteps` the time
slices' over dra.kubeletplugin.timeslice, and `MetadataSteps` the device metadata files' over
their store. A program yields a feature's steps only where the node has the feature
(dra.core.steps.Node), so each runner asserts its part is there.
"""

from __future__ import annotations

from dra.adapters.metadatastore import MetadataStore
from dra.adapters.pcisysfs import PciSysfs
from dra.core import devicemetadata as m
from dra.core import gpusteps as g
from dra.core import mpsdaemons, sharing, vfio
from dra.gpu import dynamic
from dra.gpu.discovery import profile_infos
from dra.gpu.library import GpuLibrary, GpuLibraryError, Placement
from dra.kubeletplugin.mps import MpsDaemons, MpsError
from dra.kubeletplugin.timeslice import TimeSliceError, TimeSlicer
from dra.model.devices import MigDevice
from dra.model.pci import IommuGroup, VfioHost

#: What the features' steps fail with but files (OSError): thrown into the program as StepError.
FEATURE_ERRORS: tuple[type[Exception], ...] = (GpuLibraryError, TimeSliceError, MpsError)


class GpuSteps:
    """Runs the GPU's steps (dra.core.gpusteps.GpuRunner) over the GPU library: NVML's MIG calls."""

    #: None where no GPU can do MIG (Node.mig): no program yields a GPU step.
    _lib: GpuLibrary | None

    def read_gpus(self, step: g.ReadGpus) -> tuple[g.GpuIdentity, ...]:
        """Every GPU's index, PCI device ID, UUID and name."""
        lib = self._gpus()
        handles = [(i, lib.device_by_index(i)) for i in range(lib.device_count())]
        return tuple(g.GpuIdentity(i, lib.pci_device_id(h), lib.uuid(h), lib.name(h)) for i, h in handles)

    def list_instance_profiles(self, step: g.ListInstanceProfiles) -> tuple[g.InstanceProfile, ...]:
        """The GPU's GPU-instance profiles and their placements."""
        lib = self._gpus()
        handle = lib.device_by_index(step.gpu_index)
        found = []
        for info in profile_infos(lib, handle):
            placements = lib.gpu_instance_possible_placements(handle, info.id)
            found.append(
                g.InstanceProfile(
                    info.name.removeprefix("MIG ").strip(),
                    info.id,
                    info.slice_count,
                    placements[0].size if placements else 0,
                    tuple(p.start for p in placements),
                    info.instance_count,
                )
            )
        return tuple(found)

    def list_gpu_instances(self, step: g.ListGpuInstances) -> tuple[g.GpuInstanceAt, ...]:
        """The GPU's instances, their profiles and where they sit."""
        return tuple(
            g.GpuInstanceAt(i.gpu_instance_id, i.profile_id, i.placement.start, i.placement.size)
            for i in dynamic.instances(self._gpus(), step.gpu_index)
        )

    def has_compute_instance(self, step: g.HasComputeInstance) -> bool:
        """Whether the GPU instance has a compute instance."""
        lib = self._gpus()
        return bool(
            lib.compute_instances(
                lib.gpu_instance_by_id(lib.device_by_index(step.gpu_index), step.gpu_instance_id)
            )
        )

    def create_gpu_instance(self, step: g.CreateGpuInstance) -> int:
        """Make the GPU instance at the placement."""
        placement = Placement(step.start, step.size)
        return dynamic.create_gpu_instance(self._gpus(), step.gpu_index, step.profile_id, placement)

    def create_compute_instance(self, step: g.CreateComputeInstance) -> int:
        """Make the compute instance spanning the GPU instance."""
        return dynamic.create_compute_instance(
            self._gpus(), step.gpu_index, step.gpu_instance_id, step.slices
        )

    def find_mig_device(self, step: g.FindMigDevice) -> MigDevice:
        """The MIG device the instances make."""
        return dynamic.find_mig_device(self._gpus(), step.gpu, step.gpu_instance_id, step.compute_instance_id)

    def read_mig_mode(self, step: g.ReadMigMode) -> tuple[int, int]:
        """The GPU's current and pending MIG mode."""
        return dynamic.mig_mode(self._gpus(), step.gpu_index)

    def set_mig_mode(self, step: g.SetMigMode) -> bool:
        """Ask for the MIG mode; whether it is current."""
        return dynamic.set_mig_mode(self._gpus(), step.gpu_index, step.mode)

    def destroy_gpu_instance(self, step: g.DestroyGpuInstance) -> None:
        """Destroy the GPU instance and its compute instances."""
        dynamic.destroy(self._gpus(), step.gpu_index, step.gpu_instance_id)

    def _gpus(self) -> GpuLibrary:
        assert self._lib is not None
        return self._lib


class MpsSteps:
    """Runs the MPS daemons' steps (dra.core.mpsdaemons.MpsRunner) on the node's daemons."""

    _mps: MpsDaemons | None

    def mps_daemon_pid(self, step: mpsdaemons.MpsDaemonPid) -> int | None:
        """The pid of the MPS daemon, if it runs."""
        return self._daemons().pid(step.key)

    def list_mps_daemons(self, step: mpsdaemons.ListMpsDaemons) -> tuple[str, ...]:
        """The MPS daemons with directories."""
        return tuple(self._daemons().daemons())

    def launch_mps(self, step: mpsdaemons.LaunchMps) -> int:
        """Start an MPS daemon; its pid."""
        return self._daemons().launch(step.uuids, step.multi_user)

    def ask_mps(self, step: mpsdaemons.AskMps) -> str:
        """One command to an MPS daemon; its answer."""
        return self._daemons().ask(step.key, step.command)

    def stop_mps(self, step: mpsdaemons.StopMps) -> None:
        """Stop an MPS daemon and remove its directories."""
        self._daemons().stop(step.key)

    def _daemons(self) -> MpsDaemons:
        assert self._mps is not None
        return self._mps


class PassthroughSteps:
    """Runs passthrough's steps (dra.core.vfio.VfioRunner's own) on the PCI functions in sysfs."""

    _pci: PciSysfs

    def read_vfio_host(self, step: vfio.ReadVfioHost) -> VfioHost:
        """Whether the kernel has an IOMMU and vfio-pci."""
        return self._pci.host()

    def read_iommu_group(self, step: vfio.ReadIommuGroup) -> IommuGroup:
        """The function's IOMMU group."""
        return self._pci.iommu_group(step.address)

    def bind_vfio(self, step: vfio.BindVfio) -> None:
        """Bind the function to vfio-pci."""
        self._pci.bind_vfio(step.address)

    def restore_pci(self, step: vfio.RestorePci) -> None:
        """Give the function back to its driver."""
        self._pci.restore(step.address, step.driver)


class TimeSliceSteps:
    """Runs the time-slice steps (dra.core.sharing.TimeSliceRunner) on the node's time slicer."""

    _time_slicer: TimeSlicer | None

    def apply_time_slices(self, step: sharing.ApplyTimeSlices) -> None:
        """Set the time-slice intervals."""
        self._slicer().apply(step.wanted)

    def restore_time_slices(self, step: sharing.RestoreTimeSlices) -> None:
        """Give the GPUs their default interval back."""
        self._slicer().restore(step.uuids)

    def _slicer(self) -> TimeSlicer:
        assert self._time_slicer is not None
        return self._time_slicer


class MetadataSteps:
    """Runs the device metadata files' steps (dra.core.devicemetadata.MetadataRunner) on their store."""

    _metadata: MetadataStore | None

    def metadata_dirs(self, step: m.MetadataDirs) -> frozenset[str]:
        """The claim directories of the metadata root."""
        return self._metadata.directories() if self._metadata else frozenset()

    def write_metadata(self, step: m.WriteMetadata) -> None:
        """Write a claim's metadata files."""
        self._metadata_store().write(step.directory, step.files)

    def remove_metadata(self, step: m.RemoveMetadata) -> None:
        """Remove a claim's metadata directory."""
        self._metadata_store().remove(step.directory)

    def _metadata_store(self) -> MetadataStore:
        assert self._metadata is not None
        return self._metadata
