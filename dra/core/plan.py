"""What a prepare or unprepare gives a claim, decided over plain data: the plan, or why the claim is refused.

`read_allocation` takes this driver's share of the ResourceClaim the API server returned, or says
why there is none (re-created, not allocated, no device of this driver). `decide_prepare` says
what a claim gets (its record, the holders it releases, the MIG devices to make, the GPUs to pass
through) or refuses it with every problem at once, from the allocation, the node's inventory and
prepared claims, and the node's settings (dra.model.node.Node). The claim's CDI spec and device
metadata files are built from what it then has by dra.core.cdi.respec, and the programs that
carry a plan out are dra.core.prepare's. Nothing here touches a file, a GPU or the API server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dra.core import cdi, migdevices, sharing, vfio
from dra.core import config as deviceconfig
from dra.model.allocation import (
    POD_CLAIM_NAME_ANNOTATION,
    AllocatedDevice,
    ClaimAllocation,
    ClaimError,
    OpaqueConfig,
)
from dra.model.devices import Device, Gpu, Inventory, MigDevice, MigPartition, is_vfio_twin
from dra.model.node import ClaimRead, Node
from dra.model.prepared import VFIO_BIND, DeviceAction, Holders, PreparedClaim, PreparedDevice


def read_allocation(claim: Mapping[str, Any], expected_uid: str, driver: str) -> ClaimAllocation:
    """This driver's allocation in `claim`, the ResourceClaim the kubelet named; ClaimError when none.

    The claim must be the one the kubelet meant (its UID), be allocated and have results of this
    driver; the message says which it is not. The configs kept are the opaque ones for this driver.
    """
    meta = claim.get("metadata") or {}
    ref = f"{meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != expected_uid:
        raise ClaimError(
            f"ResourceClaim {ref} has UID {meta.get('uid')}, but the kubelet asked for UID {expected_uid}: "
            "the claim was deleted and re-created; delete the pod so that it gets the new claim"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {ref} is not allocated yet")
    devices_status = allocation.get("devices") or {}
    results = devices_status.get("results") or []
    mine = [
        AllocatedDevice(
            request=str(r["request"]),
            pool=str(r["pool"]),
            device=str(r["device"]),
            admin_access=bool(r.get("adminAccess")),
            share_id=str(r.get("shareID") or ""),
            consumed_capacity=tuple(
                sorted((str(k), str(v)) for k, v in (r.get("consumedCapacity") or {}).items())
            ),
        )
        for r in results
        if r.get("driver") == driver
    ]
    if not mine:
        drivers = sorted({str(r.get("driver")) for r in results}) or ["none"]
        raise ClaimError(
            f"ResourceClaim {ref} has no device allocated by driver {driver} "
            f"(allocated by: {', '.join(drivers)})"
        )
    configs = tuple(
        OpaqueConfig(
            source=str(entry.get("source", "FromClaim")),
            requests=tuple(entry.get("requests") or ()),
            parameters=entry["opaque"].get("parameters") or {},
        )
        for entry in devices_status.get("config") or []
        if (entry.get("opaque") or {}).get("driver") == driver
    )
    return ClaimAllocation(
        uid=expected_uid,
        namespace=str(meta.get("namespace")),
        name=str(meta.get("name")),
        devices=tuple(mine),
        configs=configs,
        pod_claim_name=str((meta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION) or ""),
    )


@dataclass(frozen=True)
class Release:
    """A prepared claim the API server says is gone: its spec and checkpoint entry go."""

    holder: PreparedClaim
    reason: str


@dataclass(frozen=True)
class PreparePlan:
    """Prepare one claim: release `release`, record `claim` if `record`, write its spec if `write`, answer it.

    Everything a prepare does is here: the holders it releases, the MIG mode it switches on
    dynamic-MIG GPUs (`mig_off`, `mig_on`), the MIG devices it makes (`create`: dra.core.migdevices;
    `made` gives the claim their UUIDs), the GPUs it binds to vfio-pci (`vfio`), and the sharing
    settings its devices record (time slices, MPS: `mps`). A whole-GPU claim on a GPU outside
    dynamic MIG has none of the MIG fields, and its prepare runs no MIG step. The spec is built from
    what the claim then has (dra.core.cdi.respec), once.
    """

    claim: PreparedClaim
    #: Whether the claim's CDI spec (and its metadata files) must be written: a new claim, or one
    #: prepared before whose spec is not on disk.
    write: bool = False
    #: Whether the checkpoint must record `claim` (new, or its devices changed).
    record: bool = False
    release: tuple[Release, ...] = ()
    #: The record this plan replaces: the claim was allocated anew without an unprepare.
    replaces: PreparedClaim | None = None
    create: tuple[migdevices.CreateMig, ...] = ()
    #: The GPUs passed through (VfioDeviceConfig), by name: whether each gets the IOMMU API device.
    #: They are bound to vfio-pci (dra.core.vfio) before the spec, which names their groups, is built.
    vfio: Mapping[str, bool] = field(default_factory=dict)
    #: Dynamic-MIG GPUs the claim gets whole: MIG mode off (CUDA sees no GPU in MIG mode without MIG
    #: devices), after the MIG instances no prepared claim holds are destroyed.
    mig_off: tuple[Gpu, ...] = ()
    #: Dynamic-MIG GPUs the MIG devices of `create` are made on: MIG mode on first.
    mig_on: tuple[Gpu, ...] = ()

    @property
    def given_back(self) -> list[str]:
        """Whose passed-through GPUs and MIG devices go first: the released holders, the replaced record."""
        uids = [r.holder.uid for r in self.release]
        return (
            [*uids, self.replaces.uid]
            if self.replaces is not None and self.replaces.uid not in uids
            else uids
        )

    @property
    def mps(self) -> bool:
        """Whether the claim's devices use an MPS control daemon (dra.core.mpsdaemons starts or joins it)."""
        return self.claim.uses_mps

    def made(self, created: Mapping[str, MigDevice]) -> PreparePlan:
        """The plan once the MIG devices of `create` exist (by allocated device name), with their UUIDs."""
        entries = tuple(
            replace(d, uuid=created[d.device].uuid) if d.device in created else d for d in self.claim.devices
        )
        return replace(self, claim=replace(self.claim, devices=entries), create=())


