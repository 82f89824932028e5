"""Prepared-claim state of the node: applies the plans of dra.core.prepare to CDI specs and the checkpoint.

Each call decides under the lock, on the state as it is then, and applies the
plan in an order that a crash at any point leaves recoverable:
- prepare removes the specs of stale holders it releases, writes the claim's
  CDI spec, then saves the checkpoint once (holders dropped, claim recorded),
  then answers; a spec without a checkpoint entry is removed at the next
  start-up and the kubelet retries the prepare; a released holder still in the
  checkpoint gets its spec back at start-up and is released again on the retry;
- unprepare removes the spec, then the checkpoint entry; a leftover entry is
  unprepared again when the kubelet retries. Neither step waits for the disk:
  kill -9 keeps both, and what a power cut undoes start-up repairs (a spec
  without an entry goes; an entry back from the dead is a stale holder).
Dynamic MIG adds device actions (dra.model.prepared.DeviceAction) around them:
prepare records each MIG device to make as intent in the checkpoint, makes
the GPU instance and compute instance, records the action done, and only then
writes the spec and records the claim; unprepare destroys the instances after
removing the spec and before dropping the claim and its actions. At start-up
an action done for a prepared claim is adopted, and every other MIG instance
on a dynamic-MIG GPU (a crash's leftover, or one made by hand) is destroyed.
`dra.adapters.faults` points between the steps let tests kill the process there.

GPU settings a claim asks (the time-slice interval, dra.kubeletplugin.timeslice;
its MPS control daemon, dra.kubeletplugin.mps) are applied after the checkpoint
records the claim and before the answer, and again at start-up for every
recorded claim (setting an interval is idempotent, a running daemon is
adopted); they are undone before the checkpoint entry goes, so a crash never
loses track of one. At start-up, daemons of claims not recorded are stopped.
A prepare whose spec or checkpoint write fails (ENOSPC, EIO) removes the spec
it wrote and answers that claim's error, so no spec is left without its entry.
Calls are serialised by a lock; they block on file I/O and run in worker threads.
A prepare waits for its checkpoint record's fsync after letting go of the lock,
so prepares of other claims go on meanwhile and concurrent ones share one fsync
(group commit); the kubelet is answered only once the record is durable.
The lock is also held across processes (the checkpoint's flock), and the state
re-read under it when another instance saved it: during a rolling update two
instances prepare and unprepare on the same checkpoint and CDI directory.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from dra.adapters import faults
from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import CheckpointStore
from dra.core import prepare as plans
from dra.core import sharing
from dra.core.allocation import ClaimAllocation, ClaimError
from dra.gpu import dynamic
from dra.gpu.library import ERROR_INSUFFICIENT_RESOURCES, GpuLibrary, GpuLibraryError, Placement
from dra.kubeletplugin.mps import MpsDaemons, MpsError
from dra.kubeletplugin.timeslice import TimeSliceError, TimeSlicer
from dra.model.devices import Gpu, Inventory, MigDevice
from dra.model.prepared import MIG_CREATE, DeviceAction, PreparedClaim

log = logging.getLogger(__name__)

T = TypeVar("T")


def _warn_missing(missing: Iterable[plans.MissingDevice]) -> None:
    for gone in missing:
        log.warning("%s", gone.message)


class DeviceState:
    """The node's prepared claims; decides and applies prepares, unprepares and the start-up repair."""

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
    ) -> None:
        self.driver = driver
        self._time_slicer = time_slicer
        self._mps = mps
        self._mps_root = str(mps.root) if mps is not None else ""
        self.pool = node_name
        self.inventory = inventory
        self._cdi = cdi_store
        self._checkpoint = checkpoint
        #: The GPU library dynamic MIG makes and destroys MIG devices through.
        self._lib = lib
        self._lock = threading.Lock()
        self._prepared, self._actions = checkpoint.load_state()

    @property
    def actions(self) -> list[DeviceAction]:
        """Device actions the checkpoint records (a snapshot)."""
        return list(self._actions)

    def _save(
        self, prepared: dict[str, PreparedClaim], actions: list[DeviceAction], durable: bool = True
    ) -> int:
        ticket = self._checkpoint.save(prepared, actions, durable)
        self._prepared, self._actions = prepared, actions
        return ticket

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the state against threads and other processes, with what another instance saved."""
        with self._lock, self._checkpoint.exclusive() as saved_elsewhere:
            if saved_elsewhere is not None:
                self._prepared, self._actions = saved_elsewhere
                self._adopt_instances()
            yield

    def _adopt_instances(self) -> None:
        """Know the MIG devices another instance made for its claims, and forget those it destroyed."""
        made = {str(a.result["uuid"]): a for a in self._actions if a.done}
        known = [m for m in self.inventory.instances if m.uuid in made]
        found = {m.uuid for m in known}
        for uuid, action in made.items():
            gpu = next((g for g in self.inventory.gpus if g.uuid == action.params["gpu"]), None)
            if uuid in found or gpu is None or self._lib is None:
                continue
            try:
                known.append(
                    dynamic.find_mig_device(
                        self._lib,
                        gpu,
                        int(action.result["gpuInstance"]),
                        int(action.result["computeInstance"]),
                    )
                )
            except GpuLibraryError as err:
                log.warning("claim %s: cannot find MIG device %s: %s", action.claim_uid, uuid, err)
        self.inventory = replace(self.inventory, instances=tuple(known))

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
        with self._locked():
            result, inventory = change(dict(self._prepared), list(self._actions))
            if inventory is not None:
                self.inventory = inventory
            return result, inventory

    @property
    def prepared(self) -> Mapping[str, PreparedClaim]:
        """Prepared claims by UID (a snapshot)."""
        return dict(self._prepared)

    def recover(self) -> None:
        """After a restart: drop specs of claims not prepared, (re)write the specs of prepared ones."""
        with self._locked():
            self._checkpoint.remove_leftovers()
            self._cdi.remove_leftovers()
            faults.point("recover.leftovers-removed")
            self._recover_mig()
            plan = plans.decide_recover(
                self._prepared,
                self.inventory,
                self._cdi.claim_uids(),
                driver=self.driver,
                mps_root=self._mps_root,
            )
            for uid in plan.remove:
                log.info("removing CDI spec of claim %s, which is not prepared", uid)
                self._cdi.remove(uid)
                faults.point("recover.spec-removed")
            _warn_missing(plan.missing)
            for uid, spec in plan.write:
                self._cdi.write(uid, spec)
                faults.point("recover.spec-written")
            if self._time_slicer is not None:
                try:
                    self._time_slicer.apply(sharing.wanted_time_slices(self._prepared))
                except TimeSliceError as err:
                    log.error("%s", err)
            if self._mps is not None:
                self._mps.stop_others(self._prepared)
                for claim in self._prepared.values():
                    try:
                        self._mps.start(claim)
                    except MpsError as err:
                        log.error("claim %s/%s: %s", claim.namespace, claim.name, err)

    def _held(self) -> set[tuple[str, int]]:
        """(GPU UUID, GPU instance ID) of every MIG device made for a prepared claim."""
        return {
            (str(a.params["gpu"]), int(a.result["gpuInstance"]))
            for a in self._actions
            if a.done and a.claim_uid in self._prepared
        }

    def _destroy_unheld(self, gpus: Iterable[Gpu]) -> int:
        """Destroy the MIG instances on these GPUs that no prepared claim holds; how many there were."""
        if self._lib is None:
            return 0
        held, destroyed = self._held(), 0
        for gpu in gpus:
            for instance in dynamic.instances(self._lib, gpu.index):
                if (gpu.uuid, instance.gpu_instance_id) in held:
                    continue
                start, size = instance.placement.start, instance.placement.size
                log.warning(
                    "destroying MIG instance %d (memory slices %d-%d) on GPU %d: no prepared claim holds it "
                    "(left by a crash, or made by hand on a GPU in dynamic MIG mode)",
                    instance.gpu_instance_id,
                    start,
                    start + size - 1,
                    gpu.index,
                )
                dynamic.destroy(self._lib, gpu.index, instance.gpu_instance_id)
                destroyed += 1
        return destroyed

    def _recover_mig(self) -> None:
        """Adopt the MIG devices made for prepared claims; destroy every other one on dynamic-MIG GPUs."""
        kept = [a for a in self._actions if a.done and a.claim_uid in self._prepared]
        known = self._held()
        self._destroy_unheld(self.inventory.dynamic_gpus)
        for action in self._actions:
            if action not in kept:
                log.info(
                    "undid %s of %s for claim %s, which never completed",
                    action.kind,
                    action.device,
                    action.claim_uid,
                )
        if kept != self._actions:
            self._save(self._prepared, kept)
        self.inventory = replace(
            self.inventory,
            instances=tuple(
                m for m in self.inventory.instances if (m.parent.uuid, m.gpu_instance_id) in known
            ),
        )

    def prepare(self, allocation: ClaimAllocation, stale: Mapping[str, str] | None = None) -> PreparedClaim:
        """Prepare a claim, releasing the holders `stale` names (UID -> why), or return its recorded answer.

        ClaimError when it cannot be prepared; then nothing changes.
        """
        with self._locked():
            claim, ticket = self._prepare_locked(allocation, stale or {})
        self._make_durable(ticket, claim, allocation)
        return claim

    def prepare_unless_held(self, allocation: ClaimAllocation) -> PreparedClaim | list[PreparedClaim]:
        """`prepare` when no prepared claim holds a device the allocation needs; else those holders.

        With holders nothing changes: the caller asks the API server which of them
        are stale and calls `prepare` with the answer, which decides again on the
        state it then sees. The common case, no holder, so costs one call (one trip
        to a worker thread and one hold of the lock) instead of two.
        """
        with self._locked():
            holders = plans.conflicts(allocation, self.inventory, self._prepared, pool=self.pool)
            if holders:
                return holders
            claim, ticket = self._prepare_locked(allocation, {})
        self._make_durable(ticket, claim, allocation)
        return claim

    def _prepare_locked(
        self, allocation: ClaimAllocation, stale: Mapping[str, str]
    ) -> tuple[PreparedClaim, int]:
        """Decide and apply a prepare; the caller holds the lock and then makes the ticket durable."""
        plan = plans.decide_prepare(
            allocation,
            self.inventory,
            self._prepared,
            driver=self.driver,
            pool=self.pool,
            stale=stale,
            has_spec=self._cdi.exists(allocation.uid),
            mps_root=self._mps_root,
        )
        if isinstance(plan, plans.Refusal):
            raise ClaimError(plan.message)
        # A claim allocated anew, or a stale holder released, gives its MIG devices back first.
        for uid in {r.holder.uid for r in plan.release} | ({plan.replaces.uid} if plan.replaces else set()):
            self._destroy_mig_devices(uid)
        if plan.create:
            plan = self._make_mig_devices(plan, allocation)
        gone = self._missing_host_paths(plan)
        if gone:
            # The runtime would fail every container of the claim on a path that is gone.
            self._destroy_mig_devices(allocation.uid)
            raise ClaimError(
                f"cannot prepare ResourceClaim {allocation.ref}: its CDI spec would name "
                f"{', '.join(gone)}, not on this node (a GPU or the driver changed since discovery)"
            )
        ticket = self._apply(plan, allocation)
        faults.point("sharing-before-gpu-settings")
        self._apply_gpu_settings(plan, allocation)
        return plan.claim, ticket

    def _make_durable(self, ticket: int, claim: PreparedClaim, allocation: ClaimAllocation) -> None:
        """Wait for the prepare's checkpoint record to reach the disk; ClaimError undoes the prepare.

        Outside the lock: prepares of other claims go on meanwhile, and concurrent
        ones share one fsync (group commit).
        """
        try:
            self._checkpoint.sync(ticket)
        except OSError as err:
            with self._locked():
                if self._prepared.get(claim.uid) is claim:
                    self._unprepare_locked(claim.uid)
            raise ClaimError(
                f"cannot record claim {allocation.ref} in the checkpoint {self._checkpoint.path}: {err}"
            ) from err
        if ticket:
            faults.point("prepare.checkpoint-saved")

    def _make_mig_devices(self, plan: plans.PreparePlan, allocation: ClaimAllocation) -> plans.PreparePlan:
        """Make the plan's MIG devices, each recorded as intent, then done; ClaimError leaves none behind."""
        if self._lib is None:
            raise ClaimError(f"cannot prepare ResourceClaim {allocation.ref}: this node does not manage MIG")
        intents = [
            DeviceAction(
                allocation.uid,
                c.device,
                MIG_CREATE,
                {
                    "gpu": c.partition.parent.uuid,
                    "profile": c.partition.profile,
                    "profileId": c.partition.profile_id,
                    "start": c.partition.placement_start,
                    "size": c.partition.placement_size,
                },
            )
            for c in plan.create
        ]
        self._save(self._prepared, [*self._actions, *intents])
        faults.point("mig-intent-recorded")
        made: dict[str, MigDevice] = {}
        for create, intent in zip(plan.create, intents, strict=True):
            try:
                device = self._make_one(create)
            except GpuLibraryError as err:
                self._destroy_mig_devices(allocation.uid)
                raise ClaimError(self._creation_failed(allocation, create, err)) from None
            made[create.device] = device
            done = replace(
                intent,
                done=True,
                result={
                    "gpuInstance": device.gpu_instance_id,
                    "computeInstance": device.compute_instance_id,
                    "uuid": device.uuid,
                },
            )
            self._save(self._prepared, [done if a.key == intent.key else a for a in self._actions])
            faults.point("mig-recorded")
            self.inventory = replace(self.inventory, instances=(*self.inventory.instances, device))
        return plan.made(made, self.inventory, self.driver, self._mps_root)

    def _creation_failed(
        self, allocation: ClaimAllocation, create: plans.CreateMig, err: GpuLibraryError
    ) -> str:
        """The per-claim error; a taken placement first reconciles the GPU with the checkpoint."""
        message = (
            f"cannot prepare ResourceClaim {allocation.ref}: cannot make MIG device {create.device}, "
            f"{create.placement}: NVML error {err.code}: {err}"
        )
        if err.code != ERROR_INSUFFICIENT_RESOURCES:
            return message
        try:
            reaped = self._destroy_unheld([create.partition.parent])
        except GpuLibraryError as failed:
            log.warning(
                "cannot reconcile the MIG instances of GPU %d: %s", create.partition.parent.index, failed
            )
            reaped = 0
        if reaped:
            return (
                f"{message}; the placement was taken by MIG instances no prepared claim held, "
                "now destroyed: the retry can succeed"
            )
        return f"{message}; a claim still prepared on this node holds the placement (the allocation is stale)"

    def _make_one(self, create: plans.CreateMig) -> MigDevice:
        """GPU instance, then compute instance; the GPU instance goes again if the compute instance fails."""
        assert self._lib is not None
        p = create.partition
        gi = dynamic.create_gpu_instance(
            self._lib, p.parent.index, p.profile_id, Placement(p.placement_start, p.placement_size)
        )
        faults.point("mig-gpu-instance-created")
        try:
            ci = dynamic.create_compute_instance(self._lib, p.parent.index, gi, p.slices)
            faults.point("mig-compute-instance-created")
            return dynamic.find_mig_device(self._lib, p.parent, gi, ci)
        except GpuLibraryError:
            dynamic.destroy(self._lib, p.parent.index, gi)
            raise

    def _destroy_mig_devices(self, uid: str) -> None:
        """Destroy the MIG devices made for a claim and drop their actions (the claim's record stays)."""
        mine = [a for a in self._actions if a.claim_uid == uid and a.kind == MIG_CREATE]
        if not mine:
            return
        for action in mine:
            gpu = next((g for g in self.inventory.gpus if g.uuid == action.params["gpu"]), None)
            if self._lib is not None and gpu is not None and action.done:
                dynamic.destroy(self._lib, gpu.index, int(action.result["gpuInstance"]))
                faults.point("mig-destroyed")
            elif self._lib is not None and gpu is not None:
                # Never recorded as done: whatever sits at its placement was made for it.
                for instance in dynamic.instances(self._lib, gpu.index):
                    if instance.placement == Placement(
                        int(action.params["start"]), int(action.params["size"])
                    ):
                        dynamic.destroy(self._lib, gpu.index, instance.gpu_instance_id)
        gone = {m.uuid for m in self.inventory.instances if any(a.result.get("uuid") == m.uuid for a in mine)}
        self.inventory = replace(
            self.inventory, instances=tuple(m for m in self.inventory.instances if m.uuid not in gone)
        )
        self._save(self._prepared, [a for a in self._actions if a not in mine])

    def _missing_host_paths(self, plan: plans.PreparePlan) -> list[str]:
        """Host paths the plan's spec names that are not on this node, but for those the prepare makes.

        The MPS directories of the claim's devices come with their daemon, which starts after the spec
        is written.
        """
        if plan.spec is None:
            return []
        gone = self._cdi.missing_host_paths(plan.spec)
        if self._mps is None:
            return gone
        own = sharing.mps_dirs(self._mps_root, sharing.claim_mps_key(plan.claim)).root + "/"
        return [path for path in gone if not path.startswith(own)]

    def _apply_gpu_settings(self, plan: plans.PreparePlan, allocation: ClaimAllocation) -> None:
        """Set the claim's time slices and start its MPS daemon (again, on a retry).

        On failure the prepare is undone and ClaimError says why.
        """
        wanted = sharing.wanted_time_slices({plan.claim.uid: plan.claim})
        try:
            if self._time_slicer is not None and wanted:
                self._time_slicer.apply(wanted)
            if self._mps is not None:
                if plan.replaces is not None:
                    # The daemon of the old allocation's devices, unless the new one or another claim uses it.
                    self._mps.release(plan.replaces, self._prepared)
                self._mps.start(plan.claim)
        except (TimeSliceError, MpsError) as err:
            self._unprepare_locked(plan.claim.uid)
            raise ClaimError(f"cannot prepare ResourceClaim {allocation.ref}: {err}") from None

    def _apply(self, plan: plans.PreparePlan, allocation: ClaimAllocation) -> int:
        """Effects of a prepare plan in crash-safe order; the caller holds the lock.

        Returns the ticket that makes the checkpoint record durable (0: nothing recorded).
        """
        if plan.replaces is not None:
            # The kubelet unprepares before a claim is allocated anew; if it did not, the
            # claim's current allocation is the truth, not the record.
            log.warning(
                "claim %s (%s) is prepared with %s but now allocated %s: preparing it again",
                allocation.ref,
                allocation.uid,
                sorted(plans.recorded(plan.replaces)),
                sorted(plans.recorded(plan.claim)),
            )
        for release in plan.release:
            holder = release.holder
            log.warning(
                "releasing %s/%s (%s), prepared but stale: %s",
                holder.namespace,
                holder.name,
                holder.uid,
                release.reason,
            )
            self._cdi.remove(holder.uid)
            faults.point("prepare.stale-spec-removed")
        _warn_missing(plan.missing)
        if plan.spec is not None:
            faults.point("prepare.before-cdi-write")
            try:
                self._cdi.write(plan.claim.uid, plan.spec)
            except OSError as err:
                self._drop_unrecorded_spec(plan.claim.uid)
                raise ClaimError(f"cannot write the CDI spec of claim {allocation.ref}: {err}") from err
            faults.point("prepare.cdi-written")
        if not plan.record:
            return 0
        released = {r.holder.uid for r in plan.release}
        updated = {uid: c for uid, c in self._prepared.items() if uid not in released}
        updated[plan.claim.uid] = plan.claim
        try:
            ticket = self._save(
                updated, [a for a in self._actions if a.claim_uid not in released], durable=False
            )
        except OSError as err:
            # A failed directory fsync comes after the rename: put back the record the kubelet is told of.
            with contextlib.suppress(OSError):
                self._save(self._prepared, self._actions)
            self._drop_unrecorded_spec(plan.claim.uid)
            raise ClaimError(
                f"cannot record claim {allocation.ref} in the checkpoint {self._checkpoint.path}: {err}"
            ) from err
        log.info(
            "prepared claim %s (%s): %s",
            allocation.ref,
            plan.claim.uid,
            ", ".join(d.device for d in plan.claim.devices),
        )
        return ticket

    def _drop_unrecorded_spec(self, uid: str) -> None:
        """After a failed write: remove the claim's spec unless the checkpoint records the claim."""
        if uid in self._prepared:
            return
        # Best effort on a failing disk: a spec that stays is removed at the next start-up.
        with contextlib.suppress(OSError):
            self._cdi.remove(uid)

    def unprepare(self, uid: str) -> PreparedClaim | None:
        """Undo a prepare; an unknown claim is fine (its stray spec, if any, goes too)."""
        with self._locked():
            return self._unprepare_locked(uid)

    def _unprepare_locked(self, uid: str) -> PreparedClaim | None:
        """Undo a prepare; the caller holds the lock."""
        plan = plans.decide_unprepare(uid, self._prepared)
        self._cdi.remove(plan.uid)
        if plan.claim is None:
            return None
        faults.point("unprepare.spec-removed")
        if self._time_slicer is not None:
            self._time_slicer.restore(sharing.time_slices_to_restore(uid, self._prepared))
        if self._mps is not None:
            self._mps.release(plan.claim, {k: v for k, v in self._prepared.items() if k != uid})
        faults.point("sharing-before-unrecord")
        try:
            self._destroy_mig_devices(plan.uid)
        except GpuLibraryError as err:
            raise ClaimError(
                f"cannot unprepare claim {plan.claim.namespace}/{plan.claim.name}: destroying its MIG "
                f"device failed (NVML error {err.code}: {err}); the kubelet retries"
            ) from None
        updated = {k: v for k, v in self._prepared.items() if k != plan.uid}
        # Not fsynced: an entry back after a power loss is a stale holder, released when needed.
        self._save(updated, self._actions, durable=False)
        faults.point("unprepare.checkpoint-saved")
        log.info("unprepared claim %s/%s (%s)", plan.claim.namespace, plan.claim.name, uid)
        return plan.claim
