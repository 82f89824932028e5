"""NVIDIA's own example specs (tests/e2e/nvidia_specs/, copied unchanged) run on this driver.

Each spec is applied as NVIDIA's docs and tests apply it, every pod it makes must start, and its
namespace is then deleted so that the next spec finds the GPUs free. A spec without a Namespace
(NVIDIA's bats specs) goes into a fresh namespace, as `kubectl apply -n` puts it; a template of
NVIDIA's e2e framework gets the namespace its `{{ .Namespace }}` asks for, as `framework.Render`
fills it in. The consumable-share specs run against the driver started with the
--consumable-shares value NVIDIA runs each with; where NVIDIA's test checks that the claims share
one device, so does this one.

NVIDIA's bats specs (`bats-*.yaml`) each get the assertion its bats test makes, with the driver
started as that bats file starts NVIDIA's. Their containers run `nvidia-smi -L`; the fake
runtime runs no process, so what it would print is read from what the runtime resolved for the
container (`Bats.nvidia_smi`).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, load_manifests, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claim_template,
    container_record,
    ensure_device_classes,
    gpu_pod,
    pod_claim,
    published_devices,
    published_slices,
    visible_devices,
)

from dra.core.cdi import env_key
from dra.fakegpus.sysfs import FakeSysfs
from dra.kubeletplugin.publisher import RETRY_ANNOTATION
from tests.skips import Lack, reason

pytestmark = pytest.mark.cluster

SPECS = Path(__file__).parent / "nvidia_specs"
#: NVIDIA's passthrough spec (class vfio.gpu.nvidia.com): its driver runs it with the
#: PassthroughSupport gate on, this one with --vfio (test_nvidias_vfio_spec_runs_unchanged).
VFIO_SPEC = "quickstart-v1-gpu-test-vfiopci.yaml"
QUICKSTART = sorted(p.name for p in SPECS.glob("quickstart-*gpu-test*.yaml") if p.name != VFIO_SPEC)
#: Each consumable-share spec, the --consumable-shares value NVIDIA runs it with (its demo README;
#: its e2e framework: the mode the spec is named for), and whether NVIDIA's test checks that its
#: claims share one device. The bats ones are in ONE_GPU below, with their bats tests' checks.
SHARES = {
    "consumable-shares-memory-sharing.yaml": ("memory", False),
    "consumable-shares-unlimited-sharing.yaml": ("unlimited", False),
    "consumable-shares-integer-sharing.yaml": ("4", False),
    "e2e-consumable-shares-memory.yaml.tmpl": ("memory", True),
    "e2e-consumable-shares-unlimited.yaml.tmpl": ("unlimited", True),
}
#: The fake GPUs each quickstart spec needs: H100s, but A100s where it selects them by name or
#: by their MIG profiles.
PROFILES = {
    "quickstart-v1-gpu-test4.yaml": str(SPECS / "a100x8-40gb.profile.yaml"),
    "quickstart-v1-gpu-test6.yaml": str(SPECS / "a100x8.profile.yaml"),
}
#: gpu-test4 runs on GPUs partitioned by NVIDIA's mig-parted layout, which the README applies with
#: `nvidia-mig-parted apply -f mig-parted-config.yaml -c half-balanced` first.
DRIVER_ARGS = {
    "quickstart-v1-gpu-test4.yaml": (
        f"--mig-config-file={SPECS / 'quickstart-mig-parted-config.yaml'}",
        "--mig-config=half-balanced",
    )
}
#: Written for resource.k8s.io/v1beta1, which the API server serves only where an admin turns it on.
V1BETA1 = ("quickstart-gpu-test7.yaml", "quickstart-gpu-test8.yaml")


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
        _delete_namespace(kube, namespace)


def _delete_namespace(kube: Kube, namespace: str) -> None:
    """Delete the namespace's pods at once and the namespace, and wait until its claims are gone."""
    for pod in kube.list_objects("v1", "Pod", namespace=namespace):
        kube.delete("v1", "Pod", pod["metadata"]["name"], namespace, grace_period=0)
    kube.delete("v1", "Namespace", namespace)
    wait_for(
        f"the claims of namespace {namespace} to go",
        lambda: not kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace),
        timeout=90,
    )


