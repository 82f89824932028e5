"""GPU sharing decisions: time-slice intervals, consumable shares and MPS, over plain data. Pure.

A time-slice interval is a setting of the whole GPU, so the claims on one GPU must agree on it
(Default is no preference); a shareable GPU's claims each carry a share ID and the capacity they
consume; the MPS devices of claims on the same set of devices share one control daemon, and a
set that overlaps another daemon's without being it is refused. The rules: docs/sharing.md.
The time-slice steps' runner (intervals set and given back) is here too; the MPS daemons' is
dra.core.mpsdaemons'.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dra.api.v1beta1 import DeviceConfig, GpuConfig, MpsConfig, VfioDeviceConfig, device_for_key
from dra.core import config as deviceconfig
from dra.model.allocation import ClaimAllocation
from dra.model.devices import Device
from dra.model.prepared import PreparedClaim, PreparedDevice
from dra.model.quantity import Quantity

#: nvidia-smi's time-slice levels, by the interval names of GpuConfig.
INTERVAL_LEVELS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
DEFAULT_INTERVAL = "Default"

#: The environment variables that tell a container its share of a shared GPU.
SHARE_ID_ENV = "DRA_GPU_SHARE_ID"
SHARE_MEMORY_ENV = "DRA_GPU_SHARE_MEMORY"


def level(interval: str) -> int:
    """nvidia-smi's level of an interval name (validated by dra.api)."""
    return INTERVAL_LEVELS[interval]


def _timed(claims: Iterable[PreparedClaim]) -> Iterable[tuple[PreparedClaim, PreparedDevice]]:
    return ((c, d) for c in claims for d in c.devices if d.time_slice and d.uuid)


def wanted_time_slices(prepared: Mapping[str, PreparedClaim]) -> dict[str, str]:
    """GPU UUID -> the interval its prepared claims set (only GPUs with one)."""
    return {d.uuid: d.time_slice for _, d in _timed(prepared.values())}


def time_slice_conflict(
    uuid: str, interval: str, uid: str, prepared: Mapping[str, PreparedClaim]
) -> tuple[PreparedClaim, str] | None:
    """Another prepared claim that runs GPU `uuid` at a different interval, and that interval."""
    if interval == DEFAULT_INTERVAL:
        return None
    for claim, device in _timed(prepared.values()):
        if claim.uid != uid and device.uuid == uuid and device.time_slice != interval:
            return claim, device.time_slice
    return None


def time_slices_to_restore(uid: str, prepared: Mapping[str, PreparedClaim]) -> list[str]:
    """GPUs that go back to Default when claim `uid` is unprepared: no other claim sets their interval."""
    claim = prepared.get(uid)
    timed = {d.uuid for _, d in _timed([claim])} if claim is not None else set()
    if not timed:
        # Most claims set no interval: the other claims need not be walked (1,000 of them on a node).
        return []
    others = wanted_time_slices({k: v for k, v in prepared.items() if k != uid})
    return sorted(timed - others.keys())


class TimeSliceRunner(Protocol):
    """What runs the time-slice steps (dra.kubeletplugin.devicesteps): one method per kind."""

    def apply_time_slices(self, wanted: Mapping[str, str]) -> None:
        """Set these time-slice intervals, by GPU UUID."""

    def restore_time_slices(self, uuids: tuple[str, ...]) -> None:
        """Give these GPUs (by UUID) back their default interval."""


def share_env(device: PreparedDevice) -> list[str]:
    """KEY=value lines that tell a container its share of a shared device; none for an exclusive one."""
    if not device.share_id:
        return []
    env = [f"{SHARE_ID_ENV}={device.share_id}"]
    if device.share_memory:
        env.append(f"{SHARE_MEMORY_ENV}={device.share_memory}")
    return env


# -- MPS -----------------------------------------------------------------------------------------

#: Where containers find the claim's MPS pipe directory (NVIDIA's choice, kept for portability).
MPS_CONTAINER_PIPE = "/tmp/nvidia-mps"


