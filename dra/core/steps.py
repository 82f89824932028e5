"""The steps a prepare, unprepare or start-up repair is made of, as plain data.

A program (dra.core.prepare, dra.core.recovery, dra.core.migdevices) is a
generator: it yields one step at a time and is resumed with the step's result,
the way a sans-I/O protocol asks for more input. It decides everything; the
executor (dra.kubeletplugin.state) only runs each step and sends back what it
returned, or throws `StepError` into the program when the step failed.
docs/architecture.md has the table of steps in the order a prepare takes them.
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar, cast

from dra.model.devices import Gpu, Inventory, MigDevice
from dra.model.pci import IommuGroup, VfioHost
from dra.model.prepared import DeviceAction, Holders, PreparedClaim

T = TypeVar("T")
Obj = dict[str, Any]


@dataclass(frozen=True)
class Step:
    """One effect or question; `point` names the crash point the executor passes right after it."""

    #: Whether the executor runs it holding the state's lock (threads and other instances).
    locked: ClassVar[bool] = True
    point: str = field(default="", kw_only=True)


@dataclass(frozen=True)
class Query(Step, Generic[T]):
    """A step whose result the program needs: `yield from ask(step)` returns it, typed."""


#: A program: yields steps, is sent their results, returns its answer.
Program = Generator[Step, object, T]


def ask(step: Query[T]) -> Program[T]:
    """Yield a query and return its result, as the query's type says."""
    return cast(T, (yield step))


