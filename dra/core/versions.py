"""Which API servers the driver supports, and which gated ResourceSlice fields they keep. Pure.

A server older than 1.34 or without `resource.k8s.io/v1` is a start-up error; one newer than
the newest tested is a warning. The version does not say which gated fields the server keeps,
so the driver dry-run creates `probe_slices`, and `kept_fields` and `features` turn what came
back into ApiFeatures (docs/kubernetes-versions.md, "Start-up check").
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra.model.quoting import quote

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
    #: List-valued device attributes, `ints` and the like (DRAListTypeAttributes, KEP-5491).
    list_attributes: bool = False

    @property
    def counters_in_own_slice(self) -> bool:
        """From 1.35 a slice holds either devices or shared counters, never both (1.34: both in one)."""
        return self.minor >= 35


#: Field names `kept_fields` looks for, one per gated feature (or two: counters).
TAINTS: Final = "taints"
ALLOW_MULTIPLE_ALLOCATIONS: Final = "allowMultipleAllocations"
SHARED_COUNTERS: Final = "sharedCounters"
CONSUMES_COUNTERS: Final = "consumesCounters"
#: The attribute field the list probe uses (DeviceAttribute.IntValues).
INT_VALUES: Final = "ints"

#: The gate an admin turns on for each feature (on the API server, scheduler, controller manager
#: and kubelet), and the release from which it is on whatever the gates say (GA).
GATES: Final = {
    "partitionable_devices": ("DRAPartitionableDevices", "shared counters (partitionable devices)", None),
    "device_taints": ("DRADeviceTaints", "device taints", 37),
    "consumable_capacity": ("DRAConsumableCapacity", "consumable capacity", None),
    "list_attributes": ("DRAListTypeAttributes", "list-typed attributes", None),
}
#: The components each gate must be on in, where not all four: list-typed attributes are validated
#: by the API server and matched by the scheduler (KEP-5491's kep.yaml).
GATE_COMPONENTS: Final = {"DRAListTypeAttributes": "API server, scheduler"}
_ALL_COMPONENTS = "API server, scheduler, controller manager, kubelet"

_PROBE_COUNTER_SET = "probe"


def _probe_slice(driver: str, node_name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A throwaway ResourceSlice of `spec` for a dry run, in the node's own pool.

    A dry run stores nothing, so the pool may be the one the driver publishes; it must be,
    since the chart's admission policy lets the driver's identity write no other pool and
    applies to dry runs too (a pool of another name was refused, and every gated field taken as off).
    """
    return {
        "apiVersion": f"resource.k8s.io/{RESOURCE_VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "dra-gpu-feature-probe-"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            **spec,
        },
    }


def probe_slices(driver: str, node_name: str, minor: int) -> list[list[dict[str, Any]]]:
    """Throwaway ResourceSlices that use every gated field, for dry-run creates.

    Each inner list is created in one go; from 1.35 the counters need a slice of
    their own, so there are two.
    """
    counters = [{"name": _PROBE_COUNTER_SET, "counters": {"memory": {"value": "1Gi"}}}]
    devices: list[dict[str, Any]] = [
        {"name": "taint", "taints": [{"key": f"{driver}/probe", "value": "probe", "effect": "NoSchedule"}]},
        {"name": "shared", ALLOW_MULTIPLE_ALLOCATIONS: True},
        {
            "name": "counters",
            CONSUMES_COUNTERS: [{"counterSet": _PROBE_COUNTER_SET, "counters": {"memory": {"value": "1Gi"}}}],
        },
    ]
    if minor >= 35:
        return [
            [_probe_slice(driver, node_name, {SHARED_COUNTERS: counters})],
            [_probe_slice(driver, node_name, {"devices": devices})],
        ]
    return [[_probe_slice(driver, node_name, {SHARED_COUNTERS: counters, "devices": devices})]]


def list_probe_slice(driver: str, node_name: str) -> dict[str, Any]:
    """A throwaway ResourceSlice with one list-valued attribute, created on its own.

    A server that drops the field (gate off, or a release without it) is left with an attribute
    that has no value and refuses the whole slice as invalid, so this one cannot share a create
    with the other probes: `kept_fields` reads its answer, and a refusal means dropped.
    """
    return _probe_slice(
        driver, node_name, {"devices": [{"name": "list", "attributes": {"probe": {INT_VALUES: [0, 1]}}}]}
    )


def kept_fields(answers: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The gated fields that the server's answers to the probe creates still carry."""
    kept: set[str] = set()
    for answer in answers:
        spec = answer.get("spec") or {}
        if spec.get(SHARED_COUNTERS):
            kept.add(SHARED_COUNTERS)
        for device in spec.get("devices") or []:
            kept.update(
                name for name in (TAINTS, ALLOW_MULTIPLE_ALLOCATIONS, CONSUMES_COUNTERS) if device.get(name)
            )
            if any(INT_VALUES in (a or {}) for a in (device.get("attributes") or {}).values()):
                kept.add(INT_VALUES)
    return frozenset(kept)


def features(server: ServerInfo, kept: frozenset[str]) -> ApiFeatures:
    """What the driver may publish to this server, from the fields its probe kept."""
    return ApiFeatures(
        minor=server.minor or OLDEST_MINOR,
        partitionable_devices=SHARED_COUNTERS in kept and CONSUMES_COUNTERS in kept,
        device_taints=TAINTS in kept,
        consumable_capacity=ALLOW_MULTIPLE_ALLOCATIONS in kept,
        list_attributes=INT_VALUES in kept,
    )


def assumed_features(server: ServerInfo) -> ApiFeatures:
    """What to publish when the probe could not be made: only what no gate can turn off."""
    minor = server.minor or OLDEST_MINOR
    return ApiFeatures(
        minor=minor,
        **{name: ga is not None and minor >= ga for name, (_, _, ga) in GATES.items()},
    )


def missing(found: ApiFeatures) -> list[str]:
    """One line for each feature the server lacks, naming the gate that turns it on."""
    return [
        f"the API server drops {what} from ResourceSlices (feature gate {gate} off): the driver does "
        f"without them; turn {gate} on ({GATE_COMPONENTS.get(gate, _ALL_COMPONENTS)}) to use them"
        for name, (gate, what, _) in GATES.items()
        if not getattr(found, name)
    ]


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


def parse_minor(text: str) -> int:
    """A Kubernetes minor release (the x of 1.x) the driver supports, as `--kubernetes-minor` takes it."""
    minor = int(text) if text.isascii() and text.isdigit() and len(text) <= 3 else None
    if minor is None or not OLDEST_MINOR <= minor <= NEWEST_MINOR:
        raise ValueError(
            f"expected a minor release from {OLDEST_MINOR} to {NEWEST_MINOR} ({SUPPORTED}), got {quote(text)}"
        )
    return minor


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
