"""The local cluster is real Kubernetes: slices, CEL, the scheduler and the kubelet.

These tests use a hand-written ResourceSlice and a stub DRA plugin process, not
the driver, so they prove the harness on its own.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.dynamic.exceptions import UnprocessibleEntityError
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.kube import Kube, Obj, wait_for

from tests import stubplugin

DRIVER = "stub.dra-gpu.test"


def _device(name: str, model: str, index: int, firmware: str, memory: str) -> Obj:
    return {
        "name": name,
        "attributes": {
            "model": {"string": model},
            "index": {"int": index},
            "firmware": {"version": firmware},
        },
        "capacity": {"memory": {"value": memory}},
    }


@pytest.fixture(scope="module")
def stub_plugin(cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The stub plugin, running as a process and registered with the kubelet."""
    with stubplugin.running(
        DRIVER, Path(cluster.kubelet_root), tmp_path_factory.mktemp("stub") / "events.jsonl"
    ) as events:
        yield events


@pytest.fixture(scope="module")
def stub_slice(cluster: ClusterInfo, kube: Kube) -> Iterator[Obj]:
    """Three devices with string, int and version attributes and a memory capacity."""
    slice_obj = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{cluster.node_name}-stub"},
            "spec": {
                "driver": DRIVER,
                "nodeName": cluster.node_name,
                "pool": {"name": cluster.node_name, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    _device("dev-0", "alpha", 0, "1.2.0", "16Gi"),
                    _device("dev-1", "beta", 1, "2.0.0", "40Gi"),
                    _device("dev-2", "gamma", 2, "3.1.0", "80Gi"),
                ],
            },
        }
    )
    yield slice_obj
    kube.delete("resource.k8s.io/v1", "ResourceSlice", slice_obj["metadata"]["name"])


def _device_class(kube: Kube, expression: str) -> str:
    name = f"stub-{uuid.uuid4().hex[:6]}"
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }
    )
    return name


def _pod_with_claim(kube: Kube, namespace: str, device_class: str, selector: str) -> str:
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-device", "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "dev",
                                "exactly": {
                                    "deviceClassName": device_class,
                                    "selectors": [{"cel": {"expression": selector}}],
                                },
                            }
                        ]
                    }
                }
            },
        }
    )
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "consumer", "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "one-device"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "dev"}]},
                    }
                ],
            },
        }
    )
    return "consumer"


def test_kubelet_registers_a_plugin_process(stub_plugin: Path) -> None:
    events = stubplugin.events(stub_plugin)
    assert any(e["event"] == "GetInfo" for e in events)
    assert {"event": "NotifyRegistrationStatus", "registered": True, "error": ""} in events


def test_scheduler_allocates_by_cel_and_pod_runs(
    kube: Kube, namespace: str, stub_slice: Obj, stub_plugin: Path
) -> None:
    device_class = _device_class(kube, f'device.driver == "{DRIVER}"')
    try:
        selector = (
            f'device.attributes["{DRIVER}"].firmware.isGreaterThan(semver("1.5.0")) && '
            f'device.capacity["{DRIVER}"].memory.compareTo(quantity("64Gi")) < 0 && '
            f'device.attributes["{DRIVER}"].model.startsWith("b") && device.attributes["{DRIVER}"].index == 1'
        )
        pod = _pod_with_claim(kube, namespace, device_class, selector)
        running = kube.wait_pod_phase(pod, namespace, "Running")
        claim_name = running["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = kube.get("resource.k8s.io/v1", "ResourceClaim", claim_name, namespace)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"], r["device"]) for r in results] == [
            (DRIVER, stub_slice["spec"]["pool"]["name"], "dev-1")
        ]
        assert any(
            e["event"] == "NodePrepareResources" and f"{namespace}/{claim_name}" in e["claims"]
            for e in stubplugin.events(stub_plugin)
        )
    finally:
        kube.delete("resource.k8s.io/v1", "DeviceClass", device_class)


def test_selector_matching_nothing_leaves_pod_pending(
    kube: Kube, namespace: str, stub_slice: Obj, stub_plugin: Path
) -> None:
    device_class = _device_class(kube, f'device.driver == "{DRIVER}"')
    try:
        pod = _pod_with_claim(
            kube, namespace, device_class, f'device.attributes["{DRIVER}"].model == "omega"'
        )
        event = wait_for(
            "a FailedScheduling event",
            lambda: next(
                (e for e in kube.events_for("Pod", pod, namespace) if e["reason"] == "FailedScheduling"), None
            ),
        )
        assert "cannot allocate all claims" in event["message"]
        assert kube.get("v1", "Pod", pod, namespace)["status"]["phase"] == "Pending"
    finally:
        kube.delete("resource.k8s.io/v1", "DeviceClass", device_class)


def test_invalid_cel_is_rejected_with_the_compile_error(kube: Kube) -> None:
    with pytest.raises(UnprocessibleEntityError) as raised:
        _device_class(kube, 'device.attributes["x"].model ==')
    body = json.loads(raised.value.body)
    assert "compilation failed" in body["message"]
    assert "Syntax error" in body["message"]


def test_a_second_cluster_stops_without_a_trace() -> None:
    """After stop() no process, mount, socket or file of the run remains (start time is printed)."""
    run_dir = Path(tempfile.mkdtemp(prefix="dra-gpu-", dir="/tmp"))
    cluster = LocalCluster(run_dir=run_dir)
    started = time.monotonic()
    info = cluster.start()
    elapsed = time.monotonic() - started
    try:
        client = Kube(info.kubeconfig)
        assert client.get("v1", "Node", info.node_name)["status"]["conditions"]
        client.close()
        pids = dict(info.pids)
    finally:
        cluster.stop()
    print(f"second cluster Ready in {elapsed:.1f}s")
    for name, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) is still running"
    assert not run_dir.exists()
    assert str(run_dir) not in Path("/proc/mounts").read_text()
