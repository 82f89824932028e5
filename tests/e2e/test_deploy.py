"""What deploy/ installs, against the real API server of the local cluster.

- Every render (chart defaults, fake GPUs, the exact kind values of
  deploy/kind/up.sh, and the plain manifests via `kubectl apply -k`) passes a
  server-side dry run; the cluster-scoped objects are created for real. The
  PodMonitor passes one against the Prometheus Operator's own CRD.
- The driver runs as a process with nothing but the chart's identity: the
  token of its service account bound to a pod on the node (as the kubelet
  mounts it into the DaemonSet's pods), under the chart's RBAC and admission
  policy. It publishes its slices and becomes ready; the same token is refused
  another node's slices by the policy, and anything outside the role by RBAC.
- With that token the driver writes its entries of status.devices in a claim
  allocated on its node; the policy refuses them in a claim allocated elsewhere,
  and any change to another driver's entries or to the allocation.

The node name in the token comes from ServiceAccountTokenPodNodeInfo, GA and
locked on since Kubernetes 1.32: the harness needs no feature gate for it.
The objects here use their own driver, class and release names, so they never
meet tests/e2e/test_driver.py's gpu.nvidia.com.
"""

from __future__ import annotations

import copy
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import kubernetes
import pytest
import yaml
from kubernetes.dynamic.exceptions import DynamicApiError
from localcluster import chart, promoperator
from localcluster.binaries import ensure_binary
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, load_manifests, wait_for

from dra.adapters.kube import KubeClient, KubeError

DRIVER = "gpu.deploy-test.dra-gpu.test"
RELEASE = "deploy-test"
OTHER_NODE = "gpu-node-elsewhere"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
RESOURCE_API = "resource.k8s.io/v1"
POLICY_API = "admissionregistration.k8s.io/v1"


def _values(node: str) -> dict[str, Any]:
    return {
        "driverName": DRIVER,
        "deviceClasses": {
            "gpu": {"name": f"gpu.{DRIVER}"},
            "mig": {"name": f"mig.{DRIVER}"},
            "vfio": {"name": f"vfio.{DRIVER}"},
        },
        # The local node gets profile `mixed` (4 GPUs) through the chart's per-node map.
        "fakeGpus": {"enabled": True, "profile": "h100x8", "nodes": {node: "mixed"}},
    }


def _kubectl(cluster: ClusterInfo, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ensure_binary("kubectl")), f"--kubeconfig={cluster.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def _server_dry_run(cluster: ClusterInfo, *args: str, stdin: str | None = None) -> str:
    result = _kubectl(
        cluster,
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "--field-manager=dra-gpu-deploy-test",
        *args,
        stdin=stdin,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def chart_namespace(kube: Kube) -> Iterator[str]:
    """The namespace the plain manifests and the kind values name (dra-gpu), for dry runs."""
    created = kube.get_or_none("v1", "Namespace", chart.MANIFEST_NAMESPACE) is None
    if created:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": chart.MANIFEST_NAMESPACE}})
    yield chart.MANIFEST_NAMESPACE
    if created:
        kube.delete("v1", "Namespace", chart.MANIFEST_NAMESPACE)


def _applied(output: str) -> list[str]:
    return [line.split()[0] for line in output.splitlines() if "serverside-applied (server dry run)" in line]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"fakeGpus": {"enabled": True}, "rbac": {"claimEvents": True}}, id="fake-gpus"),
        pytest.param({"nvml": {"runtimeClassName": "nvidia"}, "nodeSelector": {"a": "b"}}, id="real-gpus"),
        pytest.param(
            {"devicePlugin": {"enabled": True}, "gpuAssignment": {"devicePlugin": "model=Tesla T4"}},
            id="device-plugin",
        ),
        pytest.param(
            {
                "kubeletPlugin": {"enabled": False},
                "devicePlugin": {
                    "enabled": True,
                    "migStrategy": "single",
                    "config": {"data": "version: v1\n"},
                },
            },
            id="device-plugin-config",
        ),
        pytest.param(
            {
                "fakeGpus": {"enabled": True},
                "devicePlugin": {"enabled": True, "config": {"data": "version: v1\n"}},
                "gpuAssignment": {"devicePlugin": "none"},
                "nodeLabeller": {"enabled": True, "adminLabels": {"gpu-type": "{model}"}},
            },
            id="node-labeller",
        ),
        # CAP_SYS_ADMIN and CAP_SETPCAP with escalation allowed: what the API accepts with them.
        pytest.param({"kubeletPlugin": {"mps": {"enabled": True}}}, id="mps"),
        pytest.param(
            {"grafanaDashboard": {"enabled": True}, "kubeletPlugin": {"claimMetricsInterval": 2.5}},
            id="grafana-dashboard",
        ),
    ],
)
def test_chart_render_passes_server_side_dry_run(
    cluster: ClusterInfo, chart_namespace: str, values: dict[str, Any]
) -> None:
    text = chart.template_text(values, namespace=chart_namespace)
    applied = _applied(_server_dry_run(cluster, "-f", "-", stdin=text))
    assert len(applied) == len(chart.template(values, namespace=chart_namespace))
    assert f"daemonset.apps/{chart.MANIFEST_RELEASE}" in applied


