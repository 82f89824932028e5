"""Prepared-claim state of the node: decisions, CDI specs and the checkpoint, kept consistent.

Order of effects, so that a crash at any point is recoverable:
- prepare writes the claim's CDI spec, then the checkpoint, then answers; a
  spec without a checkpoint entry is removed at the next start-up and the
  kubelet retries the prepare;
- unprepare removes the spec, then the checkpoint entry; a leftover entry is
  unprepared again when the kubelet retries.
Calls are serialised by a lock; they block on file I/O and run in worker threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import CheckpointStore
from dra.core import cdi
from dra.core import config as deviceconfig
from dra.core.allocation import ClaimAllocation, ClaimError, DeviceHeldError
from dra.model.devices import Device, Inventory
from dra.model.prepared import PreparedClaim, PreparedDevice

log = logging.getLogger(__name__)


def _recorded(claim: PreparedClaim) -> set[tuple[str, str]]:
    return {(d.device, request) for d in claim.devices for request in d.request_names}


def _requested(allocation: ClaimAllocation) -> set[tuple[str, str]]:
    return {(r.device, r.request_name) for r in allocation.devices}


class DeviceState:
    """The node's prepared claims and the decisions about new ones."""

    def __init__(
        self,
        driver: str,
        node_name: str,
        inventory: Inventory,
        cdi_store: CdiStore,
        checkpoint: CheckpointStore,
    ) -> None:
        self.driver = driver
        self.pool = node_name
        self.inventory = inventory
        self._cdi = cdi_store
        self._checkpoint = checkpoint
        self._lock = threading.Lock()
        self._prepared: dict[str, PreparedClaim] = checkpoint.load()

    def set_inventory(self, inventory: Inventory) -> None:
        """Devices changed: new prepares see the new inventory; prepared claims stay as they are."""
        with self._lock:
            self.inventory = inventory

    @property
    def prepared(self) -> Mapping[str, PreparedClaim]:
        """Prepared claims by UID (a snapshot)."""
        return dict(self._prepared)

    def recover(self) -> None:
        """After a restart: drop specs of claims not prepared, write the specs of prepared ones."""
        with self._lock:
            self._checkpoint.remove_leftovers()
            self._cdi.remove_stale(keep=self._prepared)
            for claim in self._prepared.values():
                devices = self._devices_of(claim)
                # A spec that is there is rewritten too (the store leaves identical bytes alone), so
                # that one an older driver wrote gets the current layout before a container of the
                # claim restarts; but not to leave out a device that vanished: its edits do no harm.
                if not self._cdi.exists(claim.uid) or len(devices) == len(claim.devices):
                    self._write_spec(claim.uid, devices)

    def _devices_of(self, claim: PreparedClaim) -> list[Device]:
        found = []
        for entry in claim.devices:
            device = self.inventory.by_uuid(entry.uuid) if entry.uuid else self.inventory.get(entry.device)
            if device is None:
                log.warning(
                    "prepared claim %s/%s uses %s, which this node no longer has",
                    claim.namespace,
                    claim.name,
                    entry.device,
                )
            else:
                found.append(device)
        return found

    def _write_spec(self, uid: str, devices: list[Device]) -> None:
        if devices:
            self._cdi.write(uid, cdi.build_spec(self.driver, uid, devices, self.inventory))

    def _holders(self, device: Device, exclude_uid: str) -> list[PreparedClaim]:
        return [
            c for c in self._prepared.values() if c.uid != exclude_uid and c.holds(device.name, device.uuid)
        ]

    def _check(self, allocation: ClaimAllocation) -> list[Device]:
        problems: list[str] = []
        holders: dict[str, PreparedClaim] = {}
        devices: dict[str, Device] = {}
        for result in allocation.devices:
            if result.pool != self.pool:
                problems.append(
                    f"device {result.device} is in pool {result.pool!r}, not this node's pool {self.pool!r}"
                )
                continue
            device = self.inventory.get(result.device)
            if device is None:
                problems.append(f"device {result.device} does not exist on node {self.pool}")
                continue
            if not result.admin_access:
                for holder in self._holders(device, allocation.uid):
                    holders[holder.uid] = holder
                    problems.append(
                        f"device {result.device} is already prepared for claim "
                        f"{holder.namespace}/{holder.name} ({holder.uid})"
                    )
            try:
                deviceconfig.effective([c.parameters for c in allocation.configs_for(result)], device)
            except deviceconfig.ConfigError as err:
                problems.append(f"invalid configuration for device {result.device}: {err}")
            devices[device.name] = device
        if problems:
            message = f"cannot prepare ResourceClaim {allocation.ref}: " + "; ".join(problems)
            if holders:
                raise DeviceHeldError(message, [(h.namespace, h.name, h.uid) for h in holders.values()])
            raise ClaimError(message)
        return list(devices.values())

    def prepare(self, allocation: ClaimAllocation) -> PreparedClaim:
        """Prepare a claim, or return what an earlier prepare of it recorded."""
        with self._lock:
            existing = self._prepared.get(allocation.uid)
            if existing is not None:
                if _recorded(existing) == _requested(allocation):
                    if not self._cdi.exists(existing.uid):
                        self._write_spec(existing.uid, self._devices_of(existing))
                    return existing
                # The kubelet unprepares before a claim is allocated anew; if it did not, the
                # claim's current allocation is the truth, not the record.
                log.warning(
                    "claim %s (%s) is prepared with %s but now allocated %s: preparing it again",
                    allocation.ref,
                    allocation.uid,
                    sorted(_recorded(existing)),
                    sorted(_requested(allocation)),
                )
            devices = self._check(allocation)
            self._cdi.write(
                allocation.uid, cdi.build_spec(self.driver, allocation.uid, devices, self.inventory)
            )
            entries = []
            for device in devices:
                results = [r for r in allocation.devices if r.device == device.name]
                entries.append(
                    PreparedDevice(
                        request_names=tuple(dict.fromkeys(r.request_name for r in results)),
                        pool=self.pool,
                        device=device.name,
                        cdi_device_ids=(cdi.qualified_name(self.driver, allocation.uid, device.name),),
                        admin_access=all(r.admin_access for r in results),
                        uuid=device.uuid,
                    )
                )
            claim = PreparedClaim(
                uid=allocation.uid,
                namespace=allocation.namespace,
                name=allocation.name,
                devices=tuple(entries),
            )
            updated = {**self._prepared, claim.uid: claim}
            self._checkpoint.save(updated)
            self._prepared = updated
            log.info(
                "prepared claim %s (%s): %s", allocation.ref, claim.uid, ", ".join(d.name for d in devices)
            )
            return claim

    def unprepare(self, uid: str) -> PreparedClaim | None:
        """Undo a prepare; an unknown claim is fine (its stray spec, if any, goes too)."""
        with self._lock:
            self._cdi.remove(uid)
            claim = self._prepared.get(uid)
            if claim is None:
                return None
            updated = {k: v for k, v in self._prepared.items() if k != uid}
            self._checkpoint.save(updated)
            self._prepared = updated
            log.info("unprepared claim %s/%s (%s)", claim.namespace, claim.name, uid)
            return claim
