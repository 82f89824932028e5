"""Building blocks for end-to-end tests: claim templates, pods, and what they were given."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster import chart
from localcluster.clusterinfo import ClusterInfo
from localcluster.kube import Kube, Obj, load_manifests, wait_for

DRIVER = "gpu.nvidia.com"


@functools.cache
def _chart_device_classes() -> tuple[Obj, ...]:
    return tuple(o for o in chart.template() if o["kind"] == "DeviceClass")


def device_classes() -> list[Obj]:
    """The DeviceClasses the chart installs with its defaults (gpu, mig and vfio.gpu.nvidia.com).

    Tests use what admins install; the chart is rendered once per session.
    """
    return [copy.deepcopy(c) for c in _chart_device_classes()]


def committed_device_classes() -> list[Obj]:
    """The chart's DeviceClasses as deploy/manifests holds them: no helm needed.

    A test keeps deploy/manifests equal to a fresh render of the chart.
    """
    return load_manifests((chart.MANIFESTS / "deviceclasses.yaml").read_text())


def ensure_device_classes(kube: Kube, classes: Sequence[Obj] | None = None) -> None:
    """Create these DeviceClasses (default: the chart's, rendered) unless they exist."""
    for device_class in device_classes() if classes is None else classes:
        if kube.get_or_none("resource.k8s.io/v1", "DeviceClass", device_class["metadata"]["name"]) is None:
            kube.create(device_class)


def replace_device_classes(kube: Kube, classes: Sequence[Obj]) -> None:
    """Make these the DeviceClasses of their names (another driver's classes of the same names go)."""
    for device_class in classes:
        name = device_class["metadata"]["name"]
        if kube.get_or_none("resource.k8s.io/v1", "DeviceClass", name) is not None:
            kube.delete("resource.k8s.io/v1", "DeviceClass", name)
        kube.create(device_class)


def published_slices(kube: Kube, cluster: ClusterInfo) -> list[Obj]:
    """The ResourceSlices this driver publishes for the cluster's node."""
    return kube.list_objects(
        "resource.k8s.io/v1",
        "ResourceSlice",
        field_selector=f"spec.driver={DRIVER},spec.nodeName={cluster.node_name}",
    )


def published_devices(kube: Kube, cluster: ClusterInfo) -> list[Obj]:
    """The devices this driver publishes for the cluster's node, from all its ResourceSlices."""
    return [d for s in published_slices(kube, cluster) for d in s["spec"].get("devices") or []]


def claim_template(
    kube: Kube,
    namespace: str,
    name: str,
    selectors: Sequence[str] = (),
    count: int = 1,
    device_class: str = "gpu.nvidia.com",
    memory: str = "",
) -> Obj:
    """A ResourceClaimTemplate of one request `gpu`: `count` devices, a `memory` share each if given."""
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
        }
    )


def gpu_pod(kube: Kube, namespace: str, name: str, template: str) -> Obj:
    """A pod whose one container uses the whole claim made from `template`."""
    return claims_pod(kube, namespace, name, {"gpu": template}, {"main": [{"name": "gpu"}]})


def claims_pod(
    kube: Kube,
    namespace: str,
    name: str,
    templates: Mapping[str, str],
    containers: Mapping[str, Sequence[Obj]],
) -> Obj:
    """A pod with a claim per entry of `templates` (pod claim name: template) and `containers`
    (name: its `resources.claims` entries, e.g. `[{"name": "gpus", "request": "mig1"}]`)."""
    return kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [
                    {"name": claim, "resourceClaimTemplateName": template}
                    for claim, template in templates.items()
                ],
                "containers": [
                    {
                        "name": container,
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": list(refs)},
                    }
                    for container, refs in containers.items()
                ],
            },
        }
    )


def pod_claims(kube: Kube, namespace: str, pod_name: str) -> dict[str, Obj]:
    """The ResourceClaims generated for the pod, by the pod's name for each claim."""
    pod = kube.get("v1", "Pod", pod_name, namespace)
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    assert statuses, f"pod {namespace}/{pod_name} has no generated claim yet"
    return {
        s["name"]: kube.get("resource.k8s.io/v1", "ResourceClaim", s["resourceClaimName"], namespace)
        for s in statuses
    }


def pod_claim(kube: Kube, namespace: str, pod_name: str) -> Obj:
    """The ResourceClaim generated for the pod's one claim."""
    return next(iter(pod_claims(kube, namespace, pod_name).values()))


