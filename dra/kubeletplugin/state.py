"""The node's prepared claims and their durable record, and the runner of the programs of dra.core on them.

The programs (dra.core.prepare, .recovery) decide; `DeviceState` holds what they decide on (the
prepared claims, the device actions, the inventory) and calls each call's program with a
`CallSteps` of its own: one method per step of a claim's own, over the CDI directory, the
checkpoint and the state, with the call's stale check; each runs inside a `nodefiles.Step`, which
gives the program a failure as StepError and passes the step's crash point. Each feature's steps
(the GPU's MIG calls, MPS daemons, passthrough, time slices, metadata files) are run by that
feature's runner, which `CallSteps` extends (dra.kubeletplugin.devicesteps) over `Steps`, the root
every runner has (the log). Around the steps, each in one place:

- the lock (`_Hold`): a thread lock and the checkpoint's flock, since in a rolling update two
  instances share the checkpoint and the CDI directory; the two steps that wait on others (asking
  the API server about holders, waiting for the fsync) let it go and take it again;
- adoption (`DeviceState._adopt`): when the other instance saved, its record is read and the MIG
  devices it made adopted, on taking the lock;
- group commit (`GroupCommit`): a prepare's fsync waits, briefly, for the programs started
  beside it.

Calls block on file I/O and run in worker threads. docs/architecture.md, "Preparing a claim, step
by step", has the order and why.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from dra.adapters import nodefiles
from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.metadatastore import MetadataStore
from dra.adapters.nodefiles import CdiStore
from dra.adapters.pcisysfs import PciSysfs
from dra.core import migdevices, recovery
from dra.core import prepare as programs
from dra.gpu.library import GpuLibrary
from dra.kubeletplugin.devicesteps import (
    GpuSteps,
    MetadataSteps,
    MpsSteps,
    PassthroughSteps,
    TimeSliceSteps,
)
from dra.kubeletplugin.mps import MpsDaemons
from dra.kubeletplugin.timeslice import TimeSlicer
from dra.model.allocation import ClaimAllocation
from dra.model.devices import Inventory
from dra.model.node import ClaimRead, Facts, Level, Node, StepError
from dra.model.prepared import VFIO_BIND, DeviceAction, Holders, PreparedClaim

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The most a save's fsync waits for the programs running beside it to reach their own, so that one
#: fsync covers the burst (docs/testing.md, issue 44): a few programs' decisions, well under a disk's fsync.
GROUP_WAIT = 0.005

_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

#: Answers ask_stale: what the API server answered for each of these prepared claims, by UID (absent: live).
StaleCheck = Callable[[Sequence[PreparedClaim]], Mapping[str, ClaimRead]]
Obj = dict[str, Any]


def _every_holder_live(holders: Sequence[PreparedClaim]) -> Mapping[str, ClaimRead]:
    return {}


def _held_by_caller(locked: bool) -> None:
    """The lock of a runner whose caller holds the state's lock throughout (adoption)."""


