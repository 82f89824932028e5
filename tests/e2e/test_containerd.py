"""Real containers: containerd 2.x and runc resolve the driver's CDI specs (CONTAINER_RUNTIME=containerd).

A cluster of its own on containerd (localcluster.containerd), fake GPUs of profile
`h100x8-mig` made visible to real containers (--fake-gpu-root: device nodes and a
stand-in driver with nvidia-smi), the kubelet plugin on GPUs 0, 1 and 4-7 (GPU 1 in
dynamic MIG mode, offering 3g.40gb only, which no other test asks for; passthrough on,
over the fake sysfs tree it makes under the fake root) and the device plugin on GPUs 2
and 3. Every test pod runs the static busybox image and writes what its containers saw
(environment, /dev/nvidia* and /dev/vfio/*, `nvidia-smi -L`, the driver library) to a
hostPath directory, then sleeps. Skipped, naming it, where the machine is not root; a containerd
that cannot be built or started is an error.
"""

from __future__ import annotations

import io
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import pytest
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.containerd import LEAKY_HANDLER
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claim_template,
    committed_device_classes,
    ensure_device_classes,
    observed,
    out_dir,
    pod_claim,
    seen,
)
from prometheus_client.parser import text_string_to_metric_families

from dra.adapters.checkpoint import CheckpointStore
from dra.fakegpus import node as fakegpus
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.fakegpus.sysfs import FakeSysfs
from dra.gpu.discovery import discover
from dra.kubeletplugin import top
from dra.model.devices import Device, Gpu, Inventory, MigDevice
from tests.skips import Lack, reason

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]

PROFILE = "h100x8-mig"
SPLIT = "--device-plugin-gpus=2,3"
DYNAMIC = ("--mig-mode=static,1=dynamic", "--mig-profiles=3g.40gb")
#: KEP-5304: each claim's containers get their devices' attributes in files.
METADATA = "--device-metadata=true"
PRODUCT = "NVIDIA H100 80GB HBM3"


class CtrNode(NamedTuple):
    """The containerd cluster and the kubelet plugin on it."""

    cluster: ClusterInfo
    driver: DriverProcess


@pytest.fixture(scope="module")
def ctr_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CtrNode]:
    """A cluster on containerd for this module, with the driver and the device plugin on it.

    The driver attributes GPU processes to pods (--usage-processes) through the host's /proc.
    """
    if os.geteuid() != 0:
        pytest.skip(reason(Lack.ROOT, "containerd and runc run as root"))
    cluster = LocalCluster(runtime="containerd")
    try:
        # A containerd that fails to build or start is an error of the test, not a skip.
        info = cluster.start(timeout=180)
        workdir = tmp_path_factory.mktemp("containerd")
        usage = ("--claim-metrics-interval=1", "--usage-processes=true")
        flags = (SPLIT, *DYNAMIC, "--vfio=true", METADATA, *usage)
        driver = DriverProcess(info, PROFILE, workdir / "driver.log", extra_args=flags).start()
        device_plugin = DevicePluginProcess(info, PROFILE, workdir, (SPLIT,), with_driver=True).start()
        try:
            yield CtrNode(info, driver)
        finally:
            device_plugin.stop()
            driver.stop()
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def ctr_cluster(ctr_node: CtrNode) -> ClusterInfo:
    """The containerd cluster."""
    return ctr_node.cluster


@pytest.fixture(scope="module")
def ckube(ctr_cluster: ClusterInfo) -> Iterator[Kube]:
    """A cluster-admin client of the containerd cluster, with the chart's DeviceClasses."""
    client = Kube(ctr_cluster.kubeconfig)
    ensure_device_classes(client, committed_device_classes())
    yield client
    client.close()


