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
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DaemonProcess, DriverProcess
from localcluster.kube import Kube, Obj, WaitTimeoutError, load_manifests, wait_for
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


#: What differs in the slices, each explained in docs/migration.md.
SLICES: set[Key] = {
    # Extras of ours: the NVML index and minor of a whole GPU (unstable across reboots, so not for
    # selecting), the bus ID as NVML writes it, the NUMA node (NVIDIA's v0.5.0 publishes it too).
    *_ours("gpu", "index", "minor", "pcieBusID", "resource.kubernetes.io/numaNode"),
    *_ours("mig", "parentIndex", "pcieBusID", "resource.kubernetes.io/numaNode"),
    *_ours("mig offer", "parentIndex", "pcieBusID", "resource.kubernetes.io/numaNode"),
    *_ours("mig offer", "placementStart", "placementSize"),
    # Names: <gpu>-mig-<profile>-<GI>-<CI> and -at<slice> here, -<GI profile>-<slice> there.
    ("name", "mig"),
    ("name", "mig offer"),
    # Dynamic MIG: a whole GPU in NVIDIA's driver carries the full MIG profile's engines and memory.
    *{("capacity", "gpu", name, THEIRS) for name in ("copyEngines", "decoders", "encoders", "jpegEngines")},
    *{("capacity", "gpu", name, THEIRS) for name in ("multiprocessors", "ofaEngines")},
    ("capacity", "gpu", "memory", "value"),
    # ... and its counters are its own vocabulary: what they count differs, not what they exclude.
    ("counter set names",),
    ("counter", "compute", OURS),
    ("counter", "jpegengines", OURS),
    ("counter", "ofaengines", OURS),
    ("counter", "memsliceN", OURS),
    ("counter", "copy-engines", THEIRS),
    ("counter", "encoders", THEIRS),
    ("counter", "jpeg-engines", THEIRS),
    ("counter", "memory-slice-N", THEIRS),
    ("counter", "multiprocessors", THEIRS),
    ("counter", "ofa-engines", THEIRS),
    ("slices", "count"),
    # An Ampere GPU in MIG mode: NVIDIA's driver does not offer it whole (it will not reset the GPU).
    ("device", "gpu", OURS),
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
    # Theirs: nvidia-cdi-hook's settings and hooks; ours mounts the SONAME links the hook would make.
    ("env", "NVIDIA_CTK_LIBCUDA_DIR", THEIRS),
    ("hook", "createContainer create-symlinks", THEIRS),
    ("hook", "createContainer update-ldcache", THEIRS),
    ("hook", "createContainer enable-cuda-compat", THEIRS),
    ("hook", "createContainer disable-device-node-modification", THEIRS),
    ("mount", "*.so.1", OURS),
}


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

    def _pool(self) -> list[Obj] | None:
        """The node's slices once every slice of the newest generation is there (resourceSliceCount)."""
        slices = published_slices(self.kube, self.cluster)
        if not slices:
            return None
        newest = max(s["spec"]["pool"]["generation"] for s in slices)
        pool = [s for s in slices if s["spec"]["pool"]["generation"] == newest]
        return pool if len(pool) == pool[0]["spec"]["pool"]["resourceSliceCount"] else None


@pytest.fixture
def turns(cluster: ClusterInfo, kube: Kube, tmp_path: Path) -> Iterator[Turns]:
    yield Turns(cluster, kube, tmp_path)
    # The session's other tests expect this driver's classes.
    replace_device_classes(kube, ours_classes())


def test_the_slices_differ_only_as_documented(turns: Turns) -> None:
    found: dict[str, set[Key]] = {}
    for profile in sorted(BUILTIN_PROFILES):
        node = turns.node(profile)
        with turns.running(turns.ours(node)) as ours:
            pass
        with turns.running(turns.nvidia(node)) as theirs:
            pass
        found[profile] = slice_differences(ours, theirs)
    undocumented = {p: sorted(keys - SLICES) for p, keys in found.items() if keys - SLICES}
    assert not undocumented, f"differences docs/migration.md does not explain: {undocumented}"
    assert set().union(*found.values()) == SLICES, (
        f"documented but not seen: {sorted(SLICES - set().union(*found.values()))}"
    )


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
            _delete_namespace(kube, namespace, turns.cluster.cdi_dir)
    return records


def _delete_namespace(kube: Kube, namespace: str, cdi_dir: str) -> None:
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
#: (every one runs on this driver: test_nvidia_specs.py). gpu-test5 and gpu-test-mps: its MPS control
#: daemon is a Deployment of its own image, which the local cluster cannot run (no image of NVIDIA's is
#: pulled here), so prepare waits for a daemon that never comes. gpu-test6 selects GPUs by `index`,
#: which its v0.4.1 does not publish: the scheduler's CEL fails ("no such key: index").
NVIDIA_QUICKSTART = {
    "quickstart-v1-gpu-test1.yaml": ("h100x8", "Running"),
    "quickstart-v1-gpu-test2.yaml": ("h100x8", "Running"),
    "quickstart-v1-gpu-test3.yaml": ("h100x8", "Running"),
    "quickstart-v1-gpu-test5.yaml": ("h100x8", "ContainerCreating"),
    "quickstart-v1-gpu-test-mps.yaml": ("h100x8", "ContainerCreating"),
    "quickstart-v1-gpu-test6.yaml": (str(SPECS / "a100x8.profile.yaml"), "no such key: index"),
}


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
            if outcome == "Running":
                kube.wait_pods_running(
                    namespace, expected, f"the pods of {name} on NVIDIA's driver", timeout=60
                )
            else:
                with pytest.raises(WaitTimeoutError):
                    kube.wait_pods_running(namespace, expected, f"the pods of {name}", timeout=20)
        finally:
            _delete_namespace(kube, namespace, turns.cluster.cdi_dir)


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
                _delete_namespace(turns.kube, namespace, turns.cluster.cdi_dir)
        assert phrase in said[side], said


def test_every_documented_difference_is_in_docs_migration_md() -> None:
    text = MIGRATION.read_text()
    missing = [_rendered(key) for key in sorted(SLICES | EDITS) if _rendered(key) not in text]
    assert not missing, f"docs/migration.md lists no row for: {missing}"
