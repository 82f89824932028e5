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
from dataclasses import dataclass, field, replace
from typing import Any

from dra.core import cdi, devicemetadata, migdevices, sharing, vfio
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
    RemoveMetadata,
    RemoveSpec,
    RestoreTimeSlices,
    Save,
    StartMps,
    StepError,
    Sync,
    WriteMetadata,
    WriteSpec,
    ask,
)
from dra.model.devices import Device, Inventory, MigDevice, MigPartition
from dra.model.prepared import Holders, PreparedClaim, PreparedDevice

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
    #: The GPUs passed through (VfioDeviceConfig), by name: whether each gets the IOMMU API device.
    #: They are bound to vfio-pci (dra.core.vfio) before the spec, which names their groups, is built.
    vfio: Mapping[str, bool] = field(default_factory=dict)
    #: The claim's device metadata files, written with `spec` (the claim records `metadata`).
    metadata: devicemetadata.ClaimMetadata | None = None

    def made(
        self,
        created: Mapping[str, MigDevice],
        inventory: Inventory,
        driver: str,
        mps_root: str = "",
        metadata_root: str = "",
    ) -> PreparePlan:
        """The plan once the MIG devices of `create` exist (by allocated device name): answer and spec."""
        entries = tuple(
            replace(d, uuid=created[d.device].uuid) if d.device in created else d for d in self.claim.devices
        )
        # Named as the offer the claim was allocated, which the CDI IDs in the answer name.
        devices = [*self.devices, *(replace(created[c.device], name=c.device) for c in self.create)]
        claim = replace(self.claim, devices=entries)
        spec, metadata = _outputs(claim, devices, inventory, driver, mps_root, metadata_root)
        return replace(self, claim=claim, spec=spec, metadata=metadata, create=(), devices=())


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


def conflicts(
    allocation: ClaimAllocation,
    inventory: Inventory,
    prepared: Mapping[str, PreparedClaim],
    *,
    pool: str,
    holders: Holders | None = None,
) -> list[PreparedClaim]:
    """Prepared claims holding a device the allocation needs exclusively: ask the API server about these.

    `holders` indexes `prepared` (Facts.holders); built here when not given.
    """
    if _up_to_date(allocation, prepared) is not None:
        return []
    holders = holders or Holders(prepared)
    found: dict[str, PreparedClaim] = {}
    for result in allocation.devices:
        device = inventory.device_or_twin(result.device) if result.pool == pool else None
        partition = inventory.partition(result.device) if device is None and result.pool == pool else None
        if partition is not None:
            device = _made_for_offer(partition, allocation.uid, holders, inventory, {})
        if device is not None and not result.admin_access:
            held = holders.of(device.name, device.uuid, allocation.uid, result.share_id)
            found.update((h.uid, h) for h in held)
    return list(found.values())


def _devices_of(claim: PreparedClaim, inventory: Inventory) -> tuple[list[Device], list[MissingDevice]]:
    found: list[Device] = []
    missing: list[MissingDevice] = []
    for entry in claim.devices:
        device = inventory.by_uuid(entry.uuid) if entry.uuid else inventory.get(entry.device)
        if device is None:
            missing.append(MissingDevice(claim, entry.device))
        elif device.name != entry.device:
            # A dynamic MIG device, or a GPU through its passthrough twin: the kubelet knows it by the
            # offer's or twin's name, which its CDI ID carries.
            found.append(replace(device, name=entry.device))
        else:
            found.append(device)
    return found, missing


def _outputs(
    claim: PreparedClaim,
    devices: list[Device],
    inventory: Inventory,
    driver: str,
    mps_root: str,
    metadata_root: str,
) -> tuple[Obj, devicemetadata.ClaimMetadata | None]:
    """The claim's CDI spec, and its metadata files if it records having them (mounted by the spec)."""
    share_env = {d.device: sharing.share_env(d) for d in claim.devices}
    unique = list({d.name: d for d in devices}.values())
    mps = sharing.mps_edits(claim, mps_root)
    metadata = (
        devicemetadata.for_claim(driver, metadata_root, claim, unique, inventory) if claim.metadata else None
    )
    passthrough = {d.device: d.vfio_group for d in claim.devices if d.vfio_group >= 0}
    spec = cdi.build_spec(
        driver,
        claim.uid,
        unique,
        inventory,
        device_env=share_env,
        claim_edits=mps,
        passthrough=passthrough,
        vfio_api_device=any(d.vfio_api_device for d in claim.devices),
        extra_devices=metadata.cdi_devices if metadata else (),
    )
    return spec, metadata


