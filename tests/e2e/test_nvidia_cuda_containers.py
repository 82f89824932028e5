"""NVIDIA's DRA driver and this one, in turn, on the same node: what a CUDA workload's container sees.

The containers of tests/e2e/cudapods.py (Debian and distroless workload images, with and without
newer CUDA forward-compatibility libraries) run on a containerd cluster over one fake node
(fakenvml.node: the fake NVML and fake CUDA driver in its driver root, under usr/lib64), first with
this driver serving their claims, then with NVIDIA's gpu-kubelet-plugin (localcluster.nvidiadriver)
in its place, each running NVIDIA's nvidia-cdi-hook from its specs. What each container sees (the
loader cache's driver entries, libcuda.so.1 and libcuda.so, the libraries the loader maps, the
devices CUDA and nvidia-smi list, its device nodes and environment) is compared; the differences
must be exactly the ones docs/migration.md explains ("What a container sees").
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from fakenvml.node import FakeNode
from localcluster.cluster import LocalCluster
from localcluster.driverprocess import DaemonProcess
from localcluster.kube import Kube
from localcluster.workloads import claim_template

from tests.e2e.cudapods import IMAGES, CudaSeen, cuda_pod, cuda_seen, import_images
from tests.e2e.differential import OURS, THEIRS, Key
from tests.e2e.test_nvidia_differential import MIGRATION, Turns, delete_namespace

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]

PROFILE = "h100x8-mig"
#: The pods: a whole GPU (by UUID) for every image, and for the two kinds the one static MIG device of
#: its profile on GPU 4 (a profile GPU 4 has twice would let each driver pick another).
PODS = {
    "whole": ("gpu.nvidia.com", 'device.attributes["gpu.nvidia.com"].uuid == "{gpu1}"', list(IMAGES)),
    "mig": (
        "mig.nvidia.com",
        'device.attributes["gpu.nvidia.com"].profile == "3g.40gb" && '
        'device.attributes["gpu.nvidia.com"].parentUUID == "{gpu4}"',
        ["debian", "distroless"],
    ),
}
#: What differs in what the containers see, each explained in docs/migration.md.
CONTAINERS: set[Key] = {
    # Ours: each device's name, UUID and product, and the claim, in the environment.
    ("container", "env", "DRA_GPU_*", OURS),
}


@pytest.fixture(scope="module")
def turns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Turns, dict[str, str]]]:
    """A containerd cluster with the workload images; the drivers' turns on it."""
    if os.geteuid() != 0:
        pytest.skip("containerd and runc run as root")
    cluster = LocalCluster(runtime="containerd")
    try:
        info = cluster.start(timeout=180)
        images = import_images(cluster)
        kube = Kube(info.kubeconfig)
        try:
            yield Turns(info, kube, tmp_path_factory.mktemp("turns")), images
        finally:
            kube.close()
    finally:
        cluster.stop()


def _seen(turns: Turns, images: dict[str, str], driver: DaemonProcess, node: FakeNode) -> dict[str, CudaSeen]:
    """What every container of PODS saw, with this driver serving the claims."""
    fake = node.config.fake_gpus()
    uuids = {f"gpu{i}": fake.uuid(fake.device_by_index(i)) for i in range(fake.device_count())}
    namespace = f"cuda-{uuid.uuid4().hex[:6]}"
    kube, cluster = turns.kube, turns.cluster
    seen: dict[str, CudaSeen] = {}
    with turns.running(driver):
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        try:
            for pod, (device_class, selector, names) in PODS.items():
                claim_template(kube, namespace, pod, [selector.format(**uuids)], device_class=device_class)
                containers = {n: (IMAGES[n][0], images[n], {"claims": [{"name": "gpu"}]}) for n in names}
                cuda_pod(kube, cluster, namespace, pod, containers, {"gpu": pod})
            for pod, (_, _, names) in PODS.items():
                for name in names:
                    seen[f"{pod}/{name}"] = cuda_seen(kube, cluster, namespace, pod, name, IMAGES[name][0])
        finally:
            delete_namespace(kube, namespace, cluster.cdi_dir)
    return seen


def _driver_lines(seen: CudaSeen) -> list[str]:
    return [line.strip() for line in seen.ldconfig if "libcuda" in line or "libnvidia-ml" in line]


def container_differences(ours: CudaSeen, theirs: CudaSeen) -> set[Key]:
    """How what two containers of the same pod saw differs, as keys."""
    found: set[Key] = set()
    for what, mine, their in [
        ("loader cache", _driver_lines(ours), _driver_lines(theirs)),
        ("links", ours.links, theirs.links),
        ("libraries loaded", ours.probe, theirs.probe),
        ("cuda devices", ours.devices, theirs.devices),
        ("nvidia-smi", ours.smi, theirs.smi),
        ("device nodes", ours.dev, theirs.dev),
    ]:
        if mine != their:
            found.add(("container", what))
    for name in set(ours.env) | set(theirs.env):
        generic = "DRA_GPU_*" if name.startswith("DRA_GPU_") else name
        if name not in theirs.env:
            found.add(("container", "env", generic, OURS))
        elif name not in ours.env:
            found.add(("container", "env", generic, THEIRS))
        elif ours.env[name] != theirs.env[name] and name != "HOSTNAME":
            found.add(("container", "env", generic, "value"))
    return found


def test_a_cuda_workload_sees_the_same_under_either_driver(turns: tuple[Turns, dict[str, str]]) -> None:
    driver_turns, images = turns
    node = driver_turns.node(PROFILE)
    ours = _seen(driver_turns, images, driver_turns.ours(node), node)
    theirs = _seen(driver_turns, images, driver_turns.nvidia(node), node)
    assert set(ours) == set(theirs)
    found: set[Key] = set()
    details: dict[str, tuple[set[Key], CudaSeen, CudaSeen]] = {}
    for container in ours:
        # Either way the workload finds its driver: loaded by SONAME, its devices listed.
        assert ours[container].probe.get("cuInit") == "0", (container, ours[container].raw)
        assert theirs[container].probe.get("cuInit") == "0", (container, theirs[container].raw)
        differences = container_differences(ours[container], theirs[container])
        details[container] = (differences - CONTAINERS, ours[container], theirs[container])
        found |= differences
    assert found == CONTAINERS, (
        f"undocumented: {sorted(found - CONTAINERS)}; documented, not seen: {sorted(CONTAINERS - found)}; "
        f"where: {[(c, sorted(d), o, t) for c, (d, o, t) in details.items() if d]}"
    )


def test_every_container_difference_is_in_docs_migration_md() -> None:
    text = MIGRATION.read_text()
    missing = [" · ".join(key) for key in sorted(CONTAINERS) if " · ".join(key) not in text]
    assert not missing, f"docs/migration.md lists no row for: {missing}"
