"""A CUDA workload on a share of a GPU finds its driver as on a whole one (containerd).

As test_cuda_containers.py, on fake GPUs of `h100x8` with gpu-0 shareable: Kubernetes 1.34 checks a
share against the first device of its slice (docs/sharing.md, "Consumable shares"), which on a
node with MIG devices is one of them, so shares get a node of whole GPUs. Two pods each get a
share of gpu-0; every container sees it, through the same loader cache and links.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from localcluster.workloads import DRIVER

from tests.e2e.cudapods import CudaNode, check, claim_devices, cuda_node, namespace, run, template

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CudaNode]:
    """The containerd cluster with the workload images and the kubelet plugin, gpu-0 shareable."""
    if os.geteuid() != 0:
        pytest.skip("containerd and runc run as root")
    with cuda_node(tmp_path_factory.mktemp("cuda"), "h100x8", ("--shareable-gpus=0",)) as made:
        yield made


def test_shares_of_a_gpu(node: CudaNode) -> None:
    with namespace(node) as ns:
        template(
            node.kube, ns, "share", "gpu.nvidia.com", f'device.attributes["{DRIVER}"].index == 0', "10Gi"
        )
        for pod in ("first", "second"):
            seen = run(
                node, ns, pod, ["debian", "distroless"], {"claims": [{"name": "gpu"}]}, {"gpu": "share"}
            )
            devices = claim_devices(node, ns, pod)
            assert [d.name for d in devices] == ["gpu-0"]
            for name, saw in seen.items():
                check(node, name, saw, devices)
