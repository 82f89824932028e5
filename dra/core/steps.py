"""The steps a prepare, unprepare or start-up repair is made of, as plain data.

A program (dra.core.prepare, dra.core.recovery, dra.core.migdevices) is a
generator: it yields one step at a time and is resumed with the step's result,
the way a sans-I/O protocol asks for more input. It decides everything; the
executor (dra.kubeletplugin.state) only runs each step and sends back what it
returned, or throws `StepError` into the program when the step failed.
docs/architecture.md has the table of steps in the order a prepare takes them.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

from dra.model.devices import Gpu, Inventory, MigDevice
from dra.model.pci import IommuGroup, VfioHost
from dra.model.prepared import DeviceAction, Holders, PreparedClaim

T = TypeVar("T")
Obj = dict[str, Any]
#: What the API server says of a prepared claim's ResourceClaim: gone (404), re-created (another
#: UID), deallocated, still allocated, or unreadable (any other error). dra.core.plan decides.
ClaimSeen = Literal["gone", "re-created", "deallocated", "allocated", "unreadable"]


@dataclass(frozen=True)
class Step(abc.ABC):
    """One effect or question; `point` names the crash point the executor passes right after it."""

    #: Whether the executor runs it holding the state's lock (threads and other instances).
    locked: ClassVar[bool] = True
    point: str = field(default="", kw_only=True)

    @abc.abstractmethod
    def run(self, runner: Runner) -> object:
        """Have the runner's method for this kind of step run it; its result."""


@dataclass(frozen=True)
class Query(Step, Generic[T]):
    """A step whose result the program needs: `yield from ask(step)` returns it (its `run` returns a T)."""


#: A program: yields steps, is sent their results (what each step's `run` returned), returns its answer.
Program = Generator[Step, Any, T]


def ask(step: Query[T]) -> Program[T]:
    """Yield a query and return its result: what `step.run` returned, of the query's type."""
    result: T = yield step
    return result


class StepError(Exception):
    """A step failed (a file, NVML, nvidia-smi, an MPS daemon); thrown into the program at its yield.

    `code`: NVML's return code (nvml.h's nvmlReturn_t) where the step was an NVML call, else 0.
    """

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Node:
    """What a program needs to know of the node, fixed while the plugin runs."""

    driver: str
    pool: str
    #: Where claims' MPS daemons keep their directories ("": the node runs none).
    mps_root: str = ""
    #: Whether MIG devices are made and destroyed here (a GPU library is at hand).
    mig: bool = False
    #: Whether time-slice intervals are set here.
    time_slicing: bool = False
    #: The checkpoint's path, for messages.
    checkpoint: str = ""
    #: Where claims' device metadata files go (KEP-5304), a host path.
    metadata_root: str = ""
    #: Whether claims prepared from now on get device metadata files (those that have them keep them).
    device_metadata: bool = False
    #: Whether claims may pass GPUs through (VfioDeviceConfig binds them to vfio-pci).
    vfio: bool = False
    #: N where shareable devices are divided into N equal shares (--consumable-shares=N), else 0.
    equal_shares: int = 0

    @property
    def mps(self) -> bool:
        """Whether the node runs claims' MPS control daemons."""
        return bool(self.mps_root)


@dataclass(frozen=True)
class Facts:
    """The node's state as the executor holds it: prepared claims, device actions, inventory."""

    prepared: Mapping[str, PreparedClaim]
    actions: tuple[DeviceAction, ...]
    inventory: Inventory

    @functools.cached_property
    def holders(self) -> Holders:
        """The prepared claims by device, built once for these facts."""
        return Holders(self.prepared)

    @classmethod
    def indexed(
        cls,
        prepared: Mapping[str, PreparedClaim],
        actions: tuple[DeviceAction, ...],
        inventory: Inventory,
        holders: Holders,
    ) -> Facts:
        """Facts with this holders index (the executor keeps one up to date; a replace() builds its own)."""
        facts = cls(prepared, actions, inventory)
        facts.__dict__["holders"] = holders  # the cached property's slot
        return facts


