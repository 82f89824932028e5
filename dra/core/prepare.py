"""Preparing and unpreparing a claim: what it gets, decided over plain data, and the steps that give it.

`decide_prepare` says what a claim gets (its record, its CDI spec, the holders
it releases, the MIG devices to make) or why it is refused; `prepare` and
`unprepare` are the programs (dra.core.steps) the executor runs, in the order
that a crash at any step leaves recoverable (docs/architecture.md, "Prepare,
step by step"). Nothing here touches a file, a GPU or the API server.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dra.core import cdi, migdevices, sharing
from dra.core import config as deviceconfig
from dra.core.allocation import AllocatedDevice, ClaimAllocation, ClaimError
from dra.core.migdevices import CreateMig
from dra.core.steps import (
    ApplyTimeSlices,
    AskStale,
    Facts,
    HasSpec,
    Log,
    Mark,
    MissingHostPaths,
    Node,
    Program,
    ReadState,
    ReleaseMps,
    RemoveSpec,
    RestoreTimeSlices,
    Save,
    StartMps,
    StepError,
    Sync,
    WriteSpec,
    ask,
)
from dra.model.devices import Device, Inventory, MigDevice, MigPartition
from dra.model.prepared import PreparedClaim, PreparedDevice

Obj = dict[str, Any]


@dataclass(frozen=True)
class Release:
    """A prepared claim the API server says is gone: its spec and checkpoint entry go."""

    holder: PreparedClaim
    reason: str


@dataclass(frozen=True)
class MissingDevice:
    """A device a prepared claim records that the inventory no longer has (left out of its spec)."""

    claim: PreparedClaim
    device: str

    @property
    def message(self) -> str:
        """The warning for the log."""
        return (
            f"prepared claim {self.claim.namespace}/{self.claim.name} uses {self.device}, "
            "which this node no longer has"
        )


@dataclass(frozen=True)
class PreparePlan:
    """Prepare one claim: release `release`, write `spec` if any, record `claim` if `record`, answer it.

    With `create` (dynamic MIG), those MIG devices are made first (dra.core.migdevices), and
    `made` finishes the plan once they exist (it builds the spec).
    """

    claim: PreparedClaim
    #: The claim's CDI spec; None when the one on disk is right (or no device of it is left).
    spec: Obj | None = None
    #: Whether the checkpoint must record `claim` (new, or its devices changed).
    record: bool = False
    release: tuple[Release, ...] = ()
    #: The record this plan replaces: the claim was allocated anew without an unprepare.
    replaces: PreparedClaim | None = None
    missing: tuple[MissingDevice, ...] = ()
    create: tuple[CreateMig, ...] = ()
    #: With `create`: the claim's devices that exist already, for the spec `made` builds.
    devices: tuple[Device, ...] = ()

    def made(
        self, created: Mapping[str, MigDevice], inventory: Inventory, driver: str, mps_root: str = ""
    ) -> PreparePlan:
        """The plan once the MIG devices of `create` exist (by allocated device name): answer and spec."""
        entries = tuple(
            replace(d, uuid=created[d.device].uuid) if d.device in created else d for d in self.claim.devices
        )
        # Named as the offer the claim was allocated, which the CDI IDs in the answer name.
        devices = [*self.devices, *(replace(created[c.device], name=c.device) for c in self.create)]
        return replace(
            self,
            claim=replace(self.claim, devices=entries),
            spec=_spec(replace(self.claim, devices=entries), devices, inventory, driver, mps_root),
            create=(),
            devices=(),
        )


@dataclass(frozen=True)
class Refusal:
    """The claim cannot be prepared; `message` is what the admin sees. Nothing changes."""

    message: str


@dataclass(frozen=True)
class UnpreparePlan:
    """Remove the spec of `uid` (a stray one too), then drop `claim` from the checkpoint if prepared."""

    uid: str
    claim: PreparedClaim | None


def recorded(claim: PreparedClaim) -> set[tuple[str, str]]:
    """(device, request) pairs a prepared claim records."""
    return {(d.device, request) for d in claim.devices for request in d.request_names}


def _requested(allocation: ClaimAllocation) -> set[tuple[str, str]]:
    return {(r.device, r.request_name) for r in allocation.devices}


def _up_to_date(allocation: ClaimAllocation, prepared: Mapping[str, PreparedClaim]) -> PreparedClaim | None:
    existing = prepared.get(allocation.uid)
    if existing is not None and recorded(existing) == _requested(allocation):
        return existing
    return None


def _holders(
    device: Device, uid: str, prepared: Mapping[str, PreparedClaim], share_id: str = ""
) -> list[PreparedClaim]:
    return [c for c in prepared.values() if c.uid != uid and c.holds(device.name, device.uuid, share_id)]


def conflicts(
    allocation: ClaimAllocation, inventory: Inventory, prepared: Mapping[str, PreparedClaim], *, pool: str
) -> list[PreparedClaim]:
    """Prepared claims holding a device the allocation needs exclusively: ask the API server about these."""
    if _up_to_date(allocation, prepared) is not None:
        return []
    found: dict[str, PreparedClaim] = {}
    for result in allocation.devices:
        device = inventory.get(result.device) if result.pool == pool else None
        if device is not None and not result.admin_access:
            found.update((h.uid, h) for h in _holders(device, allocation.uid, prepared, result.share_id))
    return list(found.values())


def _devices_of(claim: PreparedClaim, inventory: Inventory) -> tuple[list[Device], list[MissingDevice]]:
    found: list[Device] = []
    missing: list[MissingDevice] = []
    for entry in claim.devices:
        device = inventory.by_uuid(entry.uuid) if entry.uuid else inventory.get(entry.device)
        if device is None:
            missing.append(MissingDevice(claim, entry.device))
        elif isinstance(device, MigDevice) and device.name != entry.device:
            # A dynamic MIG device: the kubelet knows it by the offer's name, which its CDI ID carries.
            found.append(replace(device, name=entry.device))
        else:
            found.append(device)
    return found, missing


def _spec(
    claim: PreparedClaim, devices: list[Device], inventory: Inventory, driver: str, mps_root: str
) -> Obj:
    share_env = {d.device: sharing.share_env(d) for d in claim.devices}
    unique = list({d.name: d for d in devices}.values())
    mps = sharing.mps_edits(claim, mps_root)
    return cdi.build_spec(driver, claim.uid, unique, inventory, device_env=share_env, claim_edits=mps)


def respec(
    claim: PreparedClaim, inventory: Inventory, driver: str, mps_root: str
) -> tuple[Obj | None, list[MissingDevice]]:
    """The spec a prepared claim's devices still present on the node give, or None when none is."""
    devices, missing = _devices_of(claim, inventory)
    return (_spec(claim, devices, inventory, driver, mps_root) if devices else None), missing


