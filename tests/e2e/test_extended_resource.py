"""Pods that ask for `nvidia.com/gpu` without a claim get DRA GPUs (KEP-5004, issue 11).

The chart's `deviceClasses.gpu.extendedResourceName` maps the extended resource
to the whole-GPU class. The real scheduler then writes a claim for such a pod
(`status.extendedResourceClaimStatus` names it), the kubelet asks this driver
to prepare it like any claim, and the container gets the GPUs through CDI.
On 1.34 this needs the DRAExtendedResource gate, which the harness turns on;
it is GA from 1.37.

A node that once ran a device plugin for the name keeps it in its status at 0
(the kubelet's way of saying "device-plugin managed"). The 1.34 scheduler
then never uses DRA for that name on the node; from 1.37 a 0 no longer
blocks it (docs/migration.md). The module runs on a cluster of its own, so
the session's device-plugin tests cannot leave such a 0 behind.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from localcluster import chart
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, wait_for
from localcluster.workloads import (
    allocated_devices,
    container_record,
    delete_pods,
    ensure_device_classes,
    gpu_limits_pod,
    node_resources,
    published_devices,
    visible_devices,
)

pytestmark = pytest.mark.cluster

RESOURCE = "nvidia.com/gpu"
CLASS = "gpu-extended.nvidia.com"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterInfo]:
    """A cluster of this module's own: its node has never run a device plugin."""
    local = LocalCluster()
    try:
        yield local.start()
    finally:
        local.stop()


@pytest.fixture(scope="module")
def kube(cluster: ClusterInfo) -> Iterator[Kube]:
    """A cluster-admin client of the module's cluster."""
    client = Kube(cluster.kubeconfig)
    yield client
    client.close()


@pytest.fixture(scope="module")
def driver(cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The driver on 8 fake H100s, and the chart's whole-GPU class mapped to nvidia.com/gpu."""
    ensure_device_classes(kube)
    values = {"deviceClasses": {"gpu": {"name": CLASS, "extendedResourceName": RESOURCE}}}
    [mapped] = [c for c in chart.template(values) if c["metadata"]["name"] == CLASS]
    kube.create(mapped)
    process = DriverProcess(cluster, "h100x8", tmp_path_factory.mktemp("extended") / "driver.log").start()
    try:
        yield
    finally:
        kube.delete("resource.k8s.io/v1", "DeviceClass", CLASS)
        assert process.stop() == 0, process.log_path.read_text()


@pytest.fixture
def uuids(driver: None, kube: Kube, cluster: ClusterInfo) -> dict[str, str]:
    """Each published device's UUID, by device name."""
    return {d["name"]: d["attributes"]["uuid"]["string"] for d in published_devices(kube, cluster)}


def _claim_of(kube: Kube, namespace: str, pod: str) -> Obj:
    """The claim the scheduler wrote for the pod's extended resource (status.extendedResourceClaimStatus)."""
    status = kube.get("v1", "Pod", pod, namespace)["status"]["extendedResourceClaimStatus"]
    [mapping] = status["requestMappings"]
    assert (mapping["containerName"], mapping["resourceName"]) == ("main", RESOURCE)
    return kube.get("resource.k8s.io/v1", "ResourceClaim", status["resourceClaimName"], namespace)


def test_a_pod_asking_for_nvidia_gpu_gets_exactly_that_many_dra_gpus(
    kube: Kube, cluster: ClusterInfo, namespace: str, uuids: dict[str, str]
) -> None:
    assert RESOURCE not in node_resources(kube, cluster, "allocatable"), (
        "a device plugin advertises nvidia.com/gpu on this node: the scheduler would not use DRA here"
    )
    gpu_limits_pod(kube, namespace, "one", {RESOURCE: 1})
    gpu_limits_pod(kube, namespace, "two", {RESOURCE: 2})
    seen: set[str] = set()
    for pod, count in (("one", 1), ("two", 2)):
        kube.wait_pod_phase(pod, namespace)
        claim = _claim_of(kube, namespace, pod)
        devices = allocated_devices(claim)
        assert len(devices) == count
        assert visible_devices(container_record(cluster, namespace, pod), uuids) == sorted(devices)
        assert not seen & set(devices), "a GPU was handed out twice"
        seen |= set(devices)


def test_the_extended_resource_is_counted_against_the_gpus_left(
    kube: Kube, cluster: ClusterInfo, namespace: str, uuids: dict[str, str]
) -> None:
    gpu_limits_pod(kube, namespace, "most", {RESOURCE: 6})
    kube.wait_pod_phase("most", namespace)
    gpu_limits_pod(kube, namespace, "too-many", {RESOURCE: 3})

    def unschedulable() -> bool:
        conditions = kube.get("v1", "Pod", "too-many", namespace)["status"].get("conditions") or []
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)

    wait_for("the pod asking for 3 of the 2 GPUs left to be unschedulable", unschedulable, timeout=30)
    kube.delete("v1", "Pod", "most", namespace, grace_period=0)
    kube.wait_pod_phase("too-many", namespace, timeout=90)
    assert len(allocated_devices(_claim_of(kube, namespace, "too-many"))) == 3
    delete_pods(kube, namespace)


def _set_device_plugin_zero(kube: Kube, cluster: ClusterInfo, present: bool) -> None:
    """Put the 0 a gone device plugin leaves in the node status (present), or remove it."""
    value = "0" if present else None
    status = {"capacity": {RESOURCE: value}, "allocatable": {RESOURCE: value}}
    kube.patch("v1", "Node", cluster.node_name, {"status": status}, status=True)


def test_a_node_that_ran_a_device_plugin_needs_its_zero_removed_on_1_34_only(
    kube: Kube, cluster: ClusterInfo, namespace: str, uuids: dict[str, str]
) -> None:
    _set_device_plugin_zero(kube, cluster, present=True)
    try:
        gpu_limits_pod(kube, namespace, "after-migration", {RESOURCE: 1})
        if cluster.kubernetes_version.startswith("v1.34."):

            def insufficient() -> bool:
                events = kube.events_for("Pod", "after-migration", namespace)
                return any(f"Insufficient {RESOURCE}" in (e.get("message") or "") for e in events)

            wait_for("the 1.34 scheduler to take the device plugin's 0", insufficient, timeout=30)
            # The migration step docs/migration.md gives for 1.34, once the kubelet's 5-minute
            # grace for the stopped device plugin is over.
            _set_device_plugin_zero(kube, cluster, present=False)
        kube.wait_pod_phase("after-migration", namespace, timeout=90)
        [device] = allocated_devices(_claim_of(kube, namespace, "after-migration"))
        assert visible_devices(container_record(cluster, namespace, "after-migration"), uuids) == [device]
    finally:
        _set_device_plugin_zero(kube, cluster, present=False)
        delete_pods(kube, namespace)