@dataclass(frozen=True)
class MpsDirs:
    """A daemon's MPS directories on the host: its pipes, its logs, its and its clients' /dev/shm."""

    root: str
    pipe: str
    log: str
    shm: str


def mps_key(uuids: Iterable[str]) -> str:
    """The name of the daemon that serves exactly these devices (by UUID), whatever their order.

    A digest rather than the UUIDs: the pipe directory's path must stay short enough for the
    Unix sockets MPS makes in it (108 bytes with the socket's name).
    """
    return "mps-" + hashlib.sha256(",".join(sorted(uuids)).encode()).hexdigest()[:16]


def mps_dirs(mps_root: str, key: str) -> MpsDirs:
    """The directories of daemon `key` (mps_key) under the driver's MPS root."""
    root = f"{mps_root.rstrip('/')}/{key}"
    return MpsDirs(root=root, pipe=f"{root}/pipe", log=f"{root}/log", shm=f"{root}/shm")


def claim_mps_key(claim: PreparedClaim) -> str:
    """The key of the daemon serving the claim's MPS devices; "" when it uses none."""
    devices = mps_devices(claim)
    return mps_key(d.uuid for d in devices) if devices else ""


def mps_users(key: str, prepared: Mapping[str, PreparedClaim]) -> list[PreparedClaim]:
    """The claims of `prepared` that daemon `key` serves."""
    return [c for c in prepared.values() if key and claim_mps_key(c) == key]


def mps_isolated(claim: PreparedClaim) -> bool:
    """Whether the claim's daemon serves it alone, so that its limits may be the daemon's defaults.

    A daemon of shared devices serves every claim holding a share of them: its defaults
    would be one claim's limits imposed on the others, so each claim's limits go to its
    own clients only (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
    in their environment, per client on MPS).
    """
    return not any(d.share_id or d.admin_access for d in mps_devices(claim))


def mps_set_problems(uid: str, devices: Sequence[Device], prepared: Mapping[str, PreparedClaim]) -> list[str]:
    """Why claim `uid` cannot have one daemon for `devices` (its MPS devices): another claim's daemon
    serves some of them with others.

    A GPU or MIG device runs one MPS server, so claims using MPS on the same devices share
    one daemon, which serves one set of devices. A MIG device still to be made has no UUID
    yet ("") and is in no daemon's set.
    """
    wanted = {d.uuid for d in devices}
    for claim in prepared.values():
        theirs = mps_devices(claim)
        uuids = {d.uuid for d in theirs}
        if claim.uid != uid and uuids & wanted and uuids != wanted:
            return [
                f"the MPS devices of this claim ({', '.join(d.name for d in devices)}) overlap those of "
                f"claim {claim.namespace}/{claim.name} ({claim.uid}), whose MPS control daemon serves "
                f"{', '.join(d.device for d in theirs)}: a device runs one MPS daemon, so claims using MPS "
                "on the same devices must use the same set"
            ]
    return []


def mps_mode_problems(
    uid: str,
    devices: Sequence[Device],
    settings: Mapping[str, MpsSetting],
    prepared: Mapping[str, PreparedClaim],
) -> list[str]:
    """Why claim `uid` cannot join the daemon of its devices: it runs in the other user mode.

    Multi-user mode is the daemon's start flag (-M), so claims sharing a daemon must agree on it;
    within a claim, its devices' configs must too, for the same reason.
    """
    modes = {s.multi_user for s in settings.values()}
    if len(modes) > 1:
        return [
            "the MPS devices of this claim disagree on mpsConfig.multiUser; their one daemon runs in one mode"
        ]
    if not modes:
        return []
    wanted, key = modes.pop(), mps_key(d.uuid for d in devices)
    for claim in mps_users(key, prepared):
        theirs = mps_devices(claim)[0].mps_multi_user
        if claim.uid != uid and theirs != wanted:
            return [
                f"the MPS control daemon of {', '.join(d.name for d in devices)} runs "
                f"{'multi-user' if theirs else 'single-user'} for claim {claim.namespace}/{claim.name} "
                f"({claim.uid}); this claim asks multiUser: {str(wanted).lower()}, and one daemon runs "
                "in one mode"
            ]
    return []


