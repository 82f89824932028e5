"""The chart as an admin installs it: helm, the image built here, the containerd cluster's real kubelet.

One cluster on containerd (its node a network namespace of its own, kube-proxy giving pods
the API server through the kubernetes Service: localcluster.nodenet) runs, in order:

1. ``helm install`` of this tree's chart with its defaults, the image of this tree
   (localcluster.driverimage), the node's kubelet root and CDI directory, and fake GPUs through
   the chart's ``fakeGpus`` values (localcluster.release): the DaemonSet's pod registers with
   the kubelet through the directories the chart mounts, publishes its slices, and serves
   docs/examples/demo.yaml, each container seeing exactly its claims' devices;
2. the privileges of its processes as the kernel reports them (/proc/<pid>/status on the
   machine), and what of the node's credentials the plugin's container can reach;
3. ``helm uninstall``, then ``helm install`` of the previous release (chart and image of
   localcluster.release.previous(), found in the history), pods with claims, ``helm upgrade`` to this tree
   with a pod created during the rollout, ``helm rollback`` to the previous release the same
   way: no failed prepare, no claim lost, the old plugin's pod gone and the new one serving;
4. ``helm upgrade`` with the webhook, the device plugin, the node labeller and MPS on: each
   container's privileges, each component at work; then a corrupted checkpoint, which the
   plugin and the device plugin refuse as docs/operations.md says.

The tests run in this order and build on each other (one cluster: an install, an upgrade and
a rollback cost seconds, a cluster more). Figures (image size, pod start to ready, rollout
times) are printed; run with -s to see them. Skipped, naming it, where the machine lacks root, the
image's Python (3.11) or the previous release's commit (a shallow clone); an image that fails to
build or a cluster that fails to start is an error.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import DynamicApiError
from localcluster import chart, containerd, release, releases
from localcluster.binaries import ensure_binary
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterInfo
from localcluster.demo import EXAMPLES
from localcluster.driverimage import PYTHON_MINOR, DriverImage, driver_image
from localcluster.kube import Kube, Obj, load_manifests, wait_for
from localcluster.workloads import DRIVER, allocated_devices, observed, pod_claims, seen

from dra.core import versions
from tests.skips import Lack, reason

pytestmark = [pytest.mark.cluster, pytest.mark.containerd]

RESOURCE_API = "resource.k8s.io/v1"
#: The kernel's sets as /proc/<pid>/status writes them: none, and CAP_SYS_ADMIN | CAP_SETPCAP.
NO_CAPABILITIES = "0000000000000000"
MPS_LAUNCHER_CAPABILITIES = f"{(1 << 21) | (1 << 8):016x}"
#: Seccomp mode 2: a filter (the chart's RuntimeDefault).
SECCOMP_FILTER = "2"


@dataclass
class Node:
    """The cluster, its clients, the two releases' images, and the figures measured on the way."""

    cluster: LocalCluster
    info: ClusterInfo
    kube: Kube
    helm: release.Helm
    current: DriverImage
    previous: DriverImage
    figures: dict[str, str] = field(default_factory=dict)

    def kubectl(self, *args: str, check: bool = True) -> str:
        """kubectl against the cluster; its output."""
        done = subprocess.run(
            [str(ensure_binary("kubectl")), "--kubeconfig", self.info.kubeconfig, *args],
            capture_output=True,
            text=True,
            check=False,
        )
        assert not check or done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout + done.stderr

    def values(self, image: DriverImage, **more: Any) -> dict[str, Any]:
        """The node's values for an image, plus chart values of the test's own."""
        return {**release.node_values(self.info, image), **more}