@dataclass(frozen=True)
class Respec:
    """What a prepared claim's devices still present on the node give: its spec and metadata files."""

    #: None when no device of the claim is left.
    spec: Obj | None
    metadata: devicemetadata.ClaimMetadata | None
    missing: tuple[MissingDevice, ...]


def respec(
    claim: PreparedClaim, inventory: Inventory, driver: str, mps_root: str, metadata_root: str = ""
) -> Respec:
    """The spec (and metadata files) a prepared claim's devices still present on the node give."""
    devices, missing = _devices_of(claim, inventory)
    if not devices:
        return Respec(None, None, tuple(missing))
    spec, metadata = _outputs(claim, devices, inventory, driver, mps_root, metadata_root)
    return Respec(spec, metadata, tuple(missing))


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
    vfio_enabled: bool = False,
    equal_shares: int = 0,
    metadata_root: str = "",
    device_metadata: bool = False,
    holders: Holders | None = None,
) -> PreparePlan | Refusal:
    """What preparing `allocation` takes, given the facts about its holders.

    `stale` maps the UID of a conflicting holder to why the API server says it is
    gone (see `conflicts`); a holder not in it is live and refuses the claim.
    `has_spec` says whether the claim's spec is on disk. A claim already prepared
    with the same devices gets its recorded answer, and its spec back if missing.
    `mps_root` is where claims' MPS daemons keep their directories ("": no MPS here);
    `vfio_enabled` whether GPUs may be passed through here.
    `equal_shares` is N where shareable devices are divided into N equal shares (0: not so).
    `device_metadata`: the claim gets device metadata files (KEP-5304) under `metadata_root`.
    `holders` indexes `prepared` (Facts.holders); built here when not given.
    """
    existing = _up_to_date(allocation, prepared)
    if existing is not None:
        if has_spec:
            return PreparePlan(claim=existing)
        again = respec(existing, inventory, driver, mps_root, metadata_root)
        return PreparePlan(claim=existing, spec=again.spec, metadata=again.metadata, missing=again.missing)
    holders = holders or Holders(prepared)

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
        device = inventory.device_or_twin(result.device)
        partition = inventory.partition(result.device) if device is None else None
        if partition is not None:
            if result.admin_access:
                problems.append(
                    f"device {result.device} is a dynamic MIG device, which admin access cannot use"
                )
            device = _made_for_offer(partition, allocation.uid, holders, inventory, stale)
            if device is None:
                creates[partition.name] = CreateMig(partition)
                continue
        if device is None:
            problems.append(f"device {result.device} does not exist on node {pool}")
            continue
        if not result.admin_access:
            for holder in holders.of(device.name, device.uuid, allocation.uid, result.share_id):
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
    passthrough = vfio.passthrough(allocation, configured)
    problems = vfio.problems(allocation, configured, passthrough, inventory, enabled=vfio_enabled)
    if problems:
        return _refusal(allocation, problems)
    intervals, mps_settings, problems = sharing.decide_sharing(
        allocation, configured, prepared, mps_root, equal_shares
    )
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
        uid=allocation.uid,
        namespace=allocation.namespace,
        name=allocation.name,
        devices=tuple(_with_metadata_ids(entries, driver, allocation.uid) if device_metadata else entries),
        pod_claim_name=allocation.pod_claim_name,
        metadata=device_metadata,
    )
    spec, metadata = (
        (None, None)
        if creates or passthrough
        else _outputs(claim, list(devices.values()), inventory, driver, mps_root, metadata_root)
    )
    return PreparePlan(
        claim=claim,
        spec=spec,
        metadata=metadata,
        record=True,
        release=tuple(releases.values()),
        replaces=prepared.get(allocation.uid),
        create=tuple(creates.values()),
        devices=tuple(devices.values()) if creates else (),
        vfio=passthrough,
    )