def mps_limit(value: int) -> str:
    """A byte count as MPS's pinned memory limit value, in whole MiB rounded down ("20480M")."""
    return f"{value // 1024**2}M"


def mps_devices(claim: PreparedClaim) -> list[PreparedDevice]:
    """The claim's devices its MPS daemon serves, in CUDA_VISIBLE_DEVICES order (one per device)."""
    return list({d.device: d for d in claim.devices if d.mps}.values())


def mps_edits(claim: PreparedClaim, mps_root: str) -> dict[str, Any] | None:
    """CDI edits that connect a container to its claim's MPS daemon; None when the claim uses none."""
    devices = mps_devices(claim)
    if not devices:
        return None
    dirs = mps_dirs(mps_root, claim_mps_key(claim))
    env = [f"CUDA_MPS_PIPE_DIRECTORY={MPS_CONTAINER_PIPE}"]
    if devices[0].mps_thread_percentage:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={devices[0].mps_thread_percentage}")
    limits = [f"{i}={d.mps_pinned_limit}" for i, d in enumerate(devices) if d.mps_pinned_limit]
    if limits:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(limits)}")
    options = ["rbind", "rw", "nosuid", "nodev"]
    return {
        "env": env,
        "mounts": [
            {"hostPath": dirs.pipe, "containerPath": MPS_CONTAINER_PIPE, "options": options},
            {"hostPath": dirs.shm, "containerPath": "/dev/shm", "options": options},
        ],
    }


@dataclass(frozen=True)
class MpsSetting:
    """What the claim's MPS daemon is told about one device."""

    thread_percentage: int
    pinned_limit: str
    multi_user: bool = False


