"""The node labeller against the real API server and kubelet, under the chart's identity and policy.

The labeller runs as a process with nothing but the chart's identity (the
service account's token bound to a pod on the node), as in test_deploy.py.
It labels its own Node; a pod selecting `nvidia.com/gpu.product` schedules
there; an XID error lowers `nvidia.com/gpu.count` until the GPU is quiet again. The same token may change
only the nvidia.com/ labels it writes and the admin keys, of its own Node only.

Health recovery is not covered: the health tracker never marks a device
healthy again until the driver restarts, so the labels cannot follow a GPU
"back" (docs/node-labels.md).
"""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import DynamicApiError
from localcluster import chart
from localcluster.clusterinfo import ClusterInfo
from localcluster.kube import Kube, Obj, wait_for
from localcluster.labellerprocess import LabellerProcess

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from tests.e2e.test_deploy import _identity_kubeconfig

pytestmark = pytest.mark.cluster

RELEASE = "labels-test"
DRIVER = "gpu.labels-test.dra-gpu.test"
OTHER_NODE = "gpu-node-labels-elsewhere"
PRODUCT = "NVIDIA-L40S"  # profile `mixed`: 2 L40S and 2 T4


@dataclass
class Labelled:
    """The chart's identity in its namespace, the labeller running as it, and a client with its token."""

    namespace: str
    labeller: LabellerProcess
    client: Kube


def _labels(kube: Kube, node: str) -> dict[str, str]:
    return dict(kube.get("v1", "Node", node)["metadata"].get("labels") or {})


@dataclass
class Identity:
    """The chart's account in a namespace of its own: a kubeconfig with its pod-bound token, a client."""

    namespace: str
    kubeconfig: Path
    client: Kube


@contextlib.contextmanager
def chart_identity(
    kube: Kube,
    cluster: ClusterInfo,
    values: dict[str, Any],
    release: str,
    work: Path,
    other_node: str,
    probe_label: str,
    name: str = "driver-identity",
) -> Iterator[Identity]:
    """The chart's ServiceAccount, RBAC and admission policies (rendered with `values`) in a new
    namespace, and a client with the account's token bound to a pod on this node, once the policy
    refuses `probe_label` on `other_node` (a Node made for that). All of it is removed after."""
    namespace = f"t-{release}-{uuid.uuid4().hex[:6]}"
    objects = chart.template(values, release=release, namespace=namespace)
    keep = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy")
    created = [o for o in objects if o["kind"].startswith(keep)]
    [account] = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    kube.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": other_node}})
    client: Kube | None = None
    try:
        kube.create_all(copy.deepcopy(created))
        path = _identity_kubeconfig(kube, cluster, namespace, account, work / f"{name}.kubeconfig", name=name)
        client = Kube(str(path))
        wait_for(
            f"the admission policy to refuse {probe_label} on another node",
            lambda: _refused(lambda: client.patch("v1", "Node", other_node, _set(probe_label, "x"))),
            timeout=30,
        )
        yield Identity(namespace, path, client)
    finally:
        if client is not None:
            client.close()
        kube.delete("v1", "Node", other_node)
        for obj in reversed([o for o in created if "namespace" not in o["metadata"]]):
            kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        kube.delete("v1", "Namespace", namespace)


@pytest.fixture(scope="module")
def labelled(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Labelled]:
    work = tmp_path_factory.mktemp("labels")
    values: dict[str, Any] = {
        "driverName": DRIVER,
        "deviceClasses": {"enabled": False},
        "nodeLabeller": {"enabled": True, "adminLabels": {"gpu-type": "{model}"}},
    }
    with chart_identity(
        kube, cluster, values, RELEASE, work, OTHER_NODE, "nvidia.com/probe", name="labeller-identity"
    ) as identity:
        labeller: LabellerProcess | None = None
        try:
            labeller = LabellerProcess(
                cluster,
                "mixed",
                work,
                str(identity.kubeconfig),
                extra_args=(
                    "--interval=2",
                    "--label-template=gpu-type={model}",
                    "--health-recovery-period=6",
                ),
            ).start()
            yield Labelled(identity.namespace, labeller, identity.client)
        finally:
            if labeller is not None:
                labeller.stop()
            mine = [
                k for k in _labels(kube, cluster.node_name) if k.startswith("nvidia.com/") or k == "gpu-type"
            ]
            kube.patch("v1", "Node", cluster.node_name, {"metadata": {"labels": dict.fromkeys(mine)}})


def _set(key: str, value: str | None) -> Obj:
    return {"metadata": {"labels": {key: value}}}


def _refused(call: Any) -> bool:
    try:
        call()
    except DynamicApiError as err:
        return int(err.status) == 403
    return False


def _refusal(call: Any) -> str:
    with pytest.raises(DynamicApiError) as caught:
        call()
    assert int(caught.value.status) == 403
    return str(caught.value.summary())


