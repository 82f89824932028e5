"""Preparing, unpreparing and recovering claims, decided as plans over plain data.

Every decision takes what the node knows as input (its inventory, the claims it
has prepared, which CDI specs are on disk, which holders the API server says
are stale) and returns a plan: the effects to apply, in the order
``dra.kubeletplugin.state`` applies them, or the per-claim error for the admin.
Nothing here touches a file or the API server.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dra.api.v1beta1 import DeviceConfig, GpuConfig
from dra.core import cdi, sharing
from dra.core import config as deviceconfig
from dra.core.allocation import ClaimAllocation
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
class CreateMig:
    """Device action: make the MIG device of a dynamic-MIG offer the claim was allocated."""

    partition: MigPartition

    @property
    def device(self) -> str:
        """The allocated device's name."""
        return self.partition.name

    @property
    def placement(self) -> str:
        """Where it goes, for messages: "3g.40gb at memory slices 4-7 of GPU 0 (GPU-...)"."""
        p = self.partition
        last = p.placement_start + p.placement_size - 1
        gpu = f"GPU {p.parent.index} ({p.parent.uuid})"
        return f"{p.profile} at memory slices {p.placement_start}-{last} of {gpu}"


@dataclass(frozen=True)
class PreparePlan:
    """Prepare one claim: release `release`, write `spec` if any, record `claim` if `record`, answer it.

    With `create` (dynamic MIG), the executor makes those MIG devices first, recording each
    as intent and then as done, and finishes the plan with `made` (which builds the spec).
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


@dataclass(frozen=True)
class RecoverPlan:
    """At start-up: remove specs of claims not prepared, (re)write the specs of prepared ones."""

    remove: tuple[str, ...]
    write: tuple[tuple[str, Obj], ...]
    missing: tuple[MissingDevice, ...]


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


def _respec(
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
        spec, missing = (None, []) if has_spec else _respec(existing, inventory, driver, mps_root)
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
    intervals, mps_settings, problems = _decide_sharing(allocation, configured, prepared, mps_root)
    if problems:
        return _refusal(allocation, problems)

    entries = []
    for device in devices.values():
        results = [r for r in allocation.devices if r.device == device.name]
        # A claim holds at most one share of a device in practice; each share gets its own entry.
        for share_id in dict.fromkeys(r.share_id for r in results):
            of_share = [r for r in results if r.share_id == share_id]
            entries.append(
                PreparedDevice(
                    request_names=tuple(dict.fromkeys(r.request_name for r in of_share)),
                    pool=pool,
                    device=device.name,
                    cdi_device_ids=(cdi.qualified_name(driver, allocation.uid, device.name),),
                    admin_access=all(r.admin_access for r in of_share),
                    uuid=device.uuid,
                    time_slice=intervals.get(device.name, ""),
                    share_id=share_id,
                    share_memory=of_share[0].consumed("memory") if share_id else "",
                    **_mps_fields(mps_settings.get(device.name)),
                )
            )
    # The UUID of a MIG device still to be made is filled in once it exists (PreparePlan.made).
    for name in creates:
        results = [r for r in allocation.devices if r.device == name]
        entries.append(
            PreparedDevice(
                request_names=tuple(dict.fromkeys(r.request_name for r in results)),
                pool=pool,
                device=name,
                cdi_device_ids=(cdi.qualified_name(driver, allocation.uid, name),),
                admin_access=all(r.admin_access for r in results),
                **_mps_fields(mps_settings.get(name)),
            )
        )
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


def _mps_fields(setting: sharing.MpsSetting | None) -> dict[str, Any]:
    if setting is None:
        return {}
    return {
        "mps": True,
        "mps_thread_percentage": setting.thread_percentage,
        "mps_pinned_limit": setting.pinned_limit,
    }


def _decide_sharing(
    allocation: ClaimAllocation,
    devices: Mapping[str, Device],
    prepared: Mapping[str, PreparedClaim],
    mps_root: str,
) -> tuple[dict[str, str], dict[str, sharing.MpsSetting], list[str]]:
    """The intervals and MPS settings of the claim's devices (by name), or the problems refusing it.

    Its configs are valid (deviceconfig.problems): what is left are the conflicts with
    other claims and with the node, and what a share adds.
    """
    problems: list[str] = []
    intervals: dict[str, str] = {}
    mps: dict[str, sharing.MpsRequest] = {}
    for result in allocation.devices:
        device = devices.get(result.device)
        if device is None:
            continue
        entries = allocation.configs_for(result)
        config = deviceconfig.effective([c.parameters for c in entries], device)
        problems.extend(_time_slice(config, device, allocation.uid, prepared, intervals))
        mps_config = config.sharing.mps_config if config.sharing.strategy == "MPS" else None
        if mps_config is not None and device.name not in mps:
            configured = tuple(deviceconfig.targets(allocation, entries[-1], devices))
            mps[device.name] = sharing.MpsRequest(device, mps_config, configured, result.consumed("memory"))
    if mps and not mps_root:
        problems.append("MPS is not available on this node (the driver runs no MPS control daemons)")
    mps_settings, mps_problems = sharing.decide_mps(list(mps.values()))
    if mps:
        mps_problems += sharing.mps_set_problems(allocation.uid, [r.device for r in mps.values()], prepared)
    return intervals, mps_settings, problems + mps_problems


def _time_slice(
    config: DeviceConfig,
    device: Device,
    uid: str,
    prepared: Mapping[str, PreparedClaim],
    intervals: dict[str, str],
) -> list[str]:
    """Record the interval a GPU of the claim is to run at; the problem when another claim runs another."""
    slicing = config.sharing.time_slicing_config if isinstance(config, GpuConfig) else None
    if slicing is None or slicing.interval == sharing.DEFAULT_INTERVAL:
        return []
    interval = slicing.interval
    clash = sharing.time_slice_conflict(device.uuid, interval, uid, prepared)
    if clash is not None:
        other, theirs = clash
        return [
            f"device {device.name} cannot run time-slice interval {interval}: claim "
            f"{other.namespace}/{other.name} ({other.uid}) runs it with interval {theirs}"
        ]
    intervals[device.name] = interval
    return []


def decide_unprepare(uid: str, prepared: Mapping[str, PreparedClaim]) -> UnpreparePlan:
    """Unpreparing a claim: an unknown one only loses its stray spec, if any."""
    return UnpreparePlan(uid=uid, claim=prepared.get(uid))


def decide_recover(
    prepared: Mapping[str, PreparedClaim],
    inventory: Inventory,
    specs: Collection[str],
    *,
    driver: str,
    mps_root: str = "",
) -> RecoverPlan:
    """After a restart, given the UIDs of the claim specs on disk: which to remove, which to write again.

    A spec without a checkpoint entry is a prepare that crashed before recording
    (the kubelet retries it); a prepared claim without its spec lost it in a crash
    or by hand, and gets it back with the devices still on the node. A spec that
    is there is written again too (the store leaves identical bytes alone), so
    that one an older driver wrote gets the current layout before a container of
    the claim restarts; but not when one of its devices vanished, since the old
    spec still names it and its edits do no harm.
    """
    writes: list[tuple[str, Obj]] = []
    missing: list[MissingDevice] = []
    for uid, claim in prepared.items():
        spec, gone = _respec(claim, inventory, driver, mps_root)
        missing.extend(gone)
        if spec is not None and (uid not in specs or not gone):
            writes.append((uid, spec))
    return RecoverPlan(
        remove=tuple(sorted(uid for uid in specs if uid not in prepared)),
        write=tuple(writes),
        missing=tuple(missing),
    )
