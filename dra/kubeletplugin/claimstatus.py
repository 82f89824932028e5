"""Prepared claims' status.devices, written off the kubelet's request path.

After a prepare, the claim's status says what each of its devices is (UUID, for MIG the MIG
UUID, its parent, profile and instance IDs, PCI bus ID, how it is shared:
dra.core.devicestatus). The service only queues the write, so a slow or unreachable API server
never delays the kubelet: one thread writes, the newest entries of a claim replacing older ones not
yet written, with a server-side apply on the status subresource under this node's field manager
(other drivers' entries stay).

An unprepare writes nothing: the kubelet unprepares once no pod of the node uses the claim, the
claim is then deallocated (or deleted with its pod), and the API server drops every status.devices
entry of a deallocated device in the same update (dropDeallocatedStatusDevices in its
ResourceClaim strategy). A removal of our own would be a second write per claim for what that
update does anyway (issue 44); the writer only forgets the claim, so a claim prepared again
is written again.

The writes wait for a lull in the kubelet's calls (QUIET seconds without a new change, or
MOST_DELAY after the oldest waiting one): each apply costs the process about 0.2 ms of CPU,
which the next prepare of a pod's burst would otherwise wait behind. They are made on the
writer's own thread, one blocking call each: handed to a worker thread and back from an event
loop, each cost as much CPU again (issue 44). A write let through by MOST_DELAY while calls
still come is followed by PACE seconds before the next: a backlog (a thousand claims prepared at
once) trickles out beside the calls instead of crowding them. A claim unprepared before its
entries were written is not written at all.

What the API server keeps is learnt from the first write: a server with
DRAResourceClaimDeviceStatus off (beta and on by default since 1.33, GA in 1.37) answers
without the entries, and a role without resourceclaims/status is refused; either is said once
and ends the writing, the claims work as before. There is no dry run to ask at start-up: a
status write needs a claim allocated on this node.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.to_thread

from dra.adapters.kube import ConflictError, KubeError, NotFoundError, UnreachableError
from dra.core.devicestatus import identities, status_entries
from dra.daemon import metrics
from dra.model.devices import Inventory
from dra.model.prepared import PreparedClaim

log = logging.getLogger(__name__)

#: Waits before writing again after the API server did not answer: doubled each time, up to the last.
_RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
#: Seconds without a new change before the writes start, and the most a change waits for that lull.
QUIET = 0.1
MOST_DELAY = 1.0
#: Seconds between writes while changes keep coming (a backlog let through by MOST_DELAY).
PACE = 0.02


class StatusClient(Protocol):
    """The part of the Kubernetes adapter the writer needs."""

    def write_resource_claim_devices(
        self, namespace: str, name: str, uid: str, devices: list[dict[str, Any]], field_manager: str
    ) -> dict[str, Any]:
        """Server-side apply a claim's status.devices entries, blocking the calling worker thread."""


@dataclass(frozen=True)
class _Write:
    namespace: str
    name: str
    uid: str
    #: The entries this driver owns in the claim.
    devices: list[dict[str, Any]]


