"""A CUDA workload finds its driver: real containers, real loaders, NVIDIA's hooks (containerd).

A cluster of its own on containerd with fake GPUs of `h100x8-mig` made visible to real containers
(--fake-gpu-root: device nodes, ELF driver libraries, the fake CUDA driver and nvidia-smi), the
kubelet plugin on GPUs 0, 1 and 4-7 and the device plugin on GPUs 2 and 3, both running NVIDIA's
nvidia-cdi-hook from their specs as the image ships it (found on PATH, copied into the plugin
directory). The pods run the workload images of localcluster.cudaimages (tests/e2e/cudapods.py),
whose loader cache was built without a driver: a Debian image with ldconfig and a distroless one
without, each also with CUDA forward-compatibility libraries newer and older than the driver.
Each container checks what a workload relies on (cudapods.check): `ldconfig -p` lists the driver
at the mounted paths, libcuda.so resolves, Triton's lookup finds libcuda, cudaprobe loads both
libraries by SONAME and CUDA enumerates exactly the claim's devices, and the compat libcuda is the
one loaded exactly when it is newer than the driver. Shares: test_cuda_container_shares.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from localcluster.workloads import DRIVER, claim_template

from dra.model.devices import MigDevice
from tests.e2e.cudapods import IMAGES, CudaNode, check, claim_devices, cuda_node, namespace, run

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]

PROFILE = "h100x8-mig"
SPLIT = "--device-plugin-gpus=2,3"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CudaNode]:
    """The containerd cluster with the workload images, the kubelet plugin and the device plugin."""
    if os.geteuid() != 0:
        pytest.skip("containerd and runc run as root")
    with cuda_node(tmp_path_factory.mktemp("cuda"), PROFILE, (SPLIT,), (SPLIT,)) as made:
        yield made


@pytest.fixture
def ns(node: CudaNode) -> Iterator[str]:
    """A namespace per test."""
    with namespace(node) as name:
        yield name


def test_a_whole_gpu_claim_every_image(node: CudaNode, ns: str) -> None:
    claim_template(node.kube, ns, "whole", [f'device.attributes["{DRIVER}"].index == 1'])
    seen = run(node, ns, "whole", list(IMAGES), {"claims": [{"name": "gpu"}]}, {"gpu": "whole"})
    devices = claim_devices(node, ns, "whole")
    for name, saw in seen.items():
        check(node, name, saw, devices)


def test_a_mig_device_claim(node: CudaNode, ns: str) -> None:
    claim_template(
        node.kube,
        ns,
        "mig",
        [f'device.attributes["{DRIVER}"].profile == "1g.10gb"'],
        device_class="mig.nvidia.com",
    )
    seen = run(node, ns, "mig", ["debian", "distroless"], {"claims": [{"name": "gpu"}]}, {"gpu": "mig"})
    (device,) = claim_devices(node, ns, "mig")
    assert isinstance(device, MigDevice)
    for name, saw in seen.items():
        check(node, name, saw, [device])
        assert saw.devices[0][2] == f"{device.parent.product_name} MIG 1g.10gb"


def test_the_device_plugins_gpus(node: CudaNode, ns: str) -> None:
    seen = run(node, ns, "legacy", ["debian", "distroless"], {"limits": {"nvidia.com/gpu": "1"}})
    given = {d.uuid: d for d in node.inventory if d.name in ("gpu-2", "gpu-3")}
    for name, saw in seen.items():
        (uuid,) = [u for u, _, _ in saw.devices]
        check(node, name, saw, [given[uuid]])
    assert {saw.devices[0][0] for saw in seen.values()} == set(given)
