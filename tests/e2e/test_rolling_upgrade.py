"""A rolling upgrade of the driver under load, as a DaemonSet with maxSurge 1 does it on each node.

The new instance starts beside the old one (sockets of its own), registers and
becomes ready; the kubelet sends it the new calls; the old one gets SIGTERM,
finishes what it has in flight and goes. Meanwhile pods with claims come and
go. Nothing may fail: no FailedPrepareDynamicResources, no claim lost, no GPU
handed out twice, and no fight over the ResourceSlices.

Profile h100x8: eight whole GPUs, gpu-0 .. gpu-7.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import uuid
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
    ensure_device_classes,
    gpu_pod,
    published_devices,
)

#: How many pods with a claim may live at once under the load.
ALIVE = 4
#: Pods the load creates while both instances run, and after the old one ended.
DURING, AFTER = 10, 6


def _slice_writes(driver: DriverProcess) -> int:
    """The driver's ResourceSlice writes so far (creates, updates, deletes)."""
    found = re.findall(r"^dra_gpu_resourceslice_writes_total\{[^}]*\} ([\d.]+)$", driver.metrics(), re.M)
    return int(sum(float(v) for v in found))


def _checkpointed(driver: DriverProcess) -> dict[str, Obj]:
    claims: dict[str, Obj] = driver.checkpointed()
    return claims


def _claims_logged(what: str, driver: DriverProcess) -> set[str]:
    """UIDs of the claims the driver logged as `what` ("prepared" or "unprepared")."""
    pattern = rf"(?<![a-z]){what} claim \S+ \(([0-9a-f-]+)\)"
    return set(re.findall(pattern, driver.log_path.read_text()))


def _spec(cluster: ClusterInfo, claim_uid: str) -> Path:
    return Path(cluster.cdi_dir) / f"k8s.{DRIVER}-claim_{claim_uid}.json"


def _slice_devices(kube: Kube, cluster: ClusterInfo) -> list[str]:
    return sorted(d["name"] for d in published_devices(kube, cluster))


class Load:
    """Creates pods in a thread until stopped, deleting the oldest whenever ALIVE are there."""

    def __init__(self, cluster: ClusterInfo, namespace: str, template: str) -> None:
        self.kube = Kube(cluster.kubeconfig)
        self.namespace = namespace
        self.template = template
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        """Begin creating pods."""
        self._thread.start()

    def wait_for_more(self, count: int, timeout: float = 120) -> None:
        """Wait until `count` more pods were created."""
        target = len(self.created) + count
        wait_for(f"{target} pods under load", lambda: len(self.created) >= target or self.error, timeout)

    def stop(self, timeout: float = 60) -> None:
        """Create no more pods; re-raise what went wrong in the thread."""
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the load did not finish"
        self.kube.close()
        if self.error is not None:
            raise self.error

    def _running(self, name: str) -> bool:
        pod = self.kube.get("v1", "Pod", name, self.namespace)
        return bool(pod.get("status", {}).get("phase") == "Running")

    def _run(self) -> None:
        try:
            for i in itertools.count():
                if self._stop.is_set():
                    return
                alive = [p for p in self.created if p not in self.deleted]
                if len(alive) >= ALIVE:
                    oldest = alive[0]
                    # Only a running pod: its claim is prepared, so its end is an unprepare.
                    wait_for(f"pod {oldest} to run", lambda: self._running(oldest), timeout=60)  # noqa: B023 (called at once)
                    self.kube.delete("v1", "Pod", oldest, self.namespace, grace_period=0)
                    self.deleted.append(oldest)
                name = f"load-{i:02d}"
                gpu_pod(self.kube, self.namespace, name, self.template)
                self.created.append(name)
                time.sleep(0.3)
        except BaseException as err:  # handed to the test thread by stop()
            self.error = err


@pytest.fixture
def old_driver(cluster: ClusterInfo, kube: Kube, tmp_path: Path) -> Iterator[DriverProcess]:
    """The instance being replaced, running and ready."""
    ensure_device_classes(kube)
    process = DriverProcess(cluster, "h100x8", tmp_path / "old.log").start()
    yield process
    process.stop()


def _no_claim_lost_or_shared(kube: Kube, cluster: ClusterInfo, driver: DriverProcess, namespace: str) -> None:
    """Every running pod's claim is prepared (checkpoint and CDI spec); no GPU is held twice."""
    checkpoint = _checkpointed(driver)
    held = [d["device"] for claim in checkpoint.values() for d in claim["devices"]]
    assert len(held) == len(set(held)), f"a GPU is prepared for two claims: {sorted(held)}"
    allocated: list[str] = []
    for claim in kube.list_objects("resource.k8s.io/v1", "ResourceClaim", namespace=namespace):
        uid = claim["metadata"]["uid"]
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        if not reserved:
            continue
        pod = kube.get_or_none("v1", "Pod", reserved[0]["name"], namespace)
        if pod is None or pod.get("status", {}).get("phase") != "Running":
            continue
        name = claim["metadata"]["name"]
        assert uid in checkpoint, f"claim {name} of a running pod is not in the checkpoint"
        assert _spec(cluster, uid).exists(), f"claim {name} of a running pod has no CDI spec"
        allocated += allocated_devices(claim)
    assert len(allocated) == len(set(allocated)), f"two running pods share a GPU: {sorted(allocated)}"