@pytest.fixture
def ns(ckube: Kube) -> Iterator[str]:
    """A namespace per test, deleted with its pods afterwards."""
    name = f"ctr-{int(time.monotonic() * 1000) % 10**9}"
    ckube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    for pod in ckube.list_objects("v1", "Pod", namespace=name):
        ckube.delete("v1", "Pod", pod["metadata"]["name"], name, grace_period=0)
    wait_for("pods to be gone", lambda: not ckube.list_objects("v1", "Pod", namespace=name), timeout=60)
    ckube.delete("v1", "Namespace", name)


@pytest.fixture(scope="module")
def inventory(ctr_cluster: ClusterInfo) -> Inventory:
    """The fake GPUs as the driver discovers them (same node name: same UUIDs)."""
    return discover(
        FakeGpuLibrary(load_profile(PROFILE), ctr_cluster.node_name, root=Path(ctr_cluster.fake_gpu_root))
    )


def busybox_pod(
    kube: Kube,
    cluster: ClusterInfo,
    namespace: str,
    name: str,
    containers: dict[str, dict[str, Any]],
    claims: dict[str, str] | None = None,
    runtime_class: str | None = None,
) -> None:
    """A pod of busybox containers that record what they see; `containers`: name -> resources."""
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {"name": container, "resources": resources} for container, resources in containers.items()
        ],
    }
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()]
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    kube.create(observed(cluster, pod))


CONTROL = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]


def smi_lines(devices: list[Device]) -> list[str]:
    """What the real nvidia-smi -L prints in a container given these devices (GPUs before MIG)."""
    lines: list[str] = []
    gpus = sorted({d.parent if isinstance(d, MigDevice) else d for d in devices}, key=lambda g: g.minor)
    for index, gpu in enumerate(gpus):
        lines.append(f"GPU {index}: {PRODUCT} (UUID: {gpu.uuid})")
        migs = [d for d in devices if isinstance(d, MigDevice) and d.parent == gpu]
        lines += [f"  MIG {m.profile:<11} Device {i:2d}: (UUID: {m.uuid})" for i, m in enumerate(migs)]
    return lines


def test_a_claim_gives_exactly_its_gpu_node_driver_and_nvidia_smi_line(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str, inventory: Inventory
) -> None:
    claim_template(ckube, ns, "one-gpu")
    busybox_pod(ckube, ctr_cluster, ns, "solo", {"main": {"claims": [{"name": "gpu"}]}}, {"gpu": "one-gpu"})
    saw = seen(ctr_cluster, ns, "solo", "main")
    (name,) = allocated_devices(pod_claim(ckube, ns, "solo"))
    device = inventory.get(name)
    assert device is not None
    assert saw.dev == sorted([*device.device_nodes, *CONTROL])
    assert saw.smi_rc == 0
    assert saw.smi == smi_lines([device])
    assert saw.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    # The driver's files came with the spec, no runtime hook involved.
    assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= set(saw.libs)


def test_a_mig_claim_shows_its_gpu_and_only_its_mig_device(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str, inventory: Inventory
) -> None:
    claim_template(
        ckube, ns, "mig", ['device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'], 1, "mig.nvidia.com"
    )
    busybox_pod(ckube, ctr_cluster, ns, "mig", {"main": {"claims": [{"name": "gpu"}]}}, {"gpu": "mig"})
    saw = seen(ctr_cluster, ns, "mig", "main")
    (name,) = allocated_devices(pod_claim(ckube, ns, "mig"))
    device = inventory.get(name)
    assert isinstance(device, MigDevice)
    assert saw.smi == smi_lines([device])
    assert saw.dev == sorted([*device.device_nodes, *CONTROL])


def _gpu1_mig_mode(cluster: ClusterInfo) -> int:
    """GPU 1's MIG mode as the fake GPUs record it (absent: the profile's, off)."""
    state = Path(cluster.kubelet_root) / "plugins" / DRIVER / "fake-gpu-mig.json"
    return int(json.loads(state.read_text()).get("migMode", {}).get("1", 0)) if state.exists() else 0


