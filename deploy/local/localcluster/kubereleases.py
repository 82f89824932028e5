"""The Kubernetes releases a local cluster runs: what each minor needs turned on, and API rate limits.

The release is KUBERNETES_VERSION's (localcluster.binaries.kubernetes_version()); RELEASES says
what each minor needs for the driver's features, and every component gets the same gates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from localcluster.binaries import kubernetes_version
from localcluster.clusterinfo import ClusterError


@dataclass(frozen=True)
class Release:
    """What one Kubernetes minor needs turned on for the driver's features."""

    #: Gates beyond the release's defaults; every component gets them (they share one registry).
    feature_gates: Mapping[str, bool]
    #: API versions beyond the default ones that those gates need served (--runtime-config).
    runtime_config: tuple[str, ...]


#: The driver's features: DRAPartitionableDevices, DRADeviceTaints, DRAConsumableCapacity,
#: DRAExtendedResource, ResourceHealthStatus; each needs DynamicResourceAllocation, GA and on since 1.34.
RELEASES: dict[str, Release] = {
    # All five are alpha in 1.34, off by default.
    "1.34": Release(
        feature_gates={
            "DRAPartitionableDevices": True,
            "DRADeviceTaints": True,
            "DRAExtendedResource": True,
            "DRAConsumableCapacity": True,
            "ResourceHealthStatus": True,
        },
        # DeviceTaintRule (DRADeviceTaints) is served only as v1alpha3, and the scheduler waits
        # for it; v1beta1 and v1beta2 serve clients of the older resource APIs.
        runtime_config=("resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1alpha3"),
    ),
    # All five are on by default in 1.37. The beta ones are set anyway, so that the harness
    # says what it relies on; DRADeviceTaints is GA (setting it only warns) and
    # DRAExtendedResource GA and locked (setting it false fails), so they are left alone.
    "1.37": Release(
        feature_gates={
            "DRAPartitionableDevices": True,
            "DRAConsumableCapacity": True,
            "ResourceHealthStatus": True,
        },
        # DeviceTaintRule is in resource.k8s.io/v1 (DRADeviceTaintRules is GA): nothing to add.
        runtime_config=(),
    ),
}


def release(version: str) -> Release:
    """The entry of RELEASES for a version such as v1.37.2."""
    minor = ".".join(version.lstrip("v").split(".")[:2])
    try:
        return RELEASES[minor]
    except KeyError:
        raise ClusterError(
            f"Kubernetes {version}: the harness knows the feature gates of {', '.join(RELEASES)} only "
            "(add the minor to localcluster.kubereleases.RELEASES)"
        ) from None


def default_feature_gates(version: str | None = None) -> dict[str, bool]:
    """The gates a cluster of this release (default: the chosen one) starts with."""
    return dict(release(version or kubernetes_version()).feature_gates)


def runtime_config_flag(versions: tuple[str, ...]) -> list[str]:
    """kube-apiserver's --runtime-config for these API versions (none: no flag)."""
    return [f"--runtime-config={','.join(f'{version}=true' for version in versions)}"] if versions else []


def gates_flag(gates: Mapping[str, bool]) -> str:
    """The --feature-gates value of these gates, sorted."""
    return ",".join(f"{name}={str(value).lower()}" for name, value in sorted(gates.items()))


def parse_gates(text: str, version: str | None = None) -> dict[str, bool]:
    """Parse "A=true,B=false" into a dict, starting from the harness defaults of the release."""
    gates = default_feature_gates(version)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise ValueError(f"feature gate {item!r}: expected Name=true or Name=false")
        gates[name] = value.lower() == "true"
    return gates


def api_burst(qps: int) -> int:
    """The burst of a raised API rate limit of `qps` requests/s: twice that, for every component."""
    return 2 * qps


def api_limit_flags(qps: int) -> tuple[str, ...]:
    """kube-controller-manager's or kube-scheduler's flags for an API rate limit of `qps` requests/s;
    none for 0 (their defaults: 20 and 30, 50 and 100)."""
    return (f"--kube-api-qps={qps}", f"--kube-api-burst={api_burst(qps)}") if qps > 0 else ()


def kubelet_api_limit(qps: int) -> dict[str, int]:
    """KubeletConfiguration fields for an API rate limit of `qps` requests/s; none for 0.

    The kubelet's default is 50 with a burst of 100; its pods' status updates spend it.
    """
    return {"kubeAPIQPS": qps, "kubeAPIBurst": api_burst(qps)} if qps > 0 else {}
