"""Why shareable GPUs leave pods pending on 1.34: the real scheduler, on both releases.

Kubernetes 1.34's allocator checks a request against the capacity left on the device at the
request's own index in the candidate's ResourceSlice (kubernetes/kubernetes#133705; #133706
fixed it in 1.35), not on the candidate. With every GPU shareable, a claim given the slice's first
device whole (in this driver's order the smallest MIG device) leaves no capacity there, and from
then on every request whose first device is checked against it fails, whole GPUs included, which
that share does not touch. 1.37 allocates them. The driver warns at start on 1.34
(docs/sharing.md, Consumable shares).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from localcluster.binaries import kubernetes_version
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, WaitTimeoutError
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    delete_pods_and_wait,
    ensure_device_classes,
    gpu_pod,
    pod_claim,
    published_slices,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    """The driver on h100x8-mig (gpu-0 to gpu-3 whole, gpu-4 to gpu-7 in MIG mode), every GPU shareable."""
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("shares-scheduler")
    process = DriverProcess(
        cluster, "h100x8-mig", workdir / "driver.log", extra_args=("--shareable-gpus=all",)
    ).start()
    yield process
    assert process.stop() == 0, process.log_path.read_text()


def _template(kube: Kube, namespace: str, name: str, device_class: str, selector: str = "") -> None:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
        }
    )


def test_a_whole_share_of_the_slices_first_device_blocks_a_gpu_claim_on_1_34_only(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    [pool] = published_slices(kube, cluster)
    first = pool["spec"]["devices"][0]
    assert first["name"] == "gpu-4-mig-1g10gb-3-0"
    uuid = first["attributes"]["uuid"]["string"]
    _template(kube, namespace, "first", "mig.nvidia.com", f'device.attributes["{DRIVER}"].uuid == "{uuid}"')
    _template(kube, namespace, "gpu", DRIVER)
    try:
        # No capacity asked: the claim gets the default, the MIG device's whole memory.
        gpu_pod(kube, namespace, "whole", "first")
        kube.wait_pod_phase("whole", namespace)
        assert allocated_devices(pod_claim(kube, namespace, "whole")) == [first["name"]]
        gpu_pod(kube, namespace, "gpu", "gpu")
        if kubernetes_version().startswith("v1.34."):
            with pytest.raises(WaitTimeoutError, match="cannot allocate all claims"):
                kube.wait_pod_phase("gpu", namespace, timeout=20)
            assert "kubernetes/kubernetes#133705" in driver.log_path.read_text()
        else:
            kube.wait_pod_phase("gpu", namespace, timeout=30)
            assert allocated_devices(pod_claim(kube, namespace, "gpu")) == ["gpu-0"]
    finally:
        delete_pods_and_wait(kube, cluster, namespace, [])