def decide_prepare(
    allocation: ClaimAllocation,
    inventory: Inventory,
    prepared: Mapping[str, PreparedClaim],
    *,
    driver: str,
    pool: str,
    stale: Mapping[str, str],
    has_spec: bool,
    mps_root: str = "",
) -> PreparePlan | Refusal:
    """What preparing `allocation` takes, given the facts about its holders.

    `stale` maps the UID of a conflicting holder to why the API server says it is
    gone (see `conflicts`); a holder not in it is live and refuses the claim.
    `has_spec` says whether the claim's spec is on disk. A claim already prepared
    with the same devices gets its recorded answer, and its spec back if missing.
    `mps_root` is where claims' MPS daemons keep their directories ("": no MPS here).
    """
    existing = _up_to_date(allocation, prepared)
    if existing is not None:
        spec, missing = (None, []) if has_spec else respec(existing, inventory, driver, mps_root)
        return PreparePlan(claim=existing, spec=spec, missing=tuple(missing))

    problems: list[str] = []
    releases: dict[str, Release] = {}
    devices: dict[str, Device] = {}
    creates: dict[str, CreateMig] = {}
    for result in allocation.devices:
        if result.pool != pool:
            problems.append(
                f"device {result.device} is in pool {result.pool!r}, not this node's pool {pool!r}"
            )
            continue
        device = inventory.get(result.device)
        partition = inventory.partition(result.device) if device is None else None
        if partition is not None:
            if result.admin_access:
                problems.append(
                    f"device {result.device} is a dynamic MIG device, which admin access cannot use"
                )
            creates[partition.name] = CreateMig(partition)
            continue
        if device is None:
            problems.append(f"device {result.device} does not exist on node {pool}")
            continue
        if not result.admin_access:
            for holder in _holders(device, allocation.uid, prepared, result.share_id):
                reason = stale.get(holder.uid)
                if reason is not None:
                    releases[holder.uid] = Release(holder, reason)
                else:
                    problems.append(
                        f"device {result.device} is already prepared for claim "
                        f"{holder.namespace}/{holder.name} ({holder.uid})"
                    )
        devices[device.name] = device
    # Configs apply to the MIG devices to be made as to those that exist.
    configured = {**devices, **{name: _to_be_made(c.partition) for name, c in creates.items()}}
    problems.extend(deviceconfig.problems(allocation, configured))
    if problems:
        return _refusal(allocation, problems)
    intervals, mps_settings, problems = sharing.decide_sharing(allocation, configured, prepared, mps_root)
    if problems:
        return _refusal(allocation, problems)

    # A MIG device still to be made has no UUID yet: it is filled in once it exists (PreparePlan.made).
    entries = [
        PreparedDevice(
            request_names=tuple(dict.fromkeys(r.request_name for r in results)),
            pool=pool,
            device=device.name,
            cdi_device_ids=(cdi.qualified_name(driver, allocation.uid, device.name),),
            admin_access=all(r.admin_access for r in results),
            uuid=device.uuid,
            time_slice=intervals.get(device.name, ""),
            share_id=results[0].share_id,
            share_memory=results[0].consumed("memory") if results[0].share_id else "",
            **sharing.mps_fields(mps_settings.get(device.name)),
        )
        for device in configured.values()
        for results in _by_share(allocation, device.name)
    ]
    claim = PreparedClaim(
        uid=allocation.uid, namespace=allocation.namespace, name=allocation.name, devices=tuple(entries)
    )
    return PreparePlan(
        claim=claim,
        spec=None if creates else _spec(claim, list(devices.values()), inventory, driver, mps_root),
        record=True,
        release=tuple(releases.values()),
        replaces=prepared.get(allocation.uid),
        create=tuple(creates.values()),
        devices=tuple(devices.values()) if creates else (),
    )