def test_kind_values_of_up_sh_pass_server_side_dry_run(cluster: ClusterInfo, chart_namespace: str) -> None:
    args = chart.kind_chart_args()
    namespace = args[args.index("--namespace") + 1]
    assert namespace == chart_namespace
    text = chart.template_text(release=args[0], namespace=namespace, extra=args[2:])
    applied = _applied(_server_dry_run(cluster, "-f", "-", stdin=text))
    assert f"configmap/{args[0]}-fake-gpus" in applied
    assert "deviceclass.resource.k8s.io/gpu.nvidia.com" in applied


def test_plain_manifests_pass_kubectl_apply_k_dry_run(cluster: ClusterInfo, chart_namespace: str) -> None:
    applied = _applied(_server_dry_run(cluster, "-k", str(chart.MANIFESTS)))
    kinds = sorted(name.split("/")[0] for name in applied)
    assert kinds == sorted(
        [
            "namespace",
            "serviceaccount",
            "clusterrole.rbac.authorization.k8s.io",
            "clusterrolebinding.rbac.authorization.k8s.io",
            "daemonset.apps",
            # gpu.nvidia.com, mig.nvidia.com and vfio.gpu.nvidia.com
            "deviceclass.resource.k8s.io",
            "deviceclass.resource.k8s.io",
            "deviceclass.resource.k8s.io",
            "validatingadmissionpolicy.admissionregistration.k8s.io",
            "validatingadmissionpolicy.admissionregistration.k8s.io",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io",
            "validatingadmissionpolicybinding.admissionregistration.k8s.io",
        ]
    )


@pytest.fixture(scope="module")
def pod_monitors(kube: Kube) -> Iterator[None]:
    """The Prometheus Operator's PodMonitor CRD, as the operator publishes it, installed for the module."""
    path = promoperator.crd("podmonitors")  # pinned by hash: a fetch that fails is an error, not a skip
    [crd] = load_manifests(path.read_text())
    created = kube.get_or_none(crd["apiVersion"], crd["kind"], crd["metadata"]["name"]) is None
    if created:
        kube.create(crd)

    def established() -> bool:
        got = kube.get(crd["apiVersion"], crd["kind"], crd["metadata"]["name"])
        conditions = got.get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for("the PodMonitor CRD to be served", established, timeout=30)
    yield
    if created:
        kube.delete(crd["apiVersion"], crd["kind"], crd["metadata"]["name"])


def test_the_pod_monitor_passes_the_prometheus_operators_own_schema(
    cluster: ClusterInfo, chart_namespace: str, pod_monitors: None
) -> None:
    values = {
        "podMonitor": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "interval": "30s",
            "scrapeTimeout": "10s",
            "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}],
            "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}],
        },
        "devicePlugin": {"enabled": True},
        "gpuAssignment": {"devicePlugin": "6,7"},
        "nodeLabeller": {"enabled": True},
        "webhook": {"enabled": True},
    }
    text = chart.template_text(values, namespace=chart_namespace)
    # kubectl validates strictly: a field the CRD's schema lacks would be refused, not dropped.
    applied = _applied(_server_dry_run(cluster, "-f", "-", stdin=text))
    assert f"podmonitor.monitoring.coreos.com/{chart.MANIFEST_RELEASE}" in applied
    [monitor] = [o for o in chart.template(values, namespace=chart_namespace) if o["kind"] == "PodMonitor"]
    misspelled = copy.deepcopy(monitor)
    misspelled["spec"]["podMetricsEndpoints"][0]["honorLabel"] = True
    refused = _kubectl(
        cluster, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(misspelled)
    )
    assert refused.returncode != 0
    assert ".spec.podMetricsEndpoints[0].honorLabel: field not declared in schema" in refused.stderr


