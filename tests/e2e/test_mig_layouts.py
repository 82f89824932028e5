"""Static MIG layouts on the local cluster: the Node's nvidia.com/mig.config label picks a layout of
--mig-config-file, the kubelet plugin partitions the fake GPUs at start and publishes the MIG devices,
a claim gets one, and a restart keeps the claim's instance.

Two fake H100s with MIG mode off; the layout turns MIG on for GPU 0 only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from localcluster.cluster import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claims_pod,
    delete_pods_and_wait,
    ensure_device_classes,
    pod_claims,
    published_devices,
)

TWO_H100 = {"gpus": [{"model": "h100-sxm5-80gb", "count": 2}]}
LABEL = "nvidia.com/mig.config"
LAYOUTS = {
    "version": "v1",
    "mig-configs": {
        "e2e-mixed": [
            {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
            {"devices": [1], "mig-enabled": False},
        ],
        "e2e-unused": [{"devices": "all", "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}],
    },
}


@pytest.fixture
def driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("mig-layouts")
    profile = workdir / "profile.yaml"
    profile.write_text(yaml.safe_dump(TWO_H100))
    layouts = workdir / "layouts.yaml"
    layouts.write_text(yaml.safe_dump(LAYOUTS))
    # The label wins over --mig-config, which serves nodes without it.
    kube.patch("v1", "Node", cluster.node_name, {"metadata": {"labels": {LABEL: "e2e-mixed"}}})
    process = DriverProcess(
        cluster,
        str(profile),
        workdir / "driver.log",
        extra_args=(f"--mig-config-file={layouts}", "--mig-config=e2e-unused"),
    )
    _fake_state(process).unlink(missing_ok=True)
    try:
        # Partitioning comes before the plugin serves: on a busy machine start-up takes longer.
        process.start(timeout=90)
        yield process
    finally:
        process.stop()
        kube.patch("v1", "Node", cluster.node_name, {"metadata": {"labels": {LABEL: None}}})
        _fake_state(process).unlink(missing_ok=True)


def _fake_state(driver: DriverProcess) -> Path:
    return driver.checkpoint.parent / "fake-gpu-mig.json"


def _instances(driver: DriverProcess) -> dict[int, list[tuple[str, int]]]:
    data = json.loads(_fake_state(driver).read_text())
    return {
        int(g): sorted((i["profile"], i["start"]) for i in found)
        for g, found in data["gpus"].items()
        if found
    }


def _published(kube: Kube, cluster: ClusterInfo) -> dict[str, str]:
    """Published device name -> its uuid attribute."""
    return {
        d["name"]: str((d.get("attributes") or {}).get("uuid", {}).get("string", ""))
        for d in published_devices(kube, cluster)
    }


def test_the_label_s_layout_is_applied_at_start_and_a_claim_gets_one_of_its_devices(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    assert _instances(driver) == {0: [("1g.10gb", 2), ("1g.10gb", 3), ("2g.20gb", 0), ("3g.40gb", 4)]}
    wait_for(
        "the layout's MIG devices to be published",
        lambda: any(n.startswith("gpu-0-mig-3g40gb-") for n in _published(kube, cluster)),
        timeout=30,
    )
    published = _published(kube, cluster)
    assert sorted(n.rsplit("-", 2)[0] for n in published if n.startswith("gpu-0-")) == [
        "gpu-0-mig-1g10gb",
        "gpu-0-mig-1g10gb",
        "gpu-0-mig-2g20gb",
        "gpu-0-mig-3g40gb",
    ]
    # GPU 1's entry keeps MIG off: published whole; GPU 0 is MIG devices only.
    assert "gpu-1" in published
    assert "gpu-0" not in published

    three_g = f'device.attributes["{DRIVER}"].profile == "3g.40gb"'
    request = {"deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {"expression": three_g}}]}
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "big", "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "mig", "exactly": request}]}}},
        }
    )
    claims_pod(kube, namespace, "big", {"gpus": "big"}, {"main": [{"name": "gpus"}]})
    kube.wait_pod_phase("big", namespace)
    claim = pod_claims(kube, namespace, "big")["gpus"]
    [device] = allocated_devices(claim)
    assert device.startswith("gpu-0-mig-3g40gb-")

    # A second start finds the layout in place: nothing is made again, the claim's device stays.
    driver.stop()
    driver.start(timeout=90)
    assert _published(kube, cluster) == published
    assert _instances(driver)[0] == [("1g.10gb", 2), ("1g.10gb", 3), ("2g.20gb", 0), ("3g.40gb", 4)]
    delete_pods_and_wait(kube, cluster, namespace, [claim])
