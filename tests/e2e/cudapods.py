"""Pods of CUDA workload images (localcluster.cudaimages) on a containerd cluster, and what each saw.

A container of the ``debian`` image records, as a workload finds its driver: `/sbin/ldconfig -p`,
where libcuda.so.1 and libcuda.so lead in each folder the cache lists libcuda.so.1 in, cudaprobe's
report (the libraries the loader mapped by SONAME, the devices CUDA enumerates), `nvidia-smi -L`,
its environment and device nodes. A ``distroless`` container has no shell: cudaprobe alone
writes its report. Both write into a hostPath directory (localcluster.workloads.out_dir).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.cudaimages import PROBE, cuda_image
from localcluster.devicepluginprocess import DevicePluginProcess
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, WaitTimeoutError, wait_for
from localcluster.workloads import (
    allocated_devices,
    committed_device_classes,
    ensure_device_classes,
    out_dir,
    pod_claim,
)

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Device, Inventory, MigDevice

LIB = "/usr/lib/x86_64-linux-gnu"
COMPAT = "/usr/local/cuda/compat"
#: The fake GPUs' driver is 550.54.15 (CUDA 12.4): forward-compatibility libraries of a newer and an
#: older driver.
NEWER, OLDER = "570.86.10", "535.104.05"
#: The images, by container name: (kind, compat version).
IMAGES = {
    "debian": ("debian", None),
    "distroless": ("distroless", None),
    "debian-compat-newer": ("debian", NEWER),
    "debian-compat-older": ("debian", OLDER),
    "distroless-compat-newer": ("distroless", NEWER),
}

#: The debian container's record; `cudaprobe` last but one, so that a failing probe still leaves the rest.
DEBIAN_REPORT = (
    'o=/out/"$C"; /sbin/ldconfig -p > "$o.ldconfig" 2>&1; '
    "for f in $(/sbin/ldconfig -p | sed -n 's/.*libcuda[.]so[.]1 .*=> //p'); do d=\"${f%/*}\"; "
    'for l in "$d/libcuda.so.1" "$d/libcuda.so"; do [ -e "$l" ] && echo "$l $(readlink -f "$l")"; done; '
    'done > "$o.links"; '
    'nvidia-smi -L > "$o.smi" 2>&1; env > "$o.env"; '
    'for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -c "$f" ] && echo "$f"; done > "$o.dev"; '
    f'{PROBE["debian"]} "$o.probe"; echo $? > "$o.rc"; touch "$o.done"; exec sleep 3600'
)


@dataclass
class CudaSeen:
    """What one container of a CUDA workload image saw."""

    kind: str
    #: cudaprobe's report, `key: value` (libcuda.so.1, libnvidia-ml.so.1, cuInit, ...).
    probe: dict[str, str]
    #: The devices CUDA enumerated: (UUID, total memory, name), in ordinal order.
    devices: list[tuple[str, int, str]]
    #: The lines of `ldconfig -p` (debian only).
    ldconfig: list[str] = field(default_factory=list)
    #: For each folder where the cache lists libcuda.so.1: that link and libcuda.so, resolved.
    links: dict[str, str] = field(default_factory=dict)
    smi: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    dev: list[str] = field(default_factory=list)
    #: cudaprobe's report as it printed it.
    raw: list[str] = field(default_factory=list)

    def cache(self, soname: str) -> list[str]:
        """The paths `ldconfig -p` gives for a library name, e.g. libcuda.so.1."""
        return [line.split(" => ")[-1] for line in self.ldconfig if line.strip().startswith(soname + " ")]


def cuda_pod(
    kube: Kube,
    cluster: ClusterInfo,
    namespace: str,
    name: str,
    containers: dict[str, tuple[str, str, dict[str, Any]]],
    claims: dict[str, str] | None = None,
) -> None:
    """A pod whose containers run CUDA workload images: `containers` maps a name to (kind, image,
    resources); `claims` maps a pod claim name to its ResourceClaimTemplate."""
    out = out_dir(cluster, namespace, name)
    out.mkdir(parents=True, exist_ok=True)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "volumes": [{"name": "out", "hostPath": {"path": str(out)}}],
        "containers": [
            {
                "name": container,
                "image": image,
                "command": ["sh", "-c", DEBIAN_REPORT]
                if kind == "debian"
                else [PROBE[kind], f"/out/{container}.probe"],
                "env": [{"name": "C", "value": container}],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                "resources": resources,
            }
            for container, (kind, image, resources) in containers.items()
        ],
    }
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimTemplateName": t} for c, t in claims.items()]
    kube.create(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    )


def _terminated(kube: Kube, namespace: str, pod: str, container: str) -> bool:
    status = kube.get("v1", "Pod", pod, namespace).get("status") or {}
    for found in status.get("containerStatuses") or []:
        if found["name"] == container and "terminated" in (found.get("state") or {}):
            return True
    return False


def cuda_seen(
    kube: Kube, cluster: ClusterInfo, namespace: str, pod: str, container: str, kind: str
) -> CudaSeen:
    """What a container of a cuda_pod recorded, once it has."""
    out = out_dir(cluster, namespace, pod)
    if kind == "debian":
        done = (out / f"{container}.done").exists
    else:

        def done() -> bool:
            return _terminated(kube, namespace, pod, container)

    try:
        wait_for(f"{pod}/{container} to record what it sees", done, timeout=120)
    except WaitTimeoutError as err:
        raise WaitTimeoutError(f"{err}\n{kube.describe_pods(namespace)}") from None
    probe_lines = _read(out / f"{container}.probe")
    probe = dict(
        line.split(": ", 1) for line in probe_lines if ": " in line and not line.startswith("device ")
    )
    devices = []
    for line in probe_lines:
        match = re.match(r"device \d+: (\S+) (\d+) (.*)$", line)
        if match:
            devices.append((match[1], int(match[2]), match[3]))
    seen = CudaSeen(kind, probe, devices, raw=probe_lines)
    if kind == "debian":
        seen.ldconfig = _read(out / f"{container}.ldconfig")
        seen.links = dict(line.split(" ", 1) for line in _read(out / f"{container}.links"))
        seen.smi = _read(out / f"{container}.smi")
        seen.env = dict(line.split("=", 1) for line in _read(out / f"{container}.env") if "=" in line)
        seen.dev = sorted(_read(out / f"{container}.dev"))
    return seen


def _read(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def triton_libcuda_dirs(ldconfig: list[str], exists: set[str]) -> list[str]:
    """Where Triton's NVIDIA backend finds libcuda (triton/backends/nvidia/driver.py, libcuda_dirs):
    the folders of the `ldconfig -p` lines naming libcuda.so.1; it fails ("libcuda.so cannot found!")
    unless libcuda.so.1 is in one of them (`exists`: the paths the container has), then links -lcuda."""
    locations = [line.split()[-1] for line in ldconfig if "libcuda.so.1" in line]
    folders = [os.path.dirname(location) for location in locations]
    if not any(f"{folder}/libcuda.so.1" in exists for folder in folders):
        raise AssertionError(f"libcuda.so cannot found! (ldconfig -p: {locations})")
    return folders


class CudaNode(NamedTuple):
    """A containerd cluster with the workload images imported and the driver on it."""

    cluster: ClusterInfo
    kube: Kube
    profile: str
    inventory: Inventory
    #: The image of each container name of IMAGES.
    images: dict[str, str]
    driver: DriverProcess


def import_images(cluster: LocalCluster) -> dict[str, str]:
    """Build (or reuse) the images of IMAGES and import them into the cluster's containerd; each
    container's image name."""
    images = {}
    for container, (kind, compat) in IMAGES.items():
        image = cuda_image(kind, compat)
        cluster.import_image(image)
        images[container] = image.name
    return images