def test_upgrade_under_load_fails_no_prepare_and_loses_no_claim(
    old_driver: DriverProcess,
    kube: Kube,
    cluster: ClusterInfo,
    namespace: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    claim_template(kube, namespace, "one-gpu")
    # Prepared by the old instance and ended only after it: its unprepare can only go to the
    # new one. (Which instance ends the load's pods depends on when the kubelet switches.)
    gpu_pod(kube, namespace, "held", "one-gpu")
    kube.wait_pod_phase("held", namespace)
    load = Load(cluster, namespace, "one-gpu")
    load.start()
    load.wait_for_more(4)

    old_writes = _slice_writes(old_driver)
    # At debug: an unprepare's line, which says which claims the new instance took over.
    new_driver = DriverProcess(
        cluster, "h100x8", tmp_path / "new.log", extra_args=("--log-level=debug",)
    ).start()
    # A failed assertion must not leave a second instance holding the node's publisher lock.
    request.addfinalizer(new_driver.stop)
    overlap_started = time.monotonic()
    # Both registered, each on its own sockets: the kubelet holds both and calls the newer.
    assert old_driver.registration_socket.exists()
    assert new_driver.registration_socket != old_driver.registration_socket
    load.wait_for_more(DURING)
    old_writes_after = _slice_writes(old_driver)
    assert old_writes_after == old_writes, "the old instance rewrote slices during the overlap"
    assert _slice_writes(new_driver) == 0, "the new instance wrote slices while the old one publishes"

    assert old_driver.stop() == 0, old_driver.log_path.read_text()
    overlap = time.monotonic() - overlap_started
    assert not old_driver.registration_socket.exists()
    assert not old_driver.dra_socket.exists()
    load.wait_for_more(AFTER)
    load.stop()

    for name in [p for p in load.created if p not in load.deleted]:
        kube.wait_pod_phase(name, namespace, timeout=60)
    failed = [
        f"{e['involvedObject']['name']}: {e.get('message')}"
        for e in kube.list_objects("v1", "Event", namespace=namespace)
        if e.get("reason") == "FailedPrepareDynamicResources"
    ]
    assert failed == [], "\n".join(failed)
    _no_claim_lost_or_shared(kube, cluster, new_driver, namespace)

    for name in ["held", *(p for p in load.created if p not in load.deleted)]:
        kube.delete("v1", "Pod", name, namespace, grace_period=0)
    wait_for("every claim unprepared", lambda: _checkpointed(new_driver) == {}, timeout=60)
    # The kubelet sent the new instance the calls from its start: it prepared claims, and
    # unprepared claims that the old one had prepared.
    by_old = _claims_logged("prepared", old_driver)
    by_new = _claims_logged("prepared", new_driver)
    handed_over = by_old & _claims_logged("unprepared", new_driver)
    assert by_new, "the new instance prepared nothing"
    assert handed_over, "no claim prepared by the old instance was unprepared by the new one"
    assert not list(Path(cluster.cdi_dir).glob(f"k8s.{DRIVER}-claim_*.json"))
    # Publishing passed to the new instance when the old one ended; same devices, no rewrite.
    assert _slice_devices(kube, cluster) == [f"gpu-{i}" for i in range(8)]
    new_writes = _slice_writes(new_driver)
    print(
        f"\nrolling upgrade: {len(load.created)} pods, {len(load.deleted)} deleted under load, "
        f"overlap {overlap:.1f}s, "
        f"{len(failed)} failed prepares; claims prepared by old {len(by_old)}, by new {len(by_new)}, "
        f"prepared by old and unprepared by new {len(handed_over)}; slice writes: old during the overlap "
        f"{old_writes_after - old_writes}, new after taking over {new_writes}"
    )
    assert new_writes == 0
    assert new_driver.stop() == 0, new_driver.log_path.read_text()


def test_a_changed_configuration_is_published_once_the_old_instance_ends(
    old_driver: DriverProcess, kube: Kube, cluster: ClusterInfo, tmp_path: Path
) -> None:
    # The new configuration advertises half the GPUs: the two instances disagree on the slices.
    old_writes = _slice_writes(old_driver)
    new_driver = DriverProcess(
        cluster, "h100x8", tmp_path / "new.log", extra_args=("--dra-gpus=0,1,2,3",)
    ).start()
    try:
        time.sleep(3)
        assert _slice_devices(kube, cluster) == [f"gpu-{i}" for i in range(8)]
        assert _slice_writes(new_driver) == 0
        assert _slice_writes(old_driver) == old_writes
        assert "left to the previous instance to publish" in new_driver.log_path.read_text()

        assert old_driver.stop() == 0
        wait_for(
            "the new configuration's slices",
            lambda: _slice_devices(kube, cluster) == [f"gpu-{i}" for i in range(4)],
            timeout=15,
        )
        time.sleep(2)
        writes = _slice_writes(new_driver)
        print(f"\nhand-over of a changed pool: {writes} slice write(s) by the new instance, 0 by the old")
        assert writes == 1
    finally:
        assert new_driver.stop() == 0, new_driver.log_path.read_text()


def test_a_killed_instances_sockets_are_removed_by_the_next(
    old_driver: DriverProcess, cluster: ClusterInfo, tmp_path: Path
) -> None:
    old_driver.kill()
    assert old_driver.registration_socket.exists()
    new_driver = DriverProcess(cluster, "h100x8", tmp_path / "new.log", instance_id=uuid.uuid4().hex).start()
    try:
        assert not old_driver.registration_socket.exists()
        assert not old_driver.dra_socket.exists()
        assert new_driver.registration_socket.exists()
    finally:
        assert new_driver.stop() == 0
