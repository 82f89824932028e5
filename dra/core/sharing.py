"""GPU sharing decisions: time-slice intervals and consumable shares, over plain data. Pure.

Time-slicing: a claim whose GpuConfig asks a non-Default interval sets it on
each of its GPUs (`nvidia-smi compute-policy --set-timeslice`). The interval
is a property of the whole GPU, so two prepared claims on one GPU (admin
access, or shares of a shareable GPU) must agree on it; the GPU goes back to
Default when the last claim that set an interval on it is unprepared. A claim
asking Default leaves the GPU as it is: Default is "no preference", not a
setting that competes with another claim's.

Consumable shares (KEP-5075): a shareable GPU is allocated to several claims,
each result carrying a share ID and the capacity it consumes; the container
learns its share from environment variables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dra.model.prepared import PreparedClaim, PreparedDevice

#: nvidia-smi's time-slice levels, by the interval names of GpuConfig.
INTERVAL_LEVELS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
DEFAULT_INTERVAL = "Default"

#: The environment variables that tell a container its share of a shared GPU.
SHARE_ID_ENV = "DRA_GPU_SHARE_ID"
SHARE_MEMORY_ENV = "DRA_GPU_SHARE_MEMORY"


def level(interval: str) -> int:
    """nvidia-smi's level of an interval name (validated by dra.core.config)."""
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
    if claim is None:
        return []
    others = wanted_time_slices({k: v for k, v in prepared.items() if k != uid})
    return sorted({d.uuid for _, d in _timed([claim]) if d.uuid not in others})


def share_env(device: PreparedDevice) -> list[str]:
    """KEY=value lines that tell a container its share of a shared device; none for an exclusive one."""
    if not device.share_id:
        return []
    env = [f"{SHARE_ID_ENV}={device.share_id}"]
    if device.share_memory:
        env.append(f"{SHARE_MEMORY_ENV}={device.share_memory}")
    return env