class StepError(Exception):
    """A step failed (a file, NVML, nvidia-smi, an MPS daemon); thrown into the program at its yield.

    `code` is NVML's return code for a GPU library error (0 otherwise); `placement_taken` says that
    NVML refused a GPU instance for lack of room (NVML_ERROR_INSUFFICIENT_RESOURCES).
    """

    def __init__(self, message: str, code: int = 0, *, placement_taken: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.placement_taken = placement_taken


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
        """Facts whose holders index is given (the executor keeps one of its claims up to date)."""
        facts = cls(prepared, actions, inventory)
        # The cached property's own slot; a copy made with replace() builds its own index.
        facts.__dict__["holders"] = holders
        return facts


# -- questions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadState(Query[Facts]):
    """The state as it is now (after the lock was let go, another thread or instance may have changed it)."""


@dataclass(frozen=True)
class HasSpec(Query[bool]):
    """Whether the claim's CDI spec is on disk."""

    uid: str


@dataclass(frozen=True)
class SpecUids(Query[frozenset[str]]):
    """The UIDs of the claims whose CDI specs are on disk."""


@dataclass(frozen=True)
class MetadataDirs(Query[frozenset[str]]):
    """The claim directories (dra.core.devicemetadata.claim_dir) under the metadata root."""


@dataclass(frozen=True)
class AskStale(Query[Mapping[str, str]]):
    """Which of these holders the API server says are gone, by UID, with why; asked without the lock."""

    locked: ClassVar[bool] = False
    holders: tuple[PreparedClaim, ...]


@dataclass(frozen=True)
class MissingHostPaths(Query[tuple[str, ...]]):
    """The host paths a CDI spec names that are not on this node."""

    spec: Obj


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


@dataclass(frozen=True)
class CreateGpuInstance(Query[int]):
    """Make a GPU instance of the profile at memory slices start..start+size-1; its ID."""

    gpu_index: int
    profile_id: int
    start: int
    size: int


@dataclass(frozen=True)
class CreateComputeInstance(Query[int]):
    """Make the compute instance spanning the whole GPU instance (shared engines); its ID."""

    gpu_index: int
    gpu_instance_id: int
    slices: int


@dataclass(frozen=True)
class ReadMigMode(Query[tuple[int, int]]):
    """The GPU's (current, pending) MIG mode, 1 on and 0 off; they differ while a change awaits a reset."""

    gpu_index: int


@dataclass(frozen=True)
class SetMigMode(Query[bool]):
    """Ask for MIG mode on (1) or off (0); whether it is current now (False: pending until a GPU reset)."""

    gpu_index: int
    mode: int


@dataclass(frozen=True)
class FindMigDevice(Query[MigDevice]):
    """The MIG device a GPU instance and compute instance make, as discovery reads it."""

    gpu: Gpu
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class ReadVfioHost(Query[VfioHost]):
    """Whether the kernel runs with an IOMMU and has vfio-pci loaded."""


@dataclass(frozen=True)
class ReadIommuGroup(Query[IommuGroup]):
    """The IOMMU group of the PCI function at `address`, each member with its driver."""

    address: str


@dataclass(frozen=True)
class Save(Query[int]):
    """Record these claims and actions in the checkpoint; the ticket `Sync` makes durable (0: already)."""

    prepared: Mapping[str, PreparedClaim]
    actions: tuple[DeviceAction, ...]
    durable: bool = True
    #: The UIDs whose claims this save adds, replaces or drops against the state it was built from;
    #: None when not said. The executor carries its holders index over the save in that time.
    changed: frozenset[str] | None = None


# -- effects -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Log(Step):
    """Tell the admin, in the plugin's log."""

    level: Literal["info", "warning", "error"]
    message: str


@dataclass(frozen=True)
class Mark(Step):
    """Nothing but the crash point: a place between two steps that tests kill the process at."""


@dataclass(frozen=True)
class RemoveLeftovers(Step):
    """Remove the temporary files a crash left beside the checkpoint and in the CDI directory."""


@dataclass(frozen=True)
class WriteSpec(Step):
    """Write the claim's CDI spec, atomically."""

    uid: str
    spec: Obj


@dataclass(frozen=True)
class RemoveSpec(Step):
    """Remove the claim's CDI spec; none is fine."""

    uid: str


@dataclass(frozen=True)
class WriteMetadata(Step):
    """Write a claim's device metadata files, one per request, atomically; other requests' files go."""

    directory: str
    files: Mapping[str, bytes]


@dataclass(frozen=True)
class RemoveMetadata(Step):
    """Remove a claim's device metadata directory; none is fine."""

    directory: str


@dataclass(frozen=True)
class SetInventory(Step):
    """Prepares from now on see this inventory (MIG devices made or destroyed)."""

    inventory: Inventory


@dataclass(frozen=True)
class DestroyGpuInstance(Step):
    """Destroy a GPU instance's compute instances, then the GPU instance; gone already is fine."""

    gpu_index: int
    gpu_instance_id: int


@dataclass(frozen=True)
class BindVfio(Step):
    """Bind the PCI function at `address` to vfio-pci (override, unbind, bind); bound already is fine."""

    address: str


@dataclass(frozen=True)
class RestorePci(Step):
    """Clear its driver_override, bind the function to `driver` ("": none); bound there already is fine."""

    address: str
    driver: str


@dataclass(frozen=True)
class Sync(Step):
    """Wait until the checkpoint change numbered `ticket` is on disk; run without the lock (group commit)."""

    locked: ClassVar[bool] = False
    ticket: int


@dataclass(frozen=True)
class ApplyTimeSlices(Step):
    """Set these time-slice intervals, by GPU UUID."""

    wanted: Mapping[str, str]


@dataclass(frozen=True)
class RestoreTimeSlices(Step):
    """Give these GPUs (by UUID) back their default interval."""

    uuids: tuple[str, ...]


@dataclass(frozen=True)
class StartMps(Step):
    """Start the claim's MPS control daemon (a running one is adopted)."""

    claim: PreparedClaim


@dataclass(frozen=True)
class ReleaseMps(Step):
    """Stop the claim's MPS daemon unless one of `others` still uses it."""

    claim: PreparedClaim
    others: Mapping[str, PreparedClaim]


@dataclass(frozen=True)
class StopOtherMps(Step):
    """Stop every MPS daemon no claim of `prepared` uses."""

    prepared: Mapping[str, PreparedClaim]
