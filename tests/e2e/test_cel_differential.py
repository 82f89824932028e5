"""dra.cel against the real API server and kube-scheduler: generated selectors, a hand-made slice.

The API server must reject (at write time) exactly the selectors dra.cel does not compile.

A Node object without a kubelet gets one slice of the driver's fake-GPU devices (under a
driver name of its own, so nothing else on the cluster interferes). For each generated
selector a claim asks for all matching devices with admin access, which lets every
claim take the same devices at once, and a pod that tolerates the node's taints uses
it. What the scheduler does must be what ``dra-gpu explain`` (on dra.cel) predicts:
exactly the matching devices, "cannot allocate all claims" where none matches, or a CEL
runtime error where any device errs (which aborts the whole attempt).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes.dynamic.exceptions import ConflictError, UnprocessibleEntityError
from localcluster.kube import Kube, Obj, wait_for
from localcluster.workloads import allocated_devices

from dra.explain import report as explain
from tests.celgen import SelectorGenerator, devices
from tests.celoracle import compiles

DRIVER = "cel-differential.example.com"
NODE = "cel-differential"
CLASS = "cel-differential"
SEED = 34
# Selectors the API server judges at write time (dry run), and how many of the accepted
# ones the scheduler then allocates.
WRITTEN = 400
SCHEDULED = 120
# One claim holds at most 32 devices, so the pool stays below that: 20 H100 GPUs and
# MIG devices plus the four GPUs of profile `mixed`.
PROFILE_TAGS = ("h100", "mixed")
NO_MATCH = "cannot allocate all claims"
CEL_ERROR = "CEL runtime error"
# ("allocated", devices), or (NO_MATCH or CEL_ERROR, no devices)
Outcome = tuple[str, frozenset[str]]


def _node() -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"cel-differential": ""}},
    }


def _slice() -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-{DRIVER}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices(DRIVER, PROFILE_TAGS),
        },
    }


def _device_class() -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def _claim(name: str, expression: str) -> Obj:
    request = {
        "deviceClassName": CLASS,
        "allocationMode": "All",
        "adminAccess": True,
        "selectors": [{"cel": {"expression": expression}}],
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "all", "exactly": request}]}},
    }


def _pod(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"cel-differential": ""},
            # Whatever taints a node that no kubelet reports on may get.
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "all", "resourceClaimName": name}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "all"}]},
                }
            ],
        },
    }


@pytest.fixture
def kubeletless_node(kube: Kube, namespace: str) -> Iterator[Obj]:
    """A schedulable Node object nobody runs, with the hand-made slice; yields the slice.

    Its pods are deleted at once: no kubelet would ever confirm a graceful deletion.
    """
    kube.create(_node())
    try:
        wait_for("room for pods on the node", lambda: _allow_pods(kube))
        published = kube.create(_slice())
        kube.create(_device_class())
        yield published
    finally:
        for pod in kube.list_objects("v1", "Pod", namespace=namespace):
            kube.delete("v1", "Pod", pod["metadata"]["name"], namespace, grace_period=0)
        kube.delete("resource.k8s.io/v1", "DeviceClass", CLASS)
        kube.delete("resource.k8s.io/v1", "ResourceSlice", _slice()["metadata"]["name"])
        kube.delete("v1", "Node", NODE)


def _allow_pods(kube: Kube) -> bool:
    """Give the node a pod capacity; False where the node controller changed it meanwhile."""
    node = kube.get("v1", "Node", NODE)
    node["status"] = {"capacity": {"pods": "500"}, "allocatable": {"pods": "500"}}
    try:
        kube.replace_status(node)
    except ConflictError:
        return False
    return True


def _predict(claim: Obj, device_class: Obj, published: Obj) -> Outcome:
    [request] = explain.explain_claim(claim, [device_class], [published]).requests
    if request.errors:
        return CEL_ERROR, frozenset()
    if not request.matching:
        return NO_MATCH, frozenset()
    return "allocated", frozenset(request.matching)


def _outcomes(kube: Kube, namespace: str, names: list[str]) -> tuple[dict[str, Outcome], dict[str, str]]:
    """What the scheduler did with each claim so far; the last event of the undecided ones."""
    claims = {
        c["metadata"]["name"]: c for c in kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace)
    }
    failures: dict[str, str] = {}
    for event in kube.list_objects("v1", "Event", namespace=namespace):
        if event.get("reason") == "FailedScheduling":
            failures[event["involvedObject"]["name"]] = event.get("message") or ""
    outcomes = {}
    for name in names:
        allocated = allocated_devices(claims.get(name, {}))
        if allocated:
            outcomes[name] = ("allocated", frozenset(allocated))
        elif CEL_ERROR in failures.get(name, ""):
            outcomes[name] = (CEL_ERROR, frozenset())
        elif NO_MATCH in failures.get(name, ""):
            outcomes[name] = (NO_MATCH, frozenset())
    return outcomes, {name: failures.get(name, "no event yet") for name in names if name not in outcomes}


def _admin_access(kube: Kube, namespace: str) -> None:
    label = {"resource.kubernetes.io/admin-access": "true"}
    kube.patch("v1", "Namespace", namespace, {"metadata": {"labels": label}})


def _accepted(kube: Kube, namespace: str, claim: Obj) -> bool:
    """Whether the API server takes the claim; False where its selector does not compile."""
    try:
        kube.create(claim, namespace=namespace, dry_run=True)
    except UnprocessibleEntityError as err:
        if "compilation failed" not in str(err.body):
            raise
        return False
    return True


def test_the_api_server_rejects_what_dra_cel_does_not_compile(
    kube: Kube, namespace: str, kubeletless_node: Obj
) -> None:
    _admin_access(kube, namespace)
    selectors = SelectorGenerator(kubeletless_node["spec"]["devices"], DRIVER, SEED).selectors(WRITTEN)
    disagreements = []
    for i, expression in enumerate(selectors):
        accepted = _accepted(kube, namespace, _claim(f"written-{i}", expression))
        if accepted != compiles(expression):
            verdict = "accepts" if accepted else "rejects"
            disagreements.append(f"the API server {verdict}, dra.cel does not: {expression}")
    assert not disagreements, f"seed {SEED}:\n" + "\n".join(disagreements)
    assert not all(compiles(e) for e in selectors), "some generated selectors should be ill-typed"


def test_the_scheduler_allocates_what_dra_cel_predicts(
    kube: Kube, namespace: str, kubeletless_node: Obj
) -> None:
    _admin_access(kube, namespace)
    published = kubeletless_node
    generated = SelectorGenerator(published["spec"]["devices"], DRIVER, SEED).selectors(WRITTEN)
    selectors = [e for e in generated if compiles(e)][:SCHEDULED]
    names = [f"selector-{i}" for i in range(len(selectors))]
    predicted = {}
    for name, expression in zip(names, selectors, strict=True):
        claim = kube.create(_claim(name, expression), namespace=namespace)
        predicted[name] = _predict(claim, _device_class(), published)
    for name in names:
        kube.create(_pod(name), namespace=namespace)

    deadline = time.monotonic() + 90
    seen, undecided = _outcomes(kube, namespace, names)
    while undecided and time.monotonic() < deadline:
        time.sleep(0.5)
        seen, undecided = _outcomes(kube, namespace, names)
    assert not undecided, f"the scheduler has not decided on: {undecided}"

    disagreements = [
        f"{name}: scheduler {seen[name][0]} {sorted(seen[name][1])}, dra.cel {predicted[name][0]} "
        f"{sorted(predicted[name][1])}: {expression}"
        for name, expression in zip(names, selectors, strict=True)
        if seen[name] != predicted[name]
    ]
    assert not disagreements, f"seed {SEED}:\n" + "\n".join(disagreements)
    kinds = {outcome[0] for outcome in predicted.values()}
    assert kinds == {"allocated", NO_MATCH, CEL_ERROR}, "the generated selectors should reach every outcome"


def test_known_gap_the_api_server_estimates_cost_and_dra_cel_does_not(kube: Kube, namespace: str) -> None:
    """The API server rejects a selector whose worst-case cost (from unbounded attribute
    strings) exceeds the limit; dra.cel only stops a runaway evaluation at run time."""
    _admin_access(kube, namespace)
    expression = f'[string(device.attributes["{DRIVER}"].uuid), "x"].join("/") == "a"'
    with pytest.raises(UnprocessibleEntityError, match="exceeds cost limit"):
        kube.create(_claim("costly", expression), namespace=namespace, dry_run=True)
    assert compiles(expression)
