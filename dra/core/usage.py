"""Usage per claim, honestly attributed: a device's readings split among the claims that hold it.

What the sampler (dra.kubeletplugin.usage) reads of each GPU or MIG device, the device's
memory used and utilisation and, where it reads them, its processes with their pod and
container, goes to the claims that hold the device by these rules:

- a device one claim holds (exclusive, or shared only by that claim's containers): all its
  use is that claim's, unless its processes are read, when each process goes to the claim
  only if its container is one the kubelet says uses the claim's device;
- a device several claims hold (time slices, MPS, shares): only through its processes, each
  to the claim its container uses; without them nothing is attributed (no claim series and
  no unattributed series: which claim used what is not known);
- what no claim is credited with (a process in a pod without the claim, or in no pod, and
  the memory no process accounts for) is the device's unattributed use, so that the claims'
  and the unattributed series add up to the device's reading;
- a utilisation NVML cannot measure (a MIG device without GPM) is absent, never 0.

Series are labelled as dra_gpu_claim_device_info labels them (dra.core.devicestatus), with
the pod labels of the container that used the device ("" when the use is the claim's as a
whole); no PID label: a container's processes add up. `cap` bounds the number of claim series.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dra.core.devicestatus import JOIN_LABELS, Consumer, DeviceIdentity
from dra.model.prepared import PreparedClaim

#: Claim series kept at most, by default (--usage-max-series).
DEFAULT_MAX_SERIES = 2000

#: Labels of the claim series, in order: the join metric's, less the profile (the join carries it).
CLAIM_LABELS = tuple(label for label in JOIN_LABELS if label != "GPU_I_PROFILE")
#: Labels of the unattributed series.
DEVICE_LABELS = ("UUID", "GPU_I_ID")


@dataclass(frozen=True)
class Owner:
    """The pod and container a process runs in."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True)
class ProcessUse:
    """One process on a device: its memory, its utilisation (0..1; None where NVML has none per process)."""

    pid: int
    memory: int
    utilization: float | None
    #: None: the process is in no pod the driver knows.
    owner: Owner | None


@dataclass(frozen=True)
class Reading:
    """One sample of a GPU (GPU_I_ID "") or MIG device (its GPU instance ID)."""

    uuid: str
    gpu_instance_id: str
    memory: int
    #: 0..1; None where NVML cannot measure it.
    utilization: float | None
    #: None when its processes were not read.
    processes: tuple[ProcessUse, ...] | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(UUID, GPU_I_ID)."""
        return self.uuid, self.gpu_instance_id


@dataclass(frozen=True)
class Value:
    """Memory in bytes and utilisation (0..1, None: not measured) of one series."""

    memory: int
    utilization: float | None


@dataclass
class Usage:
    """The claim series (labels in CLAIM_LABELS' order) and unattributed series (DEVICE_LABELS')."""

    claims: dict[tuple[str, ...], Value] = field(default_factory=dict)
    unattributed: dict[tuple[str, ...], Value] = field(default_factory=dict)
    #: Claim series left out by the cap.
    dropped: int = 0


@dataclass(frozen=True)
class Holder:
    """A claim's device on a GPU or MIG device, and the containers using it."""

    claim: tuple[str, str, str]
    users: tuple[Owner, ...]


def holders(
    claims: Mapping[str, tuple[PreparedClaim, tuple[DeviceIdentity, ...]]], consumers: Iterable[Consumer]
) -> dict[tuple[str, str], list[Holder]]:
    """Which claims' devices sit on each (UUID, GPU_I_ID), with the containers the kubelet says use them."""
    users: dict[tuple[str, str], list[Consumer]] = {}
    for consumer in consumers:
        users.setdefault((consumer.claim_namespace, consumer.claim_name), []).append(consumer)
    found: dict[tuple[str, str], list[Holder]] = {}
    for claim, devices in claims.values():
        for identity in devices:
            device = identity.entry.device
            mine = tuple(
                dict.fromkeys(
                    Owner(u.namespace, u.pod, u.container)
                    for u in users.get((claim.namespace, claim.name), [])
                    if u.device in ("", device)
                )
            )
            gi = "" if identity.gpu_instance_id is None else str(identity.gpu_instance_id)
            holder = Holder((claim.namespace, claim.name, device), mine)
            if holder not in found.setdefault((identity.gpu_uuid, gi), []):
                found[(identity.gpu_uuid, gi)].append(holder)
    return found


