"""NVIDIA's device-plugin config file on the real kubelet: time-slicing replicas and MIG strategies.

Each test starts the device plugin alone on the node with its own fake GPUs
(a profile file) and config file, and stops it at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import delete_pods, gpu_limits_pod, node_resources

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from tests.unit.test_deviceplugin_config import TIME_SLICING

GPU = "nvidia.com/gpu"


@contextmanager
def plugin(
    cluster: ClusterInfo, workdir: Path, gpus: list[dict[str, Any]], config: str
) -> Iterator[DevicePluginProcess]:
    """The device plugin on a node with these fake GPUs, reading this config file."""
    profile = workdir / "gpus.json"
    profile.write_text(json.dumps({"gpus": gpus}))
    config_file = workdir / "config.yaml"
    config_file.write_text(config)
    process = DevicePluginProcess(cluster, str(profile), workdir, (f"--config-file={config_file}",)).start()
    try:
        yield process
    finally:
        assert process.stop() == 0, process.log_path.read_text()


def advertised(kube: Kube, cluster: ClusterInfo) -> dict[str, str]:
    """Allocatable resources with devices (a plugin that is gone leaves its resources at 0)."""
    return {k: v for k, v in node_resources(kube, cluster, "allocatable").items() if v != "0"}


def allocated(process: DevicePluginProcess, start: int, resource: str = GPU) -> list[list[str]]:
    """The device IDs of each Allocate call since `start` calls."""
    return [
        c["devices"]
        for c in process.calls()[start:]
        if c["event"] == "Allocate" and c["resource"] == resource and "error" not in c
    ]


def test_time_slicing_four_pods_share_one_gpu_and_a_fifth_waits(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    with plugin(cluster, tmp_path, [{"model": "h100-sxm5-80gb"}], TIME_SLICING) as process:
        wait_for("allocatable nvidia.com/gpu: 4", lambda: advertised(kube, cluster) == {GPU: "4"})
        [gpu] = discover(FakeGpuLibrary(load_profile(str(tmp_path / "gpus.json")), cluster.node_name))
        uuid = gpu.uuid
        start = len(process.calls())
        for n in range(4):
            gpu_limits_pod(kube, namespace, f"share-{n}", {GPU: 1})
        for n in range(4):
            kube.wait_pod_phase(f"share-{n}", namespace)
        ids = allocated(process, start)
        assert sorted(i for call in ids for i in call) == [f"{uuid}::{n}" for n in range(4)]

        gpu_limits_pod(kube, namespace, "fifth", {GPU: 1})
        event = wait_for(
            "FailedScheduling",
            lambda: next(
                (e for e in kube.events_for("Pod", "fifth", namespace) if e["reason"] == "FailedScheduling"),
                None,
            ),
        )
        assert f"Insufficient {GPU}" in event["message"]
        assert kube.get("v1", "Pod", "fifth", namespace)["status"]["phase"] == "Pending"
        delete_pods(kube, namespace)


def test_mig_strategy_single_offers_mig_devices_as_nvidia_com_gpu(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    gpus = [{"model": "a100-sxm4-40gb", "count": 2, "mig": ["3g.20gb", "3g.20gb"]}]
    with plugin(cluster, tmp_path, gpus, "version: v1\nflags:\n  migStrategy: single\n") as process:
        wait_for("allocatable nvidia.com/gpu: 4", lambda: advertised(kube, cluster) == {GPU: "4"})
        start = len(process.calls())
        gpu_limits_pod(kube, namespace, "mig-user", {GPU: 2})
        kube.wait_pod_phase("mig-user", namespace)
        [ids] = allocated(process, start)
        assert len(ids) == 2
        assert all(i.startswith("MIG-") for i in ids), ids
        delete_pods(kube, namespace)


def test_mig_strategy_single_on_a_mixed_layout_stops_with_one_error(
    cluster: ClusterInfo, tmp_path: Path
) -> None:
    profile = tmp_path / "gpus.json"
    profile.write_text(json.dumps({"gpus": [{"model": "a100-sxm4-40gb", "mig": ["3g.20gb", "2g.10gb"]}]}))
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: single\n")
    process = DevicePluginProcess(cluster, str(profile), tmp_path, (f"--config-file={config}",))
    with pytest.raises(RuntimeError) as raised:
        process.start()
    assert "device plugin exited with 1" in str(raised.value)
    errors = [line for line in process.log_path.read_text().splitlines() if "error" in line]
    assert errors == [
        "dra-gpu: error: MIG strategy single needs one MIG profile on the node, found 2 "
        "(2g.10gb on gpu-0; 3g.20gb on gpu-0); use the mixed strategy"
    ]


def test_mig_strategy_mixed_with_a_renamed_shared_mig_resource(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    gpus: list[dict[str, Any]] = [
        {"model": "h100-sxm5-80gb"},
        {"model": "h100-sxm5-80gb", "mig": ["3g.40gb", "1g.10gb", "1g.10gb"]},
    ]
    config = """\
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/mig-1g.10gb
      replicas: 2
"""
    with plugin(cluster, tmp_path, gpus, config) as process:
        expected = {GPU: "1", "nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb.shared": "4"}
        wait_for("the mixed resources", lambda: advertised(kube, cluster) == expected)
        start = len(process.calls())
        gpu_limits_pod(kube, namespace, "small", {"nvidia.com/mig-1g.10gb.shared": 1})
        kube.wait_pod_phase("small", namespace)
        [[replica]] = allocated(process, start, "nvidia.com/mig-1g.10gb.shared")
        assert replica.startswith("MIG-")
        assert replica.endswith(("::0", "::1"))

        # failRequestsGreaterThanOne: the kubelet fails a pod asking for two, with the plugin's reason.
        gpu_limits_pod(kube, namespace, "greedy", {"nvidia.com/mig-1g.10gb.shared": 2})
        pod = kube.wait_pod_phase("greedy", namespace, "Failed")
        assert pod["status"]["reason"] == "UnexpectedAdmissionError"
        assert "failRequestsGreaterThanOne allows 1 per container" in pod["status"]["message"]
        delete_pods(kube, namespace)
