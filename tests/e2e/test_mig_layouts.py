"""Static MIG layouts on the local cluster: the Node's nvidia.com/mig.config label picks a layout of
--mig-config-file, the kubelet plugin partitions the fake GPUs at start and publishes the MIG devices,
a claim gets one, and a restart keeps the claim's instance; a new label value is applied while the
driver runs, and a kill in the middle of that is repaired by the next start. The Node's
nvidia.com/mig.config.state label says how it went; under the chart's identity and policy the driver
may set that label on its own Node and no other label, nor on another Node.

Two fake H100s with MIG mode off; the layout turns MIG on for GPU 0 only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from localcluster.clusterinfo import ClusterInfo
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

from tests.e2e.test_node_labels import _labels, _refusal, _refused, _set, chart_identity

TWO_H100 = {"gpus": [{"model": "h100-sxm5-80gb", "count": 2}]}
LABEL = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
#: GPU 0's instances under e2e-sevens: (profile, start) of seven 1g.10gb.
SEVENS = {0: [("1g.10gb", s) for s in range(7)]}
LAYOUTS = {
    "version": "v1",
    "mig-configs": {
        "e2e-mixed": [
            {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
            {"devices": [1], "mig-enabled": False},
        ],
        "e2e-unused": [{"devices": "all", "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}],
        "e2e-sevens": [
            {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
            {"devices": [1], "mig-enabled": False},
        ],
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
        kube.patch("v1", "Node", cluster.node_name, {"metadata": {"labels": {LABEL: None, STATE: None}}})
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


def _sevens_published(kube: Kube, cluster: ClusterInfo) -> bool:
    """Whether GPU 0's published devices are e2e-sevens': seven 1g.10gb."""
    return (
        sorted(n.rsplit("-", 2)[0] for n in _published(kube, cluster) if n.startswith("gpu-0-"))
        == ["gpu-0-mig-1g10gb"] * 7
    )


def test_the_label_s_layout_is_applied_at_start_and_a_claim_gets_one_of_its_devices(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    assert _instances(driver) == {0: [("1g.10gb", 2), ("1g.10gb", 3), ("2g.20gb", 0), ("3g.40gb", 4)]}
    assert _labels(kube, cluster.node_name)[STATE] == "success"
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


def test_a_new_label_value_is_applied_while_the_driver_runs(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo
) -> None:
    assert driver.proc is not None
    pid = driver.proc.pid
    kube.patch("v1", "Node", cluster.node_name, _set(LABEL, "e2e-sevens"))
    wait_for(
        "the new layout's devices to be published",
        lambda: _sevens_published(kube, cluster),
        timeout=30,
    )
    assert _instances(driver) == SEVENS
    wait_for("the state label to say success", lambda: _labels(kube, cluster.node_name)[STATE] == "success")

    # A name the file does not have: failed; the GPUs and what is published stay; the driver serves on.
    published = _published(kube, cluster)
    kube.patch("v1", "Node", cluster.node_name, _set(LABEL, "e2e-missing"))
    wait_for("the state label to say failed", lambda: _labels(kube, cluster.node_name)[STATE] == "failed")
    assert _instances(driver) == SEVENS
    assert _published(kube, cluster) == published
    assert driver.ready()
    assert driver.proc.pid == pid


def _complete(driver: DriverProcess) -> bool:
    """Whether every GPU instance on the fake GPUs has its compute instance."""
    data = json.loads(_fake_state(driver).read_text())
    return all(i["compute_instances"] for found in data["gpus"].values() for i in found)


# Counted from the relabel e2e-mixed -> e2e-sevens on GPU 0 (two instances destroyed, five made):
# after the first destroy, between a GPU instance and its compute instance, after the last one.
@pytest.mark.parametrize(
    "arm",
    ["miglayout.destroyed:1", "miglayout.gpu-instance-created:2", "miglayout.compute-instance-created:5"],
)
def test_a_kill_during_a_relayout_is_repaired_at_the_next_start(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, arm: str
) -> None:
    # Restarted with the point armed: the start finds e2e-mixed in place and makes nothing.
    driver.stop()
    driver.env = {"DRA_GPU_FAULT_POINT": arm}
    driver.start(timeout=90)
    assert driver.proc is not None
    kube.patch("v1", "Node", cluster.node_name, _set(LABEL, "e2e-sevens"))
    assert driver.proc.wait(30) == 137, driver.log_path.read_text()[-3000:]
    assert f"fault point {arm.split(':')[0]}: exiting" in driver.log_path.read_text()
    assert _labels(kube, cluster.node_name)[STATE] == "pending"

    driver.env = {}
    driver.start(timeout=90)
    assert _instances(driver) == SEVENS
    assert _complete(driver)
    assert _labels(kube, cluster.node_name)[STATE] == "success"
    wait_for(
        "the layout's devices to be published",
        lambda: _sevens_published(kube, cluster),
    )


STATE_DRIVER = "gpu.mig-state-test.dra-gpu.test"
OTHER_NODE = "gpu-node-mig-state-elsewhere"


def test_the_chart_s_identity_sets_the_state_label_of_its_own_node_and_nothing_else(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """mig.configs without the node labeller: RBAC's patch of Nodes, narrowed by the policy to one label."""
    work = tmp_path_factory.mktemp("mig-state")
    values = {
        "driverName": STATE_DRIVER,
        "deviceClasses": {"enabled": False},
        "mig": {"configs": LAYOUTS["mig-configs"]},
    }
    profile = work / "profile.yaml"
    profile.write_text(yaml.safe_dump(TWO_H100))
    layouts = work / "layouts.yaml"
    layouts.write_text(yaml.safe_dump(LAYOUTS))
    with chart_identity(kube, cluster, values, "mig-state-test", work, OTHER_NODE, STATE) as identity:
        client = identity.client
        driver: DriverProcess | None = None
        try:
            kube.patch("v1", "Node", cluster.node_name, _set(LABEL, "e2e-mixed"))
            driver = DriverProcess(
                cluster,
                str(profile),
                work / "driver.log",
                driver_name=STATE_DRIVER,
                kubeconfig=str(identity.kubeconfig),
                extra_args=(f"--mig-config-file={layouts}",),
            )
            _fake_state(driver).unlink(missing_ok=True)
            driver.start(timeout=90)
            assert _labels(kube, cluster.node_name)[STATE] == "success"
            # It watches its Node too: a new label value is applied.
            kube.patch("v1", "Node", cluster.node_name, _set(LABEL, "e2e-sevens"))
            wait_for(
                "the new layout to be applied",
                lambda: _instances(driver) == SEVENS and _labels(kube, cluster.node_name)[STATE] == "success",
            )
            assert "cannot set" not in driver.log_path.read_text()
            assert "watching Node" not in driver.log_path.read_text()

            message = _refusal(
                lambda: client.patch("v1", "Node", cluster.node_name, _set("nvidia.com/gpu.count", "9"))
            )
            assert "may change only the label nvidia.com/mig.config.state" in message
            assert _refused(lambda: client.patch("v1", "Node", cluster.node_name, _set(LABEL, "e2e-unused")))
            assert _refused(lambda: client.patch("v1", "Node", OTHER_NODE, _set(STATE, "failed")))
        finally:
            if driver is not None:
                driver.stop()
                _fake_state(driver).unlink(missing_ok=True)
            kube.patch("v1", "Node", cluster.node_name, {"metadata": {"labels": {LABEL: None, STATE: None}}})
            for item in kube.list_objects(
                "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={STATE_DRIVER}"
            ):
                kube.delete("resource.k8s.io/v1", "ResourceSlice", item["metadata"]["name"])
