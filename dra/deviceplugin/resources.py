"""Which extended resources the device plugin offers, with which device IDs: pure.

Full GPUs are offered as one resource (`nvidia.com/gpu` by default). When
GPUs of the node are in MIG mode their MIG devices are offered per profile
(`nvidia.com/mig-1g.10gb`, ...: NVIDIA's "mixed" MIG strategy), each resource
with its own plugin socket and registration. A device's ID is its UUID: the
kubelet checkpoints allocations by ID, and a UUID survives index changes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from dra.deviceplugin.preferred import Placement
from dra.model.devices import Device, Inventory, MigDevice, gpu_of

DEFAULT_RESOURCE = "nvidia.com/gpu"
#: Device IDs longer than this are refused.
MAX_DEVICE_ID = 63

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class ResourceError(ValueError):
    """A resource name or device ID the kubelet would refuse."""


def check_resource_name(name: str) -> str:
    """Return `name` if it is a valid extended resource name (domain/name, not *kubernetes.io)."""
    domain, sep, local = name.partition("/")
    if not sep or not domain or not local:
        raise ResourceError(f"resource name {name!r} must be <domain>/<name>, such as nvidia.com/gpu")
    if len(domain) > 253 or not _DNS_SUBDOMAIN.match(domain):
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
    domain = gpu_resource.partition("/")[0]
    slug = re.sub(r"[^a-z0-9_.-]+", ".", profile.lower()).strip("._-")
    return f"{domain}/mig-{slug}"


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

    @property
    def socket_name(self) -> str:
        """Its socket file name."""
        return socket_name(self.name)


def resources(inventory: Inventory, gpu_resource: str = DEFAULT_RESOURCE) -> list[Resource]:
    """The resources to offer: the GPU resource (always, even with no GPU), then one per MIG profile."""
    check_resource_name(gpu_resource)
    gpus: list[Device] = []
    migs: dict[str, list[Device]] = {}
    for device in inventory:
        device_id(device)
        if isinstance(device, MigDevice):
            migs.setdefault(check_resource_name(mig_resource_name(gpu_resource, device.profile)), []).append(
                device
            )
        else:
            gpus.append(device)
    result = [Resource(gpu_resource, tuple(gpus))]
    result.extend(Resource(name, tuple(devices)) for name, devices in sorted(migs.items()))
    return result


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