def _by_share(allocation: ClaimAllocation, device: str) -> list[list[AllocatedDevice]]:
    """The allocation's results for a device, one list per share (in practice a claim holds one at most)."""
    results = [r for r in allocation.devices if r.device == device]
    shares = dict.fromkeys(r.share_id for r in results)
    return [[r for r in results if r.share_id == share] for share in shares]


def _to_be_made(partition: MigPartition) -> MigDevice:
    """The MIG device a dynamic-MIG offer becomes, as far as it is known before it is made: no UUID yet."""
    return MigDevice(
        name=partition.name,
        uuid="",
        parent=partition.parent,
        profile=partition.profile,
        gpu_instance_id=0,
        compute_instance_id=0,
        memory_bytes=partition.memory_bytes,
        engines=partition.engines,
        device_nodes=(),
    )


def _refusal(allocation: ClaimAllocation, problems: list[str]) -> Refusal:
    return Refusal(f"cannot prepare ResourceClaim {allocation.ref}: " + "; ".join(problems))


def decide_unprepare(uid: str, prepared: Mapping[str, PreparedClaim]) -> UnpreparePlan:
    """Unpreparing a claim: an unknown one only loses its stray spec, if any."""
    return UnpreparePlan(uid=uid, claim=prepared.get(uid))