def _cluster_scoped(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if "namespace" not in o["metadata"]]


def _delete_all(kube: Kube, objects: list[Obj]) -> None:
    for obj in reversed(objects):
        meta = obj["metadata"]
        kube.delete(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))


def test_cluster_scoped_objects_are_created_and_the_policy_type_checks(kube: Kube) -> None:
    """DeviceClass CEL compiles at create; the policy's validations type-check against the 1.34 schema.

    (The API server type-checks validations and messages, not variables: the tests below prove
    the variables' field names by what the policy lets through and refuses.)
    """
    objects = _cluster_scoped(chart.template(_values("any-node"), release=f"{RELEASE}-create"))
    assert sorted(o["kind"] for o in objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "DeviceClass",
        "DeviceClass",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
    ]
    try:
        kube.create_all(copy.deepcopy(objects))
        for policy in [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]:
            name = policy["metadata"]["name"]

            def type_checking(name: str = name) -> Obj | None:
                stored = kube.get(POLICY_API, "ValidatingAdmissionPolicy", name)
                checking: Obj | None = (stored.get("status") or {}).get("typeChecking")
                return checking

            checked = wait_for(f"the type checking of {name}", type_checking, timeout=30)
            assert checked.get("expressionWarnings") in (None, []), checked
    finally:
        _delete_all(kube, objects)


# -- the chart's identity ---------------------------------------------------------------


@dataclass
class Installed:
    """The chart's objects in a namespace of their own, and the driver running as their identity."""

    namespace: str
    service_account: str
    objects: list[Obj]
    kubeconfig: Path
    driver: DriverProcess
    client: Kube


def _token(kube: Kube, namespace: str, account: str, pod: Obj | None) -> str:
    """A TokenRequest for the account, bound to the pod when given (as the kubelet asks for it)."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    core = kubernetes.client.CoreV1Api(kube.api_client)
    response = core.create_namespaced_service_account_token(account, namespace, {"spec": spec})
    token: str = response.status.token
    return token


def _kubeconfig(cluster: ClusterInfo, token: str, path: Path) -> Path:
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    authority = admin["clusters"][0]["cluster"]["certificate-authority"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": cluster.api_server, "certificate-authority": authority}}
        ],
        "users": [{"name": "driver", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "driver"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _identity_kubeconfig(
    kube: Kube,
    cluster: ClusterInfo,
    namespace: str,
    account: str,
    path: Path,
    name: str = "driver-identity",
    tolerations: list[Obj] | None = None,
) -> Path:
    """A kubeconfig with the account's token bound to a pause pod on the node, as the kubelet gives it
    to the chart's pod: the API server then sees the node name the admission policy checks."""
    pod = kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeName": cluster.node_name,
                "serviceAccountName": account,
                "tolerations": tolerations or [{"operator": "Exists"}],
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
    )
    return _kubeconfig(cluster, _token(kube, namespace, account, pod), path)


