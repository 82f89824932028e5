"""Prepared-claim state of the node: applies the plans of dra.core.prepare to CDI specs and the checkpoint.

Each call decides under the lock, on the state as it is then, and applies the
plan in an order that a crash at any point leaves recoverable:
- prepare removes the specs of stale holders it releases, writes the claim's
  CDI spec, then saves the checkpoint once (holders dropped, claim recorded),
  then answers; a spec without a checkpoint entry is removed at the next
  start-up and the kubelet retries the prepare; a released holder still in the
  checkpoint gets its spec back at start-up and is released again on the retry;
- unprepare removes the spec, then the checkpoint entry; a leftover entry is
  unprepared again when the kubelet retries.
GPU settings a claim asks (the time-slice interval, dra.kubeletplugin.timeslice;
its MPS control daemon, dra.kubeletplugin.mps) are applied after the checkpoint
records the claim and before the answer, and again at start-up for every
recorded claim (setting an interval is idempotent, a running daemon is
adopted); they are undone before the checkpoint entry goes, so a crash never
loses track of one. At start-up, daemons of claims not recorded are stopped.
A prepare whose spec or checkpoint write fails (ENOSPC, EIO) removes the spec
it wrote and answers that claim's error, so no spec is left without its entry.
Calls are serialised by a lock; they block on file I/O and run in worker threads.
The lock is also held across processes (the checkpoint's flock), and the state
re-read under it when another instance saved it: during a rolling update two
instances prepare and unprepare on the same checkpoint and CDI directory.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping

from dra.adapters import faults
from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import CheckpointStore
from dra.core import prepare as plans
from dra.core import sharing
from dra.core.allocation import ClaimAllocation, ClaimError
from dra.kubeletplugin.mps import MpsDaemons, MpsError
from dra.kubeletplugin.timeslice import TimeSliceError, TimeSlicer
from dra.model.devices import Inventory
from dra.model.prepared import PreparedClaim

log = logging.getLogger(__name__)


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
        self._lock = threading.Lock()
        self._prepared: dict[str, PreparedClaim] = checkpoint.load()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the state against threads and other processes, with what another instance saved."""
        with self._lock, self._checkpoint.exclusive() as saved_elsewhere:
            if saved_elsewhere is not None:
                self._prepared = saved_elsewhere
            yield

    def set_inventory(self, inventory: Inventory) -> None:
        """Devices changed: new prepares see the new inventory; prepared claims stay as they are."""
        with self._lock:
            self.inventory = inventory

    @property
    def prepared(self) -> Mapping[str, PreparedClaim]:
        """Prepared claims by UID (a snapshot)."""
        return dict(self._prepared)

    def conflicts(self, allocation: ClaimAllocation) -> list[PreparedClaim]:
        """Prepared claims that hold devices of `allocation` now; the caller finds out which are stale.

        Under the lock only to see what another instance prepared meanwhile: `prepare`
        decides again under it on the state it then sees.
        """
        with self._locked():
            return plans.conflicts(allocation, self.inventory, self._prepared, pool=self.pool)

    def recover(self) -> None:
        """After a restart: drop specs of claims not prepared, (re)write the specs of prepared ones."""
        with self._locked():
            self._checkpoint.remove_leftovers()
            self._cdi.remove_leftovers()
            faults.point("recover.leftovers-removed")
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

    def prepare(self, allocation: ClaimAllocation, stale: Mapping[str, str] | None = None) -> PreparedClaim:
        """Prepare a claim, releasing the holders `stale` names (UID -> why), or return its recorded answer.

        ClaimError when it cannot be prepared; then nothing changes.
        """
        with self._locked():
            plan = plans.decide_prepare(
                allocation,
                self.inventory,
                self._prepared,
                driver=self.driver,
                pool=self.pool,
                stale=stale or {},
                has_spec=self._cdi.exists(allocation.uid),
                mps_root=self._mps_root,
            )
            if isinstance(plan, plans.Refusal):
                raise ClaimError(plan.message)
            gone = self._missing_host_paths(plan)
            if gone:
                # The runtime would fail every container of the claim on a path that is gone.
                raise ClaimError(
                    f"cannot prepare ResourceClaim {allocation.ref}: its CDI spec would name "
                    f"{', '.join(gone)}, not on this node (a GPU or the driver changed since discovery)"
                )
            self._apply(plan, allocation)
            faults.point("sharing-before-gpu-settings")
            self._apply_gpu_settings(plan, allocation)
            return plan.claim

    def _missing_host_paths(self, plan: plans.PreparePlan) -> list[str]:
        """Host paths the plan's spec names that are not on this node, but for those the prepare makes.

        The claim's MPS directories come with its daemon, which starts after the spec is written.
        """
        if plan.spec is None:
            return []
        gone = self._cdi.missing_host_paths(plan.spec)
        if self._mps is None:
            return gone
        own = sharing.mps_dirs(self._mps_root, plan.claim.uid).root + "/"
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
                    # Its daemon serves the devices of the old allocation.
                    self._mps.stop(plan.claim.uid)
                self._mps.start(plan.claim)
        except (TimeSliceError, MpsError) as err:
            self._unprepare_locked(plan.claim.uid)
            raise ClaimError(f"cannot prepare ResourceClaim {allocation.ref}: {err}") from None

    def _apply(self, plan: plans.PreparePlan, allocation: ClaimAllocation) -> None:
        """Effects of a prepare plan in crash-safe order; the caller holds the lock."""
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
            return
        released = {r.holder.uid for r in plan.release}
        updated = {uid: c for uid, c in self._prepared.items() if uid not in released}
        updated[plan.claim.uid] = plan.claim
        try:
            self._checkpoint.save(updated)
        except OSError as err:
            # A failed directory fsync comes after the rename: put back the record the kubelet is told of.
            with contextlib.suppress(OSError):
                self._checkpoint.save(self._prepared)
            self._drop_unrecorded_spec(plan.claim.uid)
            raise ClaimError(
                f"cannot record claim {allocation.ref} in the checkpoint {self._checkpoint.path}: {err}"
            ) from err
        faults.point("prepare.checkpoint-saved")
        self._prepared = updated
        log.info(
            "prepared claim %s (%s): %s",
            allocation.ref,
            plan.claim.uid,
            ", ".join(d.device for d in plan.claim.devices),
        )

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
            self._mps.stop(uid)
        faults.point("sharing-before-unrecord")
        updated = {k: v for k, v in self._prepared.items() if k != plan.uid}
        self._checkpoint.save(updated)
        faults.point("unprepare.checkpoint-saved")
        self._prepared = updated
        log.info("unprepared claim %s/%s (%s)", plan.claim.namespace, plan.claim.name, uid)
        return plan.claim