def prepare(node: Node, allocation: ClaimAllocation, facts: Facts) -> Program[PreparedClaim]:
    """Prepare a claim, or give its recorded answer; ClaimError when it cannot be, and then nothing changes.

    Prepared claims holding a device the allocation needs are asked about first (AskStale): those the
    API server says are gone are released, the others refuse the claim.
    """
    holders = conflicts(allocation, facts.inventory, facts.prepared, pool=node.pool)
    stale: Mapping[str, str] = {}
    if holders:
        stale = yield from ask(AskStale(tuple(holders)))
        # Decided again on the state as it is now: a holder that appeared meanwhile counts as live.
        facts = yield from ask(ReadState())
    has_spec = yield from ask(HasSpec(allocation.uid))
    plan = decide_prepare(
        allocation,
        facts.inventory,
        facts.prepared,
        driver=node.driver,
        pool=node.pool,
        stale=stale,
        has_spec=has_spec,
        mps_root=node.mps_root,
    )
    if isinstance(plan, Refusal):
        raise ClaimError(plan.message)
    # A claim allocated anew, or a stale holder released, gives its MIG devices back first.
    for uid in {r.holder.uid for r in plan.release} | ({plan.replaces.uid} if plan.replaces else set()):
        facts = yield from migdevices.destroy_claim_devices(node, uid, facts)
    if plan.record and node.mig:
        facts = yield from migdevices.switch_for_claim(node, allocation, plan.claim, plan.create, facts)
    if plan.create:
        made, inventory = yield from migdevices.make(node, allocation, plan.create, facts)
        plan = plan.made(made, inventory, node.driver, node.mps_root)
        facts = yield from ask(ReadState())
    if plan.spec is not None:
        gone = yield from _missing_host_paths(node, plan)
        if gone:
            # The runtime would fail every container of the claim on a path that is gone.
            yield from migdevices.destroy_claim_devices(node, allocation.uid, facts)
            raise ClaimError(
                f"cannot prepare ResourceClaim {allocation.ref}: its CDI spec would name "
                f"{', '.join(gone)}, not on this node (a GPU or the driver changed since discovery)"
            )
    ticket, facts = yield from _write_and_record(node, allocation, plan, facts)
    yield Mark(point="sharing-before-gpu-settings")
    yield from _gpu_settings(node, allocation, plan, facts)
    if ticket:
        # Without the lock: prepares of other claims go on, and concurrent ones share one fsync.
        try:
            yield Sync(ticket, point="prepare.checkpoint-saved")
        except StepError as err:
            now = yield from ask(ReadState())
            if now.prepared.get(plan.claim.uid) is plan.claim:
                yield from unprepare(node, plan.claim.uid, now)
            raise ClaimError(
                f"cannot record claim {allocation.ref} in the checkpoint {node.checkpoint}: {err}"
            ) from None
    return plan.claim


def _missing_host_paths(node: Node, plan: PreparePlan) -> Program[tuple[str, ...]]:
    """Host paths the plan's spec names that are not on this node, but for those the prepare makes.

    The MPS directories of the claim's devices come with their daemon, which starts after the spec is written.
    """
    assert plan.spec is not None
    gone = yield from ask(MissingHostPaths(plan.spec))
    if not node.mps:
        return gone
    own = sharing.mps_dirs(node.mps_root, sharing.claim_mps_key(plan.claim)).root + "/"
    return tuple(path for path in gone if not path.startswith(own))