def attribute(readings: Iterable[Reading], held: Mapping[tuple[str, str], list[Holder]], cap: int) -> Usage:
    """Each reading split into claim series and unattributed use, by the rules of the module."""
    usage = Usage()
    for reading in readings:
        mine = held.get(reading.key, [])
        if reading.processes is not None:
            _by_process(reading, mine, usage)
        elif len({h.claim for h in mine}) == 1:
            holder = mine[0]
            only = holder.users[0] if len(holder.users) == 1 else None
            usage.claims[_labels(reading, holder, only)] = Value(reading.memory, reading.utilization)
            usage.unattributed[reading.key] = Value(0, None if reading.utilization is None else 0.0)
        elif not mine:
            usage.unattributed[reading.key] = Value(reading.memory, reading.utilization)
    if len(usage.claims) > cap:
        kept = sorted(usage.claims)[:cap]
        usage.dropped = len(usage.claims) - cap
        usage.claims = {labels: usage.claims[labels] for labels in kept}
    return usage


def _labels(reading: Reading, holder: Holder, user: Owner | None) -> tuple[str, ...]:
    pod = ("", "", "") if user is None else (user.namespace, user.pod, user.container)
    return (*reading.key, *holder.claim, *pod)


def _by_process(reading: Reading, mine: list[Holder], usage: Usage) -> None:
    assert reading.processes is not None
    memory: dict[tuple[str, ...], int] = {}
    busy: dict[tuple[str, ...], float] = {}
    # Every container using a claim's device has a series, idle ones at 0.
    for holder in mine:
        for user in holder.users or (None,):
            memory[_labels(reading, holder, user)] = 0
            busy[_labels(reading, holder, user)] = 0.0
    per_process = all(p.utilization is not None for p in reading.processes)
    stray = False
    by_user: dict[Owner, Holder] = {}
    for holder in mine:
        for user in holder.users:
            by_user.setdefault(user, holder)
    for process in reading.processes:
        found = None if process.owner is None else by_user.get(process.owner)
        if found is None:
            stray = True
            continue
        labels = _labels(reading, found, process.owner)
        memory[labels] += process.memory
        busy[labels] += process.utilization or 0.0
    credited = sum(memory.values())
    if per_process:
        utilization: dict[tuple[str, ...], float | None] = dict(busy)
    elif len([m for m in memory.values() if m]) <= 1 and not stray and reading.utilization is not None:
        # NVML has no per-process utilisation here (MIG), but only one series has processes: it is theirs.
        utilization = {labels: reading.utilization if memory[labels] else 0.0 for labels in memory}
    else:
        utilization = dict.fromkeys(memory)
    for labels, used in memory.items():
        usage.claims[labels] = Value(used, utilization[labels])
    rest: float | None = None
    if reading.utilization is not None and all(u is not None for u in utilization.values()):
        rest = max(reading.utilization - sum(u or 0.0 for u in utilization.values()), 0.0)
    usage.unattributed[reading.key] = Value(max(reading.memory - credited, 0), rest)


#: A container's cgroup, whose last part is the CRI container ID as the kubelet and the runtime name
#: it, cgroup v1 or v2: systemd driver (kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope,
#: crio-<id>.scope), cgroupfs driver (kubepods/burstable/pod<uid>/<id>), or containerd's own
#: namespace path when the kubelet makes no pod cgroups (/k8s.io/<id>).
_CONTAINER_CGROUP = re.compile(r"/(?:[a-z0-9]+(?:-[a-z0-9]+)*-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")


def container_of(cgroup: str) -> str | None:
    """The container ID from the text of /proc/<pid>/cgroup; None for a process in no container.

    The ID alone names the container (the pods' status lists each container's); the pod UID some
    layouts carry is not needed, and not all have it.
    """
    for line in cgroup.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        match = _CONTAINER_CGROUP.search(path.strip())
        if match:
            return match["id"]
    return None
