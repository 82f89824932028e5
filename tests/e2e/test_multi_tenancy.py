"""Shared-cluster policies on DRA GPUs, each example of docs/multi-tenancy.md applied (issue 11).

Quotas per team namespace (devices per DeviceClass, claim counts, `requests.nvidia.com/gpu`),
admin access only in labelled namespaces, priority preemption freeing a claimed GPU, and GPU
nodes tainted for GPU workloads only. The policies are Kubernetes'; the tests show they hold
with this driver's devices, on the real API server, scheduler and kubelet.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes.dynamic.exceptions import ForbiddenError, UnprocessibleEntityError
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, load_manifests, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claim_template,
    delete_pods_and_wait,
    ensure_device_classes,
    gpu_pod,
    pod_claim,
)

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "multi-tenancy"


def _example(name: str, namespace: str | None = None) -> list[Obj]:
    """An example file of docs/multi-tenancy.md, its namespace set to the test's."""
    docs = load_manifests((EXAMPLES / name).read_text())
    for doc in docs:
        if namespace is not None and doc["kind"] not in ("PriorityClass", "Namespace"):
            doc["metadata"]["namespace"] = namespace
    return docs


@pytest.fixture(scope="module")
def one_gpu_driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    """The driver on a node with a single fake H100: whoever holds it, nobody else gets it."""
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("tenancy")
    profile = workdir / "one-gpu.yaml"
    profile.write_text(yaml.safe_dump({"gpus": [{"model": "h100-sxm5-80gb"}]}))
    process = DriverProcess(cluster, str(profile), workdir / "driver.log").start()
    yield process
    assert process.stop() == 0, process.log_path.read_text()


def _wait_quota(kube: Kube, namespace: str, name: str) -> None:
    # Admission counts against status.hard, which the quota controller fills in.
    wait_for(
        "the quota to be in force",
        lambda: kube.get("v1", "ResourceQuota", name, namespace).get("status", {}).get("hard"),
        timeout=30,
    )


def test_a_team_quota_refuses_the_claim_and_the_pod_that_exceed_it(kube: Kube, namespace: str) -> None:
    [quota] = _example("quota.yaml", namespace)
    kube.create(quota)
    _wait_quota(kube, namespace, quota["metadata"]["name"])
    claim_template(kube, namespace, "one-gpu")
    first: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "first", "namespace": namespace},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
    }
    kube.create(first)
    second = {**first, "metadata": {"name": "second", "namespace": namespace}}
    with pytest.raises(
        ForbiddenError, match=r"exceeded quota: .*gpu\.nvidia\.com\.deviceclass\.resource\.k8s\.io/devices"
    ):
        kube.create(second)
    legacy: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "legacy", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "3"}},
                }
            ]
        },
    }
    with pytest.raises(ForbiddenError, match=r"exceeded quota: .*requests\.nvidia\.com/gpu"):
        kube.create(legacy)

    # A claim the control plane makes from a template is refused the same way, later: the pod waits.
    gpu_pod(kube, namespace, "over-budget", "one-gpu")

    def refused() -> bool:
        events = kube.events_for("Pod", "over-budget", namespace)
        return any(
            e.get("reason") == "FailedResourceClaimCreation" and "exceeded quota" in (e.get("message") or "")
            for e in events
        )

    wait_for("the template's claim to be refused by the quota", refused, timeout=30)


def test_admin_access_claims_need_the_namespace_label(kube: Kube, namespace: str) -> None:
    [claim] = _example("admin-access-claim.yaml", namespace)
    with pytest.raises(UnprocessibleEntityError, match="admin access to devices requires"):
        kube.create(claim)
    kube.patch(
        "v1",
        "Namespace",
        namespace,
        {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
    )
    assert kube.create(claim)["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True


def _priority_classes(kube: Kube) -> None:
    for doc in _example("priority-classes.yaml"):
        if kube.get_or_none("scheduling.k8s.io/v1", "PriorityClass", doc["metadata"]["name"]) is None:
            kube.create(doc)


def test_priority_orders_who_gets_a_freed_gpu_but_does_not_preempt_a_claim(
    kube: Kube, cluster: ClusterInfo, namespace: str, one_gpu_driver: DriverProcess
) -> None:
    """Kubernetes 1.34 to 1.37 do not preempt pods for DRA devices (KEP-5690 is not in them)."""
    _priority_classes(kube)
    claim_template(kube, namespace, "one-gpu")
    kube.create_all(_example("experiment-pod.yaml", namespace))
    kube.wait_pod_phase("experiment", namespace)
    held = pod_claim(kube, namespace, "experiment")
    spec = Path(cluster.cdi_dir) / f"k8s.{DRIVER}-claim_{held['metadata']['uid']}.json"
    assert spec.exists()

    training = _example("tolerating-pod.yaml", namespace)
    kube.create_all(training)
    kube.create_all(_example("inference-pod.yaml", namespace))

    def not_preempting() -> bool:
        events = kube.events_for("Pod", "inference", namespace)
        return any("Preemption is not helpful" in (e.get("message") or "") for e in events)

    wait_for("the scheduler to decline preempting the experiment", not_preempting, timeout=30)
    assert kube.get("v1", "Pod", "experiment", namespace)["status"]["phase"] == "Running"

    # What a queueing controller or an admin does instead: end the lowest-priority pod.
    kube.delete("v1", "Pod", "experiment", namespace, grace_period=0)
    wait_for("the experiment's claim to be unprepared", lambda: not spec.exists(), timeout=30)
    kube.wait_pod_phase("inference", namespace, timeout=60)
    inference = pod_claim(kube, namespace, "inference")
    assert allocated_devices(inference) == allocated_devices(held)
    assert kube.get("v1", "Pod", "trainer", namespace)["status"]["phase"] == "Pending"
    # Leave the GPU free for the next test: the pending trainer first, or it takes the GPU.
    kube.delete("v1", "Pod", "trainer", namespace, grace_period=0)
    delete_pods_and_wait(kube, cluster, namespace, [inference])


def test_tainted_gpu_nodes_take_only_pods_that_tolerate_them(
    kube: Kube, cluster: ClusterInfo, namespace: str, one_gpu_driver: DriverProcess
) -> None:
    taints = [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
    ]
    _priority_classes(kube)
    kube.patch("v1", "Node", cluster.node_name, {"spec": {"taints": taints}})
    try:
        claim_template(kube, namespace, "one-gpu")
        gpu_pod(kube, namespace, "untolerated", "one-gpu")

        def refused() -> bool:
            events = kube.events_for("Pod", "untolerated", namespace)
            return any("untolerated taint" in (e.get("message") or "") for e in events)

        wait_for("the pod without tolerations to be refused by the node", refused, timeout=30)
        kube.delete("v1", "Pod", "untolerated", namespace, grace_period=0)
        [tolerating] = _example("tolerating-pod.yaml", namespace)
        kube.create(tolerating)
        kube.wait_pod_phase("trainer", namespace, timeout=60)
        delete_pods_and_wait(kube, cluster, namespace, [pod_claim(kube, namespace, "trainer")])
    finally:
        kube.patch("v1", "Node", cluster.node_name, {"spec": {"taints": None}})