def _served(kube: Kube, api_version: str) -> bool:
    """Whether the API server serves this group version (its discovery document lists it)."""
    group, _ = api_version.split("/")
    found: Obj = kube.api_client.call_api(
        f"/apis/{group}", "GET", response_type="object", _return_http_data_only=True
    )
    return any(v["groupVersion"] == api_version for v in found["versions"])


def _claims_of(kube: Kube, pod: Obj) -> dict[str, Obj]:
    """The pod's claims by its name for each: a claim it names, or the one made from its template."""
    namespace = pod["metadata"]["namespace"]
    generated = {
        s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []
    }
    claims = {}
    for ref in pod["spec"].get("resourceClaims") or []:
        claim = ref.get("resourceClaimName") or generated[ref["name"]]
        claims[ref["name"]] = kube.get("resource.k8s.io/v1", "ResourceClaim", claim, namespace)
    return claims


def _devices_as_claimed(kube: Kube, cluster: ClusterInfo, namespace: str) -> None:
    """Each container of each pod got exactly the devices allocated to the claims (and requests) it names.

    What a user of the spec depends on: a container with no claim sees no GPU, one that names a claim
    (or one request of it) sees what the scheduler allocated to that, no more and no less.
    """
    pods = kube.list_objects("v1", "Pod", namespace=namespace)
    assert pods, f"no pod in {namespace}"
    for pod in pods:
        name = pod["metadata"]["name"]
        claims = _claims_of(kube, pod)
        for container in pod["spec"]["containers"]:
            wanted = {
                device
                for ref in container.get("resources", {}).get("claims") or []
                for device in allocated_devices(claims[ref["name"]], ref.get("request"))
            }
            record = container_record(cluster, namespace, name, container["name"])
            got = visible_devices(record, {})
            assert got == sorted(wanted), (name, container["name"], got, sorted(wanted))
            # NVIDIA's runtime hook, where a node has it, adds nothing for `void` or `none`.
            assert record["env"].get("NVIDIA_VISIBLE_DEVICES", "void") in ("void", "none"), record["env"]


def _run(kube: Kube, cluster: ClusterInfo, name: str, same_device: bool = False) -> None:
    """Apply the spec, wait for every pod to run, check each container's devices against its claims
    (and, if asked, that its claims share one device)."""
    with _applied(kube, name) as (docs, namespace):
        expected = _pods_expected(docs)
        kube.wait_pods_running(namespace, expected, f"the {expected} pods of {name} to run")
        _devices_as_claimed(kube, cluster, namespace)
        if same_device:
            claims = kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace)
            assert len({tuple(allocated_devices(c)) for c in claims}) == 1, claims


def _unscheduled(kube: Kube, pod: str, namespace: str) -> Obj | None:
    """The pod's PodScheduled condition once the scheduler gave up on it, else None."""
    conditions = kube.get("v1", "Pod", pod, namespace).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None)


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
    if name in V1BETA1 and not _served(kube, "resource.k8s.io/v1beta1"):
        pytest.skip(
            reason(
                Lack.RELEASE,
                "resource.k8s.io/v1beta1 is not served (beta APIs are off by default; removed in 1.38)",
            )
        )
    profile = PROFILES.get(name, "h100x8")
    args = DRIVER_ARGS.get(name, ())
    start.append(DriverProcess(cluster, profile, tmp_path / "driver.log", extra_args=args).start())
    _run(kube, cluster, name)