def _write_and_record(
    node: Node, allocation: ClaimAllocation, plan: PreparePlan, facts: Facts
) -> Program[tuple[int, Facts]]:
    """Release stale holders' specs, write the spec, record the claim; the ticket to sync (0: none)."""
    if plan.replaces is not None:
        # The kubelet unprepares before a claim is allocated anew; if it did not, the
        # claim's current allocation is the truth, not the record.
        yield Log(
            "warning",
            f"claim {allocation.ref} ({allocation.uid}) is prepared with {sorted(recorded(plan.replaces))} "
            f"but now allocated {sorted(recorded(plan.claim))}: preparing it again",
        )
    for release in plan.release:
        holder = release.holder
        yield Log(
            "warning",
            f"releasing {holder.namespace}/{holder.name} ({holder.uid}), prepared but stale: "
            + release.reason,
        )
        yield RemoveSpec(holder.uid, point="prepare.stale-spec-removed")
    for gone in plan.missing:
        yield Log("warning", gone.message)
    if plan.spec is not None:
        yield Mark(point="prepare.before-cdi-write")
        try:
            yield WriteSpec(plan.claim.uid, plan.spec, point="prepare.cdi-written")
        except StepError as err:
            yield from _drop_unrecorded_spec(plan.claim.uid, facts)
            raise ClaimError(f"cannot write the CDI spec of claim {allocation.ref}: {err}") from None
    if not plan.record:
        return 0, facts
    released = {r.holder.uid for r in plan.release}
    updated = {uid: c for uid, c in facts.prepared.items() if uid not in released}
    updated[plan.claim.uid] = plan.claim
    actions = tuple(a for a in facts.actions if a.claim_uid not in released)
    try:
        ticket = yield from ask(Save(updated, actions, durable=False))
    except StepError as err:
        # A failed directory fsync comes after the rename: put back the record the kubelet is told of.
        with contextlib.suppress(StepError):
            yield Save(facts.prepared, facts.actions)
        yield from _drop_unrecorded_spec(plan.claim.uid, facts)
        raise ClaimError(
            f"cannot record claim {allocation.ref} in the checkpoint {node.checkpoint}: {err}"
        ) from None
    yield Log(
        "info",
        f"prepared claim {allocation.ref} ({plan.claim.uid}): "
        + ", ".join(d.device for d in plan.claim.devices),
    )
    return ticket, replace(facts, prepared=updated, actions=actions)


def _drop_unrecorded_spec(uid: str, facts: Facts) -> Program[None]:
    """After a failed write: remove the claim's spec unless the checkpoint records the claim."""
    if uid in facts.prepared:
        return
    # Best effort on a failing disk: a spec that stays is removed at the next start-up.
    with contextlib.suppress(StepError):
        yield RemoveSpec(uid)


def _gpu_settings(node: Node, allocation: ClaimAllocation, plan: PreparePlan, facts: Facts) -> Program[None]:
    """Set the claim's time slices, start its MPS daemon (again, on a retry); a failure undoes the prepare."""
    wanted = sharing.wanted_time_slices({plan.claim.uid: plan.claim})
    try:
        if node.time_slicing and wanted:
            yield ApplyTimeSlices(wanted)
        if node.mps:
            if plan.replaces is not None:
                # The daemon of the old allocation's devices, unless the new one or another claim uses it.
                yield ReleaseMps(plan.replaces, facts.prepared)
            yield StartMps(plan.claim)
    except StepError as err:
        yield from unprepare(node, plan.claim.uid, facts)
        raise ClaimError(f"cannot prepare ResourceClaim {allocation.ref}: {err}") from None


def unprepare(node: Node, uid: str, facts: Facts) -> Program[PreparedClaim | None]:
    """Undo a prepare; an unknown claim is fine (its stray spec, if any, goes too)."""
    plan = decide_unprepare(uid, facts.prepared)
    if plan.claim is None:
        yield RemoveSpec(uid)
        return None
    claim = plan.claim
    yield RemoveSpec(uid, point="unprepare.spec-removed")
    others = {k: v for k, v in facts.prepared.items() if k != uid}
    if node.time_slicing:
        yield RestoreTimeSlices(tuple(sharing.time_slices_to_restore(uid, facts.prepared)))
    if node.mps:
        yield ReleaseMps(claim, others)
    yield Mark(point="sharing-before-unrecord")
    parents = migdevices.claim_parents(uid, facts)
    try:
        facts = yield from migdevices.destroy_claim_devices(node, uid, facts)
    except StepError as err:
        raise ClaimError(
            f"cannot unprepare claim {claim.namespace}/{claim.name}: destroying its MIG "
            f"device failed (NVML error {err.code}: {err}); the kubelet retries"
        ) from None
    yield from migdevices.release_mig_mode(node, parents, facts)
    # Not fsynced: an entry back after a power loss is a stale holder, released when needed.
    yield Save(others, facts.actions, durable=False, point="unprepare.checkpoint-saved")
    yield Log("info", f"unprepared claim {claim.namespace}/{claim.name} ({uid})")
    return claim
