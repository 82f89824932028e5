"""The device plugin end to end on the real kubelet: registration, allocation, restarts, health.

Profile `h100x8-mig`: gpu-0..gpu-3 are full H100s (nvidia.com/gpu: 4; PCIe roots in
pairs, NUMA node 0), gpu-4..gpu-7 are in MIG mode with 3g.40gb, 2g.20gb and two
1g.10gb each (NUMA node 1). The plugin runs alone (no DRA process), so it takes
every GPU. The tests run in file order: the health test marks a GPU unhealthy for
good and comes last.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import container_record, delete_pods, gpu_limits_pod, node_resources

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Device, Gpu, Inventory, MigDevice

PROFILE = "h100x8-mig"
GPU = "nvidia.com/gpu"
KIND = "k8s.gpu.nvidia.com/device"
RESOURCES = {
    GPU: "4",
    "nvidia.com/mig-3g.40gb": "4",
    "nvidia.com/mig-2g.20gb": "4",
    "nvidia.com/mig-1g.10gb": "8",
}


@pytest.fixture(scope="module")
def inventory(cluster: ClusterInfo) -> Inventory:
    """The devices the plugin sees, as discovery makes them (same UUIDs: same node name)."""
    return discover(FakeGpuLibrary(load_profile(PROFILE), cluster.node_name))


@pytest.fixture(scope="module")
def device_plugin(
    cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevicePluginProcess]:
    """The device plugin alone on the node, registered with the kubelet."""
    process = DevicePluginProcess(
        cluster,
        PROFILE,
        tmp_path_factory.mktemp("device-plugin"),
        extra_args=("--health-recovery-period=20",),
    ).start()
    yield process
    assert process.stop() == 0, process.log_path.read_text()
    assert not list(Path(cluster.device_plugin_dir).glob("dra-gpu-*.sock")), "sockets are removed on exit"


def calls_since(
    plugin: DevicePluginProcess, event: str, start: int, resource: str = GPU
) -> list[dict[str, Any]]:
    """Calls of one kind for one resource, after the first `start` calls of the log."""
    return [c for c in plugin.calls()[start:] if c["event"] == event and c.get("resource") == resource]


def by_uuid(inventory: Inventory) -> dict[str, Device]:
    """Devices by UUID."""
    return {d.uuid: d for d in inventory}


def env_stem(device: Device) -> str:
    """DRA_GPU_<NAME> as the CDI edits name a device."""
    return "DRA_GPU_" + device.name.upper().replace("-", "_")


def test_registers_each_resource_and_node_shows_the_gpus(
    device_plugin: DevicePluginProcess, kube: Kube, cluster: ClusterInfo, inventory: Inventory
) -> None:
    registered = {c["resource"]: c for c in device_plugin.calls("Register")}
    assert sorted(registered) == sorted(RESOURCES)
    for resource, call in registered.items():
        assert (Path(cluster.device_plugin_dir) / call["endpoint"]).is_socket(), resource

    wait_for("allocatable GPUs", lambda: node_resources(kube, cluster, "allocatable") == RESOURCES)

    lists = {c["resource"]: c["devices"] for c in device_plugin.calls("ListAndWatch")}
    gpus = lists[GPU]
    assert [d["id"] for d in gpus] == [d.uuid for d in inventory if isinstance(d, Gpu)]
    assert {d["health"] for dev in lists.values() for d in dev} == {"Healthy"}
    assert {tuple(d["numa"]) for d in gpus} == {(0,)}
    assert {tuple(d["numa"]) for d in lists["nvidia.com/mig-1g.10gb"]} == {(1,)}


def test_two_gpu_pod_gets_the_preferred_pair_through_cdi(
    device_plugin: DevicePluginProcess, kube: Kube, cluster: ClusterInfo, namespace: str, inventory: Inventory
) -> None:
    start = len(device_plugin.calls())
    gpu_limits_pod(kube, namespace, "trainer", {GPU: 2}, sidecar=True)
    kube.wait_pod_phase("trainer", namespace)

    [preferred] = calls_since(device_plugin, "GetPreferredAllocation", start)
    assert preferred["size"] == 2
    assert preferred["mustInclude"] == []
    assert len(preferred["available"]) == 4
    [allocated] = calls_since(device_plugin, "Allocate", start)
    assert sorted(allocated["devices"]) == sorted(preferred["preferred"])
    devices = [by_uuid(inventory)[u] for u in allocated["devices"]]
    assert all(isinstance(d, Gpu) for d in devices)
    assert len({d.uuid for d in devices}) == 2
    roots = {d.pcie_root for d in devices if isinstance(d, Gpu)}
    assert len(roots) == 1, f"the preferred pair shares a PCIe root: {devices}"

    # The kubelet passed the CDI names to the runtime, which resolved them from the plugin's spec.
    record = container_record(cluster, namespace, "trainer")
    assert sorted(record["cdiDevices"]) == sorted(f"{KIND}={d.uuid}" for d in devices)
    spec = json.loads((Path(cluster.cdi_dir) / "k8s.gpu.nvidia.com-device.json").read_text())
    assert spec["kind"] == KIND
    assert {d.uuid for d in devices} <= {d["name"] for d in spec["devices"]}
    for device in devices:
        assert record["env"][f"{env_stem(device)}_UUID"] == device.uuid
    assert record["env"]["NVIDIA_VISIBLE_DEVICES"] == "none"

    # The sidecar asked for no GPU: the kubelet never asked the plugin about it.
    sidecar = container_record(cluster, namespace, "trainer", "sidecar")
    assert sidecar["cdiDevices"] == []
    assert not any(k.startswith("DRA_GPU_") or k == "NVIDIA_VISIBLE_DEVICES" for k in sidecar["env"])
    delete_pods(kube, namespace)


def test_mig_devices_are_their_own_resources(
    device_plugin: DevicePluginProcess, kube: Kube, cluster: ClusterInfo, namespace: str, inventory: Inventory
) -> None:
    start = len(device_plugin.calls())
    gpu_limits_pod(kube, namespace, "small", {"nvidia.com/mig-1g.10gb": 2})
    kube.wait_pod_phase("small", namespace)
    [allocated] = calls_since(device_plugin, "Allocate", start, "nvidia.com/mig-1g.10gb")
    devices = [by_uuid(inventory)[u] for u in allocated["devices"]]
    assert all(isinstance(d, MigDevice) and d.profile == "1g.10gb" for d in devices)
    parents = {d.parent.uuid for d in devices if isinstance(d, MigDevice)}
    assert len(parents) == 1, "two MIG devices of one GPU are preferred"
    record = container_record(cluster, namespace, "small")
    assert sorted(record["cdiDevices"]) == sorted(f"{KIND}={d.uuid}" for d in devices)
    for device in devices:
        assert record["env"][f"{env_stem(device)}_UUID"] == device.uuid
    delete_pods(kube, namespace)


def test_more_gpus_than_the_node_has_stays_pending(
    device_plugin: DevicePluginProcess, kube: Kube, namespace: str
) -> None:
    gpu_limits_pod(kube, namespace, "greedy", {GPU: 5})
    event = wait_for(
        "FailedScheduling",
        lambda: next(
            (e for e in kube.events_for("Pod", "greedy", namespace) if e["reason"] == "FailedScheduling"),
            None,
        ),
    )
    assert f"Insufficient {GPU}" in event["message"]
    delete_pods(kube, namespace)


def test_kubelet_restart_makes_the_plugin_register_again(
    device_plugin: DevicePluginProcess,
    local_cluster: LocalCluster,
    kube: Kube,
    cluster: ClusterInfo,
    namespace: str,
) -> None:
    assert device_plugin.proc is not None
    plugin_pid = device_plugin.proc.pid
    kubelet_pid = cluster.pids["kubelet"]
    start = len(device_plugin.calls())

    assert local_cluster.restart_kubelet() != kubelet_pid

    def registered_again() -> bool:
        return {c["resource"] for c in device_plugin.calls("Register")[len(RESOURCES) :]} == set(RESOURCES)

    wait_for("the plugin to register every resource again", registered_again, timeout=30)
    assert device_plugin.proc.poll() is None
    assert device_plugin.proc.pid == plugin_pid, "the plugin itself was not restarted"
    again = [c for c in device_plugin.calls()[start:] if c["event"] == "Register"]
    assert {c["n"] for c in again} == {2}
    wait_for("allocatable GPUs", lambda: node_resources(kube, cluster, "allocatable") == RESOURCES)

    gpu_limits_pod(kube, namespace, "after-restart", {GPU: 1})
    kube.wait_pod_phase("after-restart", namespace)
    assert calls_since(device_plugin, "Allocate", start)
    delete_pods(kube, namespace)


def test_xid_error_takes_the_gpu_out_of_allocatable_until_it_is_quiet_again(
    device_plugin: DevicePluginProcess, kube: Kube, cluster: ClusterInfo, inventory: Inventory
) -> None:
    gpus = [d for d in inventory if isinstance(d, Gpu)]
    victim, bystander = gpus[3], gpus[2]
    migs = [d for d in inventory if isinstance(d, MigDevice) and d.profile == "2g.20gb"]
    mig_victim = next(d for d in migs if d.parent.index == 5)
    with device_plugin.events.open("a") as events:
        events.write(f"{bystander.uuid} 13\n")  # an application error: the device stays healthy
        events.write(f"{victim.uuid} 79\n")  # fallen off the bus
        # In one MIG instance of GPU 5: that MIG device only, not the GPU's other MIG devices.
        events.write(
            f"{mig_victim.parent.uuid} 94 {mig_victim.gpu_instance_id} {mig_victim.compute_instance_id}\n"
        )

    def unhealthy_sent() -> dict[str, str] | None:
        for call in reversed(device_plugin.calls("ListAndWatch")):
            if call["resource"] == GPU:
                health = {d["id"]: d["health"] for d in call["devices"]}
                return health if health[victim.uuid] == "Unhealthy" else None
        return None

    health = wait_for("ListAndWatch to send the GPU as Unhealthy", unhealthy_sent, timeout=30)
    assert health == {g.uuid: "Unhealthy" if g is victim else "Healthy" for g in gpus}
    wait_for("allocatable to drop to 3", lambda: node_resources(kube, cluster, "allocatable").get(GPU) == "3")
    assert node_resources(kube, cluster, "capacity")[GPU] == "4"

    mig_resource = "nvidia.com/mig-2g.20gb"

    def mig_unhealthy_sent() -> dict[str, str] | None:
        for call in reversed(device_plugin.calls("ListAndWatch")):
            if call["resource"] == mig_resource:
                health = {d["id"]: d["health"] for d in call["devices"]}
                return health if health[mig_victim.uuid] == "Unhealthy" else None
        return None

    health = wait_for("ListAndWatch to send the MIG device as Unhealthy", mig_unhealthy_sent, timeout=30)
    assert health == {d.uuid: "Unhealthy" if d is mig_victim else "Healthy" for d in migs}
    wait_for(
        "allocatable 2g.20gb to drop to 3",
        lambda: node_resources(kube, cluster, "allocatable").get(mig_resource) == "3",
    )
    others = [
        d.uuid for d in inventory if isinstance(d, MigDevice) and d.parent.index == 5 and d is not mig_victim
    ]
    sent = {d["id"]: d["health"] for c in device_plugin.calls("ListAndWatch") for d in c["devices"]}
    assert [sent[u] for u in others] == ["Healthy"] * len(others)

    # --health-recovery-period=20: with no further XID, both come back.
    def healthy_again() -> bool:
        latest: dict[str, str] = {}
        for call in device_plugin.calls("ListAndWatch"):
            latest.update({d["id"]: d["health"] for d in call["devices"]})
        return latest[victim.uuid] == latest[mig_victim.uuid] == "Healthy"

    wait_for("ListAndWatch to send both devices as Healthy again", healthy_again, timeout=60)
    wait_for(
        "allocatable to be 4 again", lambda: node_resources(kube, cluster, "allocatable").get(GPU) == "4"
    )