def test_a_whole_claim_on_a_dynamic_mig_gpu_gets_it_with_mig_off_and_nvidia_smi_lists_it(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str, inventory: Inventory
) -> None:
    gpu = inventory.get("gpu-1")
    assert gpu is not None
    # A MIG device first, which turns MIG mode on.
    on_gpu1 = [
        'device.attributes["gpu.nvidia.com"].profile == "3g.40gb"',
        f'device.attributes["gpu.nvidia.com"].parentUUID == "{gpu.uuid}"',
    ]
    claim_template(ckube, ns, "part", on_gpu1, 1, "mig.nvidia.com")
    busybox_pod(ckube, ctr_cluster, ns, "part", {"main": {"claims": [{"name": "gpu"}]}}, {"gpu": "part"})
    saw = seen(ctr_cluster, ns, "part", "main")
    (name,) = allocated_devices(pod_claim(ckube, ns, "part"))
    assert name.startswith("gpu-1-mig-3g40gb-at")
    assert _gpu1_mig_mode(ctr_cluster) == 1
    assert saw.smi[0] == f"GPU 0: {PRODUCT} (UUID: {gpu.uuid})"
    assert [line.split()[:2] for line in saw.smi[1:]] == [["MIG", "3g.40gb"]]
    ckube.delete("v1", "Pod", "part", ns, grace_period=0)
    wait_for("the MIG device's claim to be unprepared", lambda: not _prepared_in(ctr_cluster, ns), timeout=60)

    # Then the whole GPU: MIG off, so that CUDA sees it; nvidia-smi lists it alone.
    claim_template(ckube, ns, "whole", ['device.attributes["gpu.nvidia.com"].index == 1'])
    busybox_pod(ckube, ctr_cluster, ns, "whole", {"main": {"claims": [{"name": "gpu"}]}}, {"gpu": "whole"})
    saw = seen(ctr_cluster, ns, "whole", "main")
    assert allocated_devices(pod_claim(ckube, ns, "whole")) == ["gpu-1"]
    assert _gpu1_mig_mode(ctr_cluster) == 0
    assert saw.smi_rc == 0
    assert saw.smi == smi_lines([gpu])


def _prepared_in(cluster: ClusterInfo, namespace: str) -> bool:
    return any(
        claim.namespace == namespace
        for claim in CheckpointStore(Path(cluster.kubelet_root) / "plugins" / DRIVER / "checkpoint.json")
        .load()
        .values()
    )


def test_a_vfio_claim_binds_its_gpu_to_vfio_pci_and_the_container_gets_its_group(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str, inventory: Inventory
) -> None:
    """What this proves: prepare moves the GPU to vfio-pci in the (fake) sysfs, the claim's CDI spec
    names /dev/vfio/<group> and /dev/vfio/vfio, containerd resolves it into a real container, and
    unprepare gives the GPU back. The nodes are inert stand-ins: no VM can use them (docs/configuration.md).
    """
    gpu = inventory.get("gpu-0")
    assert isinstance(gpu, Gpu)
    vfio = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}
    exactly = {
        "deviceClassName": "gpu.nvidia.com",
        "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].index == 0'}}],
    }
    ckube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "passthrough", "namespace": ns},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": exactly}],
                        "config": [
                            {
                                "requests": ["gpu"],
                                "opaque": {
                                    "driver": DRIVER,
                                    "parameters": {**vfio, "iommu": {"enableAPIDevice": True}},
                                },
                            }
                        ],
                    }
                }
            },
        }
    )
    busybox_pod(ckube, ctr_cluster, ns, "vm", {"main": {"claims": [{"name": "gpu"}]}}, {"gpu": "passthrough"})
    saw = seen(ctr_cluster, ns, "vm", "main")
    assert allocated_devices(pod_claim(ckube, ns, "vm")) == ["gpu-0"]
    sysfs = FakeSysfs(ctr_cluster.fake_gpu_root)
    group = sysfs.group_of(gpu.pci_bus_id)
    assert sysfs.driver_of(gpu.pci_bus_id) == "vfio-pci"
    # Its group and the VFIO container, and nothing of the NVIDIA driver: no /dev/nvidia*, no nvidia-smi.
    assert saw.dev == sorted([f"/dev/vfio/{group}", "/dev/vfio/vfio"])
    assert saw.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert saw.smi_rc == 127
    ckube.delete("v1", "Pod", "vm", ns, grace_period=0)
    wait_for("the passthrough claim to be unprepared", lambda: not _prepared_in(ctr_cluster, ns), timeout=60)
    assert sysfs.driver_of(gpu.pci_bus_id) == "nvidia"
    assert not sysfs.group_node(group).exists()