def test_the_labeller_labels_its_node_like_gfd(labelled: Labelled, kube: Kube, cluster: ClusterInfo) -> None:
    labels = _labels(kube, cluster.node_name)
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.product"] == PRODUCT
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.family"] == "ada-lovelace"
    assert labels["nvidia.com/mig.strategy"] == "none"
    assert labels["gpu-type"] == "l40s"
    assert labels["kubernetes.io/hostname"] == cluster.node_name  # others' labels stay


def _selecting_pod(kube: Kube, namespace: str, name: str, product: str) -> Obj:
    return kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeSelector": {"nvidia.com/gpu.product": product},
                "tolerations": [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
    )


def test_a_pod_selecting_the_gpu_product_schedules(
    labelled: Labelled, kube: Kube, cluster: ClusterInfo
) -> None:
    _selecting_pod(kube, labelled.namespace, "wants-l40s", PRODUCT)
    running = kube.wait_pod_phase("wants-l40s", labelled.namespace)
    assert running["spec"]["nodeName"] == cluster.node_name


def test_a_pod_selecting_another_product_stays_pending(labelled: Labelled, kube: Kube) -> None:
    _selecting_pod(kube, labelled.namespace, "wants-h100", "NVIDIA-H100-80GB-HBM3")
    event = wait_for(
        "FailedScheduling",
        lambda: next(
            (
                e
                for e in kube.events_for("Pod", "wants-h100", labelled.namespace)
                if e["reason"] == "FailedScheduling"
            ),
            None,
        ),
    )
    assert "didn't match Pod's node affinity/selector" in event["message"]


def test_an_unhealthy_gpu_lowers_the_count_until_it_is_healthy_again(
    labelled: Labelled, kube: Kube, cluster: ClusterInfo
) -> None:
    gpus = discover(FakeGpuLibrary(load_profile("mixed"), cluster.node_name)).gpus
    with labelled.labeller.events.open("a") as events:
        events.write(f"{gpus[1].uuid} 79\n")
    wait_for(
        "gpu.count to drop to 3",
        lambda: _labels(kube, cluster.node_name).get("nvidia.com/gpu.count") == "3",
        timeout=30,
    )
    assert _labels(kube, cluster.node_name)["nvidia.com/gpu.present"] == "true"
    # --health-recovery-period=6: no further XID, so the GPU counts again.
    wait_for(
        "gpu.count to come back to 4",
        lambda: _labels(kube, cluster.node_name).get("nvidia.com/gpu.count") == "4",
        timeout=30,
    )


def test_the_identity_may_set_its_labels_on_its_own_node(labelled: Labelled, cluster: ClusterInfo) -> None:
    # A key of the shape the labeller writes (a MIG profile's count), of no profile the node has.
    probe = "nvidia.com/mig-e2e-probe.count"
    node = labelled.client.patch("v1", "Node", cluster.node_name, _set(probe, "1"))
    assert node["metadata"]["labels"][probe] == "1"
    node = labelled.client.patch("v1", "Node", cluster.node_name, _set(probe, None))
    assert probe not in node["metadata"]["labels"]


def test_the_identity_is_refused_another_node(labelled: Labelled, cluster: ClusterInfo) -> None:
    message = _refusal(
        lambda: labelled.client.patch("v1", "Node", OTHER_NODE, _set("nvidia.com/gpu.count", "9"))
    )
    assert f"on node {cluster.node_name} may not modify node {OTHER_NODE}" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [("team", "a"), ("kubernetes.io/hostname", None), ("gpu-class", "x"), ("nvidia.com/e2e-probe", "1")],
)
def test_the_identity_is_refused_labels_outside_its_prefixes(
    labelled: Labelled, cluster: ClusterInfo, key: str, value: str | None
) -> None:
    message = _refusal(lambda: labelled.client.patch("v1", "Node", cluster.node_name, _set(key, value)))
    assert "may change only the labels it writes (GFD's nvidia.com/ keys) and gpu-type" in message


@pytest.mark.parametrize(
    "patch",
    [
        {"metadata": {"annotations": {"example.com/a": "b"}}},
        {"spec": {"unschedulable": True}},
        {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
    ],
)
def test_the_identity_is_refused_other_node_fields(
    labelled: Labelled, cluster: ClusterInfo, patch: Obj
) -> None:
    message = _refusal(lambda: labelled.client.patch("v1", "Node", cluster.node_name, patch))
    assert "may change only a Node's labels" in message


def test_the_label_policy_type_checks(labelled: Labelled, kube: Kube) -> None:
    name = f"{RELEASE}-dra-gpu-own-node-labels"
    checked = wait_for(
        "the policy's type checking",
        lambda: (
            kube.get("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", name).get("status") or {}
        ).get("typeChecking"),
        timeout=30,
    )
    assert checked.get("expressionWarnings") in (None, []), checked