class DeviceState:
    """The node's prepared claims and their record; runs prepares, unprepares and the start-up repair."""

    def __init__(
        self,
        driver: str,
        node_name: str,
        inventory: Inventory,
        cdi_store: CdiStore,
        checkpoint: CheckpointStore,
        lib: GpuLibrary | None = None,
        time_slicer: TimeSlicer | None = None,
        mps: MpsDaemons | None = None,
        pci: PciSysfs | None = None,
        vfio: bool = False,
        equal_shares: int = 0,
        metadata: MetadataStore | None = None,
        device_metadata: bool = False,
    ) -> None:
        """`pci` is the sysfs GPUs are passed through by ("/" when None); `vfio` lets claims do so.

        `metadata` keeps claims' metadata files (KEP-5304); with `device_metadata` new claims get them.
        """
        self.driver = driver
        self.pool = node_name
        self.inventory = inventory
        self._node = Node(
            driver,
            node_name,
            mps_root=str(mps.root) if mps is not None else "",
            mig=lib is not None,
            time_slicing=time_slicer is not None,
            checkpoint=str(checkpoint.path),
            vfio=vfio,
            equal_shares=equal_shares,
            metadata_root=str(metadata.root) if metadata is not None else "",
            device_metadata=device_metadata and metadata is not None,
        )
        self._lib = lib
        self._cdi = cdi_store
        self._metadata = metadata
        self._checkpoint = checkpoint
        self._time_slicer = time_slicer
        self._mps = mps
        # Also without `vfio`: start-up gives back GPUs a run with passthrough on left bound.
        self._pci = pci or PciSysfs()
        self._lock = threading.Lock()
        self._group = GroupCommit(checkpoint)
        prepared, actions = checkpoint.load_state()
        # Replaced by each save, never changed in place: a program's Facts can hold them without a copy.
        self._prepared: Mapping[str, PreparedClaim] = prepared
        self._actions = tuple(actions)
        #: Who holds which device: carried over each save that says what it changed, else rebuilt.
        self._holders = Holders(prepared)

    @property
    def prepared(self) -> Mapping[str, PreparedClaim]:
        """Prepared claims by UID (a snapshot)."""
        return dict(self._prepared)

    @property
    def actions(self) -> list[DeviceAction]:
        """Device actions the checkpoint records (a snapshot)."""
        return list(self._actions)

    def passed_through(self) -> frozenset[str]:
        """The UUIDs of the GPUs claims pass through (bound to vfio-pci, or being bound or given back)."""
        return frozenset(str(a.params["gpu"]) for a in self._actions if a.kind == VFIO_BIND)

    def _facts(self) -> Facts:
        if self._holders.prepared is not self._prepared:
            self._holders = Holders(self._prepared)
        return Facts.indexed(self._prepared, self._actions, self.inventory, self._holders)

    def _saved(
        self,
        prepared: Mapping[str, PreparedClaim],
        actions: tuple[DeviceAction, ...],
        changed: frozenset[str] | None,
    ) -> None:
        """The record is what was saved (its holders carried over when the save says what changed)."""
        if changed is not None and self._holders.prepared is self._prepared:
            self._holders = self._holders.updated(prepared, changed)
        self._prepared, self._actions = prepared, actions

    # -- the calls -------------------------------------------------------------------------------

    def prepare(self, allocation: ClaimAllocation, stale: StaleCheck = _every_holder_live) -> PreparedClaim:
        """Prepare a claim, or return its recorded answer; ClaimError when it cannot be, and nothing changes.

        `stale` is asked, without the lock, about prepared claims that hold a device the allocation
        needs; by default every holder is live and refuses the claim.
        """
        return self._run(lambda steps, facts: programs.prepare(steps, self._node, allocation, facts), stale)

    def unprepare(self, uid: str) -> PreparedClaim | None:
        """Undo a prepare; an unknown claim is fine (its stray spec, if any, goes too)."""
        return self._run(lambda steps, facts: programs.unprepare(steps, self._node, uid, facts))

    def recover(self) -> None:
        """After a restart: drop specs of claims not prepared, (re)write the specs of prepared ones."""
        self._run(lambda steps, facts: recovery.recover(steps, self._node, facts))

    def set_inventory(self, inventory: Inventory) -> None:
        """Devices changed: new prepares see the new inventory; prepared claims stay as they are."""
        with self._lock:
            self.inventory = inventory

    def relayout(
        self,
        change: Callable[[Mapping[str, PreparedClaim], Sequence[DeviceAction]], tuple[T, Inventory | None]],
    ) -> tuple[T, Inventory | None]:
        """Change the GPUs' MIG layout and this inventory in one lock hold: no prepare runs between the two,
        so none is given a MIG device the change destroyed. `change` gets the prepared claims and the
        device actions (what it must keep) and returns its result and the new inventory (None: as it
        is); so does this.
        """
        with _Hold(self):
            result, inventory = change(dict(self._prepared), list(self._actions))
            if inventory is not None:
                self.inventory = inventory
            return result, inventory

    def _run(self, program: Callable[[CallSteps, Facts], T], stale: StaleCheck = _every_holder_live) -> T:
        """Call a program on the state as it is under the lock (its two waiting steps let the lock go)."""
        call = CallSteps(self, stale, self._group.join())
        try:
            with _Hold(self) as hold:
                call.hold = hold.set
                return program(call, self._facts())
        except StepError as failed:
            # The program did not handle it: the step's own error, as before there were steps.
            raise failed.__cause__ or failed from None
        finally:
            self._group.leave(call.member)

    # -- the lock, and adoption ------------------------------------------------------------------

    def _adopt(self, prepared: Mapping[str, PreparedClaim], actions: Sequence[DeviceAction]) -> None:
        """Take the record another instance saved, and adopt the MIG devices it made (the lock is held)."""
        self._prepared, self._actions = prepared, tuple(actions)
        if self._node.mig:
            migdevices.adopt(CallSteps(self, _every_holder_live, None), self._node, self._facts())