def test_two_containers_sharing_a_claim_see_the_same_gpu(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str, inventory: Inventory
) -> None:
    claim_template(ckube, ns, "shared")
    refs = {"claims": [{"name": "gpu"}]}
    busybox_pod(ckube, ctr_cluster, ns, "pair", {"left": refs, "right": refs}, {"gpu": "shared"})
    left, right = seen(ctr_cluster, ns, "pair", "left"), seen(ctr_cluster, ns, "pair", "right")
    (name,) = allocated_devices(pod_claim(ckube, ns, "pair"))
    device = inventory.get(name)
    assert device is not None
    assert left.smi == right.smi == smi_lines([device])
    assert left.dev == right.dev


ATTRIBUTES = "/var/run/kubernetes.io/dra-device-attributes"


def test_each_container_reads_the_attributes_of_its_requests_devices_from_files(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str, inventory: Inventory
) -> None:
    exactly = {"deviceClassName": "gpu.nvidia.com", "count": 1}
    ckube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two", "namespace": ns},
            "spec": {
                "spec": {
                    "devices": {"requests": [{"name": n, "exactly": exactly} for n in ("train", "serve")]}
                }
            },
        }
    )
    refs = {"left": "train", "right": "serve"}
    pod = observed(
        ctr_cluster,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "meta", "namespace": ns},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two"}],
                "containers": [
                    {"name": c, "resources": {"claims": [{"name": "gpus", "request": r}]}}
                    for c, r in refs.items()
                ],
            },
        },
    )
    # What each container finds under the well-known directory, and its one file's contents.
    for container in pod["spec"]["containers"]:
        container["command"] = [
            "sh",
            "-c",
            f'o=/out/"$C"; find {ATTRIBUTES} -type f > "$o.files"; '
            f'cat {ATTRIBUTES}/*/*/*/*-metadata.json > "$o.json"; touch "$o.done"; exec sleep 3600',
        ]
    ckube.create(pod)
    out = out_dir(ctr_cluster, ns, "meta")
    for container in refs:
        wait_for(f"{container} to read its files", (out / f"{container}.done").exists, timeout=90)
    claim = pod_claim(ckube, ns, "meta")
    devices = {r["request"]: r["device"] for r in claim["status"]["allocation"]["devices"]["results"]}
    for container, request in refs.items():
        path = f"{ATTRIBUTES}/resourceclaimtemplates/gpus/{request}/{DRIVER}-metadata.json"
        # Only its own request's file: the other request's device is not its business.
        assert (out / f"{container}.files").read_text().split() == [path]
        newest = json.JSONDecoder().raw_decode((out / f"{container}.json").read_text())[0]
        assert newest["apiVersion"] == "metadata.resource.k8s.io/v1beta1"
        assert newest["metadata"]["name"] == claim["metadata"]["name"]
        assert newest["podClaimName"] == "gpus"
        [entry] = newest["requests"]
        [device] = entry["devices"]
        assert (entry["name"], device["name"], device["pool"]) == (
            request,
            devices[request],
            ctr_cluster.node_name,
        )
        found = inventory.get(devices[request])
        assert found is not None
        assert device["attributes"]["uuid"] == {"string": found.uuid}
    host = Path(ctr_cluster.kubelet_root) / "plugins" / DRIVER / "dra-device-metadata"
    assert sorted(p.name for p in (host / f"{ns}_{claim['metadata']['name']}").iterdir()) == [
        "serve",
        "train",
    ]
    ckube.delete("v1", "Pod", "meta", ns, grace_period=0)
    wait_for(
        "the claim's files to be removed", lambda: not (host / f"{ns}_{claim['metadata']['name']}").exists()
    )