# -- questions (their results typed), then effects --------------------------------------------
@dataclass(frozen=True)
class ReadState(Query[Facts]):
    """The state as it is now (after the lock was let go, another thread or instance may have changed it)."""

    def run(self, runner: Runner) -> Facts:
        return runner.read_state(self)


@dataclass(frozen=True)
class HasSpec(Query[bool]):
    """Whether the claim's CDI spec is on disk."""

    uid: str

    def run(self, runner: Runner) -> bool:
        return runner.has_spec(self)


@dataclass(frozen=True)
class SpecUids(Query[frozenset[str]]):
    """The UIDs of the claims whose CDI specs are on disk."""

    def run(self, runner: Runner) -> frozenset[str]:
        return runner.spec_uids(self)


@dataclass(frozen=True)
class MetadataDirs(Query[frozenset[str]]):
    """The claim directories (dra.core.devicemetadata.claim_dir) under the metadata root."""

    def run(self, runner: Runner) -> frozenset[str]:
        return runner.metadata_dirs(self)


@dataclass(frozen=True)
class AskStale(Query[Mapping[str, "ClaimSeen"]]):
    """What the API server says of each holder's ResourceClaim, by UID; asked without the lock."""

    locked: ClassVar[bool] = False
    holders: tuple[PreparedClaim, ...]

    def run(self, runner: Runner) -> Mapping[str, ClaimSeen]:
        return runner.ask_stale(self)


@dataclass(frozen=True)
class MissingHostPaths(Query[tuple[str, ...]]):
    """The host paths a CDI spec names that are not on this node."""

    spec: Obj

    def run(self, runner: Runner) -> tuple[str, ...]:
        return runner.missing_host_paths(self)


@dataclass(frozen=True)
class GpuInstanceAt:
    """A GPU instance that exists on a GPU, and the memory slices it takes."""

    gpu_instance_id: int
    start: int
    size: int


@dataclass(frozen=True)
class ListGpuInstances(Query[tuple[GpuInstanceAt, ...]]):
    """Every GPU instance on the GPU, by ID."""

    gpu_index: int

    def run(self, runner: Runner) -> tuple[GpuInstanceAt, ...]:
        return runner.list_gpu_instances(self)


@dataclass(frozen=True)
class CreateGpuInstance(Query[int]):
    """Make a GPU instance of the profile at memory slices start..start+size-1; its ID."""

    gpu_index: int
    profile_id: int
    start: int
    size: int

    def run(self, runner: Runner) -> int:
        return runner.create_gpu_instance(self)


@dataclass(frozen=True)
class CreateComputeInstance(Query[int]):
    """Make the compute instance spanning the whole GPU instance (shared engines); its ID."""

    gpu_index: int
    gpu_instance_id: int
    slices: int

    def run(self, runner: Runner) -> int:
        return runner.create_compute_instance(self)


@dataclass(frozen=True)
class ReadMigMode(Query[tuple[int, int]]):
    """The GPU's (current, pending) MIG mode, 1 on and 0 off; they differ while a change awaits a reset."""

    gpu_index: int

    def run(self, runner: Runner) -> tuple[int, int]:
        return runner.read_mig_mode(self)


@dataclass(frozen=True)
class SetMigMode(Query[bool]):
    """Ask for MIG mode on (1) or off (0); whether it is current now (False: pending until a GPU reset)."""

    gpu_index: int
    mode: int

    def run(self, runner: Runner) -> bool:
        return runner.set_mig_mode(self)


@dataclass(frozen=True)
class FindMigDevice(Query[MigDevice]):
    """The MIG device a GPU instance and compute instance make, as discovery reads it."""

    gpu: Gpu
    gpu_instance_id: int
    compute_instance_id: int

    def run(self, runner: Runner) -> MigDevice:
        return runner.find_mig_device(self)