def _with_metadata_ids(entries: list[PreparedDevice], driver: str, uid: str) -> list[PreparedDevice]:
    """The first device of each request also names the CDI device of the request's metadata file.

    Once per request, as the Go helper does: a container gets each request's file mounted once.
    """
    seen: set[str] = set()
    result = []
    for entry in entries:
        new = [r for r in entry.request_names if r not in seen]
        seen.update(new)
        ids = tuple(devicemetadata.cdi_device_id(driver, uid, r) for r in new)
        result.append(replace(entry, cdi_device_ids=entry.cdi_device_ids + ids))
    return result


def _made_for_offer(
    partition: MigPartition, uid: str, holders: Holders, inventory: Inventory, stale: Mapping[str, str]
) -> MigDevice | None:
    """The MIG device made for this offer for a live claim other than `uid`, known by the offer's name.

    A share of a shared offer uses the device the first share made (the holder checks then say
    whether the two may share it); a stale holder's device goes with its release, so a new one is made.
    """
    for claim, entry in holders.named(partition.name):
        if claim.uid == uid or claim.uid in stale or not entry.uuid:
            continue
        made = inventory.by_uuid(entry.uuid)
        if isinstance(made, MigDevice):
            return replace(made, name=partition.name)
    return None


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
    live = conflicts(allocation, facts.inventory, facts.prepared, pool=node.pool, holders=facts.holders)
    stale: Mapping[str, str] = {}
    if live:
        stale = yield from ask(AskStale(tuple(live)))
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
        vfio_enabled=node.vfio,
        equal_shares=node.equal_shares,
        metadata_root=node.metadata_root,
        device_metadata=node.device_metadata,
        holders=facts.holders,
    )
    if isinstance(plan, Refusal):
        raise ClaimError(plan.message)
    # A claim allocated anew, or a stale holder released, gives its MIG devices back first.
    for uid in {r.holder.uid for r in plan.release} | ({plan.replaces.uid} if plan.replaces else set()):
        facts = yield from _give_back_gpus(allocation, uid, facts)
        facts = yield from migdevices.destroy_claim_devices(node, uid, facts)
    if plan.record and node.mig:
        facts = yield from migdevices.switch_for_claim(node, allocation, plan.claim, plan.create, facts)
    if plan.create:
        made, inventory = yield from migdevices.make(node, allocation, plan.create, facts)
        plan = plan.made(made, inventory, node.driver, node.mps_root, node.metadata_root)
        facts = yield from ask(ReadState())
    if plan.vfio:
        bound, facts = yield from vfio.bind(allocation, plan.claim, plan.vfio, facts)
        again = respec(bound, facts.inventory, node.driver, node.mps_root, node.metadata_root)
        plan = replace(plan, claim=bound, spec=again.spec, metadata=again.metadata)
    if plan.spec is not None:
        gone = yield from _missing_host_paths(node, plan)
        if gone:
            # The runtime would fail every container of the claim on a path that is gone.
            facts = yield from _give_back_gpus(allocation, allocation.uid, facts)
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


def _give_back_gpus(allocation: ClaimAllocation, uid: str, facts: Facts) -> Program[Facts]:
    """The GPUs claim `uid` passed through, back to nvidia before another claim or a failure moves on."""
    try:
        return (yield from vfio.release(uid, facts))
    except StepError as err:
        raise ClaimError(
            f"cannot prepare ResourceClaim {allocation.ref}: cannot give the GPUs of claim {uid} back to "
            f"the nvidia driver: {err}"
        ) from None