def allocated_devices(claim: Obj, request: str | None = None) -> list[str]:
    """Device names allocated to a claim, or to one of its requests (with its subrequests)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        r["device"]
        for r in allocation.get("devices", {}).get("results", [])
        if request is None or r["request"].split("/", 1)[0] == request
    ]


def container_record(cluster: ClusterInfo, namespace: str, pod: str, container: str = "main") -> Obj:
    """What the fake runtime resolved for a container: CDI devices, env, device nodes."""
    path = Path(cluster.runtime_records) / f"{namespace}_{pod}_{container}.json"
    record: Obj = json.loads(path.read_text())
    return record


def visible_devices(record: Obj, uuids: Mapping[str, str]) -> list[str]:
    """The devices a container sees on a node whose NVIDIA runtime hook also reads NVIDIA_VISIBLE_DEVICES.

    That is the devices its CDI edits gave it (by the `DRA_GPU_<DEVICE>_NAME` each sets: fake GPUs
    have no device nodes) plus those the hook would add from the variable's UUIDs (`all`: every
    device; `void`, `none` or empty: none). `uuids` maps device names to UUIDs.
    """
    env = record["env"]
    seen = {v for k, v in env.items() if k.startswith("DRA_GPU_") and k.endswith("_NAME")}
    listed = env.get("NVIDIA_VISIBLE_DEVICES", "")
    if listed == "all":
        seen |= set(uuids)
    elif listed not in ("void", "none"):
        wanted = set(listed.split(","))
        seen |= {name for name, uuid in uuids.items() if uuid in wanted}
    return sorted(seen)


# -- what real containers saw (clusters on containerd) -----------------------

#: What each container of an observed pod records into /out, then it sleeps: its environment,
#: its NVIDIA character devices, `nvidia-smi -L` and its exit status, the library directory.
REPORT = (
    'o=/out/"$C"; env > "$o.env"; '
    'for f in /dev/nvidia* /dev/nvidia-caps/* /dev/vfio/*; do [ -c "$f" ] && echo "$f"; done > "$o.dev"; '
    'nvidia-smi -L > "$o.smi" 2>&1; echo $? > "$o.smirc"; '
    'ls /usr/lib/x86_64-linux-gnu/ > "$o.libs" 2>/dev/null; touch "$o.done"; exec sleep 3600'
)


@dataclass
class Seen:
    """What one real container saw of itself."""

    env: dict[str, str]
    #: Its /dev/nvidia* and /dev/vfio/* character devices.
    dev: list[str]
    #: The lines of `nvidia-smi -L`, and its exit status (127: there is no nvidia-smi).
    smi: list[str]
    smi_rc: int
    #: The names in /usr/lib/x86_64-linux-gnu.
    libs: list[str]


def out_dir(cluster: ClusterInfo, namespace: str, pod: str) -> Path:
    """The host directory an observed pod's containers write what they saw into."""
    return Path(cluster.run_dir) / "out" / namespace / pod


def observed(cluster: ClusterInfo, pod: Obj) -> Obj:
    """The pod with every container running the test image and recording what it sees (REPORT)."""
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    out = out_dir(cluster, meta.get("namespace", "default"), meta["name"])
    out.mkdir(parents=True, exist_ok=True)
    spec = pod["spec"]
    spec.setdefault("volumes", []).append({"name": "out", "hostPath": {"path": str(out)}})
    for container in spec["containers"]:
        container["image"] = cluster.test_image
        container["command"] = ["sh", "-c", REPORT]
        container.setdefault("env", []).append({"name": "C", "value": container["name"]})
        container.setdefault("volumeMounts", []).append({"name": "out", "mountPath": "/out"})
    return pod


def seen(cluster: ClusterInfo, namespace: str, pod: str, container: str, timeout: float = 90) -> Seen:
    """What a container of an observed pod recorded, once it has."""
    out = out_dir(cluster, namespace, pod)
    wait_for(f"{pod}/{container} to record what it sees", (out / f"{container}.done").exists, timeout=timeout)
    lines = (out / f"{container}.env").read_text().splitlines()
    return Seen(
        env=dict(line.split("=", 1) for line in lines if "=" in line),
        dev=sorted((out / f"{container}.dev").read_text().split()),
        smi=(out / f"{container}.smi").read_text().splitlines(),
        smi_rc=int((out / f"{container}.smirc").read_text()),
        libs=(out / f"{container}.libs").read_text().split(),
    )


def delete_pods_and_wait(kube: Kube, cluster: ClusterInfo, namespace: str, claims: list[Obj]) -> None:
    """Delete every pod of the namespace and wait until their claims' CDI specs are gone."""
    for pod in kube.list_objects("v1", "Pod", namespace=namespace):
        kube.delete("v1", "Pod", pod["metadata"]["name"], namespace, grace_period=0)
    specs = [
        Path(cluster.cdi_dir) / f"k8s.{DRIVER}-claim_{claim['metadata']['uid']}.json" for claim in claims
    ]
    wait_for(
        "the claims' CDI specs to be removed", lambda: not any(spec.exists() for spec in specs), timeout=30
    )


# -- the device plugin's extended resources ----------------------------------


def gpu_limits_pod(
    kube: Kube, namespace: str, name: str, limits: dict[str, int], sidecar: bool = False
) -> Obj:
    """A pod whose container `main` has extended-resource limits (and optionally a GPU-less sidecar)."""
    containers: list[Obj] = [
        {
            "name": "main",
            "image": "registry.k8s.io/pause:3.10",
            "resources": {"limits": {k: str(v) for k, v in limits.items()}},
        }
    ]
    if sidecar:
        containers.append({"name": "sidecar", "image": "registry.k8s.io/pause:3.10"})
    return kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": containers},
        }
    )


def delete_pods(kube: Kube, namespace: str) -> None:
    """Delete every pod of the namespace and wait until they are gone (devices back to the plugin)."""
    for pod in kube.list_objects("v1", "Pod", namespace=namespace):
        kube.delete("v1", "Pod", pod["metadata"]["name"], namespace, grace_period=0)
    wait_for("pods to be gone", lambda: not kube.list_objects("v1", "Pod", namespace=namespace), timeout=30)


def node_resources(kube: Kube, cluster: ClusterInfo, field: str) -> dict[str, str]:
    """The node's nvidia.com resources in status.capacity or status.allocatable."""
    status = kube.get("v1", "Node", cluster.node_name)["status"]
    return {k: v for k, v in (status.get(field) or {}).items() if k.startswith("nvidia.com/")}
