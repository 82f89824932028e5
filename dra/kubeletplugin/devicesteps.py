"""Each feature's steps run on the node: one runner class per feature, one method per step.

The protocol of each feature's steps is that feature's module's in dra.core (the GPU's:
dra.core.gpusteps); the root of every runner (the log) and the runner of a claim's own steps
(its spec, its record, the state) are dra.kubeletplugin.state's, whose `CallSteps` combines
these. Each method runs its step inside a `FeatureStep`, which gives the program the feature's
failure as StepError and passes the step's crash point. `GpuSteps` runs the GPU's steps over
the GPU library (NVML's MIG calls), and is what static MIG layouts run on with the root alone
(dra.kubeletplugin.miglayout); `MpsSteps` runs the MPS daemons' over
dra.kubeletplugin.mps, `PassthroughSteps` passthrough's over sysfs, `TimeSliceSteps` the time
slices' over dra.kubeletplugin.timeslice, and `MetadataSteps` the device metadata files' over
their store. A program calls a feature's steps only where the node has the feature
(dra.model.node.Node), so each runner asserts its part is there.
"""

from __future__ import annotations

from collections.abc import Mapping

from dra.adapters import nodefiles
from dra.adapters.metadatastore import MetadataStore
from dra.adapters.pcisysfs import PciSysfs
from dra.core import gpusteps as g
from dra.gpu import dynamic
from dra.gpu.discovery import profile_infos
from dra.gpu.library import GpuLibrary, GpuLibraryError, Placement
from dra.kubeletplugin.mps import MpsDaemons, MpsError
from dra.kubeletplugin.timeslice import TimeSliceError, TimeSlicer
from dra.model.devices import Gpu, MigDevice
from dra.model.node import StepError
from dra.model.pci import IommuGroup, VfioHost

#: What the features' steps fail with but files (OSError): raised to the program as StepError.
FEATURE_ERRORS: tuple[type[Exception], ...] = (GpuLibraryError, TimeSliceError, MpsError)


class FeatureStep(nodefiles.Step):
    """Around a feature's step: its library's, time slicer's or MPS daemon's error reaches the program as
    StepError (with NVML's return code where it has one), as a file's does."""

    __slots__ = ()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: object) -> None:
        if isinstance(err, FEATURE_ERRORS):
            raise StepError(str(err), getattr(err, "code", 0)) from err
        super().__exit__(kind, err, tb)


class GpuSteps:
    """Runs the GPU's steps (dra.core.gpusteps.GpuRunner) over the GPU library: NVML's MIG calls."""

    #: None where no GPU can do MIG (Node.mig): no program calls a GPU step.
    _lib: GpuLibrary | None

    def read_gpus(self) -> tuple[g.GpuIdentity, ...]:
        """Every GPU's index, PCI device ID, UUID and name."""
        with FeatureStep():
            lib = self._gpus()
            handles = [(i, lib.device_by_index(i)) for i in range(lib.device_count())]
            return tuple(g.GpuIdentity(i, lib.pci_device_id(h), lib.uuid(h), lib.name(h)) for i, h in handles)

    def list_instance_profiles(self, gpu_index: int) -> tuple[g.InstanceProfile, ...]:
        """The GPU's GPU-instance profiles and their placements."""
        with FeatureStep():
            lib = self._gpus()
            handle = lib.device_by_index(gpu_index)
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

    def list_gpu_instances(self, gpu_index: int) -> tuple[g.GpuInstanceAt, ...]:
        """The GPU's instances, their profiles and where they sit."""
        with FeatureStep():
            return tuple(
                g.GpuInstanceAt(i.gpu_instance_id, i.profile_id, i.placement.start, i.placement.size)
                for i in dynamic.instances(self._gpus(), gpu_index)
            )

    def has_compute_instance(self, gpu_index: int, gpu_instance_id: int) -> bool:
        """Whether the GPU instance has a compute instance."""
        with FeatureStep():
            lib = self._gpus()
            return bool(
                lib.compute_instances(lib.gpu_instance_by_id(lib.device_by_index(gpu_index), gpu_instance_id))
            )

    def create_gpu_instance(
        self, gpu_index: int, profile_id: int, start: int, size: int, *, point: str = ""
    ) -> int:
        """Make the GPU instance at the placement."""
        with FeatureStep(point):
            return dynamic.create_gpu_instance(self._gpus(), gpu_index, profile_id, Placement(start, size))

    def create_compute_instance(
        self, gpu_index: int, gpu_instance_id: int, slices: int, *, point: str = ""
    ) -> int:
        """Make the compute instance spanning the GPU instance."""
        with FeatureStep(point):
            return dynamic.create_compute_instance(self._gpus(), gpu_index, gpu_instance_id, slices)

    def find_mig_device(self, gpu: Gpu, gpu_instance_id: int, compute_instance_id: int) -> MigDevice:
        """The MIG device the instances make."""
        with FeatureStep():
            return dynamic.find_mig_device(self._gpus(), gpu, gpu_instance_id, compute_instance_id)

    def read_mig_mode(self, gpu_index: int) -> tuple[int, int]:
        """The GPU's current and pending MIG mode."""
        with FeatureStep():
            return dynamic.mig_mode(self._gpus(), gpu_index)

    def set_mig_mode(self, gpu_index: int, mode: int, *, point: str = "") -> bool:
        """Ask for the MIG mode; whether it is current."""
        with FeatureStep(point):
            return dynamic.set_mig_mode(self._gpus(), gpu_index, mode)

    def destroy_gpu_instance(self, gpu_index: int, gpu_instance_id: int, *, point: str = "") -> None:
        """Destroy the GPU instance and its compute instances."""
        with FeatureStep(point):
            dynamic.destroy(self._gpus(), gpu_index, gpu_instance_id)

    def _gpus(self) -> GpuLibrary:
        assert self._lib is not None
        return self._lib


