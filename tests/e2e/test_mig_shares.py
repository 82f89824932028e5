"""Shares of a static MIG device end to end: NVIDIA's --consumable-shares=2 on h100x8-mig.

The flag makes every full GPU and static MIG device shareable, in two equal shares. Two claims
asking MPS on one MIG device (the 2g.20gb of gpu-4) each get one share: both pods run, their
claims hold different shares of the same device, and each container's MPS client is limited to
half the device's SMs and memory. A third share of the device waits until one is freed: 1.34's
allocator checks the candidate's own capacity before it picks it (its wrong second check, against
the slice's first device, docs/sharing.md, finds gpu-0 free here), so it does on both releases.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, WaitTimeoutError
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    container_record,
    delete_pods_and_wait,
    ensure_device_classes,
    gpu_pod,
    pod_claim,
)

from tests.unit.helpers import inventory

pytestmark = pytest.mark.cluster

MIG = "gpu-4-mig-2g20gb-2-0"
MPS = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}


@pytest.fixture(scope="module")
def driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    """The driver on h100x8-mig started as NVIDIA's docs start theirs, with two shares per device."""
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("mig-shares")
    process = DriverProcess(
        cluster, "h100x8-mig", workdir / "driver.log", extra_args=("--consumable-shares=2",)
    ).start()
    yield process
    assert process.stop() == 0, process.log_path.read_text()


def _template(kube: Kube, namespace: str) -> None:
    """Claims for a share of the one MIG device, through MPS."""
    attributes = f'device.attributes["{DRIVER}"]'
    selector = f'{attributes}.parentIndex == 4 && {attributes}.profile == "2g.20gb"'
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "mig-share", "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "mig",
                                "exactly": {
                                    "deviceClassName": "mig.nvidia.com",
                                    "selectors": [{"cel": {"expression": selector}}],
                                },
                            }
                        ],
                        "config": [{"opaque": {"driver": DRIVER, "parameters": MPS}}],
                    }
                }
            },
        }
    )


def _result(claim: Obj) -> Obj:
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


def _two_shares(kube: Kube, namespace: str) -> dict[str, Obj]:
    _template(kube, namespace)
    # One at a time: the scheduler may count a share it has just allocated twice (docs/sharing.md).
    for name in ("a", "b"):
        gpu_pod(kube, namespace, name, "mig-share")
        kube.wait_pod_phase(name, namespace)
    return {name: pod_claim(kube, namespace, name) for name in ("a", "b")}


def test_two_claims_share_a_mig_device_each_limited_to_its_half_through_mps(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    try:
        claims = _two_shares(kube, namespace)
        assert {allocated_devices(c)[0] for c in claims.values()} == {MIG}
        assert len({_result(c)["shareID"] for c in claims.values()}) == 2
        assert {_result(c)["consumedCapacity"]["shares"] for c in claims.values()} == {"1"}
        half = inventory("h100x8-mig").get(MIG).memory_bytes // 2 // 1024**2  # type: ignore[union-attr]
        for name, claim in claims.items():
            env = container_record(cluster, namespace, name)["env"]
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={half}M"
            assert env["DRA_GPU_SHARE_ID"] == _result(claim)["shareID"]
    finally:
        delete_pods_and_wait(kube, cluster, namespace, [])


def test_a_third_share_of_a_two_share_mig_device_waits_for_a_free_one(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    try:
        _two_shares(kube, namespace)
        gpu_pod(kube, namespace, "c", "mig-share")
        with pytest.raises(WaitTimeoutError, match="cannot allocate all claims"):
            kube.wait_pod_phase("c", namespace, timeout=15)
        kube.delete("v1", "Pod", "a", namespace, grace_period=0)
        kube.wait_pod_phase("c", namespace, timeout=90)
        assert allocated_devices(pod_claim(kube, namespace, "c")) == [MIG]
    finally:
        delete_pods_and_wait(kube, cluster, namespace, [])
