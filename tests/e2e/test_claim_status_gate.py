"""A 1.34 API server with DRAResourceClaimDeviceStatus off drops status.devices without an error.

The gate is beta and on by default in 1.34 (GA and locked in 1.37, where this module is
skipped). With it off, a server-side apply of the entries answers 200 and stores nothing; the
driver learns it from that first answer, says so once, stops writing, and prepares as before.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from localcluster.binaries import kubernetes_version
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, wait_for
from localcluster.kubereleases import default_feature_gates, release
from localcluster.workloads import claim_template, ensure_device_classes, gpu_pod, pod_claim

from tests.skips import Lack, reason

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def gate_off() -> Iterator[ClusterInfo]:
    """A cluster of its own with the gate off (1.34 only)."""
    if release(kubernetes_version()) is not release("v1.34.0"):
        pytest.skip(
            reason(Lack.RELEASE, "DRAResourceClaimDeviceStatus is GA and cannot be turned off after 1.34")
        )
    cluster = LocalCluster(feature_gates=default_feature_gates() | {"DRAResourceClaimDeviceStatus": False})
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_driver_says_once_that_the_server_drops_status_and_prepares_as_before(
    gate_off: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> None:
    kube = Kube(gate_off.kubeconfig)
    workdir = tmp_path_factory.mktemp("gate-off")
    driver = DriverProcess(gate_off, "mixed", workdir / "driver.log").start()
    try:
        ensure_device_classes(kube)
        namespace = f"t-{uuid.uuid4().hex[:8]}"
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        wait_for(
            "default ServiceAccount", lambda: kube.get_or_none("v1", "ServiceAccount", "default", namespace)
        )
        claim_template(kube, namespace, "any", [])
        for pod in ("first", "second"):
            gpu_pod(kube, namespace, pod, "any")
            kube.wait_pod_phase(pod, namespace)
        warning = "does not keep ResourceClaim status.devices"
        wait_for("the driver's warning", lambda: warning in driver.log_path.read_text(), timeout=10)
        assert driver.log_path.read_text().count(warning) == 1
        assert not (pod_claim(kube, namespace, "second").get("status") or {}).get("devices")
    finally:
        driver.stop()
        kube.close()