@dataclass(frozen=True)
class Refusal:
    """The claim cannot be prepared; `message` is what the admin sees. Nothing changes."""

    message: str


@dataclass(frozen=True)
class UnpreparePlan:
    """Remove the spec of `uid` (a stray one too), then drop `claim` from the checkpoint if prepared.

    `passthrough` and `mig`: whether the claim has GPUs bound to vfio-pci to give back, or MIG
    devices (or a MIG mode switch) recorded; `mps`, whether it leaves an MPS daemon. A whole-GPU
    claim outside dynamic MIG and MPS has none, and its unprepare runs no such step.
    """

    uid: str
    claim: PreparedClaim | None
    passthrough: bool = False
    mig: bool = False

    @property
    def mps(self) -> bool:
        """Whether the claim used an MPS control daemon, which it leaves (the last one stops it)."""
        return self.claim is not None and self.claim.uses_mps


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


@dataclass(frozen=True)
class _Found:
    """One result of an allocation, looked up on the node: what it is, and who else holds it."""

    result: AllocatedDevice
    #: The device (for a dynamic-MIG offer, the MIG device made for another claim's share); None when
    #: the node has none of that name, or the offer's MIG device is still to be made.
    device: Device | None
    #: The dynamic-MIG offer the result names, if it names one.
    partition: MigPartition | None
    #: Prepared claims holding the device exclusively of this result (none for admin access).
    holders: tuple[PreparedClaim, ...]


