"""The step vocabulary: what a step is; a claim's own steps (its spec, record and state) and their Runner.

A program (dra.core.prepare, .recovery, .migdevices, .vfio, .mpsdaemons) is a generator: it yields
one step at a time and is resumed with the step's result, the way a sans-I/O protocol asks for
more input. It decides everything; the executor (dra.kubeletplugin.state) only runs each step and
sends back what it returned, or throws `StepError` into the program when the step failed. A
step's `run` calls the one method of its runner that runs its kind (`WriteSpec.run` calls
`runner.write_spec`): the runner's type is the step's type parameter. Each feature's steps and the
runner of those are its own module's: the GPU's (dra.core.gpusteps, which static MIG layouts are
made of alone), MPS daemons' (.mpsdaemons), passthrough's (.vfio), time slices' (.sharing) and
device metadata files' (.devicemetadata); dra.core.prepare's `NodeRunner` runs them all. A step that
needs less of its runner is a step of every program whose runner has more.
docs/architecture.md has the table of steps in the order a prepare takes them.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

from dra.model.devices import Inventory
from dra.model.prepared import DeviceAction, Holders, PreparedClaim

T = TypeVar("T")
Obj = dict[str, Any]

#: The runner a step needs: a step for a smaller runner is a step for every larger one.
R = TypeVar("R", contravariant=True)


@dataclass(frozen=True)
class Step(abc.ABC, Generic[R]):
    """One effect or question; `point` names the crash point the executor passes right after it."""

    #: Whether the executor runs it holding the state's lock (threads and other instances).
    locked: ClassVar[bool] = True
    point: str = field(default="", kw_only=True)

    @abc.abstractmethod
    def run(self, runner: R) -> object:
        """Have the runner's method for this kind of step run it; its result."""


@dataclass(frozen=True)
class Query(Step[R], Generic[R, T]):
    """A step whose result the program needs: `yield from ask(step)` returns it (its `run` returns a T)."""


def ask(step: Query[R, T]) -> Generator[Step[R], Any, T]:
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


class Logger(Protocol):
    """What runs Log steps; every runner does."""

    def log(self, step: Log) -> None: ...


@dataclass(frozen=True)
class Log(Step[Logger]):
    """Tell the admin, in the plugin's log."""

    level: Literal["debug", "info", "warning", "error"]
    message: str

    def run(self, runner: Logger) -> None:
        return runner.log(self)


@dataclass(frozen=True)
class ClaimRead:
    """What the API server answered to a GET of a prepared claim's ResourceClaim: AskStale's answer.

    The object, or the error: its HTTP status (404: not found; 0: the server was not reached) and
    message. What it means for the claim's devices is dra.core.plan's to decide (stale_reasons).
    """

    claim: Mapping[str, Any] | None = None
    status: int = 0
    error: str = ""


@dataclass(frozen=True)
class Node:
    """What a program needs to know of the node, fixed while the plugin runs."""

    driver: str
    pool: str
    #: Where claims' MPS daemons keep their directories ("": the node runs none).
    mps_root: str = ""
    #: Whether MIG devices are made and destroyed here: a GPU of the node can do MIG (the state has the
    #: GPU library only then, dra.kubeletplugin.daemon.mig_library); else no program enters MIG code.
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

    def finished(self) -> tuple[DeviceAction, ...]:
        """The device actions done for prepared claims: those start-up keeps (the others it undoes)."""
        return tuple(a for a in self.actions if a.done and a.claim_uid in self.prepared)

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


