"""A CUDA workload finds its driver: real containers, real loaders, NVIDIA's hooks (containerd).

A cluster of its own on containerd with fake GPUs of `h100x8-mig` made visible to real containers
(--fake-gpu-root: device nodes, ELF driver libraries, the fake CUDA driver and nvidia-smi), the
kubelet plugin on GPUs 0, 1 and 4-7 (gpu-0 shareable) and the device plugin on GPUs 2 and 3, both
running NVIDIA's nvidia-cdi-hook from their specs as the image ships it (found on PATH, copied into
the plugin directory). The pods run the workload images of localcluster.cudaimages, whose loader
cache was built without a driver: a Debian image with ldconfig and a distroless one without,
each also with CUDA forward-compatibility libraries newer and older than the driver. Each
container checks what a workload relies on: `ldconfig -p` lists the driver at the mounted paths,
libcuda.so resolves, Triton's lookup finds libcuda, cudaprobe loads both libraries by SONAME and
CUDA enumerates exactly the claim's devices, and the compat libcuda is the one loaded exactly
when it is newer than the driver.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from localcluster.cluster import ClusterInfo, LocalCluster
from localcluster.cudaimages import cuda_image
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    committed_device_classes,
    ensure_device_classes,
    pod_claim,
)

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Device, Inventory, MigDevice
from tests.e2e.cudapods import CudaSeen, cuda_pod, cuda_seen, triton_libcuda_dirs

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]

PROFILE = "h100x8-mig"
SPLIT = "--device-plugin-gpus=2,3"
LIB = "/usr/lib/x86_64-linux-gnu"
COMPAT = "/usr/local/cuda/compat"
#: The profile's driver is 550.54.15: forward-compatibility libraries of a newer and an older driver.
NEWER, OLDER = "570.86.10", "535.104.05"
#: The images, by container name: (kind, compat version).
IMAGES = {
    "debian": ("debian", None),
    "distroless": ("distroless", None),
    "debian-compat-newer": ("debian", NEWER),
    "debian-compat-older": ("debian", OLDER),
    "distroless-compat-newer": ("distroless", NEWER),
}


class CudaNode(NamedTuple):
    cluster: ClusterInfo
    kube: Kube
    inventory: Inventory
    images: dict[str, str]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CudaNode]:
    """The containerd cluster with the workload images, the kubelet plugin and the device plugin."""
    if os.geteuid() != 0:
        pytest.skip("containerd and runc run as root")
    cluster = LocalCluster(runtime="containerd")
    try:
        info = cluster.start(timeout=180)
        images = {}
        for container, (kind, compat) in IMAGES.items():
            image = cuda_image(kind, compat)
            cluster.import_image(image)
            images[container] = image.name
        workdir = tmp_path_factory.mktemp("cuda")
        driver = DriverProcess(
            info, PROFILE, workdir / "driver.log", extra_args=(SPLIT, "--shareable-gpus=0")
        ).start()
        plugin = DevicePluginProcess(info, PROFILE, workdir, (SPLIT,), with_driver=True).start()
        kube = Kube(info.kubeconfig)
        ensure_device_classes(kube, committed_device_classes())
        fake = FakeGpuLibrary(load_profile(PROFILE), info.node_name, root=Path(info.fake_gpu_root))
        try:
            yield CudaNode(info, kube, discover(fake), images)
        finally:
            kube.close()
            plugin.stop()
            assert driver.stop() == 0
            log = driver.log_path.read_text()
            assert "nvidia-cdi-hook" in log
            assert "no nvidia-cdi-hook" not in log
    finally:
        cluster.stop()


@pytest.fixture
def ns(node: CudaNode) -> Iterator[str]:
    """A namespace per test, deleted with its pods afterwards."""
    name = f"cuda-{os.urandom(3).hex()}"
    node.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    for pod in node.kube.list_objects("v1", "Pod", namespace=name):
        node.kube.delete("v1", "Pod", pod["metadata"]["name"], name, grace_period=0)
    wait_for("pods to be gone", lambda: not node.kube.list_objects("v1", "Pod", namespace=name), timeout=60)
    node.kube.delete("v1", "Namespace", name)


def _template(
    kube: Kube, namespace: str, name: str, device_class: str, selector: str, memory: str = ""
) -> None:
    exactly: dict[str, Any] = {
        "deviceClassName": device_class,
        "selectors": [{"cel": {"expression": selector}}],
    }
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
        }
    )


def _run(
    node: CudaNode,
    ns: str,
    pod: str,
    names: list[str],
    resources: dict[str, Any],
    claims: dict[str, str] | None = None,
) -> dict[str, CudaSeen]:
    containers = {name: (IMAGES[name][0], node.images[name], resources) for name in names}
    cuda_pod(node.kube, node.cluster, ns, pod, containers, claims)
    return {name: cuda_seen(node.kube, node.cluster, ns, pod, name, IMAGES[name][0]) for name in names}


def _claim_devices(node: CudaNode, ns: str, pod: str) -> list[Device]:
    found = [node.inventory.get(name) for name in allocated_devices(pod_claim(node.kube, ns, pod))]
    assert all(found)
    return [d for d in found if d is not None]


def _check(name: str, seen: CudaSeen, devices: list[Device]) -> None:
    """What every workload relies on, for one container given `devices`."""
    compat = IMAGES[name][1]
    libcuda = f"{COMPAT}/libcuda.so.1" if compat == NEWER else f"{LIB}/libcuda.so.1"
    # cudaprobe: both libraries by SONAME; the compat libcuda exactly when newer than the driver.
    assert seen.probe["libcuda.so.1"] == libcuda, seen.probe
    assert seen.probe["libnvidia-ml.so.1"] == f"{LIB}/libnvidia-ml.so.1", seen.probe
    assert seen.probe["cuInit"] == "0"
    assert seen.probe["cuDriverGetVersion"] == "12040"
    # CUDA enumerates exactly the claim's devices.
    assert [uuid for uuid, _, _ in seen.devices] == [d.uuid for d in devices]
    assert [memory for _, memory, _ in seen.devices] == [d.memory_bytes for d in devices]
    if seen.kind != "debian":
        return
    # The loader cache lists the driver at the mounted paths (NVIDIA's update-ldcache hook).
    assert f"{LIB}/libcuda.so.1" in seen.cache("libcuda.so.1")
    assert seen.cache("libnvidia-ml.so.1") == [f"{LIB}/libnvidia-ml.so.1"]
    assert seen.cache("libcuda.so") == [f"{LIB}/libcuda.so"]
    # libcuda.so resolves (NVIDIA's create-symlinks hook), to the driver's file.
    version = load_profile(PROFILE).driver_version
    assert seen.links[f"{LIB}/libcuda.so"] == f"{LIB}/libcuda.so.{version}"
    # Triton (torch.compile, vLLM) finds libcuda and can link -lcuda there.
    folders = triton_libcuda_dirs(seen.ldconfig, set(seen.links))
    assert LIB in folders
    assert f"{LIB}/libcuda.so" in seen.links
    if compat == NEWER:
        assert seen.cache("libcuda.so.1")[0] == f"{COMPAT}/libcuda.so.1"
    # nvidia-smi -L lists the same devices (a MIG device under its GPU's line).
    listed = {line.split("UUID: ")[1].rstrip(")") for line in seen.smi if "UUID: " in line}
    assert listed == {d.uuid for d in devices} | {d.parent.uuid for d in devices if isinstance(d, MigDevice)}


def test_a_whole_gpu_claim_every_image(node: CudaNode, ns: str) -> None:
    _template(node.kube, ns, "whole", "gpu.nvidia.com", f'device.attributes["{DRIVER}"].index == 1')
    seen = _run(node, ns, "whole", list(IMAGES), {"claims": [{"name": "gpu"}]}, {"gpu": "whole"})
    devices = _claim_devices(node, ns, "whole")
    for name, saw in seen.items():
        _check(name, saw, devices)


def test_a_mig_device_claim(node: CudaNode, ns: str) -> None:
    _template(node.kube, ns, "mig", "mig.nvidia.com", f'device.attributes["{DRIVER}"].profile == "1g.10gb"')
    names = ["debian", "distroless"]
    seen = _run(node, ns, "mig", names, {"claims": [{"name": "gpu"}]}, {"gpu": "mig"})
    (device,) = _claim_devices(node, ns, "mig")
    assert isinstance(device, MigDevice)
    for name, saw in seen.items():
        _check(name, saw, [device])
        assert saw.devices[0][2] == f"{device.parent.product_name} MIG 1g.10gb"


def test_a_share_of_a_gpu(node: CudaNode, ns: str) -> None:
    _template(node.kube, ns, "share", "gpu.nvidia.com", f'device.attributes["{DRIVER}"].index == 0', "10Gi")
    names = ["debian", "distroless"]
    seen = _run(node, ns, "share", names, {"claims": [{"name": "gpu"}]}, {"gpu": "share"})
    devices = _claim_devices(node, ns, "share")
    assert [d.name for d in devices] == ["gpu-0"]
    for name, saw in seen.items():
        _check(name, saw, devices)


def test_the_device_plugins_gpus(node: CudaNode, ns: str) -> None:
    names = ["debian", "distroless"]
    seen = _run(node, ns, "legacy", names, {"limits": {"nvidia.com/gpu": "1"}})
    given = [d for d in node.inventory if d.name in ("gpu-2", "gpu-3")]
    uuids = set()
    for name, saw in seen.items():
        (uuid,) = [u for u, _, _ in saw.devices]
        uuids.add(uuid)
        _check(name, saw, [d for d in given if d.uuid == uuid])
    assert uuids == {d.uuid for d in given}