def _lacks() -> str | None:
    """What of the image's build this machine lacks (tests/skips.py), or None."""
    if os.geteuid() != 0:
        return reason(Lack.ROOT, "the image's pip install runs in its root filesystem (chroot): run as root")
    if sys.version_info[:2] != PYTHON_MINOR:
        return reason(
            Lack.PYTHON,
            f"the image's wheels are built with its Python {'.'.join(map(str, PYTHON_MINOR))}, "
            f"this is {sys.version.split()[0]}",
        )
    try:
        releases.check_history(chart.ROOT)
    except releases.ReleaseError as err:
        return reason(Lack.HISTORY, f"the previous release is built from the history: {err}")
    return None


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """The cluster on containerd with both releases' images imported.

    A build or a start that fails is an error of the test, not a skip: only what the machine lacks skips.
    """
    lacking = _lacks()
    if lacking:
        pytest.skip(lacking)
    current, previous = driver_image(), driver_image(release.previous().commit)
    # The previous release caps its socket paths at the kernel's 107 bytes, not gRPC's 105: its
    # registration socket (a pod UID in its name) fits gRPC only under a kubelet root of 27 bytes.
    cluster = LocalCluster(run_dir=Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp")), runtime="containerd")
    try:
        info = cluster.start(timeout=180)
        kube = Kube(info.kubeconfig)
        try:
            started = time.monotonic()
            for image in (current, previous):
                cluster.import_image(image)
            state = Node(cluster, info, kube, release.Helm(info), current, previous)
            state.figures["image"] = f"{current.size / 2**20:.0f} MiB, {len(current.packages)} distributions"
            state.figures["import of both images"] = f"{time.monotonic() - started:.1f} s"
            yield state
            print("\nchart on containerd: " + "; ".join(f"{k}: {v}" for k, v in state.figures.items()))
        finally:
            kube.close()
    finally:
        cluster.stop()


def _plugin_pods(node: Node) -> list[Obj]:
    pods = node.kube.list_objects(
        "v1", "Pod", namespace=release.NAMESPACE, label_selector=release.POD_SELECTOR
    )
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: Obj) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _serving_pod(node: Node, image: DriverImage, timeout: float = 120) -> Obj:
    """The one plugin pod, of `image`, ready: any other has gone."""

    def only_one() -> Obj | None:
        pods = node.kube.list_objects(
            "v1", "Pod", namespace=release.NAMESPACE, label_selector=release.POD_SELECTOR
        )
        if len(pods) != 1 or not _ready(pods[0]):
            return None
        images = {c["image"] for c in pods[0]["spec"]["containers"]}
        return pods[0] if images == {image.name} else None

    return wait_for(f"one ready plugin pod of {image.name}", only_one, timeout=timeout)


def _container_id(pod: Obj, name: str) -> str:
    [status] = [s for s in pod["status"]["containerStatuses"] if s["name"] == name]
    return str(status["containerID"])


def _log(node: Node, pod: Obj, container: str = "kubelet-plugin", previous: bool = False) -> str:
    args = ["logs", "-n", release.NAMESPACE, pod["metadata"]["name"], "-c", container]
    # The previous container's log exists once the kubelet has seen it end.
    return node.kubectl(*args, *(["--previous"] if previous else []), check=not previous)


def _sees(node: Node, namespace: str, pod: str, container: str) -> list[str]:
    """The devices a container's environment names (fake GPUs through the chart have no device nodes)."""
    env = seen(node.info, namespace, pod, container).env
    return sorted(v for k, v in env.items() if k.startswith("DRA_GPU_") and k.endswith("_NAME"))


def _got(node: Node, namespace: str, pod: Obj, container: Obj) -> list[str]:
    refs = container.get("resources", {}).get("claims", [])
    claims = pod_claims(node.kube, namespace, pod["metadata"]["name"]) if refs else {}
    return sorted({d for ref in refs for d in allocated_devices(claims[ref["name"]], ref.get("request"))})