class ClaimStatusWriter:
    """Writes this driver's entries of prepared claims' status.devices on a thread of its own (`run`).

    `prepared` and `unprepared` are called on the threads serving the kubelet: they only queue,
    under the writer's lock, and wake the writer's thread, which makes the applies itself (a
    blocking call each, no hand-off to another thread).
    """

    def __init__(self, kube: StatusClient, driver: str, node_name: str) -> None:
        self._kube = kube
        self._driver = driver
        # One manager per node: each node's driver owns the entries of the devices it prepared.
        self._manager = f"{driver}/{node_name}"[:128]
        #: Guards what follows, and wakes the writer's thread at a change or at its stop.
        self._changes = threading.Condition()
        self._pending: dict[str, _Write] = {}
        #: What the server holds of each prepared claim as far as this instance wrote it, to skip a repeat.
        self._written: dict[str, list[dict[str, Any]]] = {}
        #: The claim whose apply is in flight, and whether it was unprepared meanwhile (then what the
        #: apply wrote is not remembered: the claim may be deallocated and allocated anew before its
        #: next prepare, its entries dropped by the server).
        self._writing = ""
        self._writing_unprepared = False
        #: time.monotonic() of the newest change queued, and of the oldest still waiting.
        self._last_change = self._waiting_since = 0.0
        self._retries = 0
        self._stopped = False
        self.enabled = True

    def prepared(self, claim: PreparedClaim, inventory: Inventory) -> None:
        """Queue the claim's entries (a repeated prepare with the same entries writes nothing)."""
        devices = status_entries(self._driver, identities(claim, inventory))
        with self._changes:
            self._queue(_Write(claim.namespace, claim.name, claim.uid, devices))

    def unprepared(self, uid: str) -> None:
        """Forget the claim: a write not made yet is dropped, and its entries go with its allocation."""
        with self._changes:
            self._pending.pop(uid, None)
            self._written.pop(uid, None)
            if uid == self._writing:
                self._writing_unprepared = True

    def resync(self, claims: Iterable[PreparedClaim], inventory: Inventory) -> None:
        """Queue every prepared claim: after a restart, entries a crash kept from being written are
        (an earlier instance may have written them: written again all the same, once)."""
        for claim in claims:
            self.prepared(claim, inventory)

    def _queue(self, write: _Write) -> None:
        if not self.enabled:
            return
        if write.uid not in self._pending and self._written.get(write.uid) == write.devices:
            return
        now = time.monotonic()
        if not self._pending:
            self._waiting_since = now
            # Only then does the writer wait with no timeout; waiting for a lull, it wakes at the
            # lull's end and reads _last_change again. A wake per claim cost a thread switch per prepare.
            self._changes.notify()
        self._last_change = now
        self._pending[write.uid] = write

    async def run(self) -> None:
        """Write what is queued, on a thread of its own, until cancelled."""
        with self._changes:
            self._stopped = False
        try:
            await anyio.to_thread.run_sync(self._work, abandon_on_cancel=True)
        finally:
            with self._changes:
                self._stopped = True
                self._changes.notify()

    def _work(self) -> None:
        """The writer's thread: wait for a lull, write, again."""
        with self._changes:
            while self.enabled and not self._stopped:
                if not self._pending:
                    self._changes.wait()
                    continue
                self._wait_for_lull()
                while self._pending and self.enabled and not self._stopped:
                    self._write_one()

    def _wait_for_lull(self) -> None:
        """Return once no change came for QUIET seconds, or the oldest waiting has waited MOST_DELAY."""
        while not self._stopped:
            wait = min(self._last_change + QUIET, self._waiting_since + MOST_DELAY) - time.monotonic()
            if wait <= 0:
                return
            self._changes.wait(wait)

    def _sleep(self, seconds: float) -> None:
        """Let `seconds` pass (changes queue meanwhile), or less if stopped."""
        until = time.monotonic() + seconds
        while not self._stopped and (left := until - time.monotonic()) > 0:
            self._changes.wait(left)

    def _write_one(self) -> None:
        """The oldest queued write (the lock let go while it is made), then a pause if called for."""
        write = self._pending.pop(next(iter(self._pending)))
        self._writing, self._writing_unprepared = write.uid, False
        self._changes.release()
        try:
            outcome = self._apply(write)
        finally:
            self._changes.acquire()
            self._writing = ""
        if not self._settle(write, outcome):
            if not self._writing_unprepared:
                # Kept for later unless a newer change of the claim came meanwhile.
                self._pending.setdefault(write.uid, write)
            delay = _RETRY_SECONDS[min(self._retries, len(_RETRY_SECONDS) - 1)]
            self._retries += 1
            self._sleep(delay)
        elif self._pending and time.monotonic() - self._last_change < QUIET:
            # The kubelet is calling: the API server's and the process's time is the calls' first.
            self._sleep(PACE)

    def _apply(self, write: _Write) -> dict[str, Any] | KubeError:
        """The apply: the claim as stored, or the error."""
        try:
            return self._kube.write_resource_claim_devices(
                write.namespace, write.name, write.uid, write.devices, self._manager
            )
        except KubeError as err:
            return err

    def _settle(self, write: _Write, outcome: dict[str, Any] | KubeError) -> bool:
        """What the apply's outcome means; False when the API server did not answer (tried again)."""
        if isinstance(outcome, UnreachableError):
            log.info(
                "cannot write ResourceClaim %s/%s's status yet: %s", write.namespace, write.name, outcome
            )
            result = "error"
        elif isinstance(outcome, NotFoundError | ConflictError):
            # Deleted, or re-created under the same name: nothing of ours to write.
            result = "gone"
            self._written.pop(write.uid, None)
        elif isinstance(outcome, KubeError):
            result = "error"
            self._refused(write, outcome)
        else:
            result = "success"
            self._retries = 0
            if not self._kept(outcome):
                self.enabled = False
                log.warning(
                    "the API server does not keep ResourceClaim status.devices (feature gate "
                    "DRAResourceClaimDeviceStatus off): prepared claims do not name their devices"
                )
            elif not self._writing_unprepared:
                self._written[write.uid] = write.devices
        metrics.CLAIM_STATUS_WRITES.labels("set", result).inc()
        return not isinstance(outcome, UnreachableError)

    def _kept(self, stored: dict[str, Any]) -> bool:
        devices = (stored.get("status") or {}).get("devices") or []
        return any(d.get("driver") == self._driver for d in devices)

    def _refused(self, write: _Write, err: KubeError) -> None:
        if err.status == 403 and "admission" not in str(err).lower():
            # The role lacks resourceclaims/status: said once, not once per claim.
            self.enabled = False
            self._pending.clear()
            log.warning(
                "no permission to write ResourceClaim status (resourceclaims/status patch): prepared "
                "claims do not name their devices (%s)",
                err,
            )
            return
        # A claim deallocated meanwhile (its devices no longer allocated), or refused by a policy.
        log.warning("cannot write the status of ResourceClaim %s/%s: %s", write.namespace, write.name, err)
        self._written.pop(write.uid, None)