@dataclass(frozen=True)
class ReadVfioHost(Query[VfioHost]):
    """Whether the kernel runs with an IOMMU and has vfio-pci loaded."""

    def run(self, runner: Runner) -> VfioHost:
        return runner.read_vfio_host(self)


@dataclass(frozen=True)
class ReadIommuGroup(Query[IommuGroup]):
    """The IOMMU group of the PCI function at `address`, each member with its driver."""

    address: str

    def run(self, runner: Runner) -> IommuGroup:
        return runner.read_iommu_group(self)


@dataclass(frozen=True)
class Save(Query[int]):
    """Record these claims and actions in the checkpoint; the ticket `Sync` makes durable (0: already)."""

    prepared: Mapping[str, PreparedClaim]
    actions: tuple[DeviceAction, ...]
    durable: bool = True
    #: The UIDs whose claims this save adds, replaces or drops against the state it was built from;
    #: None when not said. The executor carries its holders index over the save in that time.
    changed: frozenset[str] | None = None

    def run(self, runner: Runner) -> int:
        return runner.save(self)


@dataclass(frozen=True)
class Log(Step):
    """Tell the admin, in the plugin's log."""

    level: Literal["info", "warning", "error"]
    message: str

    def run(self, runner: Runner) -> None:
        return runner.log(self)


@dataclass(frozen=True)
class Mark(Step):
    """Nothing but the crash point: a place between two steps that tests kill the process at."""

    def run(self, runner: Runner) -> None:
        return runner.mark(self)


@dataclass(frozen=True)
class RemoveLeftovers(Step):
    """Remove the temporary files a crash left beside the checkpoint and in the CDI directory."""

    def run(self, runner: Runner) -> None:
        return runner.remove_leftovers(self)


@dataclass(frozen=True)
class WriteSpec(Step):
    """Write the claim's CDI spec, atomically."""

    uid: str
    spec: Obj

    def run(self, runner: Runner) -> None:
        return runner.write_spec(self)


@dataclass(frozen=True)
class RemoveSpec(Step):
    """Remove the claim's CDI spec; none is fine."""

    uid: str

    def run(self, runner: Runner) -> None:
        return runner.remove_spec(self)


@dataclass(frozen=True)
class WriteMetadata(Step):
    """Write a claim's device metadata files, one per request, atomically; other requests' files go."""

    directory: str
    files: Mapping[str, bytes]

    def run(self, runner: Runner) -> None:
        return runner.write_metadata(self)


@dataclass(frozen=True)
class RemoveMetadata(Step):
    """Remove a claim's device metadata directory; none is fine."""

    directory: str

    def run(self, runner: Runner) -> None:
        return runner.remove_metadata(self)


@dataclass(frozen=True)
class SetInventory(Step):
    """Prepares from now on see this inventory (MIG devices made or destroyed)."""

    inventory: Inventory

    def run(self, runner: Runner) -> None:
        return runner.use_inventory(self)


@dataclass(frozen=True)
class DestroyGpuInstance(Step):
    """Destroy a GPU instance's compute instances, then the GPU instance; gone already is fine."""

    gpu_index: int
    gpu_instance_id: int

    def run(self, runner: Runner) -> None:
        return runner.destroy_gpu_instance(self)


@dataclass(frozen=True)
class BindVfio(Step):
    """Bind the PCI function at `address` to vfio-pci (override, unbind, bind); bound already is fine."""

    address: str

    def run(self, runner: Runner) -> None:
        return runner.bind_vfio(self)


@dataclass(frozen=True)
class RestorePci(Step):
    """Clear its driver_override, bind the function to `driver` ("": none); bound there already is fine."""

    address: str
    driver: str

    def run(self, runner: Runner) -> None:
        return runner.restore_pci(self)


@dataclass(frozen=True)
class Sync(Step):
    """Wait until the checkpoint change numbered `ticket` is on disk; run without the lock (group commit)."""

    locked: ClassVar[bool] = False
    ticket: int

    def run(self, runner: Runner) -> None:
        return runner.sync(self)


