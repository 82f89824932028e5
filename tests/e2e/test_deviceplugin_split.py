"""One node, two paths: GPUs 0-1 through DRA, GPUs 2-3 through the device plugin, never both.

Profile `mixed`: gpu-0 and gpu-1 are L40S, gpu-2 and gpu-3 are T4. Both processes
get the same `--device-plugin-gpus=2,3` (as a DaemonSet's two containers would
get the same env), so DRA takes the rest. They share the GPU assignment record
in <kubelet root>/plugins/gpu.nvidia.com, which is how a third process that
would advertise a GPU already taken is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.driverprocess import DriverProcess, free_port
from localcluster.kube import Kube, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claim_template,
    container_record,
    delete_pods_and_wait,
    ensure_device_classes,
    gpu_limits_pod,
    gpu_pod,
    node_resources,
    pod_claim,
    published_devices,
    visible_devices,
)

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Gpu, Inventory

PROFILE = "mixed"
GPU = "nvidia.com/gpu"
KIND = "k8s.gpu.nvidia.com/device"
SPLIT = "--device-plugin-gpus=2,3"


@dataclass
class Node:
    """Both processes of the node and its GPUs."""

    dra: DriverProcess
    device_plugin: DevicePluginProcess
    gpus: list[Gpu]


@pytest.fixture(scope="module")
def node(cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """The kubelet-plugin with GPUs 0-1 and the device plugin with GPUs 2-3, both registered."""
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("split")
    inventory: Inventory = discover(FakeGpuLibrary(load_profile(PROFILE), cluster.node_name))
    dra = DriverProcess(cluster, PROFILE, workdir / "driver.log", extra_args=(SPLIT,)).start()
    try:
        device_plugin = DevicePluginProcess(cluster, PROFILE, workdir, (SPLIT,), with_driver=True).start()
        try:
            yield Node(dra, device_plugin, list(inventory.gpus))
        finally:
            assert device_plugin.stop() == 0, device_plugin.log_path.read_text()
    finally:
        assert dra.stop() == 0, dra.log_path.read_text()


def _slice_devices(kube: Kube, cluster: ClusterInfo) -> list[str]:
    return sorted(d["name"] for d in published_devices(kube, cluster))


def test_each_path_advertises_only_its_gpus(node: Node, kube: Kube, cluster: ClusterInfo) -> None:
    wait_for(
        "DRA slices with gpu-0 and gpu-1 only", lambda: _slice_devices(kube, cluster) == ["gpu-0", "gpu-1"]
    )
    wait_for(
        "allocatable nvidia.com/gpu: 2", lambda: node_resources(kube, cluster, "allocatable").get(GPU) == "2"
    )
    [listed] = [c for c in node.device_plugin.calls("ListAndWatch") if c["resource"] == GPU]
    assert [d["id"] for d in listed["devices"]] == [node.gpus[2].uuid, node.gpus[3].uuid]

    record = json.loads((Path(cluster.kubelet_root) / "plugins" / DRIVER / "gpu-assignment.json").read_text())
    assert [g["index"] for g in record["paths"]["dra"]["gpus"]] == [0, 1]
    assert [g["index"] for g in record["paths"]["device-plugin"]["gpus"]] == [2, 3]


def test_dra_and_device_plugin_pods_run_together_and_never_share_a_gpu(
    node: Node, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    claim_template(kube, namespace, "one-gpu", [])
    for name in ("dra-0", "dra-1", "dra-2"):
        gpu_pod(kube, namespace, name, "one-gpu")
    gpu_limits_pod(kube, namespace, "legacy", {GPU: 2})
    gpu_limits_pod(kube, namespace, "legacy-more", {GPU: 1})

    def running() -> list[str] | None:
        pods = kube.list_objects("v1", "Pod", namespace=namespace)
        names = sorted(p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running")
        return names if len(names) == 3 else None

    running_pods = wait_for("two DRA pods and the 2-GPU device-plugin pod running", running)
    assert "legacy" in running_pods
    dra_pods = [p for p in running_pods if p.startswith("dra-")]
    assert len(dra_pods) == 2

    claims = [pod_claim(kube, namespace, p) for p in dra_pods]
    assert sorted(d for c in claims for d in allocated_devices(c)) == ["gpu-0", "gpu-1"]
    names = {g.name: g.uuid for g in node.gpus}
    dra_uuids = [
        names[device]
        for p in dra_pods
        for device in visible_devices(container_record(cluster, namespace, p), names)
    ]
    legacy = container_record(cluster, namespace, "legacy")
    legacy_uuids = [name.split("=", 1)[1] for name in legacy["cdiDevices"]]
    assert all(name.startswith(f"{KIND}=") for name in legacy["cdiDevices"])
    assert sorted(dra_uuids) == sorted(g.uuid for g in node.gpus[:2])
    assert sorted(legacy_uuids) == sorted(g.uuid for g in node.gpus[2:])
    assert len(set(dra_uuids) | set(legacy_uuids)) == 4

    # What is left waits: no DRA GPU is free, and nvidia.com/gpu has none left either.
    pending = {
        p["metadata"]["name"]: p
        for p in kube.list_objects("v1", "Pod", namespace=namespace)
        if p["status"].get("phase") == "Pending"
    }
    assert len(pending) == 2
    assert "legacy-more" in pending
    delete_pods_and_wait(kube, cluster, namespace, claims)


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra", *args], capture_output=True, text=True, timeout=60)


def _device_plugin_args(cluster: ClusterInfo, *extra: str) -> list[str]:
    return [
        "device-plugin",
        f"--node-name={cluster.node_name}",
        f"--kubelet-root={cluster.kubelet_root}",
        f"--device-plugin-dir={cluster.device_plugin_dir}",
        f"--cdi-root={cluster.cdi_dir}",
        f"--fake-gpus={PROFILE}",
        f"--http-address=127.0.0.1:{free_port()}",
        *extra,
    ]


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, result.stderr
    [line] = [ln for ln in result.stderr.splitlines() if ln.startswith("dra-gpu: error:")]
    return line


def test_selectors_that_overlap_are_refused_naming_the_gpu(node: Node, cluster: ClusterInfo) -> None:
    result = _run(_device_plugin_args(cluster, "--dra-gpus=0,1", "--device-plugin-gpus=1,2"))
    line = _one_error_line(result)
    assert f"GPU 1 ({node.gpus[1].uuid}, NVIDIA L40S) is selected by both" in line
    assert "--dra-gpus=0,1" in line
    assert "--device-plugin-gpus=1,2" in line


def test_a_device_plugin_wanting_a_dra_gpu_is_refused(node: Node, cluster: ClusterInfo, kube: Kube) -> None:
    before = node_resources(kube, cluster, "allocatable")
    result = _run(_device_plugin_args(cluster, "--device-plugin-gpus=1,2,3"))
    line = _one_error_line(result)
    assert f"GPU 1 ({node.gpus[1].uuid}, NVIDIA L40S) is already advertised by the DRA kubelet-plugin" in line
    # The refused process touched nothing: the running plugin is still registered.
    assert node.device_plugin.ready()
    assert node_resources(kube, cluster, "allocatable") == before


def test_a_kubelet_plugin_wanting_every_gpu_is_refused(node: Node, cluster: ClusterInfo) -> None:
    result = _run(
        [
            "kubelet-plugin",
            f"--node-name={cluster.node_name}",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--kubelet-root={cluster.kubelet_root}",
            f"--cdi-root={cluster.cdi_dir}",
            f"--fake-gpus={PROFILE}",
            f"--http-address=127.0.0.1:{free_port()}",
        ]
    )
    line = _one_error_line(result)
    assert f"GPU 2 ({node.gpus[2].uuid}, Tesla T4) is already advertised by the device plugin" in line
    assert node.dra.ready()


def test_a_gpu_moved_from_dra_to_the_device_plugin_waits_for_its_prepared_claim(
    node: Node, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    claim_template(kube, namespace, "one-gpu", [])
    gpu_pod(kube, namespace, "holder", "one-gpu")
    kube.wait_pod_phase("holder", namespace)
    claim = pod_claim(kube, namespace, "holder")
    [device] = allocated_devices(claim)
    moved = next(g for g in node.gpus if g.name == device)
    name, uid = claim["metadata"]["name"], claim["metadata"]["uid"]
    split = f"--device-plugin-gpus={moved.index},2,3"
    workdir = node.dra.log_path.parent / "moved"
    workdir.mkdir()

    # As a helm upgrade that moves the GPU does: both containers restart, the pod still runs.
    assert node.device_plugin.stop() == 0
    assert node.dra.stop() == 0
    dra = DriverProcess(cluster, PROFILE, workdir / "driver.log", extra_args=(split,))
    device_plugin = DevicePluginProcess(cluster, PROFILE, workdir, (split,), with_driver=True)
    try:
        dra.start()
        assert (
            f"prepared ResourceClaim {namespace}/{name} (UID {uid}) uses {device} on GPU {moved.index} "
            f"({moved.uuid}, NVIDIA L40S), no longer assigned to DRA"
        ) in dra.log_path.read_text()
        line = _one_error_line(_run(_device_plugin_args(cluster, split)))
        assert (
            f"GPU {moved.index} ({moved.uuid}, NVIDIA L40S) is still used by "
            f"ResourceClaim {namespace}/{name} (UID {uid}), prepared for DRA on this node"
        ) in line
        assert "wait until the pods using it end, or drain the node" in line

        # The pod ends, the kubelet unprepares its claim through DRA: now the device plugin starts with it.
        delete_pods_and_wait(kube, cluster, namespace, [claim])
        device_plugin.start()
        wait_for(
            "allocatable nvidia.com/gpu: 3",
            lambda: node_resources(kube, cluster, "allocatable").get(GPU) == "3",
        )
        [listed] = [c for c in device_plugin.calls("ListAndWatch") if c["resource"] == GPU]
        assert moved.uuid in [d["id"] for d in listed["devices"]]
    finally:
        # Back to the module's split, with the same processes the fixture stops.
        assert device_plugin.stop() == 0, device_plugin.log_path.read_text()
        assert dra.stop() == 0, dra.log_path.read_text()
        node.dra.start()
        node.device_plugin.start()


def test_a_kubelet_restart_makes_both_paths_register_again(
    node: Node, local_cluster: LocalCluster, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    registered = "registered with the kubelet as DRA driver"
    dra_before = node.dra.log_path.read_text().count(registered)
    device_plugin_before = len(node.device_plugin.calls("Register"))
    assert node.dra.proc is not None
    assert node.device_plugin.proc is not None
    pids = (node.dra.proc.pid, node.device_plugin.proc.pid)

    local_cluster.restart_kubelet()

    wait_for(
        "the DRA kubelet-plugin to register again",
        lambda: node.dra.log_path.read_text().count(registered) > dra_before,
        timeout=60,
    )
    wait_for(
        "the device plugin to register again",
        lambda: len(node.device_plugin.calls("Register")) > device_plugin_before,
        timeout=30,
    )
    assert (node.dra.proc.pid, node.device_plugin.proc.pid) == pids, "neither process was restarted"
    assert node.dra.proc.poll() is None
    assert node.device_plugin.proc.poll() is None

    claim_template(kube, namespace, "after-restart", [])
    gpu_pod(kube, namespace, "dra-after-restart", "after-restart")
    gpu_limits_pod(kube, namespace, "legacy-after-restart", {GPU: 1})
    kube.wait_pod_phase("dra-after-restart", namespace)
    kube.wait_pod_phase("legacy-after-restart", namespace)
    delete_pods_and_wait(kube, cluster, namespace, [pod_claim(kube, namespace, "dra-after-restart")])