def _missing_host_paths(node: Node, plan: PreparePlan) -> Program[tuple[str, ...]]:
    """Host paths the plan's spec names that are not on this node, but for those the prepare makes.

    The MPS directories of the claim's devices come with their daemon, which starts after the spec is
    written; its metadata files are written just before the spec.
    """
    assert plan.spec is not None
    gone = yield from ask(MissingHostPaths(plan.spec))
    own: list[str] = []
    if node.mps:
        own.append(sharing.mps_dirs(node.mps_root, sharing.claim_mps_key(plan.claim)).root + "/")
    if plan.metadata is not None:
        own.append(f"{node.metadata_root.rstrip('/')}/{plan.metadata.directory}/")
    return tuple(path for path in gone if not path.startswith(tuple(own)))


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
        if holder.metadata and (holder.namespace, holder.name) != (plan.claim.namespace, plan.claim.name):
            yield RemoveMetadata(devicemetadata.claim_dir(holder.namespace, holder.name))
    for gone in plan.missing:
        yield Log("warning", gone.message)
    if plan.metadata is not None:
        try:
            yield WriteMetadata(
                plan.metadata.directory, plan.metadata.files, point="prepare.metadata-written"
            )
        except StepError as err:
            yield from _drop_unrecorded_metadata(plan.claim, facts)
            raise ClaimError(
                f"cannot write the device metadata files of claim {allocation.ref}: {err}"
            ) from None
    if plan.spec is not None:
        yield Mark(point="prepare.before-cdi-write")
        try:
            yield WriteSpec(plan.claim.uid, plan.spec, point="prepare.cdi-written")
        except StepError as err:
            yield from _drop_unrecorded_spec(plan.claim.uid, facts)
            yield from _drop_unrecorded_metadata(plan.claim, facts)
            raise ClaimError(f"cannot write the CDI spec of claim {allocation.ref}: {err}") from None
    if not plan.record:
        return 0, facts
    released = {r.holder.uid for r in plan.release}
    # Copied whole and then trimmed: a C copy, not a Python pass over a thousand claims.
    updated = dict(facts.prepared)
    for uid in released:
        updated.pop(uid, None)
    updated[plan.claim.uid] = plan.claim
    actions = tuple(a for a in facts.actions if a.claim_uid not in released)
    try:
        ticket = yield from ask(
            Save(updated, actions, durable=False, changed=frozenset({*released, plan.claim.uid}))
        )
    except StepError as err:
        # A failed directory fsync comes after the rename: put back the record the kubelet is told of.
        with contextlib.suppress(StepError):
            yield Save(facts.prepared, facts.actions)
        yield from _drop_unrecorded_spec(plan.claim.uid, facts)
        yield from _drop_unrecorded_metadata(plan.claim, facts)
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
    # Best effort on a failing disk: a spec that stays is removed, a GPU given back, at the next start-up.
    with contextlib.suppress(StepError):
        yield RemoveSpec(uid)
    with contextlib.suppress(StepError):
        yield from vfio.release(uid, facts)


def _drop_unrecorded_metadata(claim: PreparedClaim, facts: Facts) -> Program[None]:
    """After a failed write: remove the claim's metadata files unless the checkpoint records them."""
    recorded_claim = facts.prepared.get(claim.uid)
    if not claim.metadata or (recorded_claim is not None and recorded_claim.metadata):
        return
    # Best effort, as for the spec: start-up removes what stays.
    with contextlib.suppress(StepError):
        yield RemoveMetadata(devicemetadata.claim_dir(claim.namespace, claim.name))


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
    if claim.metadata:
        # After the spec: no container can start with a mount of a file that is gone.
        yield RemoveMetadata(
            devicemetadata.claim_dir(claim.namespace, claim.name), point="unprepare.metadata-removed"
        )
    others = dict(facts.prepared)
    others.pop(uid, None)
    if node.time_slicing:
        yield RestoreTimeSlices(tuple(sharing.time_slices_to_restore(uid, facts.prepared)))
    if node.mps:
        yield ReleaseMps(claim, others)
    yield Mark(point="sharing-before-unrecord")
    parents = migdevices.claim_parents(uid, facts)
    try:
        facts = yield from vfio.release(uid, facts)
    except StepError as err:
        raise ClaimError(
            f"cannot unprepare claim {claim.namespace}/{claim.name}: giving its GPU back to the nvidia "
            f"driver failed ({err}); the kubelet retries"
        ) from None
    try:
        facts = yield from migdevices.destroy_claim_devices(node, uid, facts)
    except StepError as err:
        raise ClaimError(
            f"cannot unprepare claim {claim.namespace}/{claim.name}: destroying its MIG "
            f"device failed (NVML error {err.code}: {err}); the kubelet retries"
        ) from None
    yield from migdevices.release_mig_mode(node, parents, facts)
    # Not fsynced: an entry back after a power loss is a stale holder, released when needed.
    yield Save(
        others, facts.actions, durable=False, changed=frozenset({uid}), point="unprepare.checkpoint-saved"
    )
    yield Log("info", f"unprepared claim {claim.namespace}/{claim.name} ({uid})")
    return claim
