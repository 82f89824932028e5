"""List-typed attributes (KEP-5491) on a real 1.37 API server and scheduler with DRAListTypeAttributes on.

The gate is alpha and off by default in 1.37 (and absent in 1.34, where this module is skipped),
so the module runs a cluster of its own with it on. Fake GPUs on sub-NUMA-clustered sockets:
GPUs 0 and 1 on node 0 and 2 on node 1, nodes 0 and 1 one socket's; GPU 3 on node 2, a socket
of its own. The driver finds the gate on by its probe and publishes `numaNode` as a list where a
GPU is as close to several nodes; the real scheduler evaluates `includes` and matches lists
by intersection.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import yaml
from localcluster.binaries import kubernetes_version
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, wait_for
from localcluster.kubereleases import default_feature_gates, release
from localcluster.workloads import DRIVER, allocated_devices, ensure_device_classes, gpu_pod, pod_claim

from tests.skips import Lack, reason

pytestmark = pytest.mark.cluster

NUMA = "resource.kubernetes.io/numaNode"
PROFILE = {
    "gpus": [
        {"model": "h100-sxm5-80gb", "count": 2, "numaNode": [0, 1]},
        {"model": "h100-sxm5-80gb", "numaNode": 1},
        {"model": "h100-sxm5-80gb", "numaNode": 2},
    ]
}


@pytest.fixture(scope="module")
def lists_on(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterInfo, Kube]]:
    """A 1.37 cluster with DRAListTypeAttributes on, and the driver on the profile above."""
    if release(kubernetes_version()) is release("v1.34.0"):
        pytest.skip(
            reason(Lack.RELEASE, "DRAListTypeAttributes came in 1.36 (KUBERNETES_VERSION=v1.37.2 runs this)")
        )
    workdir = tmp_path_factory.mktemp("lists")
    profile = workdir / "snc.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    cluster = LocalCluster(feature_gates=default_feature_gates() | {"DRAListTypeAttributes": True})
    info = cluster.start()
    kube = Kube(info.kubeconfig)
    driver = DriverProcess(info, str(profile), workdir / "driver.log").start()
    try:
        ensure_device_classes(kube)
        yield info, kube
    finally:
        driver.stop()
        kube.close()
        cluster.stop()


def _namespace(kube: Kube) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for("default ServiceAccount", lambda: kube.get_or_none("v1", "ServiceAccount", "default", name))
    return name


def _published(kube: Kube) -> dict[str, object]:
    slices = kube.list_objects("resource.k8s.io/v1", "ResourceSlice")
    return {
        d["name"]: d["attributes"].get(NUMA)
        for s in slices
        if s["spec"]["driver"] == DRIVER
        for d in s["spec"].get("devices", [])
    }


def test_the_server_keeps_numa_node_lists_and_the_scheduler_selects_and_matches_on_them(
    lists_on: tuple[ClusterInfo, Kube],
) -> None:
    _, kube = lists_on
    wait_for("the driver's slices", lambda: len(_published(kube)) == 4, timeout=60)
    assert _published(kube) == {
        "gpu-0": {"ints": [0, 1]},
        "gpu-1": {"ints": [0, 1]},
        "gpu-2": {"ints": [1, 0]},
        "gpu-3": {"int": 2},
    }
    namespace = _namespace(kube)
    # Two GPUs close to node 0 whose NUMA nodes intersect: GPU 3 (node 2) can be neither.
    exactly = {
        "deviceClassName": "gpu.nvidia.com",
        "count": 2,
        "selectors": [
            {"cel": {"expression": 'device.attributes["resource.kubernetes.io"].numaNode.includes(0)'}}
        ],
    }
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "near-node-0", "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": exactly}],
                        "constraints": [{"matchAttribute": NUMA}],
                    }
                }
            },
        }
    )
    gpu_pod(kube, namespace, "near", "near-node-0")
    kube.wait_pod_phase("near", namespace)
    assert set(allocated_devices(pod_claim(kube, namespace, "near"))) <= {"gpu-0", "gpu-1", "gpu-2"}