def test_a_pod_without_a_claim_sees_no_gpu(ckube: Kube, ctr_cluster: ClusterInfo, ns: str) -> None:
    busybox_pod(ckube, ctr_cluster, ns, "plain", {"main": {}})
    saw = seen(ctr_cluster, ns, "plain", "main")
    assert saw.dev == []
    assert "NVIDIA_VISIBLE_DEVICES" not in saw.env
    assert saw.smi_rc == 127, saw.smi  # no nvidia-smi at all: the driver's files came with no spec
    assert "libcuda.so.1" not in saw.libs


def test_a_runtime_that_defaults_to_all_gpus_leaks_but_a_claim_overrides_it(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str, inventory: Inventory
) -> None:
    # The node's runtime starts every container with NVIDIA_VISIBLE_DEVICES=all, as NVIDIA's
    # toolkit set as the default runtime (or a CUDA base image) does.
    ckube.create(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": f"{LEAKY_HANDLER}-{ns}"},
            "handler": LEAKY_HANDLER,
        }
    )
    try:
        claim_template(ckube, ns, "one-gpu")
        leaky = f"{LEAKY_HANDLER}-{ns}"
        busybox_pod(ckube, ctr_cluster, ns, "asks-none", {"main": {}}, runtime_class=leaky)
        busybox_pod(
            ckube,
            ctr_cluster,
            ns,
            "asks-one",
            {"main": {"claims": [{"name": "gpu"}]}},
            {"gpu": "one-gpu"},
            leaky,
        )
        nothing_asked = seen(ctr_cluster, ns, "asks-none", "main")
        one_asked = seen(ctr_cluster, ns, "asks-one", "main")
    finally:
        ckube.delete("node.k8s.io/v1", "RuntimeClass", f"{LEAKY_HANDLER}-{ns}")
    # The leak: NVIDIA's hook reads `all` and would inject every GPU of the node into this pod.
    assert nothing_asked.env["NVIDIA_VISIBLE_DEVICES"] == "all"
    # The driver's path: the claim's spec sets `void` (the hook adds nothing) and the
    # container has its GPU's nodes only.
    (name,) = allocated_devices(pod_claim(ckube, ns, "asks-one"))
    device = inventory.get(name)
    assert device is not None
    assert one_asked.env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert one_asked.smi == smi_lines([device])


def test_the_device_plugins_cdi_devices_resolve_too(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str, inventory: Inventory
) -> None:
    busybox_pod(ckube, ctr_cluster, ns, "legacy", {"main": {"limits": {"nvidia.com/gpu": "1"}}})
    saw = seen(ctr_cluster, ns, "legacy", "main")
    # The device edits of the plugin's spec name the device (DRA_GPU_<DEVICE>_UUID).
    gpus = [d for d in inventory if d.uuid in saw.env.values()]
    assert len(gpus) == 1, saw.env
    assert gpus[0].name in ("gpu-2", "gpu-3")  # the device plugin's share
    assert saw.smi == smi_lines(gpus)
    assert saw.dev == sorted([*gpus[0].device_nodes, *CONTROL])