@contextlib.contextmanager
def cuda_node(
    workdir: Path, profile: str, driver_flags: tuple[str, ...], plugin_flags: tuple[str, ...] | None = None
) -> Iterator[CudaNode]:
    """A containerd cluster with the images of IMAGES, the kubelet plugin on `profile` and, given
    `plugin_flags`, the device plugin; both run the hook the image ships (found on PATH)."""
    cluster = LocalCluster(runtime="containerd")
    try:
        info = cluster.start(timeout=180)
        images = import_images(cluster)
        driver = DriverProcess(info, profile, workdir / "driver.log", extra_args=driver_flags).start()
        plugin = None
        if plugin_flags is not None:
            plugin = DevicePluginProcess(info, profile, workdir, plugin_flags, with_driver=True).start()
        kube = Kube(info.kubeconfig)
        ensure_device_classes(kube, committed_device_classes())
        fake = FakeGpuLibrary(load_profile(profile), info.node_name, root=Path(info.fake_gpu_root))
        try:
            yield CudaNode(info, kube, profile, discover(fake), images, driver)
        finally:
            kube.close()
            if plugin is not None:
                plugin.stop()
            assert driver.stop() == 0
            # The hook was found: no warning that containers go without.
            assert "no nvidia-cdi-hook" not in driver.log_path.read_text()
    finally:
        cluster.stop()