def _slice(name: str, node: str | None) -> Obj:
    spec: Obj = {
        "driver": DRIVER,
        "pool": {"name": node or "shared", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0"}],
    }
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {"apiVersion": RESOURCE_API, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def _refusal(call: Any) -> tuple[int, str]:
    """Run a call that must fail; its HTTP status and the API server's message."""
    with pytest.raises(DynamicApiError) as caught:
        call()
    return int(caught.value.status), str(caught.value.summary())


@pytest.fixture(scope="module")
def installed(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    """The chart's namespace objects, RBAC and policy; a pod of its account; the driver as that pod."""
    work = tmp_path_factory.mktemp("deploy")
    namespace = f"t-deploy-{uuid.uuid4().hex[:6]}"
    objects = chart.template(_values(cluster.node_name), release=RELEASE, namespace=namespace)
    keep = ("ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy")
    created = [o for o in objects if o["kind"].startswith(keep)]
    [account] = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
    [daemonset] = [o for o in objects if o["kind"] == "DaemonSet"]
    [config] = [o for o in objects if o["kind"] == "ConfigMap"]
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    driver: DriverProcess | None = None
    client: Kube | None = None
    try:
        kube.create_all(copy.deepcopy(created))
        # A pod of the chart's account on the node: what the token is bound to. The fake runtime
        # runs it; the driver itself runs outside as a process with this pod's identity.
        template = daemonset["spec"]["template"]["spec"]
        path = _identity_kubeconfig(
            kube, cluster, namespace, account, work / "driver.kubeconfig", tolerations=template["tolerations"]
        )
        client = Kube(str(path))
        # The policy takes effect once the API server has compiled it: probe with dry runs.
        wait_for(
            "the admission policy to refuse another node's slice",
            lambda: _refused_by_policy(client, _slice(f"probe-{uuid.uuid4().hex[:6]}", OTHER_NODE)),
            timeout=30,
        )
        profiles = work / "profiles.yaml"
        profiles.write_text(config["data"]["profiles.yaml"])
        [container] = template["containers"]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        driver = DriverProcess(
            cluster, str(profiles), work / "driver.log", driver_name=DRIVER, env=env, kubeconfig=str(path)
        ).start()
        yield Installed(namespace, account, created, path, driver, client)
    finally:
        if driver is not None:
            driver.stop()
        if client is not None:
            client.close()
        for item in kube.list_objects(RESOURCE_API, "ResourceSlice", field_selector=f"spec.driver={DRIVER}"):
            kube.delete(RESOURCE_API, "ResourceSlice", item["metadata"]["name"])
        _delete_all(kube, _cluster_scoped(created))
        kube.delete("v1", "Namespace", namespace)


def _refused_by_policy(client: Kube, obj: Obj) -> bool:
    try:
        client.create(obj, dry_run=True)
    except DynamicApiError as err:
        return int(err.status) == 403 and "may not modify" in str(err.summary())
    return False


def test_driver_with_the_charts_identity_publishes_its_slices(
    installed: Installed, kube: Kube, cluster: ClusterInfo
) -> None:
    assert installed.driver.ready()
    slices = kube.list_objects(
        RESOURCE_API,
        "ResourceSlice",
        field_selector=f"spec.driver={DRIVER},spec.nodeName={cluster.node_name}",
    )
    devices = sorted(d["name"] for s in slices for d in s["spec"]["devices"])
    assert devices == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], "profile `mixed` from the chart's per-node map"
    [owner] = slices[0]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("Node", cluster.node_name)
    # Those slices were written with the token: it is the driver's only credential.
    assert installed.driver.kubeconfig == str(installed.kubeconfig)
    # The retry of pending pods after a share is prepared (docs/sharing.md): an annotation patch.
    name = slices[0]["metadata"]["name"]
    annotate = {"metadata": {"annotations": {"t": "1"}}}
    patched = installed.client.patch(RESOURCE_API, "ResourceSlice", name, annotate)
    assert patched["metadata"]["annotations"]["t"] == "1"


def test_token_carries_the_node_of_its_pod(installed: Installed, cluster: ClusterInfo) -> None:
    review = installed.client.create(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview", "metadata": {}}
    )
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{installed.namespace}:{installed.service_account}"
    assert user["extra"][NODE_NAME_KEY] == [cluster.node_name]


def test_same_identity_may_not_create_another_nodes_slice(installed: Installed, cluster: ClusterInfo) -> None:
    status, message = _refusal(lambda: installed.client.create(_slice("deploy-test-other", OTHER_NODE)))
    assert status == 403
    assert f"on node {cluster.node_name} may not modify resourceslices on node {OTHER_NODE}" in message
    status, message = _refusal(lambda: installed.client.create(_slice("deploy-test-shared", None)))
    assert status == 403
    assert "may not modify resourceslices without spec.nodeName" in message


def test_same_identity_may_not_publish_another_driver_or_pool_on_its_node(
    installed: Installed, cluster: ClusterInfo
) -> None:
    other_driver = _slice("deploy-test-driver", cluster.node_name)
    other_driver["spec"]["driver"] = "other.example.com"
    status, message = _refusal(lambda: installed.client.create(other_driver))
    assert status == 403
    assert f"may write resourceslices of driver {DRIVER} only, not other.example.com" in message
    other_pool = _slice("deploy-test-pool", cluster.node_name)
    other_pool["spec"]["pool"]["name"] = OTHER_NODE
    status, message = _refusal(lambda: installed.client.create(other_pool))
    assert status == 403
    assert f"may write only the pool named {cluster.node_name}, not {OTHER_NODE}" in message


def test_same_identity_may_not_update_or_delete_another_nodes_slice(
    installed: Installed, kube: Kube, cluster: ClusterInfo
) -> None:
    theirs = kube.create(_slice(f"deploy-test-theirs-{uuid.uuid4().hex[:6]}", OTHER_NODE))
    name = theirs["metadata"]["name"]
    try:
        changed = copy.deepcopy(theirs)
        changed["spec"]["devices"].append({"name": "gpu-1"})
        status, message = _refusal(lambda: installed.client.replace(changed))
        assert status == 403
        assert f"may not modify resourceslices on node {OTHER_NODE}" in message
        annotate = {"metadata": {"annotations": {"t": "1"}}}
        status, message = _refusal(
            lambda: installed.client.patch(RESOURCE_API, "ResourceSlice", name, annotate)
        )
        assert status == 403
        assert f"may not modify resourceslices on node {OTHER_NODE}" in message
        status, message = _refusal(lambda: installed.client.delete(RESOURCE_API, "ResourceSlice", name))
        assert status == 403
        assert f"on node {cluster.node_name} may not modify resourceslices on node {OTHER_NODE}" in message
        assert kube.get(RESOURCE_API, "ResourceSlice", name)["spec"]["devices"] == [{"name": "gpu-0"}]
    finally:
        kube.delete(RESOURCE_API, "ResourceSlice", name)


def test_token_without_a_node_is_refused(
    installed: Installed, kube: Kube, cluster: ClusterInfo, tmp_path: Path
) -> None:
    token = _token(kube, installed.namespace, installed.service_account, None)
    client = Kube(str(_kubeconfig(cluster, token, tmp_path / "unbound.kubeconfig")))
    try:
        status, message = _refusal(
            lambda: client.create(_slice("deploy-test-unbound", cluster.node_name), dry_run=True)
        )
    finally:
        client.close()
    assert status == 403
    assert "has no node association" in message


OTHER_DRIVER = "other.deploy-test.dra-gpu.test"


def _allocated_claim(kube: Kube, cluster_kubeconfig: str, namespace: str, node: str, pool: str) -> Obj:
    """A claim allocated as the scheduler would: gpu-0 of `pool` and another driver's device, on `node`."""
    claim = kube.create(
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": {"generateName": "status-", "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "any"}}]}},
        }
    )
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": pool, "device": "gpu-0"},
        {"request": "gpu", "driver": OTHER_DRIVER, "pool": node, "device": "nic-0"},
    ]
    selector = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }
    claim["status"] = {"allocation": {"devices": {"results": results}, "nodeSelector": selector}}
    claim = kube.replace_status(claim)
    # Another driver's entry, which the driver must leave as it is, applied as that driver would.
    theirs = {"driver": OTHER_DRIVER, "pool": node, "device": "nic-0", "data": {"mac": "x"}}
    _apply(cluster_kubeconfig, claim, [theirs], OTHER_DRIVER)
    return claim


