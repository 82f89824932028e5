"""A node moves from the device plugin to DRA without a drain (docs/migration.md, issue 11).

The device plugin serves all 8 fake H100s; a pod gets one as `nvidia.com/gpu`.
Then the node switches paths: the device plugin stops, the kubelet plugin takes
every GPU. The pod keeps running on its GPU, so the driver asks the kubelet's
pod-resources service and does not publish that GPU until the pod ends; the
scheduler can never hand it out a second time.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import (
    delete_pods,
    ensure_device_classes,
    gpu_limits_pod,
    published_devices,
)

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.podresources import SOCKET, list_devices

pytestmark = pytest.mark.cluster

PROFILE = "h100x8"


def _published(kube: Kube, cluster: ClusterInfo) -> set[str]:
    return {d["attributes"]["uuid"]["string"] for d in published_devices(kube, cluster)}


def test_a_gpu_a_device_plugin_pod_still_uses_joins_dra_when_the_pod_ends(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    ensure_device_classes(kube)
    uuids = {gpu.uuid for gpu in discover(FakeGpuLibrary(load_profile(PROFILE), cluster.node_name)).gpus}
    device_plugin = DevicePluginProcess(cluster, PROFILE, tmp_path, with_driver=True).start()
    try:
        gpu_limits_pod(kube, namespace, "legacy", {"nvidia.com/gpu": 1})
        kube.wait_pod_phase("legacy", namespace)
    finally:
        assert device_plugin.stop() == 0, device_plugin.log_path.read_text()
    held = {
        device_id
        for holder, device_id in anyio.run(list_devices, Path(cluster.kubelet_root) / SOCKET)
        if (holder.namespace, holder.pod) == (namespace, "legacy")
    }
    assert len(held) == 1
    assert held <= uuids

    driver = DriverProcess(cluster, PROFILE, tmp_path / "driver.log", extra_args=("--rediscover-interval=1",))
    driver.start()
    try:
        wait_for("7 GPUs to be published", lambda: _published(kube, cluster) == uuids - held, timeout=30)
        assert (
            f"device-plugin container(s) {namespace}/legacy/main (nvidia.com/gpu)"
            in driver.log_path.read_text()
        )

        delete_pods(kube, namespace)
        wait_for("the 8th GPU to join DRA", lambda: _published(kube, cluster) == uuids, timeout=30)
        assert "is no longer used by a device-plugin container: publishing it" in driver.log_path.read_text()
    finally:
        assert driver.stop() == 0, driver.log_path.read_text()