class Steps:
    """The root of every runner: the log a program writes to."""

    def __init__(self, logger: logging.Logger) -> None:
        """Log lines go to `logger`."""
        self._logger = logger

    def log(self, level: Level, message: str) -> None:
        """Write the line to the plugin's log."""
        self._logger.log(_LOG_LEVELS[level], "%s", message)


class CallSteps(Steps, GpuSteps, MpsSteps, PassthroughSteps, TimeSliceSteps, MetadataSteps):
    """Runs one call's steps on the state: one method per step of a claim's own (dra.core.prepare's
    NodeRunner), with the call's stale check and its place in the group commit; each feature's steps
    are run by the runner of that feature it extends (dra.kubeletplugin.devicesteps)."""

    def __init__(self, state: DeviceState, stale: StaleCheck, member: Member | None) -> None:
        super().__init__(log)
        self._lib = state._lib
        self._state = state
        self._stale = stale
        self.member = member
        #: Lets the state's lock go (False) or takes it again (True): the call's hold (DeviceState._run).
        self.hold: Callable[[bool], None] = _held_by_caller
        self._cdi, self._checkpoint, self._metadata = state._cdi, state._checkpoint, state._metadata
        self._pci, self._time_slicer, self._mps = state._pci, state._time_slicer, state._mps

    def ask_stale(self, holders: tuple[PreparedClaim, ...]) -> Mapping[str, ClaimRead]:
        """The call's stale check (DeviceState.prepare's `stale`), without the lock: the API server
        may take its time, and prepares of other claims go on meanwhile."""
        self.hold(False)
        try:
            with nodefiles.Step():
                return self._stale(holders)
        finally:
            self.hold(True)

    def read_state(self) -> Facts:
        """The state as it is now (since the lock was let go, another thread or instance may have saved)."""
        with nodefiles.Step():
            return self._state._facts()

    def has_spec(self, uid: str) -> bool:
        """Whether the claim's spec is on disk."""
        with nodefiles.Step():
            return self._cdi.exists(uid)

    def spec_uids(self) -> frozenset[str]:
        """The claims whose specs are on disk."""
        with nodefiles.Step():
            return frozenset(self._cdi.claim_uids())

    def missing_host_paths(self, spec: Obj) -> tuple[str, ...]:
        """The spec's host paths that are not on this node."""
        with nodefiles.Step():
            return tuple(self._cdi.missing_host_paths(spec))

    def save(
        self,
        prepared: Mapping[str, PreparedClaim],
        actions: tuple[DeviceAction, ...],
        *,
        durable: bool = True,
        changed: frozenset[str] | None = None,
        point: str = "",
    ) -> int:
        """Record the claims and actions; the ticket `sync` makes durable (0: durable already). The state
        is what was saved; `changed` (the UIDs the save adds, replaces or drops, None when not said)
        carries its holders index over."""
        with nodefiles.Step(point):
            # The very mapping saved last: no claim changed (a save replaces the mapping, never edits it),
            # so the checkpoint compares none of them (a MIG prepare's action saves, 1,000 claims held).
            compared = frozenset() if prepared is self._state._prepared else changed
            ticket = self._checkpoint.save(prepared, actions, durable, compared)
            self._state._saved(prepared, actions, changed)
            return ticket

    def sync(self, ticket: int, *, point: str = "") -> None:
        """Wait, without the lock, for the fsync of the save numbered `ticket` (one for every save before
        it), the group commit's way; on a failure the lock is taken again for what the program undoes."""
        self.hold(False)
        try:
            with nodefiles.Step(point):
                self._state._group.sync(self.member, ticket)
        except StepError:
            self.hold(True)
            raise

    def mark(self, point: str) -> None:
        """Nothing but the crash point: a place between two steps that tests kill the process at."""
        with nodefiles.Step(point):
            pass

    def remove_leftovers(self, *, point: str = "") -> None:
        """Remove what a crash left beside the checkpoint, the specs and the metadata files."""
        with nodefiles.Step(point):
            self._checkpoint.remove_leftovers()
            self._cdi.remove_leftovers()
            if self._metadata is not None:
                self._metadata.remove_leftovers()

    def write_spec(self, uid: str, spec: Obj, *, compare: bool = True, point: str = "") -> None:
        """Write the claim's spec atomically. `compare`: leave a spec with the same bytes as it is
        (start-up rewrites every spec); a prepare's is one it has just decided, written without the read."""
        with nodefiles.Step(point):
            self._cdi.write(uid, spec, compare=compare)

    def remove_spec(self, uid: str, *, point: str = "") -> None:
        """Remove the claim's spec; none is fine."""
        with nodefiles.Step(point):
            self._cdi.remove(uid)

    def set_inventory(self, inventory: Inventory) -> None:
        """Prepares from now on see this inventory (MIG devices made or destroyed; the lock is held)."""
        with nodefiles.Step():
            self._state.inventory = inventory