def _apply(kubeconfig: str, claim: Obj, devices: list[Obj], manager: str) -> Obj:
    """The driver's own call (dra.adapters.kube)."""

    client = KubeClient(kubeconfig)
    try:
        meta = claim["metadata"]
        return client.write_resource_claim_devices(
            meta["namespace"], meta["name"], meta["uid"], devices, manager
        )
    finally:
        anyio.run(client.aclose)


def _apply_as_driver(installed: Installed, claim: Obj, devices: list[Obj]) -> Obj:
    """The driver's own call, with the token bound to its pod."""
    return _apply(str(installed.kubeconfig), claim, devices, f"{DRIVER}/test")


#: How 1.37 refuses a change to a driver's entries itself (DRA's granular status authorization),
#: before any admission policy: the role may patch its own driver's entries on its own node only.
BUILT_IN_REFUSAL = 'changing status.devices requires resource="resourceclaims/driver"'


def _refused_as_driver(installed: Installed, claim: Obj, devices: list[Obj], policy: str) -> None:
    """Refused by the chart's policy (with `policy` in its message), or on 1.37 by the server itself."""
    with pytest.raises(KubeError) as caught:
        _apply_as_driver(installed, claim, devices)
    message = str(caught.value)
    if caught.value.status == 422:
        assert BUILT_IN_REFUSAL in message
    else:
        assert caught.value.status == 403, message
        assert policy in message


def _mine(pool: str, device: str = "gpu-0") -> Obj:
    return {"driver": DRIVER, "pool": pool, "device": device, "data": {"uuid": "GPU-test"}}