class Runner(Logger, Protocol):
    """What runs a claim's own steps (dra.kubeletplugin.state.CallSteps): one method per kind, and Log."""

    def read_state(self, step: ReadState) -> Facts: ...
    def has_spec(self, step: HasSpec) -> bool: ...
    def spec_uids(self, step: SpecUids) -> frozenset[str]: ...
    def ask_stale(self, step: AskStale) -> Mapping[str, ClaimRead]: ...
    def missing_host_paths(self, step: MissingHostPaths) -> tuple[str, ...]: ...
    def save(self, step: Save) -> int: ...
    def mark(self, step: Mark) -> None: ...
    def remove_leftovers(self, step: RemoveLeftovers) -> None: ...
    def write_spec(self, step: WriteSpec) -> None: ...
    def remove_spec(self, step: RemoveSpec) -> None: ...
    def use_inventory(self, step: SetInventory) -> None: ...
    def sync(self, step: Sync) -> None: ...


#: A program of these steps and log lines: yields steps, is sent their results (what each step's
#: `run` returned), returns its answer.
Program = Generator[Step[Runner], Any, T]


# -- questions (their results typed), then effects --------------------------------------------
@dataclass(frozen=True)
class ReadState(Query[Runner, Facts]):
    """The state as it is now (after the lock was let go, another thread or instance may have changed it)."""

    def run(self, runner: Runner) -> Facts:
        return runner.read_state(self)


@dataclass(frozen=True)
class HasSpec(Query[Runner, bool]):
    """Whether the claim's CDI spec is on disk."""

    uid: str

    def run(self, runner: Runner) -> bool:
        return runner.has_spec(self)


@dataclass(frozen=True)
class SpecUids(Query[Runner, frozenset[str]]):
    """The UIDs of the claims whose CDI specs are on disk."""

    def run(self, runner: Runner) -> frozenset[str]:
        return runner.spec_uids(self)


@dataclass(frozen=True)
class AskStale(Query[Runner, Mapping[str, ClaimRead]]):
    """What the API server says of each holder's ResourceClaim, by UID; asked without the lock."""

    locked: ClassVar[bool] = False
    holders: tuple[PreparedClaim, ...]

    def run(self, runner: Runner) -> Mapping[str, ClaimRead]:
        return runner.ask_stale(self)


@dataclass(frozen=True)
class MissingHostPaths(Query[Runner, tuple[str, ...]]):
    """The host paths a CDI spec names that are not on this node."""

    spec: Obj

    def run(self, runner: Runner) -> tuple[str, ...]:
        return runner.missing_host_paths(self)


@dataclass(frozen=True)
class Save(Query[Runner, int]):
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
class Mark(Step[Runner]):
    """Nothing but the crash point: a place between two steps that tests kill the process at."""

    def run(self, runner: Runner) -> None:
        return runner.mark(self)


@dataclass(frozen=True)
class RemoveLeftovers(Step[Runner]):
    """Remove the temporary files a crash left beside the checkpoint and in the CDI directory."""

    def run(self, runner: Runner) -> None:
        return runner.remove_leftovers(self)


@dataclass(frozen=True)
class WriteSpec(Step[Runner]):
    """Write the claim's CDI spec, atomically.

    `compare`: leave a spec with the same bytes as it is (recovery rewrites every spec at start-up);
    a prepare's spec is one it has just decided, rarely on disk, so it is written without the read.
    """

    uid: str
    spec: Obj
    compare: bool = True

    def run(self, runner: Runner) -> None:
        return runner.write_spec(self)


@dataclass(frozen=True)
class RemoveSpec(Step[Runner]):
    """Remove the claim's CDI spec; none is fine."""

    uid: str

    def run(self, runner: Runner) -> None:
        return runner.remove_spec(self)


@dataclass(frozen=True)
class SetInventory(Step[Runner]):
    """Prepares from now on see this inventory (MIG devices made or destroyed)."""

    inventory: Inventory

    def run(self, runner: Runner) -> None:
        return runner.use_inventory(self)


@dataclass(frozen=True)
class Sync(Step[Runner]):
    """Wait until the checkpoint change numbered `ticket` is on disk; run without the lock (group commit)."""

    locked: ClassVar[bool] = False
    ticket: int

    def run(self, runner: Runner) -> None:
        return runner.sync(self)
