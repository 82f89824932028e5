"""NVIDIA's own example specs (tests/e2e/nvidia_specs/, copied unchanged) run on this driver.

Each spec is applied as NVIDIA's docs apply it, every pod it makes must start, and its namespace
is then deleted so that the next spec finds the GPUs free. The consumable-share specs run against
the driver started as NVIDIA's docs start theirs: --consumable-shares=memory, unlimited or 4.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from localcluster.cluster import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, load_manifests, wait_for
from localcluster.workloads import ensure_device_classes

pytestmark = pytest.mark.cluster

SPECS = Path(__file__).parent / "nvidia_specs"
QUICKSTART = sorted(p.name for p in SPECS.glob("quickstart-*.yaml"))
SHARES = {"memory": "memory", "unlimited": "unlimited", "integer": "4"}
#: The fake GPUs each quickstart spec needs: H100s, but A100s where it selects them by name.
PROFILES = {"quickstart-v1-gpu-test6.yaml": str(SPECS / "a100x8.profile.yaml")}


def _pods_expected(docs: list[Obj]) -> int:
    return sum(1 for d in docs if d["kind"] == "Pod") + sum(
        int(d["spec"]["replicas"]) for d in docs if d["kind"] == "Deployment"
    )


def _run(kube: Kube, name: str) -> None:
    """Apply the spec, wait for every pod to run, then delete its namespace and wait for its claims to go."""
    docs = load_manifests((SPECS / name).read_text())
    [namespace] = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
    kube.create_all(docs)
    expected = _pods_expected(docs)
    try:

        def running() -> bool:
            pods = kube.list_objects("v1", "Pod", namespace=namespace)
            return len(pods) == expected and all(p.get("status", {}).get("phase") == "Running" for p in pods)

        wait_for(f"the {expected} pods of {name} to run", running, timeout=90)
    finally:
        for pod in kube.list_objects("v1", "Pod", namespace=namespace):
            kube.delete("v1", "Pod", pod["metadata"]["name"], namespace, grace_period=0)
        kube.delete("v1", "Namespace", namespace)
        wait_for(
            f"the claims of {name} to go",
            lambda: not kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace),
            timeout=90,
        )


@pytest.fixture
def start(cluster: ClusterInfo, kube: Kube, tmp_path: Path) -> Iterator[list[DriverProcess]]:
    """Started drivers, stopped after the test (one at a time)."""
    ensure_device_classes(kube)
    started: list[DriverProcess] = []
    yield started
    for process in started:
        assert process.stop() == 0, process.log_path.read_text()


@pytest.mark.parametrize("name", QUICKSTART)
def test_a_quickstart_spec_runs_unchanged(
    cluster: ClusterInfo, kube: Kube, tmp_path: Path, start: list[DriverProcess], name: str
) -> None:
    start.append(DriverProcess(cluster, PROFILES.get(name, "h100x8"), tmp_path / "driver.log").start())
    _run(kube, name)


@pytest.mark.parametrize("mode", sorted(SHARES))
def test_a_consumable_share_spec_runs_unchanged_with_nvidias_flag(
    cluster: ClusterInfo, kube: Kube, tmp_path: Path, start: list[DriverProcess], mode: str
) -> None:
    flag = f"--consumable-shares={SHARES[mode]}"
    start.append(DriverProcess(cluster, "h100x8", tmp_path / "driver.log", extra_args=(flag,)).start())
    _run(kube, f"consumable-shares-{mode}-sharing.yaml")
