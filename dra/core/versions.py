"""Which API servers the driver supports, decided from what the server reports. Pure.

The driver writes `resource.k8s.io/v1` (GA in 1.34) and is tested on 1.34 and
1.37. At start it reads the server's `/version` and the versions the
`resource.k8s.io` group serves; a server older than 1.34, or one that does not
serve `resource.k8s.io/v1`, is a start-up error naming the supported range. A
server newer than the newest tested release is only worth a warning: the v1
API it must keep serving is all the driver uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Kubernetes minor releases (1.x) the driver is tested on, oldest and newest.
OLDEST_MINOR = 34
NEWEST_MINOR = 37
SUPPORTED = f"Kubernetes 1.{OLDEST_MINOR} to 1.{NEWEST_MINOR}"
#: The resource.k8s.io version the driver reads and writes.
RESOURCE_VERSION = "v1"


@dataclass(frozen=True)
class ServerInfo:
    """What the API server says about itself."""

    git_version: str
    minor: int
    #: Versions of resource.k8s.io it serves, preferred first (empty: the group is not served).
    resource_versions: tuple[str, ...]


@dataclass(frozen=True)
class ApiFeatures:
    """What the API server accepts in resource.k8s.io/v1 objects, decided once at start.

    A feature whose gate is off on the server is False: the server would drop
    its fields silently, so the driver does not publish them (and says so once
    at start).
    """

    #: The server's minor release (1.x).
    minor: int = OLDEST_MINOR
    #: Shared counters and devices consuming them (DRAPartitionableDevices).
    partitionable_devices: bool = False
    #: Taints on devices in ResourceSlices (DRADeviceTaints).
    device_taints: bool = False
    #: allowMultipleAllocations and capacity request policies (DRAConsumableCapacity).
    consumable_capacity: bool = False

    @property
    def counters_in_own_slice(self) -> bool:
        """From 1.35 a slice holds either devices or shared counters, never both (1.34: both in one)."""
        return self.minor >= 35


class UnsupportedServerError(Exception):
    """The API server cannot serve this driver; the message names the supported range."""


def server_info(version: Mapping[str, Any], resource_group: Mapping[str, Any] | None) -> ServerInfo:
    """Read `/version` and `/apis/resource.k8s.io` (None when the group is not served)."""
    git_version = str(version.get("gitVersion") or "")
    # "minor" is "34" on a release build and "34+" on some distributions' builds.
    found = re.match(r"(\d+)", str(version.get("minor") or "")) or re.match(r"v?1\.(\d+)", git_version)
    minor = int(found.group(1)) if found else 0
    versions = tuple(
        str(v.get("version")) for v in (resource_group or {}).get("versions") or [] if v.get("version")
    )
    return ServerInfo(git_version=git_version or "(no gitVersion)", minor=minor, resource_versions=versions)


def check(server: ServerInfo) -> Sequence[str]:
    """Warnings for a server that works; UnsupportedServerError for one that cannot."""
    if RESOURCE_VERSION not in server.resource_versions:
        served = ", ".join(server.resource_versions) or "none"
        raise UnsupportedServerError(
            f"the API server ({server.git_version}) does not serve resource.k8s.io/{RESOURCE_VERSION} "
            f"(it serves: {served}); dra-gpu needs {SUPPORTED} with the resource.k8s.io/v1 API enabled"
        )
    if server.minor and server.minor < OLDEST_MINOR:
        raise UnsupportedServerError(f"the API server is {server.git_version}; dra-gpu needs {SUPPORTED}")
    if server.minor > NEWEST_MINOR:
        return [f"the API server is {server.git_version}, newer than the newest tested release ({SUPPORTED})"]
    return []


#: The first kubelet that keeps several registered plugins of one driver and calls the newest
#: connected one (kubelet DRA plugin manager, 1.33); older ones must not see two instances.
ROLLING_UPDATE_KUBELET_MINOR = 33


def rolling_update_refusal(kubelet_version: str) -> str | None:
    """Why a kubelet of this version (Node status.nodeInfo.kubeletVersion) cannot take overlapping instances.

    None when it can, or when the version does not parse (then the kubelet is trusted).
    """
    found = re.match(r"v?1\.(\d+)", kubelet_version)
    if found is None or int(found.group(1)) >= ROLLING_UPDATE_KUBELET_MINOR:
        return None
    return (
        f"the kubelet is {kubelet_version}; overlapping plugin instances (rolling updates) need a kubelet "
        f"1.{ROLLING_UPDATE_KUBELET_MINOR} or newer: run with --rolling-update=false "
        "(chart: kubeletPlugin.rollingUpdate=false)"
    )
