"""Every example of docs/cel-cookbook.md, run on the real scheduler and kubelet.

The driver runs on docs/examples/cookbook-profile.yaml; each example's pod
must land exactly where the page says, or stay Pending with the page's message.
"""

from __future__ import annotations

import contextlib
import copy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
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

from dra.explain import report as explain
from tests import stubplugin
from tests.e2e.cookbook import Case, load_cases

PROFILE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "cookbook-profile.yaml"
CASES = load_cases()


def test_the_page_has_examples() -> None:
    assert len(CASES) >= 15
    assert all(case.objects for case in CASES), [c.title for c in CASES if not c.objects]


@pytest.fixture(scope="module")
def cookbook_driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    """The driver on the cookbook's fake node."""
    ensure_device_classes(kube)
    process = DriverProcess(cluster, str(PROFILE), tmp_path_factory.mktemp("cookbook") / "driver.log").start()
    yield process
    process.stop()


def _occupy(kube: Kube, cluster: ClusterInfo, namespace: str, devices: tuple[str, ...]) -> list[Obj]:
    """Hold devices (full GPUs, MIG devices) with ordinary pods, as other workloads would, by UUID."""
    slices = kube.list_objects(
        "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={cluster.node_name}"
    )
    found = {
        d["name"]: d["attributes"]
        for s in slices
        if s["spec"]["driver"] == DRIVER
        for d in s["spec"]["devices"]
    }
    claims = []
    for device in devices:
        name = f"busy-{device}"
        uuid, kind = found[device]["uuid"]["string"], found[device]["type"]["string"]
        selector = f'device.attributes["{DRIVER}"].uuid == "{uuid}"'
        claim_template(kube, namespace, name, [selector], device_class=f"{kind}.nvidia.com")
        gpu_pod(kube, namespace, name, name)
        kube.wait_pod_phase(name, namespace)
        claims.append(pod_claim(kube, namespace, name))
    return claims


def _explain(kube: Kube, cluster: ClusterInfo, template: Obj) -> explain.ClaimReport:
    """What dra-gpu explain says about the template, on the same objects the scheduler sees."""
    slices = kube.list_objects(
        "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={cluster.node_name}"
    )
    return explain.explain_claim(
        template,
        kube.list_objects("resource.k8s.io/v1", "DeviceClass"),
        slices,
        kube.list_objects("resource.k8s.io/v1", "ResourceClaim"),
    )


@contextlib.contextmanager
def _foreign_drivers(kube: Kube, cluster: ClusterInfo, case: Case, tmp: Path) -> Iterator[None]:
    """Another driver's slices, published on the test node, with a (stub) kubelet plugin for it."""
    slices = []
    for obj in copy.deepcopy(case.foreign_slices):
        obj["metadata"]["name"] = f"{cluster.node_name}-{obj['metadata']['name']}"
        obj["spec"]["nodeName"] = obj["spec"]["pool"]["name"] = cluster.node_name
        slices.append(obj)
    with contextlib.ExitStack() as stack:
        for driver in sorted({s["spec"]["driver"] for s in slices}):
            stack.enter_context(
                stubplugin.running(driver, Path(cluster.kubelet_root), tmp / f"{driver}.jsonl")
            )
        created = [kube.create(s) for s in slices]
        try:
            yield
        finally:
            for obj in created:
                kube.delete("resource.k8s.io/v1", "ResourceSlice", obj["metadata"]["name"])


def _assert_explain_agrees(report: explain.ClaimReport, case: Case, claim: Obj | None) -> None:
    allocatable = [r for r in report.requests if r.verdict().startswith("can be allocated")]
    text = explain.render(report)
    allocated = allocated_devices(claim) if claim is not None else []
    if not allocated:
        assert not allocatable, f"explain: {allocatable[0].name} can be allocated, the scheduler: no\n{text}"
        message = case.expectation.pending_message or ""
        has_error = any(r.errors for r in report.requests)
        assert has_error == ("cannot allocate" not in message), text
        return
    # The scheduler takes the first allocatable (sub)request, and only devices explain calls free.
    assert allocatable, f"explain says nothing can be allocated; the scheduler allocated {allocated}\n{text}"
    first = allocatable[0]
    assert claim is not None
    assert set(allocated_devices(claim, first.name)) <= set(first.available), text
    # Explain judges requests one by one; constraints across requests narrow what the scheduler takes.
    if len(report.requests) == 1 and first.mode != "All" and first.count == 1 and not case.busy:
        assert set(first.matching) == case.expectation.candidates, text


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_example_lands_where_the_page_says(
    case: Case,
    cookbook_driver: DriverProcess,
    kube: Kube,
    cluster: ClusterInfo,
    namespace: str,
    tmp_path: Path,
) -> None:
    template = copy.deepcopy(case.template)
    requests = template["spec"]["spec"]["devices"]["requests"]
    if any(r.get("exactly", {}).get("adminAccess") for r in requests):
        kube.patch(
            "v1",
            "Namespace",
            namespace,
            {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
        )
    classes = [kube.create(c) for c in case.device_classes]
    stack = contextlib.ExitStack()
    claims: list[Obj] = []
    try:
        stack.enter_context(_foreign_drivers(kube, cluster, case, tmp_path))
        claims += _occupy(kube, cluster, namespace, case.busy)
        kube.create(template, namespace=namespace)
        report = _explain(kube, cluster, template)
        gpu_pod(kube, namespace, "example", template["metadata"]["name"])
        expectation = case.expectation
        if expectation.alternatives:
            kube.wait_pod_phase("example", namespace)
            claim = pod_claim(kube, namespace, "example")
            claims.append(claim)
            devices = allocated_devices(claim)
            assert expectation.allows(devices), f"{case.title}: got {devices}, the page says {expectation}"
            _assert_explain_agrees(report, case, claim)
        else:
            event = wait_for(
                "the scheduler's verdict",
                lambda: next(
                    (
                        e
                        for e in kube.events_for("Pod", "example", namespace)
                        if e["reason"] == "FailedScheduling"
                    ),
                    None,
                ),
            )
            assert expectation.pending_message is not None
            assert expectation.pending_message in event["message"]
            assert kube.get("v1", "Pod", "example", namespace)["status"]["phase"] == "Pending"
            _assert_explain_agrees(report, case, None)
    finally:
        delete_pods_and_wait(kube, cluster, namespace, claims)
        stack.close()
        for device_class in classes:
            kube.delete("resource.k8s.io/v1", "DeviceClass", device_class["metadata"]["name"])


def test_explain_command_on_a_pending_claim_in_the_cluster(
    cookbook_driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    [case] = [c for c in CASES if c.id == "marketed-memory"]
    kube.create(copy.deepcopy(case.template), namespace=namespace)
    gpu_pod(kube, namespace, "waiting", case.template["metadata"]["name"])
    claim_name = wait_for(
        "the claim generated for the pod",
        lambda: (kube.get("v1", "Pod", "waiting", namespace)["status"].get("resourceClaimStatuses") or [{}])[
            0
        ].get("resourceClaimName"),
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dra",
            "explain",
            f"--claim={namespace}/{claim_name}",
            f"--node-name={cluster.node_name}",
            f"--kubeconfig={cluster.kubeconfig}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"claim {namespace}/{claim_name}" in result.stdout
    assert "memory is 81559Mi" in result.stdout
    assert "=> 0 device(s) match, 1 needed: cannot be allocated" in result.stdout
    delete_pods_and_wait(kube, cluster, namespace, [])