@dataclass(frozen=True)
class MpsRequest:
    """One device of a claim that asks MPS.

    `config` is the device's mpsConfig, already valid for `configured` (dra.api.v1beta1.validate):
    the devices that config applies to, whose indexes its per-device limits use. `share_memory`
    is the memory of the device's share ("" when exclusive); `shares` is how many of the
    device's `equal_shares` equal shares it holds (0: not divided so, --consumable-shares=N).
    """

    device: Device
    config: MpsConfig
    configured: tuple[Device, ...]
    share_memory: str = ""
    shares: int = 0
    equal_shares: int = 0

    def share_limits(self) -> tuple[Quantity | None, int]:
        """The pinned memory and SM percentage the share itself grants (None, 0: no limit).

        Memory the share asked for; else, holding k of N equal shares, k/N of the device's
        memory (rounded down to a MiB) and of its SMs (rounded down, at least 1 %).
        """
        share = Quantity.parse(self.share_memory) if self.share_memory else None
        if share is not None and share.sign() <= 0:
            # An unlimited or counted share that asked no memory reserves none.
            share = None
        if not (self.shares and self.equal_shares):
            return share, 0
        if share is None:
            part = self.device.memory_bytes * self.shares // self.equal_shares
            share = Quantity.parse(f"{part // 1024**2}Mi")
        return share, max(1, 100 * self.shares // self.equal_shares)


def _pinned_limit(request: MpsRequest) -> Quantity | None:
    """The pinned limit the claim sets for the device: its per-device limit, else the default one."""
    for key, limit in request.config.default_per_device_pinned_memory_limit.items():
        named = device_for_key(key, request.configured)
        if named is not None and named.name == request.device.name:
            return limit
    return request.config.default_pinned_device_memory_limit


def decide_mps(requests: Sequence[MpsRequest]) -> tuple[dict[str, MpsSetting], list[str]]:
    """The MPS setting of each device (by name) of one claim, or the problems that refuse the claim.

    The config's own checks (percentage, limits within the device's memory, per-device keys,
    compute capability) are dra.api.v1beta1.validate's, made before. What only a share adds
    (MpsRequest.share_limits): a device's pinned limit and active thread percentage are the
    claim's own, else its share's; never above its share.
    """
    problems: list[str] = []
    settings: dict[str, MpsSetting] = {}
    for request in requests:
        device = request.device
        share, share_threads = request.share_limits()
        limit = _pinned_limit(request)
        threads = request.config.default_active_thread_percentage
        if limit is not None and share is not None and limit > share:
            problems.append(f"device {device.name}: pinned memory limit {limit} is above its share ({share})")
            continue
        if threads and share_threads and threads > share_threads:
            problems.append(
                f"device {device.name}: active thread percentage {threads} is above its share "
                f"({share_threads}: {request.shares} of {request.equal_shares} shares)"
            )
            continue
        pinned = limit if limit is not None else share
        settings[device.name] = MpsSetting(
            thread_percentage=threads or share_threads,
            pinned_limit=mps_limit(int(pinned.exact())) if pinned is not None else "",
            multi_user=bool(request.config.multi_user),
        )
    return settings, problems


def mps_fields(setting: MpsSetting) -> dict[str, Any]:
    """The PreparedDevice fields of a device's MPS setting."""
    return {
        "mps": True,
        "mps_thread_percentage": setting.thread_percentage,
        "mps_pinned_limit": setting.pinned_limit,
        "mps_multi_user": setting.multi_user,
    }


def decide_sharing(
    allocation: ClaimAllocation,
    devices: Mapping[str, Device],
    prepared: Mapping[str, PreparedClaim],
    mps_root: str,
    equal_shares: int = 0,
) -> tuple[dict[str, str], dict[str, MpsSetting], list[str]]:
    """The intervals and MPS settings of the claim's devices (by name), or the problems refusing it.

    Its configs are valid (deviceconfig.problems): what is left are the conflicts with
    other claims and with the node, and what a share adds. `equal_shares` is N where
    shareable devices are divided into N equal shares (0 otherwise).
    """
    problems: list[str] = []
    intervals: dict[str, str] = {}
    mps: dict[str, MpsRequest] = {}
    for result in allocation.devices:
        device = devices.get(result.device)
        if device is None:
            continue
        entries = allocation.configs_for(result)
        config = deviceconfig.effective([c.parameters for c in entries], device)
        if isinstance(config, VfioDeviceConfig):
            # A GPU passed through is the virtual machine's: no time slices, no MPS.
            continue
        problems.extend(_time_slice(config, device, allocation.uid, prepared, intervals))
        mps_config = config.sharing.mps_config if config.sharing.strategy == "MPS" else None
        if mps_config is not None and device.name not in mps:
            configured = tuple(deviceconfig.targets(allocation, entries[-1], devices))
            held = result.consumed("shares")
            mps[device.name] = MpsRequest(
                device,
                mps_config,
                configured,
                result.consumed("memory"),
                shares=int(Quantity.parse(held).exact()) if held else 0,
                equal_shares=equal_shares,
            )
    if mps and not mps_root:
        problems.append("MPS is not available on this node (the driver runs no MPS control daemons)")
    mps_settings, mps_problems = decide_mps(list(mps.values()))
    if mps:
        mps_problems += mps_set_problems(allocation.uid, [r.device for r in mps.values()], prepared)
        mps_problems += mps_mode_problems(
            allocation.uid, [r.device for r in mps.values()], mps_settings, prepared
        )
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
    if slicing is None or slicing.interval == DEFAULT_INTERVAL:
        return []
    interval = slicing.interval
    clash = time_slice_conflict(device.uuid, interval, uid, prepared)
    if clash is not None:
        other, theirs = clash
        return [
            f"device {device.name} cannot run time-slice interval {interval}: claim "
            f"{other.namespace}/{other.name} ({other.uid}) runs it with interval {theirs}"
        ]
    intervals[device.name] = interval
    return []