def test_driver_writes_its_entries_of_a_claim_allocated_on_its_node(
    installed: Installed, kube: Kube, cluster: ClusterInfo
) -> None:
    node = cluster.node_name
    claim = _allocated_claim(kube, cluster.kubeconfig, installed.namespace, node, node)
    stored = _apply_as_driver(installed, claim, [_mine(node)])
    entries = {e["driver"]: e for e in stored["status"]["devices"]}
    assert entries[DRIVER]["data"] == {"uuid": "GPU-test"}
    assert entries[OTHER_DRIVER]["data"] == {"mac": "x"}, "the other driver's entry stays"
    stored = _apply_as_driver(installed, claim, [])
    assert [e["driver"] for e in stored["status"]["devices"]] == [OTHER_DRIVER], "removal removes only ours"


def test_driver_may_not_write_the_status_of_a_claim_on_another_node(
    installed: Installed, kube: Kube, cluster: ClusterInfo
) -> None:
    elsewhere = _allocated_claim(kube, cluster.kubeconfig, installed.namespace, OTHER_NODE, OTHER_NODE)
    mine_only = f"may change only the status.devices entries of driver {DRIVER} in pool {cluster.node_name}"
    _refused_as_driver(installed, elsewhere, [_mine(OTHER_NODE)], mine_only)
    # Even under its own pool's name, a claim allocated on another node is not the driver's.
    node = cluster.node_name
    pinned_elsewhere = _allocated_claim(kube, cluster.kubeconfig, installed.namespace, OTHER_NODE, node)
    _refused_as_driver(installed, pinned_elsewhere, [_mine(node)], f"not allocated on node {node}")


def test_driver_may_not_change_another_drivers_entry_or_the_allocation(
    installed: Installed, kube: Kube, cluster: ClusterInfo
) -> None:
    node = cluster.node_name
    claim = _allocated_claim(kube, cluster.kubeconfig, installed.namespace, node, node)
    theirs = {"driver": OTHER_DRIVER, "pool": node, "device": "nic-0", "data": {"mac": "forged"}}
    _refused_as_driver(
        installed, claim, [_mine(node), theirs], "may change only the status.devices entries of driver"
    )
    reserve = {"reservedFor": [{"resource": "pods", "name": "intruder", "uid": str(uuid.uuid4())}]}
    status, message = _refusal(
        lambda: installed.client.patch(
            RESOURCE_API,
            "ResourceClaim",
            claim["metadata"]["name"],
            {"status": reserve},
            installed.namespace,
            status=True,
        )
    )
    if status == 422:
        # 1.37 refuses it itself: reservations need resourceclaims/binding, which the role lacks.
        assert 'requires resource="resourceclaims/binding"' in message
    else:
        assert status == 403, message
        assert "may change only status.devices" in message
    # A PUT of the status is not even granted: the role has patch only.
    status, message = _refusal(lambda: installed.client.replace_status(claim))
    assert status == 403
    assert 'cannot update resource "resourceclaims/status"' in message


def test_rbac_refuses_what_the_role_does_not_grant(installed: Installed) -> None:
    client = installed.client
    calls = {
        "list secrets": lambda: client.list_objects("v1", "Secret", namespace=installed.namespace),
        "list pods": lambda: client.list_objects("v1", "Pod"),
        "list resourceclaims": lambda: client.list_objects(RESOURCE_API, "ResourceClaim"),
        "get a resourceslice": lambda: client.get(RESOURCE_API, "ResourceSlice", "any"),
        "create an event (rbac.claimEvents is off)": lambda: client.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": "x.", "namespace": installed.namespace},
                "involvedObject": {
                    "kind": "Pod",
                    "name": "driver-identity",
                    "namespace": installed.namespace,
                },
                "reason": "Test",
                "message": "test",
            }
        ),
    }
    for what, call in calls.items():
        status, message = _refusal(call)
        assert status == 403, f"{what}: {message}"
        assert "is forbidden" in message, f"{what}: {message}"


def test_daemonset_pod_is_admitted_with_node_critical_priority(
    installed: Installed, kube: Kube, cluster: ClusterInfo
) -> None:
    """The pod the DaemonSet would create passes admission (priority class, service account, host paths)."""
    objects = chart.template(_values(cluster.node_name), release=RELEASE, namespace=installed.namespace)
    [daemonset] = [o for o in objects if o["kind"] == "DaemonSet"]
    template = daemonset["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "daemonset-pod", "namespace": installed.namespace, **template["metadata"]},
        "spec": {**template["spec"], "nodeName": cluster.node_name},
    }
    admitted = kube.create(pod, dry_run=True)
    assert admitted["spec"]["priority"] == 2000001000  # system-node-critical
    assert admitted["spec"]["serviceAccountName"] == installed.service_account