def _lookup(
    allocation: ClaimAllocation, inventory: Inventory, pool: str, holders: Holders, stale: Mapping[str, str]
) -> list[_Found]:
    """Each result of the allocation looked up on the node, once: conflicts and decide_prepare read it."""
    found = []
    for result in allocation.devices:
        if result.pool != pool:
            found.append(_Found(result, None, None, ()))
            continue
        device = inventory.device_or_twin(result.device)
        partition = inventory.partition(result.device) if device is None else None
        if partition is not None:
            device = migdevices.made_for_offer(partition, allocation.uid, holders, inventory, stale)
        held = (
            ()
            if device is None or result.admin_access
            else tuple(holders.of(device.name, device.uuid, allocation.uid, result.share_id))
        )
        found.append(_Found(result, device, partition, held))
    return found


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
    found = _lookup(allocation, inventory, pool, holders or Holders(prepared), {})
    return list({h.uid: h for f in found for h in f.holders}.values())


#: Why a holder in each of these states no longer needs its devices (the kubelet lost track of it).
_STALE = {
    "gone": "the claim no longer exists",
    "re-created": "the claim was re-created",
    "deallocated": "the claim is no longer allocated",
}

#: The HTTP status of a GET of an object that does not exist.
_NOT_FOUND = 404


def _state_of(uid: str, read: ClaimRead) -> str:
    """gone, re-created, deallocated, allocated, or unknown (the API server did not say)."""
    if read.claim is None:
        return "gone" if read.status == _NOT_FOUND else "unknown"
    if (read.claim.get("metadata") or {}).get("uid") != uid:
        return "re-created"
    return "allocated" if (read.claim.get("status") or {}).get("allocation") else "deallocated"


def stale_reasons(reads: Mapping[str, ClaimRead]) -> dict[str, str]:
    """The holders whose devices a prepare may take, by UID, with why (ask_stale's answer, decided).

    A holder still allocated is a real conflict, whatever its pods do: the scheduler gives its
    devices to no other claim while it is. One the API server could not be asked about counts as
    live (`unanswered` says why): refusing now loses nothing, since the kubelet retries the prepare.
    """
    states = {uid: _state_of(uid, read) for uid, read in reads.items()}
    return {uid: _STALE[state] for uid, state in states.items() if state in _STALE}


def unanswered(reads: Mapping[str, ClaimRead]) -> dict[str, str]:
    """The holders the API server said nothing of, by UID, with its error: they count as live."""
    return {
        uid: f"HTTP {read.status}: {read.error}" if read.status else read.error
        for uid, read in reads.items()
        if _state_of(uid, read) == "unknown"
    }