def test_nvidias_vfio_spec_runs_unchanged_and_its_gpu_is_then_not_allocatable(
    cluster: ClusterInfo, kube: Kube, tmp_path: Path, start: list[DriverProcess]
) -> None:
    """The pod gets a passthrough twin and the fake sysfs has its GPU on vfio-pci; while it runs, a
    claim for that GPU whole stays unschedulable (the two share a counter set), and gets it once the
    spec is gone."""
    # The fake sysfs and /dev/vfio go under the fake GPUs' root: the containerd cluster's, else one here.
    root = cluster.fake_gpu_root or str(tmp_path / "fakegpus")
    flags = ("--vfio=true", *(() if cluster.fake_gpu_root else (f"--fake-gpu-root={root}",)))
    start.append(DriverProcess(cluster, "h100x8", tmp_path / "driver.log", extra_args=flags).start())
    sysfs = FakeSysfs(root)
    whole = "whole-gpu"
    with _applied(kube, VFIO_SPEC) as (_, namespace):
        kube.wait_pod_phase("pod1", namespace, timeout=90)
        [twin] = allocated_devices(pod_claim(kube, namespace, "pod1"))
        published = {d["name"]: d["attributes"] for d in published_devices(kube, cluster)}
        assert published[twin]["type"] == {"string": "vfio"}, published[twin]
        bus_id = published[twin]["resource.kubernetes.io/pciBusID"]["string"]
        assert sysfs.driver_of(bus_id) == "vfio-pci"
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": whole}})
        selector = f'device.attributes["resource.kubernetes.io"].pciBusID == "{bus_id}"'
        claim_template(kube, whole, "same-gpu", [selector])
        gpu_pod(kube, whole, "pod", "same-gpu")

        condition = wait_for(
            "the whole GPU's pod to be found unschedulable",
            lambda: _unscheduled(kube, "pod", whole),
            timeout=30,
        )
        assert "cannot allocate all claims" in condition["message"], condition
    try:
        kube.wait_pod_phase("pod", whole, timeout=90)
        [gpu] = allocated_devices(pod_claim(kube, whole, "pod"))
        assert published[gpu]["type"] == {"string": "gpu"}
        assert sysfs.driver_of(bus_id) == "nvidia"
    finally:
        _delete_namespace(kube, whole)


@pytest.mark.parametrize("name", sorted(SHARES))
def test_a_consumable_share_spec_runs_unchanged_with_nvidias_flag(
    cluster: ClusterInfo, kube: Kube, tmp_path: Path, start: list[DriverProcess], name: str
) -> None:
    value, same_device = SHARES[name]
    flag = f"--consumable-shares={value}"
    start.append(DriverProcess(cluster, "h100x8", tmp_path / "driver.log", extra_args=(flag,)).start())
    _run(kube, cluster, name, same_device)
    # Each share prepared had the scheduler try its pending pods again: a slice's annotation says when.
    # Without that, a pod tried while the scheduler counted a share twice waited up to 5 minutes.
    key = f"{DRIVER}/{RETRY_ANNOTATION}"
    assert any(key in (s["metadata"].get("annotations") or {}) for s in published_slices(kube, cluster)), key


# -- NVIDIA's bats specs (its tests/bats/specs), each with its bats test's assertion ----------------

#: How NVIDIA's bats files start its driver (their helm values), as this driver's flags, and the
#: fake GPUs they need: `featureGates.TimeSlicingSettings` and `MPSSupport` need no flag here
#: (both always served), `featureGates.DynamicMIG` is --mig-mode=dynamic on GPUs with MIG off,
#: `consumableShares=4` is the flag of that name, and test_gpu_mig.bats's
#: mig_create_1g0_on_node (one 1g instance on GPU 0) is a profile.
BATS_DRIVERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "plain": ("h100x8", ()),
    "consumable-shares": ("h100x8", ("--consumable-shares=4",)),
    "static-mig": (str(SPECS / "h100x8-1g0.profile.yaml"), ()),
    "dynamic-mig": ("h100x8", ("--mig-mode=dynamic",)),
}


