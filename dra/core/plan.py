"""What a prepare or unprepare gives a claim, decided over plain data: the plan, or why the claim is refused.

`decide_prepare` says what a claim gets (its record, the holders it releases, the MIG devices to
make, the GPUs to pass through) or refuses it with every problem at once, from the allocation, the
node's inventory and prepared claims, and the node's settings (dra.core.steps.Node); `respec` says
what a prepared claim's CDI spec and device metadata files are, and is the one place they are built.
The programs that carry a plan out are dra.core.prepare's. Nothing here touches a file, a GPU or
the API server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dra.core import cdi, devicemetadata, migdevices, sharing, vfio
from dra.core import config as deviceconfig
from dra.core.steps import ClaimRead, Node
from dra.model.allocation import AllocatedDevice, ClaimAllocation
from dra.model.devices import Device, Gpu, Inventory, MigDevice, MigPartition, is_vfio_twin
from dra.model.prepared import VFIO_BIND, DeviceAction, Holders, PreparedClaim, PreparedDevice

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
    """Prepare one claim: release `release`, record `claim` if `record`, write its spec if `write`, answer it.

    Everything a prepare does is here: the holders it releases, the MIG mode it switches on
    dynamic-MIG GPUs (`mig_off`, `mig_on`), the MIG devices it makes (`create`: dra.core.migdevices;
    `made` gives the claim their UUIDs), the GPUs it binds to vfio-pci (`vfio`), and the sharing
    settings its devices record (time slices, MPS: `mps`). A whole-GPU claim on a GPU outside
    dynamic MIG has none of the MIG fields, and its prepare runs no MIG step. The spec is built from
    what the claim then has (`respec`), once.
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
        return uses_mps(self.claim)

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
        return self.claim is not None and uses_mps(self.claim)


def uses_mps(claim: PreparedClaim) -> bool:
    """Whether a claim's devices are served by an MPS control daemon."""
    return any(d.mps for d in claim.devices)


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


@dataclass(frozen=True)
class Respec:
    """What a prepared claim's devices still present on the node give: its spec and metadata files."""

    #: None when no device of the claim is left.
    spec: Obj | None
    metadata: devicemetadata.ClaimMetadata | None
    missing: tuple[MissingDevice, ...]
    #: Host directories the spec names that the prepare makes itself, so that they may be missing
    #: before: its metadata files (written just before the spec), its MPS daemon's (started after).
    made_here: tuple[str, ...] = ()

    def missing_paths(self, absent: Sequence[str]) -> tuple[str, ...]:
        """Of the spec's host paths not on the node (`absent`), those the prepare does not make."""
        return tuple(path for path in absent if not path.startswith(self.made_here))


def respec(claim: PreparedClaim, inventory: Inventory, node: Node) -> Respec:
    """The CDI spec (and device metadata files) of a claim, from its devices present on the node.

    The one place a claim's spec is built: for a new claim once its MIG devices are made and its GPUs
    bound, for one prepared before whose spec is gone, and at start-up (dra.core.recovery).
    """
    devices, missing = _devices_of(claim, inventory)
    if not devices:
        return Respec(None, None, tuple(missing))
    # A share's environment and the MPS daemon's edits only where the claim has them (dra.core.sharing).
    share_env = {d.device: sharing.share_env(d) for d in claim.devices if d.share_id}
    unique = list({d.name: d for d in devices}.values())
    mps = sharing.mps_edits(claim, node.mps_root) if uses_mps(claim) else None
    metadata = (
        devicemetadata.for_claim(node.driver, node.metadata_root, claim, unique, inventory)
        if claim.metadata
        else None
    )
    passthrough = {d.device: d.vfio_group for d in claim.devices if d.vfio_group >= 0}
    made_here = [f"{node.metadata_root.rstrip('/')}/{metadata.directory}/"] if metadata else []
    if mps is not None:
        made_here.append(sharing.mps_dirs(node.mps_root, sharing.claim_mps_key(claim)).root + "/")
    spec = cdi.build_spec(
        node.driver,
        claim.uid,
        unique,
        inventory,
        device_env=share_env,
        claim_edits=mps,
        passthrough=passthrough,
        vfio_api_device=any(d.vfio_api_device for d in claim.devices),
        extra_devices=metadata.cdi_devices if metadata else (),
    )
    return Respec(spec, metadata, tuple(missing), tuple(made_here))


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
    """The holders whose devices a prepare may take, by UID, with why (AskStale's answer, decided).

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
        ids = tuple(devicemetadata.cdi_device_id(driver, uid, r) for r in new)
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