def _namespace(node: Node, name: str) -> str:
    node.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def _one_gpu_pod(node: Node, namespace: str, name: str) -> Obj:
    """An observed pod with one whole GPU from the demo's one-gpu template."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "main", "image": "-", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    return node.kube.create(observed(node.info, pod))


def _failed_prepares(node: Node, namespace: str) -> list[str]:
    """The kubelet's events of prepares that failed (its one DRA event reason), and of pods that could
    not be scheduled (a claim the driver's slices could not serve)."""
    events = node.kube.list_objects("v1", "Event", namespace=namespace)
    reasons = ("FailedPrepareDynamicResources", "FailedScheduling")
    return [f"{e['reason']}: {e.get('message', '')}" for e in events if e.get("reason") in reasons]


def _spec_file(node: Node, claim: Obj) -> Path:
    return Path(node.info.cdi_dir) / f"k8s.{DRIVER}-claim_{claim['metadata']['uid']}.json"


# -- 1. helm install -----------------------------------------------------------------------------


def test_helm_install_serves_the_demos_claims_each_container_exactly_its_own(node: Node) -> None:
    started = time.monotonic()
    with release.chart_at(None) as chart_dir:
        node.helm.install(chart_dir, node.values(node.current))
    node.figures["helm install --wait"] = f"{time.monotonic() - started:.1f} s"
    pod = _serving_pod(node, node.current)
    log = _log(node, pod)
    assert "registered with the kubelet as DRA driver gpu.nvidia.com" in log
    # The feature probe passes the chart's admission policy: the gates this cluster turns on are used.
    assert "cannot ask the API server" not in log, log
    [kept] = [line for line in log.splitlines() if " keeps " in line]
    for _, (gate, what, _) in versions.GATES.items():
        assert node.info.feature_gates.get(gate) is not True or what in kept, (gate, kept)
    [ready] = [line for line in log.splitlines() if "ready: registered with the kubelet" in line]
    node.figures["plugin: start to registered and published"] = ready.rsplit(" in ", 1)[-1]
    slices = node.kube.list_objects(
        RESOURCE_API, "ResourceSlice", field_selector=f"spec.nodeName={node.info.node_name}"
    )
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    assert len(devices) == 20, "h100x8-mig: 4 GPUs and 16 MIG devices"
    # The chart's registration and service sockets are where the kubelet looks: under its root.
    registry = Path(node.info.plugins_registry)
    assert [p.name for p in registry.iterdir() if p.name.startswith(DRIVER)], "no registration socket"

    namespace = _namespace(node, "demo")
    workloads = load_manifests(EXAMPLES.read_text())
    for workload in workloads:
        workload["metadata"]["namespace"] = namespace
    pods = [observed(node.info, w) if w["kind"] == "Pod" else w for w in workloads]
    started = time.monotonic()
    node.kube.create_all(pods, namespace=namespace)
    node.kube.wait_pods_running(namespace, sum(w["kind"] == "Pod" for w in pods), "the demo's pods")
    node.figures["demo's 6 pods running"] = f"{time.monotonic() - started:.1f} s"
    for pod_obj in (w for w in pods if w["kind"] == "Pod"):
        name = pod_obj["metadata"]["name"]
        for container in pod_obj["spec"]["containers"]:
            got = _got(node, namespace, pod_obj, container)
            assert _sees(node, namespace, name, container["name"]) == got, f"{name}/{container['name']}"
    assert not _failed_prepares(node, namespace)


# -- 2. privileges ----------------------------------------------------------------------------------


def test_the_plugin_runs_without_capabilities_and_cannot_reach_the_nodes_credentials(node: Node) -> None:
    pod = _serving_pod(node, node.current)
    [plugin] = containerd.container_processes(_container_id(pod, "kubelet-plugin"))
    status = containerd.privileges(plugin)
    node.figures["kubelet-plugin /proc/<pid>/status"] = " ".join(f"{k}={v}" for k, v in status.items())
    assert status["Uid"].split()[0] == "0", "uid 0, for the kubelet's root-owned directories"
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[name] == NO_CAPABILITIES, name
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == SECCOMP_FILTER

    run = Path(node.info.run_dir)
    # The node's own credentials, and the other pods' service-account tokens under the kubelet's root.
    secrets = [run / "kubelet.kubeconfig", run / "pki" / "kubelet.key", Path(node.info.kubelet_root) / "pods"]
    assert all(path.exists() for path in secrets)
    check = "import os, sys; print(' '.join(str(os.path.exists(p)) for p in sys.argv[1:]))"
    name = pod["metadata"]["name"]
    exec_args = ["exec", "-n", release.NAMESPACE, name, "-c", "kubelet-plugin", "--"]
    answer = node.kubectl(*exec_args, "python3.11", "-c", check, *map(str, secrets))
    assert answer.split() == ["False"] * len(secrets)


# -- 3. uninstall, the previous release, upgrade and rollback ---------------------------------------


def test_helm_uninstall_leaves_no_plugin_and_no_prepared_claim(node: Node) -> None:
    claims = node.kube.list_objects(RESOURCE_API, "ResourceClaim", namespace="demo")
    for pod in node.kube.list_objects("v1", "Pod", namespace="demo"):
        node.kube.delete("v1", "Pod", pod["metadata"]["name"], "demo", grace_period=0)
    wait_for(
        "the demo's claims to be unprepared",
        lambda: not any(_spec_file(node, c).exists() for c in claims),
        timeout=60,
    )
    node.helm.uninstall()
    wait_for("the plugin's pod to go", lambda: not _plugin_pods(node), timeout=60)
    assert node.kube.get_or_none("apps/v1", "DaemonSet", release.RELEASE, release.NAMESPACE) is None


def _rollout(node: Node, change: Any, namespace: str, during: str) -> tuple[float, Obj]:
    """Run a helm change while creating a claim pod; the change's seconds and the pod."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            change()
        except BaseException as err:  # handed to the test's thread
            outcome.append(err)

    started = time.monotonic()
    helm = threading.Thread(target=run)
    helm.start()
    try:
        # While the old and the new plugin both run: every prepare succeeds, whichever serves it.
        wait_for(
            "the new plugin's pod", lambda: len(_plugin_pods(node)) > 1 or not helm.is_alive(), timeout=60
        )
        pod = _one_gpu_pod(node, namespace, during)
    finally:
        helm.join()
    if outcome:
        raise outcome[0]
    return time.monotonic() - started, pod


def _nothing_lost(node: Node, namespace: str, before: dict[str, Obj]) -> None:
    """The pods of `before` run on as they were, and every pod of the namespace sees its claim."""
    node.kube.wait_pods_running(
        namespace, len(node.kube.list_objects("v1", "Pod", namespace=namespace)), "pods"
    )
    for name, old in before.items():
        pod = node.kube.get("v1", "Pod", name, namespace)
        assert pod["metadata"]["uid"] == old["metadata"]["uid"]
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, name
    for pod in node.kube.list_objects("v1", "Pod", namespace=namespace):
        got = _got(node, namespace, pod, pod["spec"]["containers"][0])
        assert len(got) == 1
        assert _sees(node, namespace, pod["metadata"]["name"], "main") == got
    assert not _failed_prepares(node, namespace), "no failed prepare or unprepare"


def _unprepares(node: Node, namespace: str, name: str) -> None:
    """Deleting a pod that an earlier plugin prepared: the serving plugin removes its claim's spec."""
    [claim] = pod_claims(node.kube, namespace, name).values()
    assert _spec_file(node, claim).exists()
    node.kube.delete("v1", "Pod", name, namespace, grace_period=0)
    wait_for(f"{name}'s claim to be unprepared", lambda: not _spec_file(node, claim).exists(), timeout=60)


def test_helm_upgrade_from_the_previous_release_loses_no_claim(node: Node) -> None:
    previous = release.previous()
    node.figures["previous release"] = f"{previous.version} ({previous.commit[:12]}, {previous.date})"
    with release.chart_at(previous.commit) as old_chart:
        node.helm.install(old_chart, node.values(node.previous))
    _serving_pod(node, node.previous)
    namespace = _namespace(node, "upgrade")
    templates = [w for w in load_manifests(EXAMPLES.read_text()) if w["kind"] == "ResourceClaimTemplate"]
    node.kube.create_all(templates, namespace=namespace)
    # Four whole GPUs: two pods before, one during each rollout, one after, one unprepared each time.
    before = {name: _one_gpu_pod(node, namespace, name) for name in ("before-1", "before-2")}
    node.kube.wait_pods_running(namespace, len(before), "the pods the previous release prepared")
    old_pod = _plugin_pods(node)[0]

    with release.chart_at(None) as new_chart:
        seconds, _ = _rollout(
            node, lambda: node.helm.upgrade(new_chart, node.values(node.current)), namespace, "during-upgrade"
        )
    node.figures["helm upgrade --wait (previous -> this)"] = f"{seconds:.1f} s"
    new_pod = _serving_pod(node, node.current)
    assert node.kube.get_or_none("v1", "Pod", old_pod["metadata"]["name"], release.NAMESPACE) is None
    assert new_pod["metadata"]["uid"] != old_pod["metadata"]["uid"]
    _nothing_lost(node, namespace, before)
    _unprepares(node, namespace, "before-1")
    _one_gpu_pod(node, namespace, "after-upgrade")
    _nothing_lost(node, namespace, {})


def test_helm_rollback_to_the_previous_release_loses_no_claim(node: Node) -> None:
    namespace = "upgrade"
    before = {p["metadata"]["name"]: p for p in node.kube.list_objects("v1", "Pod", namespace=namespace)}
    old_pod = _serving_pod(node, node.current)
    seconds, _ = _rollout(node, lambda: node.helm.rollback(1), namespace, "during-rollback")
    node.figures["helm rollback --wait (this -> previous)"] = f"{seconds:.1f} s"
    _serving_pod(node, node.previous)
    assert node.kube.get_or_none("v1", "Pod", old_pod["metadata"]["name"], release.NAMESPACE) is None
    _nothing_lost(node, namespace, before)
    # The previous release unprepares what this one prepared, and prepares anew.
    _unprepares(node, namespace, "after-upgrade")
    _one_gpu_pod(node, namespace, "after-rollback")
    _nothing_lost(node, namespace, {})


# -- 4. every component, MPS, a corrupted checkpoint -------------------------------------------------


EVERYTHING = {
    "webhook": {"enabled": True},
    "devicePlugin": {"enabled": True},
    "gpuAssignment": {"devicePlugin": "2,3"},
    "nodeLabeller": {"enabled": True},
    "kubeletPlugin": {"mps": {"enabled": True}},
}


def test_every_component_runs_from_the_chart_with_its_own_privileges(node: Node) -> None:
    namespace = "upgrade"
    before = {p["metadata"]["name"]: p for p in node.kube.list_objects("v1", "Pod", namespace=namespace)}
    # GPUs 2 and 3 go to the device plugin: no pod of the namespace may hold one.
    held = {d for p in before for d in _got(node, namespace, before[p], before[p]["spec"]["containers"][0])}
    for name in [p for p in before if held & {"gpu-2", "gpu-3"}]:
        _unprepares(node, namespace, name)
        before.pop(name)
    with release.chart_at(None) as new_chart:
        node.helm.upgrade(new_chart, node.values(node.current, **EVERYTHING))
    pod = _serving_pod(node, node.current)
    _nothing_lost(node, namespace, before)

    statuses = {}
    for container in ("kubelet-plugin", "device-plugin", "node-labeller"):
        pids = containerd.container_processes(_container_id(pod, container))
        statuses[container] = [containerd.privileges(pid) for pid in pids]
    [[webhook]] = [
        [containerd.privileges(pid) for pid in containerd.container_processes(_container_id(p, "webhook"))]
        for p in node.kube.list_objects("v1", "Pod", namespace=release.NAMESPACE)
        if p["metadata"]["name"].startswith(f"{release.RELEASE}-webhook")
    ]
    statuses["webhook"] = [webhook]
    # MPS on: the plugin, then the launcher it forked first, which alone keeps the two capabilities.
    plugin, launcher = statuses.pop("kubelet-plugin")
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert plugin[name] == NO_CAPABILITIES, f"the plugin's {name}"
    assert (launcher["CapPrm"], launcher["CapEff"], launcher["CapBnd"]) == (MPS_LAUNCHER_CAPABILITIES,) * 3
    assert plugin["NoNewPrivs"] == launcher["NoNewPrivs"] == "1"
    node.figures["with MPS: plugin"] = f"CapEff={plugin['CapEff']} CapBnd={plugin['CapBnd']}"
    node.figures["with MPS: launcher"] = f"CapEff={launcher['CapEff']} CapBnd={launcher['CapBnd']}"
    for container, processes in statuses.items():
        for status in processes:
            assert {status[n] for n in ("CapPrm", "CapEff", "CapBnd")} == {NO_CAPABILITIES}, container
            assert status["NoNewPrivs"] == "1", container
        node.figures[f"{container}: CapEff/CapBnd"] = f"{processes[0]['CapEff']}/{processes[0]['CapBnd']}"

    # The device plugin serves nvidia.com/gpu from GPUs 2 and 3; the labeller labels its node.
    def node_status() -> Obj | None:
        obj = node.kube.get("v1", "Node", node.info.node_name)
        ready = obj["status"].get("allocatable", {}).get("nvidia.com/gpu") == "2"
        return obj if ready and "nvidia.com/gpu.product" in obj["metadata"]["labels"] else None

    labelled = wait_for("the device plugin's GPUs and the labeller's labels", node_status, timeout=60)
    labels = labelled["metadata"]["labels"]
    # GFD's mixed strategy (the device plugin's default): GPUs 0-3 whole, GPUs 4-7's MIG devices by profile.
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert int(labels["nvidia.com/mig-1g.10gb.count"]) > 0
    # The API server calls the chart's webhook through its Service's endpoint.
    bad = {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": "bad-interval"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {
                                "apiVersion": "resource.nvidia.com/v1beta1",
                                "kind": "GpuConfig",
                                "sharing": {"timeSlicingConfig": {"interval": "VeryLong"}},
                            },
                        },
                    }
                ],
            }
        },
    }
    with pytest.raises(DynamicApiError) as refused:
        node.kube.create(bad, namespace=namespace)
    message = str(refused.value.summary())
    assert "denied the request" in message
    assert "spec.devices.config[0].opaque.parameters.sharing.timeSlicingConfig.interval" in message


