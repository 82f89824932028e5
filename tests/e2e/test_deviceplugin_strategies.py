"""What a container gets under each --device-list-strategy, as the real kubelet and the runtime pass it on.

(`cdi-cri`, the default, is tested in test_deviceplugin.py.) Profile `mixed`,
the device plugin alone on the node.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.kube import Kube
from localcluster.workloads import container_record, delete_pods, gpu_limits_pod

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover

KIND = "k8s.gpu.nvidia.com/device"


@pytest.fixture(scope="module", params=["cdi-annotations", "envvar", "cdi-cri,envvar"])
def device_plugin(
    request: pytest.FixtureRequest, cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevicePluginProcess]:
    """The device plugin with one strategy (a fresh process per strategy)."""
    strategy = str(request.param)
    process = DevicePluginProcess(
        cluster, "mixed", tmp_path_factory.mktemp("strategy"), (f"--device-list-strategy={strategy}",)
    ).start()
    yield process
    assert process.stop() == 0, process.log_path.read_text()


def test_container_gets_exactly_the_allocated_gpus(
    device_plugin: DevicePluginProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    strategy = next(a for a in device_plugin.extra_args if a.startswith("--device-list-strategy="))
    strategies = set(strategy.split("=", 1)[1].split(","))
    names = {d.uuid: d.name for d in discover(FakeGpuLibrary(load_profile("mixed"), cluster.node_name))}
    start = len(device_plugin.calls())
    gpu_limits_pod(kube, namespace, "worker", {"nvidia.com/gpu": 2}, sidecar=True)
    kube.wait_pod_phase("worker", namespace)
    [allocated] = [c for c in device_plugin.calls()[start:] if c["event"] == "Allocate"]
    uuids = allocated["devices"]
    cdi_names = sorted(f"{KIND}={u}" for u in uuids)
    record = container_record(cluster, namespace, "worker")
    annotations = {k: v for k, v in record["annotations"].items() if k.startswith("cdi.k8s.io/")}

    if "envvar" in strategies:
        assert record["env"]["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    else:
        assert record["env"]["NVIDIA_VISIBLE_DEVICES"] == "none"
    if strategies & {"cdi-cri", "cdi-annotations"}:
        # The runtime resolved the CDI names (from the CRI field or the annotation) against the spec.
        assert sorted(record["cdiDevices"]) == cdi_names
        for uuid in uuids:
            assert record["env"][f"DRA_GPU_{names[uuid].upper().replace('-', '_')}_UUID"] == uuid
    else:
        assert record["cdiDevices"] == []
        assert not any(k.startswith("DRA_GPU_") for k in record["env"])
    if "cdi-annotations" in strategies:
        [(key, value)] = annotations.items()
        assert len(key.removeprefix("cdi.k8s.io/")) <= 63
        assert sorted(value.split(",")) == cdi_names
    else:
        assert annotations == {}

    sidecar = container_record(cluster, namespace, "worker", "sidecar")
    assert "NVIDIA_VISIBLE_DEVICES" not in sidecar["env"]
    assert sidecar["cdiDevices"] == []
    delete_pods(kube, namespace)
