"""Which extended resources the device plugin offers, with which device IDs: pure.

Full GPUs are offered as one resource (`nvidia.com/gpu` by default). MIG
devices follow NVIDIA's MIG strategies: `mixed` offers them per profile
(`nvidia.com/mig-1g.10gb`, ...) beside the full GPUs, `single` offers them as
the GPU resource (every GPU in MIG mode, one profile), `none` not at all. Each
resource has its own plugin socket and registration. A device's ID is its
UUID: the kubelet checkpoints allocations by ID, and a UUID survives index
changes. A time-sliced resource advertises each device `replicas` times, as
`<UUID>::<n>` (NVIDIA's form), under its own name or a new one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from dra.core.labels import is_dns_subdomain
from dra.deviceplugin.config import DEFAULT_MIG_STRATEGY, MigStrategy, TimeSlicing, mig_resource_prefix
from dra.deviceplugin.preferred import Placement
from dra.model.devices import Device, Gpu, Inventory, MigDevice, gpu_of

DEFAULT_RESOURCE = "nvidia.com/gpu"
#: Between a device's UUID and its replica number in a time-sliced device ID.
REPLICA_SEPARATOR = "::"
#: Device IDs longer than this are refused.
MAX_DEVICE_ID = 63

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class ResourceError(ValueError):
    """A resource name or device ID the kubelet would refuse."""


def check_resource_name(name: str) -> str:
    """Return `name` if it is a valid extended resource name (domain/name, not *kubernetes.io)."""
    domain, sep, local = name.partition("/")
    if not sep or not domain or not local:
        raise ResourceError(f"resource name {name!r} must be <domain>/<name>, such as nvidia.com/gpu")
    if not is_dns_subdomain(domain):
        raise ResourceError(f"resource name {name!r}: {domain!r} is not a DNS subdomain")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io") or domain.startswith("requests."):
        raise ResourceError(f"resource name {name!r}: the {domain} domain is reserved for Kubernetes")
    if len(local) > 63 or not _NAME.match(local):
        raise ResourceError(
            f"resource name {name!r}: {local!r} must be at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return name


def mig_resource_name(gpu_resource: str, profile: str) -> str:
    """The resource of a MIG profile, in the GPU resource's domain: nvidia.com/mig-1g.10gb."""
    slug = re.sub(r"[^a-z0-9_.-]+", ".", profile.lower()).strip("._-")
    return mig_resource_prefix(gpu_resource) + slug


def device_id(device: Device) -> str:
    """The ID the kubelet sees: the UUID (GPU-... or MIG-...)."""
    if not device.uuid or len(device.uuid) > MAX_DEVICE_ID:
        raise ResourceError(
            f"device {device.name}: ID {device.uuid!r} must be 1 to {MAX_DEVICE_ID} characters"
        )
    return device.uuid


def socket_name(resource: str) -> str:
    """The plugin's socket file name in the device-plugin directory."""
    return "dra-gpu-" + re.sub(r"[^A-Za-z0-9_.-]", "-", resource) + ".sock"


@dataclass(frozen=True)
class Resource:
    """One extended resource and the devices behind it."""

    name: str
    devices: tuple[Device, ...]
    #: How many times each device is advertised (time-slicing).
    replicas: int = 1
    #: Refuse a container that asks for more than one of its (shared) devices.
    one_per_container: bool = False

    @property
    def socket_name(self) -> str:
        """Its socket file name."""
        return socket_name(self.name)

    @property
    def advertised(self) -> int:
        """How many device IDs the kubelet sees."""
        return len(self.devices) * self.replicas

    @property
    def shared(self) -> bool:
        """Whether containers share its devices (time-slicing with more than one replica)."""
        return self.replicas > 1

    def device_ids(self) -> dict[str, Device]:
        """The advertised IDs, in node order, each with its device: UUIDs, or `<UUID>::<n>` per replica."""
        if not self.shared:
            return {device_id(d): d for d in self.devices}
        return {
            f"{device_id(d)}{REPLICA_SEPARATOR}{n}": d for d in self.devices for n in range(self.replicas)
        }