@dataclass
class Bats:
    """NVIDIA's bats specs applied to a namespace of their own (they name none), on a started driver."""

    kube: Kube
    cluster: ClusterInfo
    namespace: str

    def apply(self, spec: str, text: str | None = None) -> list[Obj]:
        """Create the objects of `bats-<spec>.yaml` (or `text`, a filled-in template of it)."""
        docs = load_manifests(text if text is not None else (SPECS / f"bats-{spec}.yaml").read_text())
        return self.kube.create_all(docs, self.namespace)

    def delete(self, spec: str) -> None:
        """Delete what `bats-<spec>.yaml` made (`kubectl delete -f`) and wait until its pods are gone."""
        for doc in reversed(load_manifests((SPECS / f"bats-{spec}.yaml").read_text())):
            meta = doc["metadata"]
            self.kube.delete(
                doc["apiVersion"], doc["kind"], meta["name"], self.namespace, propagation="Background"
            )
        wait_for(
            f"the pods of {spec} to go",
            lambda: not self.kube.list_objects("v1", "Pod", namespace=self.namespace),
            timeout=60,
        )

    def running(self, *pods: str) -> None:
        """`kubectl wait --for=condition=READY`: every pod runs."""
        for pod in pods:
            self.kube.wait_pod_phase(pod, self.namespace, timeout=60)

    def pods(self, label_selector: str) -> list[str]:
        """The names of the namespace's pods with these labels."""
        found = self.kube.list_objects("v1", "Pod", namespace=self.namespace, label_selector=label_selector)
        return sorted(p["metadata"]["name"] for p in found)

    def nvidia_smi(self, pod: str, container: str = "ctr") -> list[str]:
        """The UUIDs `nvidia-smi -L` lists in the container, one per line it prints.

        nvidia-smi lists the GPUs a container sees and, under each, the MIG devices it sees of it
        (dra/fakegpus/node.py's fake imitates that, and tests/e2e/test_containerd.py checks it
        in real containers): here the devices the fake runtime resolved for the container, by
        their CDI env (`DRA_GPU_<DEVICE>_UUID`), with each MIG device's parent GPU.
        """
        record = container_record(self.cluster, self.namespace, pod, container)
        published = {d["name"]: d["attributes"] for d in published_devices(self.kube, self.cluster)}
        uuids = {name: a["uuid"]["string"] for name, a in published.items() if "uuid" in a}
        listed: set[str] = set()
        for name in visible_devices(record, uuids):
            listed.add(record["env"][f"{env_key(name)}_UUID"])
            parent = published.get(name, {}).get("parentUUID")
            if parent is not None:
                listed.add(parent["string"])
        return sorted(listed)


@pytest.fixture
def bats(
    request: pytest.FixtureRequest,
    cluster: ClusterInfo,
    kube: Kube,
    tmp_path: Path,
    start: list[DriverProcess],
    namespace: str,
) -> Iterator[Bats]:
    """A driver started as BATS_DRIVERS[request.param] says (parametrized indirectly), on fake GPUs
    as their profile makes them (no MIG state left by another test), and a namespace whose claims
    are gone before the driver stops."""
    profile, args = BATS_DRIVERS[request.param]
    driver = DriverProcess(cluster, profile, tmp_path / "driver.log", extra_args=args)
    driver.fake_mig_state.unlink(missing_ok=True)
    start.append(driver.start())
    try:
        yield Bats(kube, cluster, namespace)
    finally:
        _delete_namespace(kube, namespace)


def _one_gpu(listed: list[str]) -> str:
    """The bats check `assert_output --partial "UUID: GPU-"` and `wc -l | grep 1`: one GPU, no MIG."""
    assert [u[:4] for u in listed] == ["GPU-"], listed
    return listed[0]


def _one_mig(listed: list[str]) -> str:
    """The bats check for a MIG claim: two lines, its GPU's ("UUID: GPU-") and its own ("UUID: MIG-")."""
    assert [u[:4] for u in listed] == ["GPU-", "MIG-"], listed
    return listed[1]