@dataclass(frozen=True)
class ApplyTimeSlices(Step):
    """Set these time-slice intervals, by GPU UUID."""

    wanted: Mapping[str, str]

    def run(self, runner: Runner) -> None:
        return runner.apply_time_slices(self)


@dataclass(frozen=True)
class RestoreTimeSlices(Step):
    """Give these GPUs (by UUID) back their default interval."""

    uuids: tuple[str, ...]

    def run(self, runner: Runner) -> None:
        return runner.restore_time_slices(self)


@dataclass(frozen=True)
class StartMps(Step):
    """Start the claim's MPS control daemon (a running one is adopted)."""

    claim: PreparedClaim

    def run(self, runner: Runner) -> None:
        return runner.start_mps(self)


@dataclass(frozen=True)
class ReleaseMps(Step):
    """Stop the claim's MPS daemon unless one of `others` still uses it."""

    claim: PreparedClaim
    others: Mapping[str, PreparedClaim]

    def run(self, runner: Runner) -> None:
        return runner.release_mps(self)


@dataclass(frozen=True)
class StopOtherMps(Step):
    """Stop every MPS daemon no claim of `prepared` uses."""

    prepared: Mapping[str, PreparedClaim]

    def run(self, runner: Runner) -> None:
        return runner.stop_other_mps(self)


class Runner(Protocol):
    """What runs the steps (dra.kubeletplugin.state.DeviceState): one method per kind, each step's `run`."""

    def read_state(self, step: ReadState) -> Facts: ...
    def has_spec(self, step: HasSpec) -> bool: ...
    def spec_uids(self, step: SpecUids) -> frozenset[str]: ...
    def metadata_dirs(self, step: MetadataDirs) -> frozenset[str]: ...
    def ask_stale(self, step: AskStale) -> Mapping[str, ClaimSeen]: ...
    def missing_host_paths(self, step: MissingHostPaths) -> tuple[str, ...]: ...
    def list_gpu_instances(self, step: ListGpuInstances) -> tuple[GpuInstanceAt, ...]: ...
    def create_gpu_instance(self, step: CreateGpuInstance) -> int: ...
    def create_compute_instance(self, step: CreateComputeInstance) -> int: ...
    def read_mig_mode(self, step: ReadMigMode) -> tuple[int, int]: ...
    def set_mig_mode(self, step: SetMigMode) -> bool: ...
    def find_mig_device(self, step: FindMigDevice) -> MigDevice: ...
    def read_vfio_host(self, step: ReadVfioHost) -> VfioHost: ...
    def read_iommu_group(self, step: ReadIommuGroup) -> IommuGroup: ...
    def save(self, step: Save) -> int: ...
    def log(self, step: Log) -> None: ...
    def mark(self, step: Mark) -> None: ...
    def remove_leftovers(self, step: RemoveLeftovers) -> None: ...
    def write_spec(self, step: WriteSpec) -> None: ...
    def remove_spec(self, step: RemoveSpec) -> None: ...
    def write_metadata(self, step: WriteMetadata) -> None: ...
    def remove_metadata(self, step: RemoveMetadata) -> None: ...
    def use_inventory(self, step: SetInventory) -> None: ...
    def destroy_gpu_instance(self, step: DestroyGpuInstance) -> None: ...
    def bind_vfio(self, step: BindVfio) -> None: ...
    def restore_pci(self, step: RestorePci) -> None: ...
    def sync(self, step: Sync) -> None: ...
    def apply_time_slices(self, step: ApplyTimeSlices) -> None: ...
    def restore_time_slices(self, step: RestoreTimeSlices) -> None: ...
    def start_mps(self, step: StartMps) -> None: ...
    def release_mps(self, step: ReleaseMps) -> None: ...
    def stop_other_mps(self, step: StopOtherMps) -> None: ...
