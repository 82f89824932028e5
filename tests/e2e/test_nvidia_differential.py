"""NVIDIA's DRA driver and this one, each in turn on the same node, the same fake GPUs, the same objects.

Both run as processes on the session cluster over one fake node (fakenvml.node: the fake NVML in
the driver root both are given, the node's sysfs and procfs in their mount namespace): NVIDIA's
gpu-kubelet-plugin as its chart runs it (localcluster.nvidiadriver), this one with --driver-root
reading NVML as on a real node. What they publish, what the same claims give a container, how
NVIDIA's example specs and bad opaque configs fare: every difference is a key
(tests/e2e/differential.py), and the keys found must be exactly those docs/migration.md lists
("From NVIDIA's DRA driver"), so that an undocumented difference, or a documented one that is no
longer there, fails here.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakenvml.node import FakeNode
from localcluster.binaries import NVIDIA_PLUGIN
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DaemonProcess, DriverProcess
from localcluster.kube import Kube, Obj, WaitTimeoutError, load_manifests, wait_for
from localcluster.nvidiadriver import NAMESPACE as NVIDIA_NAMESPACE
from localcluster.nvidiadriver import NvidiaDriverProcess, device_classes
from localcluster.workloads import (
    claim_template,
    container_record,
    gpu_pod,
    pod_claim,
    published_slices,
    replace_device_classes,
)
from localcluster.workloads import device_classes as ours_classes

from dra.fakegpus.profiles import BUILTIN_PROFILES
from tests.e2e.differential import OURS, THEIRS, Key, edit_differences, slice_differences

pytestmark = pytest.mark.cluster

MIGRATION = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
SPECS = Path(__file__).parent / "nvidia_specs"


def _ours(kind: str, *names: str, side: str = OURS) -> set[Key]:
    return {("attribute", kind, name, side) for name in names}


#: What differs in the slices, by profile, each explained in docs/migration.md: a difference documented
#: for one kind of node does not hide the same difference on another.
#: Extras of ours on a whole GPU: the NVML index and minor (unstable across reboots, so not for
#: selecting), the bus ID as NVML writes it, the NUMA node (NVIDIA's v0.5.0 publishes it too).
WHOLE_GPUS: set[Key] = {*_ours("gpu", "index", "minor", "pcieBusID", "resource.kubernetes.io/numaNode")}
#: MIG devices made by the admin. Names: <gpu>-mig-<profile>-<GI>-<CI> here, -<GI profile>-<slice> there.
STATIC_MIG: set[Key] = {
    *_ours("mig", "parentIndex", "pcieBusID", "resource.kubernetes.io/numaNode"),
    ("name", "mig"),
}
#: Dynamic MIG: offers, and their GPU's counters. Its memory is counted in both drivers' sets, as the
#: GPU's here and as the full MIG profile's there (its capacity below).
DYNAMIC_MIG: set[Key] = {
    # Offers carry NVIDIA's attributes, the NUMA node and their placement (a claim can select one);
    # not the deprecated parentIndex and pcieBusID.
    *_ours("mig offer", "resource.kubernetes.io/numaNode"),
    *_ours("mig offer", "placementStart", "placementSize"),
    ("name", "mig offer"),
    ("counter value", "set totals", "memory"),
    # Counters both count (memory slices, media engines) are compared by value: the same; the others
    # are each driver's own: compute slices here, multiprocessors and copy engines there.
    ("counter set names",),
    ("counter", "compute", OURS),
    ("counter", "copy-engines", THEIRS),
    ("counter", "multiprocessors", THEIRS),
    ("slices", "count"),
}
#: A whole GPU with dynamic MIG: in NVIDIA's driver it carries the full MIG profile's engines and
#: memory, and consumes that memory of its set.
DYNAMIC_WHOLE_GPU: set[Key] = {
    *{("capacity", "gpu", name, THEIRS) for name in ("copyEngines", "decoders", "encoders", "jpegEngines")},
    *{("capacity", "gpu", name, THEIRS) for name in ("multiprocessors", "ofaEngines")},
    ("capacity", "gpu", "memory", "value"),
    ("counter value", "gpu consumes", "memory"),
}
SLICES: dict[str, set[Key]] = {
    "h100x8": WHOLE_GPUS,
    "mixed": WHOLE_GPUS,
    "h100x8-mig": WHOLE_GPUS | STATIC_MIG,
    # A100s in MIG mode: neither driver publishes a whole GPU beside its MIG devices.
    "a100x4-mig": STATIC_MIG,
    "h100x8-dynamic-mig": WHOLE_GPUS | DYNAMIC_MIG | DYNAMIC_WHOLE_GPU,
    # An Ampere GPU in MIG mode: NVIDIA's driver does not offer it whole (it will not reset the GPU).
    "a100x4-dynamic-mig": DYNAMIC_MIG | {("device", "gpu", OURS)},
}

#: What differs in the container edits of the same claims.
EDITS: set[Key] = {
    # NVIDIA gives a MIG device's nvidia-caps nodes by major and minor alone; here by host path.
    ("device nodes", "host paths"),
    # Ours: each device's name, UUID and product, and the claim, in the environment.
    ("env", "DRA_GPU_*_NAME", OURS),
    ("env", "DRA_GPU_*_UUID", OURS),
    ("env", "DRA_GPU_*_PRODUCT", OURS),
    ("env", "DRA_GPU_CLAIM_*", OURS),
}


#: NVML functions NVIDIA's plugin calls on the paths these tests take that the fake NVML answers
#: NOT_SUPPORTED (deploy/local/fakenvml/loader.c records them), each with why that answer changes
#: nothing these tests compare (docs/testing.md, "NVIDIA's driver beside this one"). Any other such
#: call fails the test that made it: the plugin would be taking a path the real NVML does not send it.
NVML_STUBS: dict[str, str] = {}


def _rendered(key: Key) -> str:
    return " · ".join(key)


class Turns:
    """Each driver in turn on one fake node: its DeviceClasses, started, asked, stopped, its slices gone."""

    def __init__(self, cluster: ClusterInfo, kube: Kube, root: Path) -> None:
        self.cluster, self.kube, self.root = cluster, kube, root

    def node(self, profile: str) -> FakeNode:
        """A fresh fake node with the profile's GPUs."""
        name = f"{Path(profile).name}-{uuid.uuid4().hex[:6]}"
        return FakeNode(self.root / name, profile, self.cluster.node_name).build()

    def ours(self, node: FakeNode, *flags: str) -> DriverProcess:
        """This driver over the node's NVML; dynamic-MIG profiles offer every profile, as NVIDIA's does."""
        dynamic = node.config.profile.endswith("dynamic-mig")
        extra = ("--mig-mode=dynamic", "--mig-profiles=all") if dynamic else ()
        return DriverProcess(self.cluster, node, self.root / "ours.log", extra_args=(*extra, *flags))

    def nvidia(self, node: FakeNode) -> NvidiaDriverProcess:
        """NVIDIA's plugin over the node's NVML, with the gates its chart gets for the profile."""
        return NvidiaDriverProcess(self.cluster, node, self.root / "nvidia.log")

    @contextlib.contextmanager
    def running(self, driver: DaemonProcess) -> Iterator[list[Obj]]:
        """The driver started with its own DeviceClasses; its slices. Then stopped, its slices deleted."""
        classes = (
            device_classes(driver.rendered) if isinstance(driver, NvidiaDriverProcess) else ours_classes()
        )
        replace_device_classes(self.kube, classes)
        driver.start(timeout=60)
        try:
            yield wait_for("the driver's pool, whole", self._pool, timeout=30)
        finally:
            assert driver.stop() == 0, driver.log_path.read_text()[-3000:]
            for stale in published_slices(self.kube, self.cluster):
                self.kube.delete("resource.k8s.io/v1", "ResourceSlice", stale["metadata"]["name"])
        if isinstance(driver, NvidiaDriverProcess):
            _check_nvml_stubs(driver.node)

    def _pool(self) -> list[Obj] | None:
        """The node's slices once every slice of the newest generation is there (resourceSliceCount)."""
        slices = published_slices(self.kube, self.cluster)
        if not slices:
            return None
        newest = max(s["spec"]["pool"]["generation"] for s in slices)
        pool = [s for s in slices if s["spec"]["pool"]["generation"] == newest]
        return pool if len(pool) == pool[0]["spec"]["pool"]["resourceSliceCount"] else None