class MpsSteps:
    """Runs the MPS daemons' steps (dra.core.mpsdaemons.MpsRunner) on the node's daemons."""

    _mps: MpsDaemons | None

    def mps_daemon_pid(self, key: str) -> int | None:
        """The pid of the MPS daemon, if it runs."""
        with FeatureStep():
            return self._daemons().pid(key)

    def list_mps_daemons(self) -> tuple[str, ...]:
        """The MPS daemons with directories."""
        with FeatureStep():
            return tuple(self._daemons().daemons())

    def launch_mps(self, uuids: tuple[str, ...], multi_user: bool, *, point: str = "") -> int:
        """Start an MPS daemon; its pid."""
        with FeatureStep(point):
            return self._daemons().launch(uuids, multi_user)

    def ask_mps(self, key: str, command: str) -> str:
        """One command to an MPS daemon; its answer."""
        with FeatureStep():
            return self._daemons().ask(key, command)

    def stop_mps(self, key: str) -> None:
        """Stop an MPS daemon and remove its directories."""
        with FeatureStep():
            self._daemons().stop(key)

    def _daemons(self) -> MpsDaemons:
        assert self._mps is not None
        return self._mps


class PassthroughSteps:
    """Runs passthrough's steps (dra.core.vfio.VfioRunner's own) on the PCI functions in sysfs."""

    _pci: PciSysfs

    def read_vfio_host(self) -> VfioHost:
        """Whether the kernel has an IOMMU and vfio-pci."""
        with FeatureStep():
            return self._pci.host()

    def read_iommu_group(self, address: str) -> IommuGroup:
        """The function's IOMMU group."""
        with FeatureStep():
            return self._pci.iommu_group(address)

    def bind_vfio(self, address: str, *, point: str = "") -> None:
        """Bind the function to vfio-pci."""
        with FeatureStep(point):
            self._pci.bind_vfio(address)

    def restore_pci(self, address: str, driver: str, *, point: str = "") -> None:
        """Give the function back to its driver."""
        with FeatureStep(point):
            self._pci.restore(address, driver)


class TimeSliceSteps:
    """Runs the time-slice steps (dra.core.sharing.TimeSliceRunner) on the node's time slicer."""

    _time_slicer: TimeSlicer | None

    def apply_time_slices(self, wanted: Mapping[str, str]) -> None:
        """Set the time-slice intervals."""
        with FeatureStep():
            self._slicer().apply(wanted)

    def restore_time_slices(self, uuids: tuple[str, ...]) -> None:
        """Give the GPUs their default interval back."""
        with FeatureStep():
            self._slicer().restore(uuids)

    def _slicer(self) -> TimeSlicer:
        assert self._time_slicer is not None
        return self._time_slicer


class MetadataSteps:
    """Runs the device metadata files' steps (dra.core.devicemetadata.MetadataRunner) on their store."""

    _metadata: MetadataStore | None

    def metadata_dirs(self) -> frozenset[str]:
        """The claim directories of the metadata root."""
        with FeatureStep():
            return self._metadata.directories() if self._metadata else frozenset()

    def write_metadata(self, directory: str, files: Mapping[str, bytes], *, point: str = "") -> None:
        """Write a claim's metadata files."""
        with FeatureStep(point):
            self._metadata_store().write(directory, files)

    def remove_metadata(self, directory: str, *, point: str = "") -> None:
        """Remove a claim's metadata directory."""
        with FeatureStep(point):
            self._metadata_store().remove(directory)

    def _metadata_store(self) -> MetadataStore:
        assert self._metadata is not None
        return self._metadata