def _drivers(which: str) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("bats", [which], indirect=True)


#: Specs whose bats test reads `nvidia-smi -L` in some containers and checks that each sees one
#: whole GPU, all the same one (a shared claim, a shared GPU) or distinct ones: the spec, the
#: driver its bats file starts (test_gpu_basic, test_gpu_sharing, test_gpu_consumable_shares),
#: the (pod, container)s it reads, and whether they see the same GPU.
ONE_GPU: dict[str, tuple[str, list[tuple[str, str]], bool]] = {
    "gpu-simple-full": ("plain", [("pod-full-gpu", "ctr")], True),
    "gpu-2pods-2gpus": ("plain", [("pod1", "ctr"), ("pod2", "ctr")], False),
    "gpu-2pods-1gpu": ("plain", [("pod1", "ctr"), ("pod2", "ctr")], True),
    "gpu-1pod-2cnt-1gpu": ("plain", [("pod1", "ctr0"), ("pod1", "ctr1")], True),
    "gpu-timeslicing": ("plain", [("pod-timeslicing", "ctr0"), ("pod-timeslicing", "ctr1")], True),
    "gpu-mps": ("plain", [("pod-mps", "ctr0"), ("pod-mps", "ctr1")], True),
    "gpu-consumable-shares-memory": (
        "consumable-shares",
        [("pod-share-memory-0", "ctr"), ("pod-share-memory-1", "ctr")],
        True,
    ),
    "gpu-consumable-shares-integer": (
        "consumable-shares",
        [("pod-share-integer-0", "ctr"), ("pod-share-integer-1", "ctr")],
        True,
    ),
}


@pytest.mark.parametrize(
    ("bats", "spec"), [(driver, spec) for spec, (driver, _, _) in sorted(ONE_GPU.items())], indirect=["bats"]
)
def test_a_bats_spec_gives_each_container_one_whole_gpu(bats: Bats, spec: str) -> None:
    _, containers, shared = ONE_GPU[spec]
    bats.apply(spec)
    bats.running(*{pod for pod, _ in containers})
    gpus = [_one_gpu(bats.nvidia_smi(pod, container)) for pod, container in containers]
    assert len(set(gpus)) == (1 if shared else len(gpus)), gpus
    bats.delete(spec)


@_drivers("plain")
def test_the_bats_mps_spec_connects_both_containers_to_one_mps_daemon(bats: Bats) -> None:
    """test_gpu_sharing.bats also counts NVIDIA's mps-control-daemon Deployments: that driver runs
    the daemon in a pod; this one runs it as the claim's process, so the check is that both
    containers get the same daemon's pipe directory, and that the daemon runs."""
    bats.apply("gpu-mps")
    bats.running("pod-mps")
    pipes = {_mps_pipe(bats, "pod-mps", ctr) for ctr in ("ctr0", "ctr1")}
    assert len(pipes) == 1, pipes
    assert (pipes.pop() / "nvidia-cuda-mps-control.pid").is_file()
    bats.delete("gpu-mps")


def _mps_pipe(bats: Bats, pod: str, container: str) -> Path:
    """The host directory of the MPS pipes the container was given (at /tmp/nvidia-mps)."""
    record = container_record(bats.cluster, bats.namespace, pod, container)
    return Path(next(m["hostPath"] for m in record["mounts"] if m["containerPath"] == "/tmp/nvidia-mps"))


@_drivers("consumable-shares")
def test_the_bats_mps_spec_is_refused_under_four_shares_as_nvidias_bats_test_expects(bats: Bats) -> None:
    """test_gpu_consumable_shares.bats expects the MPS pod never to be READY: NVIDIA's driver refuses
    MPS with consumable shares. Here MPS limits follow the share (docs/sharing.md), and the spec's
    50 % is above one of four shares, so the claim is refused, naming why."""
    bats.apply("gpu-mps")

    def refusal() -> str | None:
        events = bats.kube.list_objects("v1", "Event", namespace=bats.namespace)
        return next((m for e in events if "active thread percentage" in (m := e.get("message") or "")), None)

    message = wait_for("the claim's refusal", refusal, timeout=60)
    assert "active thread percentage 50 is above its share (25: 1 of 4 shares)" in message
    assert bats.kube.get("v1", "Pod", "pod-mps", bats.namespace)["status"].get("phase") == "Pending"
    bats.delete("gpu-mps")