def _check_nvml_stubs(node: FakeNode) -> None:
    """Print the NVML calls of NVIDIA's plugin that the fake answered NOT_SUPPORTED; fail on any not in
    NVML_STUBS."""
    calls = node.unsupported_calls(NVIDIA_PLUGIN)
    answered = ", ".join(sorted(calls)) or "none"
    print(f"\nNVIDIA's plugin on {node.config.profile}: NVML calls answered NOT_SUPPORTED: {answered}")
    needed = sorted(calls - set(NVML_STUBS))
    assert not needed, (
        f"NVIDIA's plugin called NVML functions the fake NVML does not implement (NOT_SUPPORTED): {needed}; "
        "implement them in the stand-in (deploy/local/fakenvml) or say in NVML_STUBS why the answer changes "
        "nothing compared here"
    )


@pytest.fixture
def turns(cluster: ClusterInfo, kube: Kube, tmp_path: Path) -> Iterator[Turns]:
    yield Turns(cluster, kube, tmp_path)
    # The session's other tests expect this driver's classes.
    replace_device_classes(kube, ours_classes())


def test_the_slices_differ_only_as_documented_profile_by_profile(turns: Turns) -> None:
    assert set(SLICES) == set(BUILTIN_PROFILES), "every built-in profile has its list"
    found: dict[str, set[Key]] = {}
    for profile in sorted(BUILTIN_PROFILES):
        node = turns.node(profile)
        with turns.running(turns.ours(node)) as ours:
            pass
        with turns.running(turns.nvidia(node)) as theirs:
            pass
        found[profile] = slice_differences(ours, theirs)
    wrong = {
        p: {"undocumented": sorted(keys - SLICES[p]), "documented, not seen": sorted(SLICES[p] - keys)}
        for p, keys in found.items()
        if keys != SLICES[p]
    }
    assert not wrong, f"differences not as docs/migration.md explains them, by profile: {wrong}"