@contextlib.contextmanager
def namespace(node: CudaNode) -> Iterator[str]:
    """A namespace of its own, deleted with its pods afterwards."""
    name = f"cuda-{os.urandom(3).hex()}"
    node.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    for pod in node.kube.list_objects("v1", "Pod", namespace=name):
        node.kube.delete("v1", "Pod", pod["metadata"]["name"], name, grace_period=0)
    wait_for("pods to be gone", lambda: not node.kube.list_objects("v1", "Pod", namespace=name), timeout=60)
    node.kube.delete("v1", "Namespace", name)


def run(
    node: CudaNode,
    namespace: str,
    pod: str,
    names: list[str],
    resources: dict[str, Any],
    claims: dict[str, str] | None = None,
) -> dict[str, CudaSeen]:
    """A pod of these containers of IMAGES, each with `resources`; what each saw."""
    containers = {name: (IMAGES[name][0], node.images[name], resources) for name in names}
    cuda_pod(node.kube, node.cluster, namespace, pod, containers, claims)
    return {name: cuda_seen(node.kube, node.cluster, namespace, pod, name, IMAGES[name][0]) for name in names}


def claim_devices(node: CudaNode, namespace: str, pod: str) -> list[Device]:
    """The devices the pod's one claim was allocated."""
    found = [node.inventory.get(name) for name in allocated_devices(pod_claim(node.kube, namespace, pod))]
    assert all(found)
    return [d for d in found if d is not None]


def check(node: CudaNode, name: str, seen: CudaSeen, devices: list[Device]) -> None:
    """What every workload relies on, for container `name` given `devices`."""
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
    # The loader cache lists the driver at the mounted paths (NVIDIA's update-ldcache hook), the
    # forward-compatibility libcuda first when it is newer (enable-cuda-compat).
    first = [f"{COMPAT}/libcuda.so.1"] if compat == NEWER else []
    assert seen.cache("libcuda.so.1") == [*first, f"{LIB}/libcuda.so.1"]
    assert seen.cache("libnvidia-ml.so.1") == [f"{LIB}/libnvidia-ml.so.1"]
    assert seen.cache("libcuda.so") == [f"{LIB}/libcuda.so"]
    # libcuda.so resolves (NVIDIA's create-symlinks hook), to the driver's file.
    version = load_profile(node.profile).driver_version
    assert seen.links[f"{LIB}/libcuda.so"] == f"{LIB}/libcuda.so.{version}"
    # Triton (torch.compile, vLLM) finds libcuda, and -lcuda links there.
    assert LIB in triton_libcuda_dirs(seen.ldconfig, set(seen.links))
    # nvidia-smi -L lists the same devices (a MIG device under its GPU's line).
    listed = {line.split("UUID: ")[1].rstrip(")") for line in seen.smi if "UUID: " in line}
    assert listed == {d.uuid for d in devices} | {d.parent.uuid for d in devices if isinstance(d, MigDevice)}
