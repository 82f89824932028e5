"""Named configs on the real kubelet: the Node's label picks one, and a new label reconfigures in place.

The plugin reads a directory of configs (as a ConfigMap mounted as a
directory gives it) and watches its own Node through the API server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import node_resources

LABEL = "nvidia.com/device-plugin.config"
GPU = "nvidia.com/gpu"


def _time_slicing(replicas: int) -> str:
    return f"""\
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: {replicas}
"""


def _label(kube: Kube, cluster: ClusterInfo, value: str | None) -> None:
    kube.patch("v1", "Node", cluster.node_name, {"metadata": {"labels": {LABEL: value}}})


def advertised(kube: Kube, cluster: ClusterInfo) -> dict[str, str]:
    """Allocatable resources with devices."""
    return {k: v for k, v in node_resources(kube, cluster, "allocatable").items() if v != "0"}


@pytest.fixture
def plugin(cluster: ClusterInfo, kube: Kube, tmp_path: Path) -> Iterator[DevicePluginProcess]:
    """The device plugin on one fake H100, with configs `one`, `four` and `broken`, default `one`."""
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "one").write_text(_time_slicing(1))
    (configs / "four").write_text(_time_slicing(4))
    (configs / "broken").write_text(_time_slicing(4).replace("replicas: 4", "replicas: four"))
    profile = tmp_path / "gpus.json"
    profile.write_text(json.dumps({"gpus": [{"model": "h100-sxm5-80gb"}]}))
    _label(kube, cluster, None)
    process = DevicePluginProcess(
        cluster,
        str(profile),
        tmp_path,
        (f"--config-dir={configs}", "--config-default=one", f"--kubeconfig={cluster.kubeconfig}"),
    ).start()
    try:
        yield process
    finally:
        _label(kube, cluster, None)
        assert process.stop() == 0, process.log_path.read_text()


def test_a_label_change_reconfigures_and_a_bad_config_is_refused(
    plugin: DevicePluginProcess, kube: Kube, cluster: ClusterInfo
) -> None:
    wait_for("allocatable nvidia.com/gpu: 1 (the default)", lambda: advertised(kube, cluster) == {GPU: "1"})
    registrations = len(plugin.calls("Register"))

    _label(kube, cluster, "four")
    wait_for("allocatable nvidia.com/gpu: 4", lambda: advertised(kube, cluster) == {GPU: "4"})
    assert len(plugin.calls("Register")) == registrations, "the same registration serves the new replicas"
    assert plugin.proc is not None
    assert plugin.proc.poll() is None, "no restart"

    _label(kube, cluster, "broken")
    event = wait_for(
        "a Warning Event on the Node",
        lambda: next(
            (
                e
                for e in kube.events_for("Node", cluster.node_name, "default")
                if e["reason"] == "DevicePluginConfigRefused"
            ),
            None,
        ),
    )
    assert event["type"] == "Warning"
    assert "config broken" in event["message"]
    assert "replicas" in event["message"]
    assert "keeping config four" in event["message"]
    assert "ignored a new device-plugin config" in plugin.log_path.read_text()
    assert advertised(kube, cluster) == {GPU: "4"}

    _label(kube, cluster, "missing")
    wait_for(
        "the refusal of a config that does not exist",
        lambda: "names no config (have broken, four, one)" in plugin.log_path.read_text(),
    )
    _label(kube, cluster, None)
    wait_for("the default again", lambda: advertised(kube, cluster) == {GPU: "1"})