#: Claims for the same device whichever driver publishes it: by UUID, or a dynamic offer by GPU and profile.
CLAIMS = {
    "h100x8-mig": [
        ("whole", "gpu.nvidia.com", 'device.attributes["gpu.nvidia.com"].uuid == "{gpu3}"'),
        (
            "static",
            "mig.nvidia.com",
            'device.attributes["gpu.nvidia.com"].profile == "3g.40gb" && '
            'device.attributes["gpu.nvidia.com"].parentUUID == "{gpu4}"',
        ),
    ],
    "h100x8-dynamic-mig": [
        (
            "dynamic",
            "mig.nvidia.com",
            'device.attributes["gpu.nvidia.com"].profile == "1g.10gb" && '
            'device.attributes["gpu.nvidia.com"].parentUUID == "{gpu2}"',
        ),
    ],
}


def _edits(turns: Turns, driver: DaemonProcess, node: FakeNode, namespace: str) -> dict[str, Obj]:
    """The container records of one pod per claim of CLAIMS, with this driver serving them."""
    fake = node.config.fake_gpus()
    uuids = {f"gpu{i}": fake.uuid(fake.device_by_index(i)) for i in range(fake.device_count())}
    records: dict[str, Obj] = {}
    with turns.running(driver):
        kube = turns.kube
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        try:
            for name, device_class, selector in CLAIMS[node.config.profile]:
                claim_template(kube, namespace, name, [selector.format(**uuids)], device_class=device_class)
                gpu_pod(kube, namespace, name, name)
            for name, _, _ in CLAIMS[node.config.profile]:
                kube.wait_pod_phase(name, namespace, timeout=60)
                records[name] = container_record(turns.cluster, namespace, name)
        finally:
            delete_namespace(kube, namespace, turns.cluster.cdi_dir)
    return records


def delete_namespace(kube: Kube, namespace: str, cdi_dir: str) -> None:
    """Delete the namespace's pods and the namespace; wait until the driver unprepared their claims.

    Unprepared means its CDI specs are gone (each driver names a claim's spec after the claim's UID):
    the claim object can go before the kubelet has asked the driver to unprepare it.
    """
    claims = [
        c["metadata"]["uid"]
        for c in kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace)
    ]
    for pod in kube.list_objects("v1", "Pod", namespace=namespace):
        kube.delete("v1", "Pod", pod["metadata"]["name"], namespace, grace_period=0)
    kube.delete("v1", "Namespace", namespace)
    wait_for(
        f"the claims of namespace {namespace} to be unprepared",
        lambda: (
            not kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace)
            and not [p for p in Path(cdi_dir).iterdir() if any(uid in p.name for uid in claims)]
        ),
        timeout=90,
    )