@_drivers("plain")
def test_the_bats_lifecycle_allocates_on_create_releases_on_delete_and_reacquires(bats: Bats) -> None:
    """test_gpu_robustness.bats: the claim is allocated while the pod runs and goes with it; a
    re-created pod gets a GPU again."""
    for _ in range(2):
        bats.apply("gpu-simple-full")
        bats.running("pod-full-gpu")
        [claim] = bats.kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=bats.namespace)
        assert allocated_devices(claim)
        _one_gpu(bats.nvidia_smi("pod-full-gpu"))
        bats.delete("gpu-simple-full")
        wait_for(
            "the claim to go",
            lambda: (
                not bats.kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=bats.namespace)
            ),
        )


@_drivers("plain")
def test_the_bats_two_claims_spec_gives_one_container_two_gpus(bats: Bats) -> None:
    """test_gpu_robustness.bats: `nvidia-smi -L` lists at least two GPUs, one per claim."""
    bats.apply("gpu-two-claims-one-pod")
    bats.running("pod-two-claims")
    listed = bats.nvidia_smi("pod-two-claims")
    assert [u[:4] for u in listed] == ["GPU-", "GPU-"], listed
    bats.delete("gpu-two-claims-one-pod")


@_drivers("plain")
def test_the_bats_cel_nomatch_pod_stays_pending_as_unschedulable(bats: Bats) -> None:
    """test_gpu_robustness.bats: Pending after 5s; the scheduler's reason says no claim fits."""
    bats.apply("gpu-cel-nomatch")

    condition = wait_for(
        "pod-cel-nomatch to be found unschedulable",
        lambda: _unscheduled(bats.kube, "pod-cel-nomatch", bats.namespace),
        timeout=30,
    )
    assert condition["reason"] == "Unschedulable"
    assert "cannot allocate all claims" in condition["message"], condition
    assert bats.kube.get("v1", "Pod", "pod-cel-nomatch", bats.namespace)["status"]["phase"] == "Pending"


@_drivers("plain")
def test_the_bats_pod_fail_restart_spec_gets_its_gpu_again_when_made_again(bats: Bats) -> None:
    """No bats test applies gpu-pod-fail-restart at NVIDIA's commit; its args print the GPU and
    `GPU-REACQUIRE-OK`: made, deleted and made again, the pod sees one GPU each time."""
    for _ in range(2):
        bats.apply("gpu-pod-fail-restart")
        bats.running("pod-restart-gpu")
        _one_gpu(bats.nvidia_smi("pod-restart-gpu"))
        bats.delete("gpu-pod-fail-restart")


@_drivers("plain")
def test_the_bats_job_spec_gives_its_pod_a_gpu(bats: Bats) -> None:
    """test_gpu_cuda_workloads.bats waits for the Job's 2 completions and checks each pod's GPU.
    The fake runtime's containers never exit, so a Job never completes here: the check is that
    its pod runs with one GPU (the completions are the job controller's, not this driver's)."""
    bats.apply("gpu-job-rct")
    [pod] = wait_for("the job's pod", lambda: bats.pods("job-name=gpu-job-rct") or None)
    bats.running(pod)
    _one_gpu(bats.nvidia_smi(pod, "worker"))
    bats.delete("gpu-job-rct")


