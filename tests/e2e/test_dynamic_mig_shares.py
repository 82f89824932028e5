"""Shares of a dynamic-MIG offer on the local cluster: one MIG device, made by the first share and
destroyed by the last.

Two fake H100s in MIG mode with no instance, --mig-mode=dynamic and NVIDIA's
--consumable-shares=2. Two claims for the 3g.40gb offer at memory slice 4 of gpu-0 each get a
share of it: the scheduler charges the GPU's counters once (1.37), the driver makes the MIG device
for the first and gives the second the same one; it outlives the first pod and goes with the
second. Offers are shared from Kubernetes 1.37 (docs/sharing.md), so this runs on 1.37 only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from localcluster.binaries import kubernetes_version
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    delete_pods_and_wait,
    ensure_device_classes,
    gpu_pod,
    pod_claim,
)

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import parse_profile
from tests.skips import Lack, reason

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        kubernetes_version().startswith("v1.34."),
        reason=reason(
            Lack.RELEASE,
            "dynamic-MIG offers are shared from 1.37: 1.34.12's allocator charges a shared device's "
            "counters at each allocation and forgets them once allocated",
        ),
    ),
]

TWO_H100 = {"gpus": [{"model": "h100-sxm5-80gb", "count": 2, "mig": []}]}
ATTRIBUTES = f'device.attributes["{DRIVER}"]'


def _offer(cluster: ClusterInfo) -> str:
    """GPU 0's 3g.40gb offer at memory slice 4: its parent by UUID (offers carry no parentIndex)."""
    fake = FakeGpuLibrary(parse_profile(TWO_H100, "two-h100"), cluster.node_name)
    gpu0 = fake.uuid(fake.device_by_index(0))
    return (
        f'{ATTRIBUTES}.parentUUID == "{gpu0}" && {ATTRIBUTES}.profile == "3g.40gb" '
        f"&& {ATTRIBUTES}.placementStart == 4"
    )


@pytest.fixture(scope="module")
def driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    """The driver with dynamic MIG and two shares per device."""
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("dynamic-mig-shares")
    profile = workdir / "profile.yaml"
    profile.write_text(yaml.safe_dump(TWO_H100))
    args = ("--mig-mode=dynamic", "--consumable-shares=2")
    process = DriverProcess(cluster, str(profile), workdir / "driver.log", extra_args=args)
    _fake_state(process).unlink(missing_ok=True)
    process.start()
    yield process
    assert process.stop() == 0, process.log_path.read_text()


def _fake_state(driver: DriverProcess) -> Path:
    return driver.checkpoint.parent / "fake-gpu-mig.json"


def _instances(driver: DriverProcess) -> list[tuple[int, str, int, int]]:
    """What the fake GPUs hold: (GPU, profile, placement start, size) of each GPU instance."""
    path = _fake_state(driver)
    data = json.loads(path.read_text()) if path.exists() else {"gpus": {}}
    return sorted(
        (int(gpu), i["profile"], i["start"], i["size"]) for gpu, found in data["gpus"].items() for i in found
    )


def _made(driver: DriverProcess, claim: Obj) -> str:
    """The UUID of the MIG device the driver recorded for the claim."""
    [device] = driver.checkpointed()[claim["metadata"]["uid"]]["devices"]
    return str(device["uuid"])


def test_two_shares_of_an_offer_use_one_mig_device_that_outlives_the_first(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    exactly = {"deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": _offer(cluster)}}]}
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "offer-share", "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}}},
        }
    )
    try:
        # One at a time: the scheduler may count a share it has just allocated twice (docs/sharing.md).
        claims = {}
        for name in ("a", "b"):
            gpu_pod(kube, namespace, name, "offer-share")
            kube.wait_pod_phase(name, namespace, timeout=60)
            claims[name] = pod_claim(kube, namespace, name)
        [offer] = {allocated_devices(c)[0] for c in claims.values()}
        assert _instances(driver) == [(0, "3g.40gb", 4, 4)]
        made = _made(driver, claims["a"])
        assert made.startswith("MIG-")
        assert _made(driver, claims["b"]) == made

        kube.delete("v1", "Pod", "a", namespace, grace_period=0)
        wait_for(
            "the first share unprepared", lambda: claims["a"]["metadata"]["uid"] not in driver.checkpointed()
        )
        assert _instances(driver) == [(0, "3g.40gb", 4, 4)]
        assert kube.get("v1", "Pod", "b", namespace)["status"]["phase"] == "Running"
        delete_pods_and_wait(kube, cluster, namespace, [claims["b"]])
        wait_for("the MIG device to go with the last share", lambda: not _instances(driver), timeout=30)
        assert offer.startswith("gpu-0-mig-3g40gb")
    finally:
        delete_pods_and_wait(kube, cluster, namespace, [])