def test_the_same_claims_get_the_container_edits_documented(turns: Turns) -> None:
    found: set[Key] = set()
    for profile in CLAIMS:
        node = turns.node(profile)
        ours = _edits(turns, turns.ours(node), node, f"ours-{uuid.uuid4().hex[:6]}")
        theirs = _edits(turns, turns.nvidia(node), node, f"nvidia-{uuid.uuid4().hex[:6]}")
        for name in ours:
            # The same device nodes, at the same host paths (both drivers' device root is the driver root).
            assert sorted(n["path"] for n in ours[name]["deviceNodes"]) == sorted(
                n["path"] for n in theirs[name]["deviceNodes"]
            ), (name, ours[name], theirs[name])
            found |= edit_differences(ours[name], theirs[name])
    assert found == EDITS, (
        f"undocumented: {sorted(found - EDITS)}; documented, not seen: {sorted(EDITS - found)}"
    )


#: NVIDIA's quickstart specs on NVIDIA's own driver over the fake node, and what happens to them there
#: (every one runs on this driver: test_nvidia_specs.py), as docs/migration.md says: Running; Running
#: with an MPS control daemon (MPS: each MPS claim's daemon is a Deployment of its image in its
#: release's namespace, which the fake runtime reports ready without running it, and each container
#: of the claim gets the daemon's pipe directory); or the event each pod gets, by reason and the words
#: migration.md quotes (gpu-test6 selects GPUs by `index`, which its v0.4.1 does not publish: the
#: scheduler's CEL fails). Any other outcome fails the test.
MPS = ("MPS", "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")
NVIDIA_QUICKSTART: dict[str, tuple[str, tuple[str, str] | None]] = {
    "quickstart-v1-gpu-test1.yaml": ("h100x8", None),
    "quickstart-v1-gpu-test2.yaml": ("h100x8", None),
    "quickstart-v1-gpu-test3.yaml": ("h100x8", None),
    "quickstart-v1-gpu-test5.yaml": ("h100x8", MPS),
    "quickstart-v1-gpu-test-mps.yaml": ("h100x8", MPS),
    "quickstart-v1-gpu-test6.yaml": (
        str(SPECS / "a100x8.profile.yaml"),
        ("FailedScheduling", "CEL runtime error: no such key: index"),
    ),
}


def _each_pod_got(kube: Kube, namespace: str, expected: int, reason: str, words: str) -> None:
    """Wait until each of the `expected` pods has an event of `reason` saying `words`; none may run."""

    def every_pod_told() -> bool:
        pods = kube.list_objects("v1", "Pod", namespace=namespace)
        running = [p["metadata"]["name"] for p in pods if p.get("status", {}).get("phase") == "Running"]
        assert not running, f"pods {running} run, where docs/migration.md says: {words}"
        told = [
            any(
                e.get("reason") == reason and words in e.get("message", "")
                for e in kube.events_for("Pod", p["metadata"]["name"], namespace)
            )
            for p in pods
        ]
        return len(pods) == expected and all(told)

    try:
        wait_for(f"each pod's {reason} event saying {words!r}", every_pod_told, timeout=120)
    except WaitTimeoutError:
        events = kube.list_objects("v1", "Event", namespace=namespace)
        said = sorted({f"{e.get('reason')}: {e.get('message', '')}" for e in events})
        raise AssertionError(
            f"expected {reason}: {words!r} for each of {expected} pods; events: {said}"
        ) from None


def _mps_requests(claim: Obj) -> set[str]:
    """The requests of a claim that an opaque config asks MPS for (a config naming no request: all)."""
    requests = {r["name"] for r in claim["spec"]["devices"]["requests"]}
    found: set[str] = set()
    for config in claim["spec"]["devices"].get("config") or []:
        if config.get("opaque", {}).get("parameters", {}).get("sharing", {}).get("strategy") == "MPS":
            found |= set(config.get("requests") or requests)
    return found


def _mps_daemons_serve(turns: Turns, namespace: str) -> None:
    """One MPS control daemon Deployment per MPS claim in NVIDIA's namespace, and each container that
    uses an MPS request given the daemon's pipe directory (and no other container)."""
    kube = turns.kube
    claims = kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace)
    mps = {c["metadata"]["name"]: _mps_requests(c) for c in claims if _mps_requests(c)}
    assert mps, f"no MPS claim in {namespace}"
    daemons = kube.list_objects("apps/v1", "Deployment", namespace=NVIDIA_NAMESPACE)
    assert len(daemons) == len(mps), [d["metadata"]["name"] for d in daemons]
    for pod in kube.list_objects("v1", "Pod", namespace=namespace):
        by_name = {
            s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []
        }
        for container in pod["spec"]["containers"]:
            uses_mps = any(
                (r.get("request") in mps.get(by_name.get(r["name"]) or "", set()))
                if r.get("request")
                else bool(mps.get(by_name.get(r["name"]) or ""))
                for r in container.get("resources", {}).get("claims") or []
            )
            record = container_record(turns.cluster, namespace, pod["metadata"]["name"], container["name"])
            env = [f"{k}={v}" for k, v in record["env"].items()]
            assert (MPS[1] in env) == uses_mps, (container["name"], uses_mps, env)


