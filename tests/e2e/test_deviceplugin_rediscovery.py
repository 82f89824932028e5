"""The device plugin follows devices that change under it, on the real kubelet, without a restart.

The plugin runs on a profile file it re-reads every half second, as it would
re-read NVML: a new MIG layout changes the MIG resources, and a GPU that
vanishes leaves allocatable until it comes back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcluster.clusterinfo import ClusterInfo
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import delete_pods, gpu_limits_pod, node_resources

SEVEN_SMALL = {"model": "a100-sxm4-40gb", "mig": ["1g.5gb"] * 7}
TWO_LARGE = {"model": "a100-sxm4-40gb", "mig": ["3g.20gb", "4g.20gb"]}
T4 = {"model": "t4"}


def _write(path: Path, *gpus: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump({"gpus": list(gpus)}))


def advertised(kube: Kube, cluster: ClusterInfo) -> dict[str, str]:
    """Allocatable resources with devices (a resource no longer served drops to 0)."""
    return {k: v for k, v in node_resources(kube, cluster, "allocatable").items() if v != "0"}


@pytest.fixture(scope="module")
def profile_and_plugin(
    cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, DevicePluginProcess]]:
    """The device plugin alone on the node, on a profile file, re-discovering every 0.5 s."""
    workdir = tmp_path_factory.mktemp("dp-rediscovery")
    profile = workdir / "profile.yaml"
    _write(profile, SEVEN_SMALL, T4)
    process = DevicePluginProcess(cluster, str(profile), workdir, ("--rediscover-interval=0.5",)).start()
    yield profile, process
    assert process.stop() == 0, process.log_path.read_text()


def test_a_new_mig_layout_changes_the_mig_resources_and_pods_get_the_new_devices(
    profile_and_plugin: tuple[Path, DevicePluginProcess], kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    profile, process = profile_and_plugin
    first = {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.5gb": "7"}
    wait_for(f"allocatable {first}", lambda: advertised(kube, cluster) == first, timeout=60)

    _write(profile, TWO_LARGE, T4)
    second = {"nvidia.com/gpu": "1", "nvidia.com/mig-3g.20gb": "1", "nvidia.com/mig-4g.20gb": "1"}
    wait_for(f"allocatable {second}", lambda: advertised(kube, cluster) == second, timeout=60)
    registered = {c["resource"] for c in process.calls("Register")}
    assert {"nvidia.com/mig-3g.20gb", "nvidia.com/mig-4g.20gb"} <= registered

    start = len(process.calls())
    gpu_limits_pod(kube, namespace, "large", {"nvidia.com/mig-4g.20gb": 1})
    kube.wait_pod_phase("large", namespace)
    [allocate] = [c for c in process.calls()[start:] if c["event"] == "Allocate"]
    assert allocate["resource"] == "nvidia.com/mig-4g.20gb"
    assert allocate["devices"][0].startswith("MIG-")
    delete_pods(kube, namespace)


def test_a_vanished_gpu_leaves_allocatable_and_comes_back(
    profile_and_plugin: tuple[Path, DevicePluginProcess], kube: Kube, cluster: ClusterInfo
) -> None:
    profile, process = profile_and_plugin
    _write(profile, TWO_LARGE, T4)
    wait_for("the T4 offered", lambda: advertised(kube, cluster).get("nvidia.com/gpu") == "1", timeout=60)

    _write(profile, TWO_LARGE)
    wait_for("the T4 to leave", lambda: "nvidia.com/gpu" not in advertised(kube, cluster), timeout=60)

    _write(profile, TWO_LARGE, T4, T4)
    wait_for("the T4 back", lambda: advertised(kube, cluster).get("nvidia.com/gpu") == "1", timeout=60)
    wait_for(
        "the plugin to report the GPU it was not given",
        lambda: "restart the driver to assign it" in process.log_path.read_text(),
    )
    assert advertised(kube, cluster)["nvidia.com/gpu"] == "1"
