"""The node's prepared claims, and the executor that runs the programs of dra.core.prepare and .recovery.

The programs decide; `DeviceState` only holds the state (prepared claims,
device actions, inventory) and runs each step they yield: one loop, one crash
point per step (`faults.point`), no decisions. Steps run under a lock that is
held across threads and processes (the checkpoint's flock: in a rolling update
two instances share the checkpoint and the CDI directory); the two steps
marked unlocked (asking the API server about holders, waiting for the fsync)
run without it. Calls block on file I/O and run in worker threads.
docs/architecture.md, "Prepare, step by step", has the order and why.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from dra.adapters import faults
from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.metadatastore import MetadataStore
from dra.adapters.pcisysfs import PciSysfs
from dra.core import migdevices, recovery
from dra.core import prepare as programs
from dra.core import steps as s
from dra.core.allocation import ClaimAllocation
from dra.gpu import dynamic
from dra.gpu.library import ERROR_INSUFFICIENT_RESOURCES, GpuLibrary, GpuLibraryError, Placement
from dra.kubeletplugin.mps import MpsDaemons, MpsError
from dra.kubeletplugin.timeslice import TimeSliceError, TimeSlicer
from dra.model.devices import Inventory
from dra.model.prepared import VFIO_BIND, DeviceAction, Holders, PreparedClaim

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Answers AskStale: which of these prepared claims the API server says are gone, by UID, with why.
StaleCheck = Callable[[Sequence[PreparedClaim]], Mapping[str, str]]

#: What a step may fail with; it is thrown into the program as StepError, which decides what follows.
_STEP_ERRORS = (OSError, GpuLibraryError, TimeSliceError, MpsError)

_LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _every_holder_live(holders: Sequence[PreparedClaim]) -> Mapping[str, str]:
    return {}


class DeviceState:
    """The node's prepared claims; runs prepares, unprepares and the start-up repair."""

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
        self._node = s.Node(
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
        self._cdi = cdi_store
        self._metadata = metadata
        self._checkpoint = checkpoint
        #: The GPU library dynamic MIG makes and destroys MIG devices through.
        self._lib = lib
        self._time_slicer = time_slicer
        self._mps = mps
        # Also without `vfio`: start-up gives back GPUs a run with passthrough on left bound.
        self._pci = pci or PciSysfs()
        self._lock = threading.Lock()
        self._steps = self._step_table()
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

    def _facts(self) -> s.Facts:
        if self._holders.prepared is not self._prepared:
            self._holders = Holders(self._prepared)
        return s.Facts.indexed(self._prepared, self._actions, self.inventory, self._holders)

    # -- the calls -------------------------------------------------------------------------------

    def prepare(self, allocation: ClaimAllocation, stale: StaleCheck = _every_holder_live) -> PreparedClaim:
        """Prepare a claim, or return its recorded answer; ClaimError when it cannot be, and nothing changes.

        `stale` is asked, without the lock, about prepared claims that hold a device the allocation
        needs; by default every holder is live and refuses the claim.
        """
        return self._run(lambda facts: programs.prepare(self._node, allocation, facts), stale)

    def unprepare(self, uid: str) -> PreparedClaim | None:
        """Undo a prepare; an unknown claim is fine (its stray spec, if any, goes too)."""
        return self._run(lambda facts: programs.unprepare(self._node, uid, facts))

    def recover(self) -> None:
        """After a restart: drop specs of claims not prepared, (re)write the specs of prepared ones."""
        self._run(lambda facts: recovery.recover(self._node, facts))

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
        with self._held():
            result, inventory = change(dict(self._prepared), list(self._actions))
            if inventory is not None:
                self.inventory = inventory
            return result, inventory

    # -- the executor ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """Hold the state against threads and other processes, with what another instance saved."""
        with self._lock, self._checkpoint.exclusive() as saved_elsewhere:
            if saved_elsewhere is not None:
                self._prepared, self._actions = saved_elsewhere[0], tuple(saved_elsewhere[1])
                self._execute(migdevices.adopt(self._node, self._facts()), _every_holder_live)
            yield

    def _run(self, start: Callable[[s.Facts], s.Program[T]], stale: StaleCheck = _every_holder_live) -> T:
        """Run a program from the state as it is under the lock; the lock is let go for unlocked steps."""
        with _Hold(self._held) as hold:
            return self._execute(start(self._facts()), stale, hold)

    def _execute(self, program: s.Program[T], stale: StaleCheck, hold: _Hold | None = None) -> T:
        """The loop: send each step's result back, or throw its failure in; the program's answer."""
        result: object = None
        failure: s.StepError | None = None
        while True:
            try:
                step = program.send(result) if failure is None else program.throw(failure)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            except s.StepError as failed:
                # The program did not handle it: the step's own error, as before there were steps.
                raise failed.__cause__ or failed from None
            if hold is not None:
                hold.set(step.locked)
            result, failure = None, None
            try:
                result = self._do(step, stale)
            except _STEP_ERRORS as err:
                failure = s.StepError(
                    str(err),
                    getattr(err, "code", 0),
                    placement_taken=isinstance(err, GpuLibraryError)
                    and err.code == ERROR_INSUFFICIENT_RESOURCES,
                )
                failure.__cause__ = err
                continue
            if step.point:
                faults.point(step.point)

    def _do(self, step: s.Step, stale: StaleCheck) -> object:
        """Run one step; its result."""
        if isinstance(step, s.AskStale):
            return stale(step.holders)
        return self._steps[type(step)](step)

    def _step_table(self) -> dict[type[s.Step], Callable[[Any], object]]:
        """How each kind of step is run: one line each (a table, since a match costs a test per case)."""
        return {
            s.ReadState: lambda _: self._facts(),
            s.HasSpec: lambda step: self._cdi.exists(step.uid),
            s.SpecUids: lambda _: frozenset(self._cdi.claim_uids()),
            s.MetadataDirs: lambda _: self._metadata.directories() if self._metadata else frozenset(),
            s.MissingHostPaths: lambda step: tuple(self._cdi.missing_host_paths(step.spec)),
            s.Save: self._save,
            s.Sync: lambda step: self._checkpoint.sync(step.ticket),
            s.Log: lambda step: log.log(_LOG_LEVELS[step.level], "%s", step.message),
            s.Mark: lambda _: None,
            s.RemoveLeftovers: self._remove_leftovers,
            s.WriteSpec: lambda step: self._cdi.write(step.uid, step.spec),
            s.RemoveSpec: lambda step: self._cdi.remove(step.uid),
            s.WriteMetadata: lambda step: self._metadata_store().write(step.directory, step.files),
            s.RemoveMetadata: lambda step: self._metadata_store().remove(step.directory),
            s.SetInventory: self._set_inventory,
            s.ListGpuInstances: lambda step: tuple(
                s.GpuInstanceAt(i.gpu_instance_id, i.placement.start, i.placement.size)
                for i in dynamic.instances(self._gpus(), step.gpu_index)
            ),
            s.CreateGpuInstance: lambda step: dynamic.create_gpu_instance(
                self._gpus(), step.gpu_index, step.profile_id, Placement(step.start, step.size)
            ),
            s.CreateComputeInstance: lambda step: dynamic.create_compute_instance(
                self._gpus(), step.gpu_index, step.gpu_instance_id, step.slices
            ),
            s.FindMigDevice: lambda step: dynamic.find_mig_device(
                self._gpus(), step.gpu, step.gpu_instance_id, step.compute_instance_id
            ),
            s.ReadMigMode: lambda step: dynamic.mig_mode(self._gpus(), step.gpu_index),
            s.SetMigMode: lambda step: dynamic.set_mig_mode(self._gpus(), step.gpu_index, step.mode),
            s.DestroyGpuInstance: lambda step: dynamic.destroy(
                self._gpus(), step.gpu_index, step.gpu_instance_id
            ),
            s.ApplyTimeSlices: lambda step: self._slicer().apply(step.wanted),
            s.RestoreTimeSlices: lambda step: self._slicer().restore(step.uuids),
            s.StartMps: lambda step: self._daemons().start(step.claim),
            s.ReleaseMps: lambda step: self._daemons().release(step.claim, step.others),
            s.StopOtherMps: lambda step: self._daemons().stop_others(step.prepared),
            s.ReadVfioHost: lambda _: self._pci.host(),
            s.ReadIommuGroup: lambda step: self._pci.iommu_group(step.address),
            s.BindVfio: lambda step: self._pci.bind_vfio(step.address),
            s.RestorePci: lambda step: self._pci.restore(step.address, step.driver),
        }

    def _save(self, step: s.Save) -> int:
        # The very mapping saved last: no claim changed (a save replaces the mapping, never edits it),
        # so the checkpoint compares none of them (a MIG prepare's action saves, 1,000 claims held).
        changed = frozenset() if step.prepared is self._prepared else step.changed
        ticket = self._checkpoint.save(step.prepared, step.actions, step.durable, changed)
        if step.changed is not None and self._holders.prepared is self._prepared:
            self._holders = self._holders.updated(step.prepared, step.changed)
        self._prepared, self._actions = step.prepared, step.actions
        return ticket

    def _remove_leftovers(self, step: s.RemoveLeftovers) -> None:
        self._checkpoint.remove_leftovers()
        self._cdi.remove_leftovers()
        if self._metadata is not None:
            self._metadata.remove_leftovers()

    def _set_inventory(self, step: s.SetInventory) -> None:
        self.inventory = step.inventory

    # The programs yield these steps only where the node has the part (dra.core.steps.Node).
    def _gpus(self) -> GpuLibrary:
        assert self._lib is not None
        return self._lib

    def _slicer(self) -> TimeSlicer:
        assert self._time_slicer is not None
        return self._time_slicer

    def _metadata_store(self) -> MetadataStore:
        assert self._metadata is not None
        return self._metadata

    def _daemons(self) -> MpsDaemons:
        assert self._mps is not None
        return self._mps


class _Hold:
    """The state's lock, taken and let go as the steps of one program need it."""

    def __init__(self, take: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
        self._take = take
        self._stack: contextlib.ExitStack | None = None

    def set(self, locked: bool) -> None:
        """Hold the lock, or let it go."""
        if locked and self._stack is None:
            self._stack = contextlib.ExitStack()
            self._stack.enter_context(self._take())
        elif not locked and self._stack is not None:
            self._stack.close()
            self._stack = None

    def __enter__(self) -> _Hold:
        self.set(True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.set(False)