@pytest.mark.parametrize("name", sorted(NVIDIA_QUICKSTART))
def test_nvidias_quickstart_specs_fare_on_its_own_driver_as_documented(turns: Turns, name: str) -> None:
    profile, outcome = NVIDIA_QUICKSTART[name]
    node = turns.node(profile)
    fresh = f"nv-{uuid.uuid4().hex[:8]}"
    docs = load_manifests((SPECS / name).read_text().replace("{{ .Namespace }}", fresh))
    namespace = next((d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"), fresh)
    if namespace == fresh:
        docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": fresh}}, *docs]
    expected = sum(1 for d in docs if d["kind"] == "Pod") + sum(
        int(d["spec"]["replicas"]) for d in docs if d["kind"] == "Deployment"
    )
    with turns.running(turns.nvidia(node)):
        kube = turns.kube
        for doc in docs:
            kube.create(doc, None if doc["kind"] == "Namespace" else namespace)
        try:
            if outcome is None or outcome == MPS:
                kube.wait_pods_running(
                    namespace, expected, f"the pods of {name} on NVIDIA's driver", timeout=90
                )
            if outcome == MPS:
                _mps_daemons_serve(turns, namespace)
            elif outcome is not None:
                _each_pod_got(kube, namespace, expected, *outcome)
        finally:
            delete_namespace(kube, namespace, turns.cluster.cdi_dir)


#: Opaque configs each driver refuses at prepare (NVIDIA's GpuConfig, as its API types it), and what
#: each says: both refuse, the words differ (docs/migration.md).
BAD_CONFIGS: dict[str, tuple[dict[str, Any], str, str]] = {
    "unknown field": (
        {"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}, "bogus": 1},
        "bogus",
        "bogus",
    ),
    "unknown interval": (
        {"sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Sometimes"}}},
        "Sometimes",
        "Sometimes",
    ),
    "unknown strategy": ({"sharing": {"strategy": "Magic"}}, "Magic", "Magic"),
}


def _configured_pod(kube: Kube, namespace: str, parameters: dict[str, Any]) -> None:
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "configured", "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                        "config": [
                            {
                                "requests": ["gpu"],
                                "opaque": {
                                    "driver": "gpu.nvidia.com",
                                    "parameters": {
                                        "apiVersion": "resource.nvidia.com/v1beta1",
                                        "kind": "GpuConfig",
                                        **parameters,
                                    },
                                },
                            }
                        ],
                    }
                }
            },
        }
    )
    gpu_pod(kube, namespace, "configured", "configured")


def _refusal(kube: Kube, namespace: str) -> str:
    """The kubelet's event for the pod's failed prepare: what the driver said."""

    def said() -> str | None:
        events = kube.events_for("Pod", "configured", namespace)
        return next(
            (e["message"] for e in events if e.get("reason") == "FailedPrepareDynamicResources"), None
        )

    return str(wait_for("the prepare to be refused", said, timeout=60))


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_a_bad_opaque_config_is_refused_by_both_drivers(turns: Turns, case: str) -> None:
    parameters, ours_says, theirs_says = BAD_CONFIGS[case]
    node = turns.node("h100x8")
    said = {}
    for side, driver, phrase in (
        ("ours", turns.ours(node), ours_says),
        ("nvidia", turns.nvidia(node), theirs_says),
    ):
        namespace = f"{side}-{uuid.uuid4().hex[:6]}"
        with turns.running(driver):
            turns.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
            try:
                _configured_pod(turns.kube, namespace, parameters)
                said[side] = _refusal(turns.kube, namespace)
                assert pod_claim(turns.kube, namespace, "configured")["status"].get("allocation")
            finally:
                delete_namespace(turns.kube, namespace, turns.cluster.cdi_dir)
        assert phrase in said[side], said


def test_every_documented_difference_is_in_docs_migration_md() -> None:
    text = MIGRATION.read_text()
    documented = set().union(*SLICES.values()) | EDITS
    missing = [_rendered(key) for key in sorted(documented) if _rendered(key) not in text]
    assert not missing, f"docs/migration.md lists no row for: {missing}"
