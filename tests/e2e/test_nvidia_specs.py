"""NVIDIA's own example specs (tests/e2e/nvidia_specs/, copied unchanged) run on this driver.

Each spec is applied as NVIDIA's docs and tests apply it, every pod it makes must start, and its
namespace is then deleted so that the next spec finds the GPUs free. A spec without a Namespace
(NVIDIA's bats specs) goes into a fresh namespace, as `kubectl apply -n` puts it; a template of
NVIDIA's e2e framework gets the namespace its `{{ .Namespace }}` asks for, as `framework.Render`
fills it in. The consumable-share specs run against the driver started with the
--consumable-shares value NVIDIA runs each with; where NVIDIA's test checks that the claims share
one device, so does this one.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from localcluster.cluster import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, load_manifests, wait_for
from localcluster.workloads import allocated_devices, ensure_device_classes

pytestmark = pytest.mark.cluster

SPECS = Path(__file__).parent / "nvidia_specs"
QUICKSTART = sorted(p.name for p in SPECS.glob("quickstart-*.yaml"))
#: Each consumable-share spec, the --consumable-shares value NVIDIA runs it with (its demo README,
#: its bats setup_file: 4; its e2e framework: the mode the spec is named for), and whether NVIDIA's
#: test checks that its claims share one device.
SHARES = {
    "consumable-shares-memory-sharing.yaml": ("memory", False),
    "consumable-shares-unlimited-sharing.yaml": ("unlimited", False),
    "consumable-shares-integer-sharing.yaml": ("4", False),
    "bats-gpu-consumable-shares-memory.yaml": ("4", True),
    "bats-gpu-consumable-shares-integer.yaml": ("4", True),
    "e2e-consumable-shares-memory.yaml.tmpl": ("memory", True),
    "e2e-consumable-shares-unlimited.yaml.tmpl": ("unlimited", True),
}
#: The fake GPUs each quickstart spec needs: H100s, but A100s where it selects them by name.
PROFILES = {"quickstart-v1-gpu-test6.yaml": str(SPECS / "a100x8.profile.yaml")}


def _pods_expected(docs: list[Obj]) -> int:
    return sum(1 for d in docs if d["kind"] == "Pod") + sum(
        int(d["spec"]["replicas"]) for d in docs if d["kind"] == "Deployment"
    )


def _load(name: str) -> tuple[list[Obj], str]:
    """The spec's objects, a Namespace first, and that namespace."""
    fresh = f"nv-{uuid.uuid4().hex[:8]}"
    text = (SPECS / name).read_text().replace("{{ .Namespace }}", fresh)
    docs = load_manifests(text)
    named = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
    if named:
        return docs, named[0]
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": fresh}}, *docs], fresh


@contextlib.contextmanager
def _applied(kube: Kube, name: str) -> Iterator[tuple[list[Obj], str]]:
    """The spec applied: its objects and namespace; then its namespace deleted, and its claims gone."""
    docs, namespace = _load(name)
    for doc in docs:
        kube.create(doc, None if doc["kind"] == "Namespace" else namespace)
    try:
        yield docs, namespace
    finally:
        for pod in kube.list_objects("v1", "Pod", namespace=namespace):
            kube.delete("v1", "Pod", pod["metadata"]["name"], namespace, grace_period=0)
        kube.delete("v1", "Namespace", namespace)
        wait_for(
            f"the claims of {name} to go",
            lambda: not kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace),
            timeout=90,
        )


def _run(kube: Kube, name: str, same_device: bool = False) -> None:
    """Apply the spec and wait for every pod to run (and, if asked, for its claims to share one device)."""
    with _applied(kube, name) as (docs, namespace):
        expected = _pods_expected(docs)

        def running() -> bool:
            pods = kube.list_objects("v1", "Pod", namespace=namespace)
            return len(pods) == expected and all(p.get("status", {}).get("phase") == "Running" for p in pods)

        wait_for(f"the {expected} pods of {name} to run", running, timeout=90)
        if same_device:
            claims = kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace)
            assert len({tuple(allocated_devices(c)) for c in claims}) == 1, claims


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


@pytest.mark.parametrize("name", sorted(SHARES))
def test_a_consumable_share_spec_runs_unchanged_with_nvidias_flag(
    cluster: ClusterInfo, kube: Kube, tmp_path: Path, start: list[DriverProcess], name: str
) -> None:
    value, same_device = SHARES[name]
    flag = f"--consumable-shares={value}"
    start.append(DriverProcess(cluster, "h100x8", tmp_path / "driver.log", extra_args=(flag,)).start())
    _run(kube, name, same_device)


def test_nvidias_mps_spec_is_refused_under_four_shares_as_nvidias_bats_test_expects(
    cluster: ClusterInfo, kube: Kube, tmp_path: Path, start: list[DriverProcess]
) -> None:
    # NVIDIA's driver refuses MPS with consumable shares; here MPS limits follow the share, and
    # the spec's 50 % is above one of four shares (docs/sharing.md).
    start.append(
        DriverProcess(
            cluster, "h100x8", tmp_path / "driver.log", extra_args=("--consumable-shares=4",)
        ).start()
    )
    with _applied(kube, "bats-gpu-mps.yaml") as (_, namespace):

        def refusal() -> str | None:
            messages = [e.get("message") or "" for e in kube.list_objects("v1", "Event", namespace=namespace)]
            return next((m for m in messages if "active thread percentage" in m), None)

        message = wait_for("the claim's refusal", refusal, timeout=60)
        assert "active thread percentage 50 is above its share (25: 1 of 4 shares)" in message
        assert kube.get("v1", "Pod", "pod-mps", namespace)["status"].get("phase") == "Pending"