def _single(inventory: Inventory) -> list[Device]:
    """The devices of the single strategy: the full GPUs, or else the MIG devices of one profile."""
    in_mig_mode = [g for g in inventory.gpus if g.mig_enabled]
    if not in_mig_mode:
        return list(inventory)
    whole = [g.name for g in inventory.gpus if not g.mig_enabled]
    if whole:
        raise ResourceError(
            f"MIG strategy single: {', '.join(g.name for g in in_mig_mode)} in MIG mode but "
            f"{', '.join(whole)} not; put every GPU in MIG mode with one profile, or use the mixed strategy"
        )
    migs = [d for d in inventory if isinstance(d, MigDevice)]
    profiles: dict[str, dict[str, None]] = {}
    for mig in migs:
        profiles.setdefault(mig.profile, {})[mig.parent.name] = None
    if len(profiles) > 1:
        found = "; ".join(f"{p} on {', '.join(gpus)}" for p, gpus in sorted(profiles.items()))
        raise ResourceError(
            f"MIG strategy single needs one MIG profile on the node, found {len(profiles)} ({found}); "
            "use the mixed strategy"
        )
    empty = [g.name for g in in_mig_mode if not any(m.parent.uuid == g.uuid for m in migs)]
    if empty:
        raise ResourceError(
            f"MIG strategy single: {', '.join(empty)} in MIG mode without MIG devices; create them "
            "or use the mixed strategy"
        )
    return list(migs)


def _by_strategy(inventory: Inventory, gpu_resource: str, mig_strategy: MigStrategy) -> list[Resource]:
    if mig_strategy is MigStrategy.SINGLE:
        return [Resource(gpu_resource, tuple(_single(inventory)))]
    gpus = tuple(d for d in inventory if isinstance(d, Gpu))
    result = [Resource(gpu_resource, gpus)]
    if mig_strategy is MigStrategy.MIXED:
        migs: dict[str, list[Device]] = {}
        for device in inventory:
            if isinstance(device, MigDevice):
                name = check_resource_name(mig_resource_name(gpu_resource, device.profile))
                migs.setdefault(name, []).append(device)
        result.extend(Resource(name, tuple(devices)) for name, devices in sorted(migs.items()))
    return result


def resources(
    inventory: Inventory,
    gpu_resource: str = DEFAULT_RESOURCE,
    mig_strategy: MigStrategy = DEFAULT_MIG_STRATEGY,
    time_slicing: TimeSlicing | None = None,
) -> list[Resource]:
    """The resources to offer: the GPU resource (always, even with no GPU), then one per MIG profile.

    Time-sliced resources are advertised with their replicas, under their new name if renamed.
    ResourceError for a name the kubelet would refuse, or two resources of one name.
    """
    check_resource_name(gpu_resource)
    for device in inventory:
        device_id(device)
    result = []
    for resource in _by_strategy(inventory, gpu_resource, mig_strategy):
        entry = time_slicing.entry(resource.name) if time_slicing else None
        if time_slicing is None or entry is None:
            result.append(resource)
            continue
        name = check_resource_name(time_slicing.advertised_name(entry))
        shared = entry.replicas > 1
        result.append(
            Resource(
                name,
                resource.devices,
                entry.replicas,
                one_per_container=shared and time_slicing.fail_requests_greater_than_one,
            )
        )
    names = [r.name for r in result]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ResourceError(f"two resources would be named {', '.join(twice)}; rename one of them")
    return result


@dataclass(frozen=True)
class Changes:
    """How one list of resources becomes another, by resource name."""

    added: tuple[Resource, ...] = ()
    removed: tuple[Resource, ...] = ()
    #: The new version of each resource whose devices, replicas or sharing rule changed.
    changed: tuple[Resource, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


def changes(before: Sequence[Resource], after: Sequence[Resource]) -> Changes:
    """What to start, stop and re-announce to go from `before` to `after`."""
    old = {r.name: r for r in before}
    new = {r.name: r for r in after}
    return Changes(
        added=tuple(r for name, r in new.items() if name not in old),
        removed=tuple(r for name, r in old.items() if name not in new),
        changed=tuple(r for name, r in new.items() if name in old and old[name] != r),
    )


def unshared(inventory_resources: Sequence[Resource], time_slicing: TimeSlicing) -> list[str]:
    """Resources the time-slicing config names that this node does not offer (for a log line)."""
    offered = {r.name for r in inventory_resources}
    return [
        e.name
        for e in time_slicing.resources
        if e.name not in offered and time_slicing.advertised_name(e) not in offered
    ]


def placements(devices: Sequence[Device]) -> dict[str, Placement]:
    """Where each device sits, for GetPreferredAllocation: parent GPU, PCIe root, NUMA node."""
    result = {}
    for order, device in enumerate(devices):
        gpu = gpu_of(device)
        result[device_id(device)] = Placement(
            order=order,
            groups=(
                f"gpu:{gpu.uuid}",
                f"pcie:{gpu.pcie_root}" if gpu.pcie_root else None,
                f"numa:{gpu.numa_node}" if gpu.numa_node is not None else None,
            ),
        )
    return result


def numa_node(device: Device) -> int | None:
    """The device's NUMA node (a MIG device's is its parent's)."""
    return gpu_of(device).numa_node