@_drivers("plain")
def test_the_bats_parallel_deployment_spec_gets_two_distinct_gpus(bats: Bats) -> None:
    """test_gpu_cuda_workloads.bats: both replicas run at once, each with its own GPU."""
    bats.apply("gpu-job-rct-parallel")

    def two_replicas() -> list[str] | None:
        found = bats.pods("app=gpu-deploy-parallel")
        return found if len(found) == 2 else None

    pods = wait_for("2 replicas", two_replicas)
    bats.running(*pods)
    gpus = {_one_gpu(bats.nvidia_smi(pod, "worker")) for pod in pods}
    assert len(gpus) == 2, gpus
    bats.delete("gpu-job-rct-parallel")


#: test_gpu_stress.bats's defaults: TEST_GPU_STRESS_PODS_N and TEST_GPU_STRESS_ITERATIONS.
STRESS_PODS, STRESS_ITERATIONS = 15, 5


@_drivers("plain")
def test_the_bats_stress_shares_one_claim_across_pods_repeatedly(bats: Bats) -> None:
    """test_gpu_stress.bats: one ResourceClaim, pods-shared-gpu.yaml filled in 15 times (its
    `__INDEX__` as the bats file's sed does), all Running on the one GPU; then everything goes,
    five times over."""
    template = (SPECS / "bats-pods-shared-gpu.yaml").read_text()
    for _ in range(STRESS_ITERATIONS):
        bats.apply("rc-shared-gpu")
        bats.apply(
            "pods-shared-gpu",
            "---\n".join(template.replace("__INDEX__", str(i)) for i in range(1, STRESS_PODS + 1)),
        )
        pods = [f"stress-pod-{i}" for i in range(1, STRESS_PODS + 1)]
        bats.running(*pods)
        assert len({_one_gpu(bats.nvidia_smi(pod)) for pod in pods}) == 1
        for pod in pods:
            bats.kube.delete("v1", "Pod", pod, bats.namespace)
        bats.delete("rc-shared-gpu")


@_drivers("static-mig")
def test_the_bats_anymig_spec_gets_the_mig_device_made_beforehand(bats: Bats) -> None:
    """test_gpu_mig.bats: `nvidia-smi -L` lists a GPU and a MIG device."""
    bats.apply("gpu-anymig")
    bats.running("pod-anymig")
    _one_mig(bats.nvidia_smi("pod-anymig"))
    bats.delete("gpu-anymig")


@_drivers("dynamic-mig")
@pytest.mark.parametrize("spec", ["gpu-simple-mig", "gpu-simple-mig-ts"])
def test_a_bats_dynamic_mig_spec_gets_a_mig_device_made_for_it(
    bats: Bats, start: list[DriverProcess], spec: str
) -> None:
    """test_gpu_dynmig.bats: MIG mode off, two lines ("UUID: GPU-" and "UUID: MIG-"), MIG mode off again."""
    _mig_mode_off(start[0])
    bats.apply(spec)
    bats.running("pod-mig1g")
    _one_mig(bats.nvidia_smi("pod-mig1g"))
    bats.delete(spec)
    _mig_mode_off(start[0])


def _mig_mode_off(driver: DriverProcess) -> None:
    """test_gpu_dynmig.bats's confirm_mig_mode_disabled_all_nodes: no GPU in MIG mode."""
    wait_for("MIG mode off on every GPU", lambda: 1 not in driver.fake_mig_modes().values(), timeout=30)


@_drivers("dynamic-mig")
def test_the_bats_multiple_mig_spec_gives_each_container_its_own_mig_device(
    bats: Bats, start: list[DriverProcess]
) -> None:
    """test_gpu_dynmig.bats: each container lists a GPU and a MIG device, the MIG UUIDs differ, and
    MIG mode is off before and after."""
    _mig_mode_off(start[0])
    bats.apply("gpu-multiple-mig")
    bats.running("pod-2mig")
    migs = {_one_mig(bats.nvidia_smi("pod-2mig", ctr)) for ctr in ("ctr0", "ctr1")}
    assert len(migs) == 2, migs
    bats.delete("gpu-multiple-mig")
    _mig_mode_off(start[0])