def test_a_corrupted_checkpoint_is_refused_as_the_docs_say(node: Node) -> None:
    checkpoint = Path(node.info.kubelet_root) / "plugins" / DRIVER / "checkpoint.json"
    pod = _serving_pod(node, node.current)
    containers = ("kubelet-plugin", "device-plugin")
    first = {c: containerd.container_processes(_container_id(pod, c))[0] for c in containers}
    text = checkpoint.read_text()
    # One claim's device renamed: the document parses, and its checksum no longer holds.
    edited = text.replace('"gpu-', '"gpu-x', 1)
    assert edited != text
    checkpoint.write_text(edited)
    # A crash (no clean shutdown that would write the file again); the kubelet restarts both.
    for pid in first.values():
        os.kill(pid, signal.SIGKILL)

    def last_line(container: str) -> str | None:
        log = _log(node, pod, container, previous=True).strip().splitlines()
        return log[-1] if log and "will not start on a checkpoint it cannot trust" in log[-1] else None

    for container in containers:
        last = wait_for(
            f"{container} to refuse the checkpoint", functools.partial(last_line, container), timeout=90
        )
        assert str(checkpoint) in last, last
        assert "fails its checksum (corrupted or edited)" in last, last
    assert not _ready(node.kube.get("v1", "Pod", pod["metadata"]["name"], release.NAMESPACE))
    # The pods that hold claims run on, their containers untouched.
    for held in node.kube.list_objects("v1", "Pod", namespace="upgrade"):
        assert held["status"]["phase"] == "Running"
        assert held["status"]["containerStatuses"][0]["restartCount"] == 0
