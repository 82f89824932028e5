"""A CUDA workload on a share of a GPU finds its driver as on a whole one; without NVIDIA's hook it
does not (containerd).

As test_cuda_containers.py, on fake GPUs of `h100x8` with gpu-0 shareable: Kubernetes 1.34 checks a
share against the first device of its slice (docs/sharing.md, "Consumable shares"), which on a
node with MIG devices is one of them, so shares get a node of whole GPUs. Two pods each get a
share of gpu-0; every container sees it, through the same loader cache and links. Last, the
driver restarted with a --nvidia-cdi-hook-path that names nothing: one warning, and containers
get the files without the hooks, which is what the warning says a workload then misses.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from localcluster.driverprocess import DriverProcess
from localcluster.workloads import DRIVER, claim_template

from tests.e2e.cudapods import (
    LIB,
    CudaNode,
    check,
    claim_devices,
    cuda_node,
    namespace,
    run,
    triton_libcuda_dirs,
)

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
        claim_template(node.kube, ns, "share", [f'device.attributes["{DRIVER}"].index == 0'], memory="10Gi")
        for pod in ("first", "second"):
            seen = run(
                node, ns, pod, ["debian", "distroless"], {"claims": [{"name": "gpu"}]}, {"gpu": "share"}
            )
            devices = claim_devices(node, ns, pod)
            assert [d.name for d in devices] == ["gpu-0"]
            for name, saw in seen.items():
                check(node, name, saw, devices)


def test_without_the_hook_one_warning_and_the_loader_cache_lists_no_driver(
    node: CudaNode, tmp_path_factory: pytest.TempPathFactory
) -> None:
    node.driver.stop()
    log = tmp_path_factory.mktemp("bare") / "driver.log"
    flags = ("--shareable-gpus=0", "--nvidia-cdi-hook-path=/nonexistent/nvidia-cdi-hook")
    bare = DriverProcess(node.cluster, node.profile, log, extra_args=flags).start()
    try:
        with namespace(node) as ns:
            claim_template(node.kube, ns, "whole", [f'device.attributes["{DRIVER}"].index == 1'])
            seen = run(
                node, ns, "bare", ["debian", "distroless"], {"claims": [{"name": "gpu"}]}, {"gpu": "whole"}
            )
            devices = claim_devices(node, ns, "bare")
    finally:
        assert bare.stop() == 0
    warnings = [line for line in log.read_text().splitlines() if "no executable file there" in line]
    assert len(warnings) == 1, log.read_text()[-3000:]
    debian = seen["debian"]
    # The bug: a cache built without the driver lists none, so Triton stops; no libcuda.so.
    assert debian.cache("libcuda.so.1") == []
    with pytest.raises(AssertionError, match=r"libcuda\.so cannot found"):
        triton_libcuda_dirs(debian.ldconfig, set(debian.links))
    # dlopen by SONAME still finds the SONAME mounts in the loader's multiarch folder.
    for saw in seen.values():
        assert saw.probe["libcuda.so.1"] == f"{LIB}/libcuda.so.1"
        assert [uuid for uuid, _, _ in saw.devices] == [d.uuid for d in devices]