def decide_prepare(
    allocation: ClaimAllocation,
    inventory: Inventory,
    prepared: Mapping[str, PreparedClaim],
    node: Node,
    *,
    stale: Mapping[str, str],
    has_spec: bool,
    holders: Holders | None = None,
    unknown: Mapping[str, str] | None = None,
) -> PreparePlan | Refusal:
    """What preparing `allocation` takes on `node`, given the facts about its holders.

    `stale` maps the UID of a conflicting holder to why the API server says it is
    gone (see `conflicts`); a holder not in it is live and refuses the claim, with the
    API server's error where `unknown` has one for it (it could not say).
    `has_spec` says whether the claim's spec is on disk. A claim already prepared
    with the same devices gets its recorded answer, and its spec back if missing.
    The node says where MPS daemons live, whether GPUs may be passed through, how
    shareable devices are divided and whether claims get device metadata files.
    `holders` indexes `prepared` (Facts.holders); built here when not given.
    """
    pool, driver = node.pool, node.driver
    existing = _up_to_date(allocation, prepared)
    if existing is not None:
        return PreparePlan(claim=existing, write=not has_spec)
    holders = holders or Holders(prepared)

    problems: list[str] = []
    releases: dict[str, Release] = {}
    devices: dict[str, Device] = {}
    creates: dict[str, migdevices.CreateMig] = {}
    for found in _lookup(allocation, inventory, pool, holders, stale):
        result, device = found.result, found.device
        if result.pool != pool:
            problems.append(
                f"device {result.device} is in pool {result.pool!r}, not this node's pool {pool!r}"
            )
            continue
        if found.partition is not None:
            if result.admin_access:
                problems.append(
                    f"device {result.device} is a dynamic MIG device, which admin access cannot use"
                )
            if device is None:
                creates[found.partition.name] = migdevices.CreateMig(found.partition)
                continue
        if device is None:
            problems.append(f"device {result.device} does not exist on node {pool}")
            continue
        for holder in found.holders:
            reason = stale.get(holder.uid)
            if reason is not None:
                releases[holder.uid] = Release(holder, reason)
            else:
                why = (unknown or {}).get(holder.uid)
                problems.append(
                    f"device {result.device} is already prepared for claim "
                    f"{holder.namespace}/{holder.name} ({holder.uid})"
                    + (f", which the API server could not be asked about ({why})" if why else "")
                )
        devices[device.name] = device
    # Configs apply to the MIG devices to be made as to those that exist.
    configured = {**devices, **{name: migdevices.to_be_made(c.partition) for name, c in creates.items()}}
    # Configuration, passthrough and sharing are decided where the claim asks for them (its opaque
    # configs, a passthrough twin): a claim of whole GPUs without configs needs none of those modules.
    if allocation.configs:
        problems.extend(deviceconfig.problems(allocation, configured))
    if problems:
        return _refusal(allocation, problems)
    passthrough: dict[str, bool] = {}
    if allocation.configs or any(is_vfio_twin(d) for d in configured.values()):
        passthrough = vfio.passthrough(allocation, configured)
        problems = vfio.problems(allocation, configured, passthrough, inventory, enabled=node.vfio)
        if problems:
            return _refusal(allocation, problems)
    intervals: Mapping[str, str] = {}
    mps_settings: Mapping[str, sharing.MpsSetting] = {}
    if allocation.configs:
        intervals, mps_settings, problems = sharing.decide_sharing(
            allocation, configured, prepared, node.mps_root, node.equal_shares
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
            **(sharing.mps_fields(mps_settings[device.name]) if device.name in mps_settings else {}),
        )
        for device in configured.values()
        for results in _by_share(allocation, device.name)
    ]
    dynamic = {g.uuid: g for g in inventory.dynamic_gpus} if inventory.partitions and node.mig else {}
    whole = (dynamic.get(e.uuid) for e in entries if not e.admin_access)
    claim = PreparedClaim(
        uid=allocation.uid,
        namespace=allocation.namespace,
        name=allocation.name,
        devices=tuple(
            _with_metadata_ids(entries, driver, allocation.uid) if node.device_metadata else entries
        ),
        pod_claim_name=allocation.pod_claim_name,
        metadata=node.device_metadata,
    )
    return PreparePlan(
        claim=claim,
        write=True,
        record=True,
        release=tuple(releases.values()),
        replaces=prepared.get(allocation.uid),
        create=tuple(creates.values()),
        vfio=passthrough,
        mig_off=tuple(dict.fromkeys(gpu for gpu in whole if gpu is not None)),
        mig_on=tuple(dict.fromkeys(c.partition.parent for c in creates.values())) if node.mig else (),
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
        ids = tuple(cdi.metadata_device_id(driver, uid, r) for r in new)
        result.append(replace(entry, cdi_device_ids=entry.cdi_device_ids + ids))
    return result


def _by_share(allocation: ClaimAllocation, device: str) -> list[list[AllocatedDevice]]:
    """The allocation's results for a device, one list per share (in practice a claim holds one at most)."""
    results = [r for r in allocation.devices if r.device == device]
    shares = dict.fromkeys(r.share_id for r in results)
    return [[r for r in results if r.share_id == share] for share in shares]


def _refusal(allocation: ClaimAllocation, problems: list[str]) -> Refusal:
    return Refusal(f"cannot prepare ResourceClaim {allocation.ref}: " + "; ".join(problems))


def decide_unprepare(
    uid: str, prepared: Mapping[str, PreparedClaim], actions: Sequence[DeviceAction] = ()
) -> UnpreparePlan:
    """Unpreparing a claim: an unknown one only loses its stray spec, if any."""
    kinds = {a.kind for a in actions if a.claim_uid == uid}
    return UnpreparePlan(
        uid=uid, claim=prepared.get(uid), passthrough=VFIO_BIND in kinds, mig=bool(kinds - {VFIO_BIND})
    )
