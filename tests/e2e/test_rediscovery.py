"""Devices that change under a running driver: a new MIG layout, a GPU that vanishes or appears.

The driver runs on a profile file it re-reads every half second, as it would
re-read NVML; the slices follow under a new pool generation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claim_template,
    delete_pods_and_wait,
    ensure_device_classes,
    gpu_pod,
    pod_claim,
)

SEVEN_SMALL = {"model": "a100-sxm4-40gb", "mig": ["1g.5gb"] * 7}
TWO_LARGE = {"model": "a100-sxm4-40gb", "mig": ["3g.20gb", "4g.20gb"]}
T4 = {"model": "t4"}


def _write(path: Path, *gpus: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump({"gpus": list(gpus)}))


@pytest.fixture(scope="module")
def profile_and_driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, DriverProcess]]:
    """The driver on a profile file, re-discovering every 0.5 s."""
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("rediscovery")
    profile = workdir / "profile.yaml"
    _write(profile, SEVEN_SMALL, T4)
    driver = DriverProcess(
        cluster, str(profile), workdir / "driver.log", extra_args=("--rediscover-interval=0.5",)
    ).start()
    yield profile, driver
    driver.stop()


def _pool(kube: Kube, cluster: ClusterInfo) -> tuple[int, list[str]]:
    slices = kube.list_objects(
        "resource.k8s.io/v1",
        "ResourceSlice",
        field_selector=f"spec.driver={DRIVER},spec.nodeName={cluster.node_name}",
    )
    generations = {s["spec"]["pool"]["generation"] for s in slices}
    assert len(generations) == 1, f"slices of one pool carry one generation, got {generations}"
    return generations.pop(), sorted(d["name"] for s in slices for d in s["spec"]["devices"])


def _pool_if(
    kube: Kube, cluster: ClusterInfo, wanted: Callable[[list[str]], bool]
) -> tuple[int, list[str]] | None:
    pool = _pool(kube, cluster)
    return pool if wanted(pool[1]) else None


def test_a_new_mig_layout_is_published_and_prepared_claims_survive_it(
    profile_and_driver: tuple[Path, DriverProcess], kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    profile, _ = profile_and_driver
    generation, devices = wait_for("the first layout", lambda: _pool_if(kube, cluster, lambda d: len(d) == 8))
    assert "gpu-0-mig-1g5gb-7-0" in devices

    claim_template(
        kube,
        namespace,
        "small",
        ['device.attributes["gpu.nvidia.com"].profile == "1g.5gb"'],
        device_class="mig.nvidia.com",
    )
    gpu_pod(kube, namespace, "before", "small")
    kube.wait_pod_phase("before", namespace)
    before: Obj = pod_claim(kube, namespace, "before")

    _write(profile, TWO_LARGE, T4)
    new_generation, devices = wait_for(
        "the new MIG layout in the slices",
        lambda: _pool_if(kube, cluster, lambda d: "gpu-0-mig-4g20gb-2-0" in d),
        timeout=30,
    )
    assert new_generation > generation
    assert devices == ["gpu-0-mig-3g20gb-1-0", "gpu-0-mig-4g20gb-2-0", "gpu-1"]

    claim_template(
        kube,
        namespace,
        "large",
        ['device.attributes["gpu.nvidia.com"].profile == "4g.20gb"'],
        device_class="mig.nvidia.com",
    )
    gpu_pod(kube, namespace, "after", "large")
    kube.wait_pod_phase("after", namespace)
    after = pod_claim(kube, namespace, "after")
    assert allocated_devices(after) == ["gpu-0-mig-4g20gb-2-0"]
    # The first pod keeps its (now gone) device until it ends; unprepare still works.
    assert kube.get("v1", "Pod", "before", namespace)["status"]["phase"] == "Running"
    delete_pods_and_wait(kube, cluster, namespace, [before, after])


def test_a_vanished_gpu_leaves_and_a_new_one_waits_for_a_restart(
    profile_and_driver: tuple[Path, DriverProcess], kube: Kube, cluster: ClusterInfo
) -> None:
    profile, driver = profile_and_driver
    _write(profile, TWO_LARGE)
    wait_for("gpu-1 to leave the slices", lambda: "gpu-1" not in _pool(kube, cluster)[1], timeout=30)

    _write(profile, TWO_LARGE, T4, T4)
    wait_for("gpu-1 to come back", lambda: "gpu-1" in _pool(kube, cluster)[1], timeout=30)
    wait_for(
        "the driver to report the GPU it was not given",
        lambda: (
            "GPU 2 (" in driver.log_path.read_text()
            and "restart the driver to assign it" in driver.log_path.read_text()
        ),
    )
    assert "gpu-2" not in _pool(kube, cluster)[1]
