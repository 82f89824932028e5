"""MPS on MIG devices end to end: a claim's MIG device served by an MPS daemon that sees it by UUID.

Profile `h100x8-mig`: GPUs 4-7 are in MIG mode with static MIG devices (3g.40gb, 2g.20gb,
2 x 1g.10gb each).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    container_record,
    delete_pods_and_wait,
    ensure_device_classes,
    gpu_pod,
    pod_claim,
)

from tests.unit.helpers import mps_ask

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    """The driver on h100x8-mig."""
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("mps-mig")
    process = DriverProcess(cluster, "h100x8-mig", workdir / "driver.log").start()
    yield process
    assert process.stop() == 0, process.log_path.read_text()


def _alive(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    except FileNotFoundError:
        return False


def test_a_mig_device_gets_an_mps_daemon_that_sees_it_by_uuid_and_goes_with_the_pod(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    parameters = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4Gi"}},
    }
    exactly = {
        "deviceClassName": "mig.nvidia.com",
        "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "1g.10gb"'}}],
    }
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "mig-mps", "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "mig", "exactly": exactly}],
                        "config": [{"opaque": {"driver": DRIVER, "parameters": parameters}}],
                    }
                }
            },
        }
    )
    gpu_pod(kube, namespace, "worker", "mig-mps")
    kube.wait_pod_phase("worker", namespace)
    claim = pod_claim(kube, namespace, "worker")
    [device] = allocated_devices(claim)
    record = container_record(cluster, namespace, "worker")
    uuid = record["env"][f"DRA_GPU_{device.upper().replace('-', '_')}_UUID"]
    assert uuid.startswith("MIG-")

    mounts = {m["containerPath"]: m["hostPath"] for m in record["mounts"]}
    daemon_dir = Path(mounts["/tmp/nvidia-mps"]).parent
    assert mounts["/dev/shm"] == str(daemon_dir / "shm")
    assert record["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    pid = int((daemon_dir / "pipe" / "nvidia-cuda-mps-control.pid").read_text())
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"CUDA_VISIBLE_DEVICES={uuid}".encode() in environ
    assert mps_ask(str(daemon_dir / "pipe"), "get_default_device_pinned_mem_limit 0") == "4G"

    delete_pods_and_wait(kube, cluster, namespace, [claim])
    wait_for("the MPS daemon to stop", lambda: not _alive(pid) and not daemon_dir.exists(), timeout=30)