def test_a_device_node_gone_after_prepare_fails_the_container_with_an_event_naming_the_node(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str, inventory: Inventory
) -> None:
    claim_template(ckube, ns, "one-gpu", ['device.attributes["gpu.nvidia.com"].index == 1'])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "late", "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            # The claim is prepared before the init container runs; the node goes meanwhile.
            "initContainers": [{"name": "wait", "image": ctr_cluster.test_image, "command": ["sleep", "4"]}],
            "containers": [
                {
                    "name": "main",
                    "image": ctr_cluster.test_image,
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    ckube.create(pod)
    wait_for("the claim to be prepared", lambda: _spec_written(ckube, ctr_cluster, ns), timeout=60)
    node = Path(ctr_cluster.fake_gpu_root) / "dev/nvidia1"
    node.unlink()
    try:
        events = wait_for(
            "a Failed event for the container",
            lambda: [e for e in ckube.events_for("Pod", "late", ns) if e["reason"] == "Failed"] or None,
            timeout=60,
        )
        # containerd names the missing node, not the CDI device (whose name holds the claim's
        # UID): the event says which device is gone; the claim is the pod's only one.
        assert f'failed to stat CDI host device "{node}"' in events[0]["message"], events[0]["message"]
        assert pod_claim(ckube, ns, "late")["status"]["allocation"]
    finally:
        # Put the node back as the fake driver made it (dra.fakegpus.node), for later tests.
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(fakegpus.NVIDIA_MAJOR, 1))


def _spec_written(kube: Kube, cluster: ClusterInfo, namespace: str) -> bool:
    try:
        uid = pod_claim(kube, namespace, "late")["metadata"]["uid"]
    except AssertionError:
        return False
    return any(Path(cluster.cdi_dir).glob(f"*{uid}*.json"))


def test_a_device_node_gone_before_prepare_fails_the_prepare_with_an_event_naming_the_claim(
    ckube: Kube, ctr_cluster: ClusterInfo, ns: str
) -> None:
    node = Path(ctr_cluster.fake_gpu_root) / "dev/nvidia0"
    node.unlink()  # gone after the driver discovered it: the driver's inventory still has gpu-0
    try:
        claim_template(ckube, ns, "gpu-zero", ['device.attributes["gpu.nvidia.com"].index == 0'])
        busybox_pod(
            ckube, ctr_cluster, ns, "early", {"main": {"claims": [{"name": "gpu"}]}}, {"gpu": "gpu-zero"}
        )
        claim = wait_for("the claim", lambda: _claim_or_none(ckube, ns, "early"), timeout=30)
        events = wait_for(
            "a FailedPrepareDynamicResources event",
            lambda: (
                [
                    e
                    for e in ckube.events_for("Pod", "early", ns)
                    if e["reason"] == "FailedPrepareDynamicResources"
                ]
                or None
            ),
            timeout=60,
        )
        message = events[0]["message"]
        assert f"cannot prepare ResourceClaim {ns}/{claim['metadata']['name']}" in message, message
        assert f"{node}, not on this node" in message
        assert not any(Path(ctr_cluster.cdi_dir).glob(f"*{claim['metadata']['uid']}*"))
    finally:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(fakegpus.NVIDIA_MAJOR, 0))


def _claim_or_none(kube: Kube, namespace: str, pod: str) -> dict[str, Any] | None:
    try:
        return pod_claim(kube, namespace, pod)
    except AssertionError:
        return None