class _Hold(contextlib.AbstractContextManager["_Hold"]):
    """The state's lock, held once made, then let go and taken as a program's steps need it, with what
    another instance saved: plain calls, where the five context managers it was cost more than its flock."""

    def __init__(self, state: DeviceState) -> None:
        self._state = state
        self._held = False
        self.set(True)

    def set(self, locked: bool) -> None:
        """Hold the lock, or let it go (also when adopting what another instance saved fails)."""
        state = self._state
        if locked and not self._held:
            state._lock.acquire()
            self._held = True
            try:
                saved_elsewhere = state._checkpoint.lock()
                if saved_elsewhere is not None:
                    state._adopt(saved_elsewhere[0], saved_elsewhere[1])
            except BaseException:
                self.set(False)
                raise
        elif not locked and self._held:
            self._held = False
            state._checkpoint.unlock()
            state._lock.release()

    def __exit__(self, *exc: object) -> None:
        self.set(False)


class GroupCommit:
    """The programs deciding now, and the fsync that waits for them: one fsync for a burst of prepares.

    The claims of a burst arrive together, each on its own thread: the first at its fsync waits (at
    most GROUP_WAIT) for the others to decide and save, so that one fsync makes them all durable.
    With the GIL the others' decisions would otherwise fall between fsyncs, one each.
    """

    def __init__(self, checkpoint: CheckpointStore) -> None:
        """Group the fsyncs of this checkpoint."""
        self._checkpoint = checkpoint
        self._deciding = 0
        self._decided = threading.Condition()

    def join(self) -> Member:
        """Count a call's program among those deciding, until it syncs or ends."""
        with self._decided:
            self._deciding += 1
        return Member()

    def leave(self, member: Member | None) -> None:
        """The program is done deciding (at its fsync, or its end); once only."""
        if member is None or member.left:
            return
        member.left = True
        with self._decided:
            self._deciding -= 1
            if not self._deciding:
                self._decided.notify_all()

    def sync(self, member: Member | None, ticket: int) -> None:
        """Wait, briefly, for the programs deciding beside this one, then for the fsync of `ticket`."""
        self.leave(member)
        with self._decided:
            self._decided.wait_for(lambda: not self._deciding, GROUP_WAIT)
        self._checkpoint.sync(ticket)


class Member:
    """One call's place among the programs deciding."""

    def __init__(self) -> None:
        self.left = False
