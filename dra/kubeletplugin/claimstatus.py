"""Prepared claims' status.devices, written off the kubelet's request path.

After a prepare, the claim's status says what each of its devices is (UUID, for MIG the MIG
UUID, its parent, profile and instance IDs, PCI bus ID, how it is shared:
dra.core.devicestatus); after an unprepare, this driver's entries go. The service only
queues the change, so a slow or unreachable API server never delays the kubelet: one task
writes, the newest change of a claim replacing an older one not yet written, with a server-side
apply on the status subresource under this node's field manager (other drivers' entries stay).

The writes wait for a lull in the kubelet's calls (QUIET seconds without a new change, or
MOST_DELAY after the oldest waiting one): each apply costs the event loop about 0.6 ms of CPU,
which the next prepare of a pod's burst would otherwise wait behind. A write let through by
MOST_DELAY while calls still come is followed by PACE seconds before the next: a backlog (a
thousand claims prepared at once) trickles out beside the calls instead of crowding them. A
claim unprepared before its entries were written needs no write at all.

What the API server keeps is learnt from the first write: a server with
DRAResourceClaimDeviceStatus off (beta and on by default since 1.33, GA in 1.37) answers
without the entries, and a role without resourceclaims/status is refused; either is said once
and ends the writing, the claims work as before. There is no dry run to ask at start-up: a
status write needs a claim allocated on this node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

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

    async def apply_resource_claim_devices(
        self, namespace: str, name: str, uid: str, devices: list[dict[str, Any]], field_manager: str
    ) -> dict[str, Any]:
        """Server-side apply a claim's status.devices entries."""


@dataclass(frozen=True)
class _Write:
    namespace: str
    name: str
    uid: str
    #: The entries this driver owns in the claim; empty to remove them.
    devices: list[dict[str, Any]]


class ClaimStatusWriter:
    """Writes this driver's entries of prepared claims' status.devices, one claim at a time."""

    def __init__(self, kube: StatusClient, driver: str, node_name: str) -> None:
        self._kube = kube
        self._driver = driver
        # One manager per node: each node's driver owns the entries of the devices it prepared.
        self._manager = f"{driver}/{node_name}"[:128]
        self._pending: dict[str, _Write] = {}
        #: What the server holds of each claim as far as this instance wrote it, to skip a repeat;
        #: None where entries may be there from before a restart.
        self._written: dict[str, list[dict[str, Any]] | None] = {}
        #: The claim whose apply is in flight: its entries may be on the server once it returns.
        self._writing = ""
        #: time.monotonic() of the newest change queued, and of the oldest still waiting.
        self._last_change = self._waiting_since = 0.0
        self._wake = anyio.Event()
        self._retries = 0
        self.enabled = True

    def prepared(self, claim: PreparedClaim, inventory: Inventory) -> None:
        """Queue the claim's entries (a repeated prepare with the same entries writes nothing)."""
        devices = status_entries(self._driver, identities(claim, inventory))
        self._queue(_Write(claim.namespace, claim.name, claim.uid, devices))

    def unprepared(self, namespace: str, name: str, uid: str) -> None:
        """Queue the removal of this driver's entries from the claim."""
        self._queue(_Write(namespace, name, uid, []))

    def resync(self, claims: Iterable[PreparedClaim], inventory: Inventory) -> None:
        """Queue every prepared claim: after a restart, entries a crash kept from being written are."""
        for claim in claims:
            # An earlier instance may have written them: an unprepare must remove them.
            self._written.setdefault(claim.uid, None)
            self.prepared(claim, inventory)

    def _queue(self, write: _Write) -> None:
        if not self.enabled:
            return
        if write.devices and write.uid not in self._pending and self._written.get(write.uid) == write.devices:
            return
        if not write.devices and write.uid not in self._written and write.uid != self._writing:
            # Nothing of ours can be on the server: the entries were never written.
            self._pending.pop(write.uid, None)
            return
        now = time.monotonic()
        if not self._pending:
            self._waiting_since = now
        self._last_change = now
        self._pending[write.uid] = write
        self._wake.set()

    async def _lull(self) -> None:
        """Return once no change came for QUIET seconds, or the oldest waiting has waited MOST_DELAY."""
        while True:
            wait = min(self._last_change + QUIET, self._waiting_since + MOST_DELAY) - time.monotonic()
            if wait <= 0:
                return
            await anyio.sleep(wait)

    async def run(self) -> None:
        """Write what is queued, until cancelled."""
        while self.enabled:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self._lull()
            while self._pending and self.enabled:
                uid = next(iter(self._pending))
                write = self._pending.pop(uid)
                self._writing = uid
                try:
                    written = await self._write(write)
                finally:
                    self._writing = ""
                if not written:
                    # Kept for later unless a newer change of the claim came meanwhile.
                    self._pending.setdefault(uid, write)
                    delay = _RETRY_SECONDS[min(self._retries, len(_RETRY_SECONDS) - 1)]
                    self._retries += 1
                    await anyio.sleep(delay)
                elif self._pending and time.monotonic() - self._last_change < QUIET:
                    # The kubelet is calling: the API server's and this loop's time is the calls' first.
                    await anyio.sleep(PACE)

    async def _write(self, write: _Write) -> bool:
        """One apply; False when the API server did not answer and it is to be tried again."""
        operation = "set" if write.devices else "remove"
        result = "error"
        try:
            stored = await self._kube.apply_resource_claim_devices(
                write.namespace, write.name, write.uid, write.devices, self._manager
            )
            result = "success"
        except UnreachableError as err:
            log.info("cannot write ResourceClaim %s/%s's status yet: %s", write.namespace, write.name, err)
            return False
        except (NotFoundError, ConflictError):
            # Deleted, or re-created under the same name: nothing of ours to write or remove.
            result = "gone"
            self._written.pop(write.uid, None)
            return True
        except KubeError as err:
            self._refused(write, err)
            return True
        finally:
            metrics.CLAIM_STATUS_WRITES.labels(operation, result).inc()
        self._retries = 0
        if write.devices and not self._kept(stored):
            self.enabled = False
            log.warning(
                "the API server does not keep ResourceClaim status.devices (feature gate "
                "DRAResourceClaimDeviceStatus off): prepared claims do not name their devices"
            )
        elif write.devices:
            self._written[write.uid] = write.devices
        else:
            self._written.pop(write.uid, None)
        return True

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