def _host_pid(container_id: str) -> int:
    """A PID on the host of a process in the container: the kubelet's and containerd's cgroup names it."""
    for entry in sorted(Path("/proc").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        if not entry.name.isdigit():
            continue
        try:
            if container_id in (entry / "cgroup").read_text():
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no process of container {container_id} in /proc")


def _series(driver: DriverProcess, name: str, **labels: str) -> float | None:
    """The value of the driver's series with these labels (among others); None when it has none."""
    return next(
        (
            sample.value
            for family in text_string_to_metric_families(driver.metrics())
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        ),
        None,
    )


def test_real_processes_of_a_pod_are_its_claim_s_and_their_usage_follows_them(
    ckube: Kube, ctr_node: CtrNode, ns: str, inventory: Inventory
) -> None:
    """Real PIDs of real containers carry the fake GPU's declared processes.

    The pod's `main` container uses the claim; its `other` container does not. Each runs
    busybox; the fake GPU is told (its processes file) that a PID of each has a context on the
    claim's GPU with some memory and duty. The driver finds their pods and containers through
    the host's /proc/<pid>/cgroup, as containerd and the kubelet made them.
    """
    cluster, driver = ctr_node
    claim_template(ckube, ns, "metered")
    busybox_pod(
        ckube,
        cluster,
        ns,
        "metered",
        {"main": {"claims": [{"name": "gpu"}]}, "other": {}},
        {"gpu": "metered"},
    )
    seen(cluster, ns, "metered", "main")
    seen(cluster, ns, "metered", "other")
    claim = pod_claim(ckube, ns, "metered")
    (name,) = allocated_devices(claim)
    device = inventory.get(name)
    assert device is not None

    def container_ids() -> dict[str, str] | None:
        statuses = (ckube.get("v1", "Pod", "metered", ns).get("status") or {}).get("containerStatuses") or []
        found = {s["name"]: str(s.get("containerID") or "").partition("://")[2] for s in statuses}
        return found if len(found) == 2 and all(found.values()) else None

    ids = wait_for("the pod's status to name its containers", container_ids, timeout=30)
    main, other = _host_pid(ids["main"]), _host_pid(ids["other"])
    control = driver.checkpoint.parent / "fake-gpu-processes.json"

    def declare(*processes: tuple[int, int, float]) -> None:
        entries = [{"pid": p, "device": device.uuid, "memory": m, "duty": d} for p, m, d in processes]
        control.write_text(json.dumps({"processes": entries}))

    mine = {"dra_claim_name": claim["metadata"]["name"], "pod": "metered", "container": "main"}
    gpu = {"UUID": device.uuid, "GPU_I_ID": ""}

    def near(name: str, value: float, **labels: str) -> bool:
        found = _series(driver, name, **labels)
        return found is not None and abs(found - value) < 0.05

    try:
        declare((main, 2 << 30, 0.6), (other, 512 << 20, 0.2))
        wait_for(
            "the main container's process to be the claim's",
            lambda: _series(driver, "dra_gpu_claim_memory_used_bytes", **mine) == 2 << 30,
            timeout=20,
        )
        # The pod's other container does not use the claim: its process is nobody's.
        assert _series(driver, "dra_gpu_unattributed_memory_used_bytes", **gpu) == 512 << 20
        assert _series(driver, "dra_gpu_claim_memory_used_bytes", container="other") is None
        wait_for(
            "the claim to read its duty", lambda: near("dra_gpu_claim_utilization_ratio", 0.6, **mine), 10
        )
        assert near("dra_gpu_unattributed_utilization_ratio", 0.2, **gpu)
        declare((main, 2 << 30, 0.3), (other, 512 << 20, 0.2))
        wait_for("the duty change", lambda: near("dra_gpu_claim_utilization_ratio", 0.3, **mine), 10)
        busy = _series(driver, "dra_gpu_claim_busy_seconds_total", **mine) or 0.0
        wait_for(
            "busy seconds to grow by the duty (0.3 s a second)",
            lambda: (_series(driver, "dra_gpu_claim_busy_seconds_total", **mine) or 0.0) > busy + 0.5,
            timeout=10,
        )
        shown = io.StringIO()
        url = f"http://127.0.0.1:{driver.port}/metrics"
        args = (cluster.kubeconfig, DRIVER, cluster.node_name, 1.0, True, shown, [url])
        assert anyio.run(top.run, *args) == 0
        [line] = [x for x in shown.getvalue().splitlines() if claim["metadata"]["name"] in x]
        assert line.split()[-2:] == ["2.0Gi", "30%"], shown.getvalue()
        declare((other, 512 << 20, 0.2))
        wait_for(
            "the ended process's memory to be gone",
            lambda: _series(driver, "dra_gpu_claim_memory_used_bytes", **mine) == 0,
            timeout=10,
        )
        # Ended: its claim's busy seconds stop growing.
        busy = _series(driver, "dra_gpu_claim_busy_seconds_total", **mine) or 0.0
        time.sleep(2.5)
        assert _series(driver, "dra_gpu_claim_busy_seconds_total", **mine) == busy
    finally:
        control.unlink(missing_ok=True)
