"""The kubelet plugin on the local cluster as on a real node, over the fake NVML library.

The driver is given no fake GPUs: it loads libnvidia-ml.so.1 from its --driver-root, a fake
node's (fakenvml.node), and reads the node's sysfs in a mount namespace that shows the fake one,
so it reaches the GPUs through dra.gpu.nvml, pynvml and the C library as it would a real driver.
One run: a whole GPU, static MIG devices made beforehand, a dynamic MIG device made at prepare and
destroyed at unprepare, and an XID that makes a GPU unhealthy. What it publishes must be what the
fake alone publishes.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from fakenvml.node import FakeNode
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claim_template,
    delete_pods_and_wait,
    ensure_device_classes,
    gpu_pod,
    pod_claim,
    published_devices,
)

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import parse_profile
from dra.gpu.discovery import discover
from dra.model.migmode import parse_mig_modes

#: GPU 0 whole (MIG off), GPU 1 with static MIG devices, GPU 2 in MIG mode for dynamic MIG.
PROFILE = {
    "gpus": [
        {"model": "h100-sxm5-80gb"},
        {"model": "h100-sxm5-80gb", "mig": ["3g.40gb", "2g.20gb"]},
        {"model": "h100-sxm5-80gb", "mig": []},
    ]
}
MODES = "static,2=dynamic"


def _running(kube: Kube, namespace: str, pod: str) -> None:
    wait_for(
        f"pod {pod} running",
        lambda: kube.get("v1", "Pod", pod, namespace)["status"].get("phase") == "Running",
        timeout=60,
    )


def test_the_plugin_serves_whole_static_and_dynamic_mig_and_an_xid_through_the_fake_nvml_library(
    cluster: ClusterInfo, kube: Kube, namespace: str, tmp_path: Path
) -> None:
    ensure_device_classes(kube)
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    events = tmp_path / "xid-events"
    events.touch()
    node = FakeNode(tmp_path / "node", str(profile), cluster.node_name, events=events).build()
    driver = DriverProcess(cluster, node, tmp_path / "driver.log", extra_args=(f"--mig-mode={MODES}",))
    mig_state = driver.fake_mig_state
    driver.start()
    try:
        fake = FakeGpuLibrary(parse_profile(PROFILE, str(profile)), cluster.node_name)
        expected = discover(fake, parse_mig_modes(MODES))
        devices = {d.name for d in expected}
        wait_for(
            "the devices to be published",
            lambda: devices <= {d["name"] for d in published_devices(kube, cluster)},
            timeout=30,
        )
        # The rest are the dynamic GPU's partitions the default offer includes.
        offered = {d["name"] for d in published_devices(kube, cluster)} - devices
        assert offered
        assert offered <= {p.name for p in expected.partitions}
        uuids = {
            d["name"]: d["attributes"].get("uuid", {}).get("string") for d in published_devices(kube, cluster)
        }
        assert {n: u for n, u in uuids.items() if u} == {d.name: d.uuid for d in expected if d.uuid}

        whole_gpu, static_mig = (
            expected.gpus[0],
            next(d for d in expected.devices if d.name.startswith("gpu-1-mig")),
        )
        claim_template(
            kube, namespace, "whole", [f'device.attributes["{DRIVER}"].uuid == "{whole_gpu.uuid}"']
        )
        claim_template(
            kube,
            namespace,
            "static",
            [f'device.attributes["{DRIVER}"].uuid == "{static_mig.uuid}"'],
            device_class="mig.nvidia.com",
        )
        claim_template(
            kube,
            namespace,
            "dynamic",
            [
                f'device.attributes["{DRIVER}"].profile == "1g.10gb"',
                f'device.attributes["{DRIVER}"].parentUUID == "{expected.gpus[2].uuid}"',
            ],
            device_class="mig.nvidia.com",
        )
        for name in ("whole", "static", "dynamic"):
            gpu_pod(kube, namespace, name, name)
        for name in ("whole", "static", "dynamic"):
            _running(kube, namespace, name)
        claims = {name: pod_claim(kube, namespace, name) for name in ("whole", "static", "dynamic")}
        assert allocated_devices(claims["whole"]) == ["gpu-0"]
        assert allocated_devices(claims["static"]) == [static_mig.name]
        [partition] = allocated_devices(claims["dynamic"])
        made = json.loads(mig_state.read_text())["gpus"]["2"]
        assert [(i["profile"], i["compute_instances"]) for i in made] == [("1g.10gb", [0])]
        spec = Path(cluster.cdi_dir) / f"k8s.{DRIVER}-claim_{claims['dynamic']['metadata']['uid']}.json"
        assert "_UUID=MIG-" in spec.read_text()

        with open(events, "a") as f:
            f.write(f"{whole_gpu.uuid} 79\n")
        wait_for(
            "the XID to make gpu-0 unhealthy",
            lambda: "device gpu-0 is unhealthy: XID 79" in (tmp_path / "driver.log").read_text(),
            timeout=30,
        )

        delete_pods_and_wait(kube, cluster, namespace, list(claims.values()))
        wait_for(
            "the dynamic MIG device to be destroyed",
            lambda: json.loads(mig_state.read_text())["gpus"]["2"] == [],
            timeout=30,
        )
        assert partition.startswith("gpu-2-")
    finally:
        driver.stop()
    assert "Traceback" not in (tmp_path / "driver.log").read_text()
