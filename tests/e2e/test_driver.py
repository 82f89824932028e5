"""The driver end to end: real API server, scheduler, kubelet and fake runtime; fake GPUs.

Profile `mixed`: gpu-0 and gpu-1 are L40S (46068 MiB), gpu-2 and gpu-3 are T4
(15360 MiB); driver version 550.54.15.
"""

from __future__ import annotations

import io
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claim_template,
    container_record,
    delete_pods_and_wait,
    ensure_device_classes,
    gpu_pod,
    pod_claim,
    visible_devices,
)
from prometheus_client.parser import text_string_to_metric_families

from dra import __version__
from dra.kubeletplugin import top

ATTR = f'device.attributes["{DRIVER}"]'
CAP = f'device.capacity["{DRIVER}"]'


@pytest.fixture(scope="module")
def driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    """The driver on profile `mixed`, registered with the kubelet.

    A short quiet period, so that the GPU the XID test makes unhealthy (and taints) is back
    before the module's other tests want it.
    """
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("driver")
    events = workdir / "xid-events"
    events.touch()
    process = DriverProcess(
        cluster,
        "mixed",
        workdir / "driver.log",
        extra_args=(
            f"--fake-gpu-events={events}",
            "--health-recovery-period=20",
            "--claim-metrics-interval=1",
        ),
    ).start()
    yield process
    assert process.stop() == 0, process.log_path.read_text()


def _checkpointed(driver: DriverProcess) -> dict[str, Obj]:
    claims: dict[str, Obj] = driver.checkpointed()
    return claims


def _slice_devices(kube: Kube, cluster: ClusterInfo) -> dict[str, Obj]:
    slices = kube.list_objects(
        "resource.k8s.io/v1",
        "ResourceSlice",
        field_selector=f"spec.driver={DRIVER},spec.nodeName={cluster.node_name}",
    )
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


def test_driver_publishes_typed_attributes(driver: DriverProcess, kube: Kube, cluster: ClusterInfo) -> None:
    devices = _slice_devices(kube, cluster)
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    gpu0 = devices["gpu-0"]
    assert gpu0["attributes"]["productName"] == {"string": "NVIDIA L40S"}
    assert gpu0["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:10:00.0"}
    assert gpu0["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert gpu0["attributes"]["addressingMode"] == {"string": "HMM"}
    assert gpu0["attributes"]["driverVersion"] == {"version": "550.54.15"}
    assert gpu0["capacity"]["memory"] == {"value": "46068Mi"}


def test_the_running_driver_says_its_release_in_its_ready_line_and_metrics(driver: DriverProcess) -> None:
    ready = f"dra-gpu {__version__} ready: registered with the kubelet and published"
    wait_for("the ready line", lambda: ready in driver.log_path.read_text(), timeout=30)
    assert f'dra_gpu_build_info{{version="{__version__}"}} 1.0' in driver.metrics().splitlines()


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param(f'{ATTR}.productName == "Tesla T4"', {"gpu-2", "gpu-3"}, id="productName"),
        pytest.param(f'{CAP}.memory.compareTo(quantity("40Gi")) >= 0', {"gpu-0", "gpu-1"}, id="memory"),
        pytest.param(
            f'{ATTR}.driverVersion.isGreaterThan(semver("535.0.0")) && '
            'device.attributes["resource.kubernetes.io"].pciBusID == "0000:40:00.0"',
            {"gpu-3"},
            id="driverVersion",
        ),
    ],
)
def test_pod_gets_the_selected_gpu(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str, selector: str, expected: set[str]
) -> None:
    claim_template(kube, namespace, "pick", [selector])
    gpu_pod(kube, namespace, "worker", "pick")
    kube.wait_pod_phase("worker", namespace)

    claim = pod_claim(kube, namespace, "worker")
    [device] = allocated_devices(claim)
    assert device in expected
    uid = claim["metadata"]["uid"]
    spec_path = Path(cluster.cdi_dir) / f"k8s.{DRIVER}-claim_{uid}.json"
    spec = json.loads(spec_path.read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-{device}"]

    # The kubelet passed our CDI device to the runtime, which resolved it from the spec.
    record = container_record(cluster, namespace, "worker")
    assert record["cdiDevices"] == [f"k8s.{DRIVER}/claim={uid}-{device}"]
    device_uuid = _slice_devices(kube, cluster)[device]["attributes"]["uuid"]["string"]
    assert record["env"][f"DRA_GPU_{device.upper().replace('-', '_')}_UUID"] == device_uuid
    assert record["env"]["NVIDIA_VISIBLE_DEVICES"] == "none", "NVIDIA's runtime hook adds nothing of its own"
    assert record["deviceNodes"] == []

    delete_pods_and_wait(kube, cluster, namespace, [claim])
    # Unprepare removes the spec first, then the checkpoint entry.
    wait_for("the claim to leave the checkpoint", lambda: uid not in _checkpointed(driver), timeout=10)


def claim_device_info(driver: DriverProcess) -> list[dict[str, str]]:
    """The label sets of dra_gpu_claim_device_info the driver serves now."""
    return [
        sample.labels
        for family in text_string_to_metric_families(driver.metrics())
        if family.name == "dra_gpu_claim_device_info"
        for sample in family.samples
    ]


def test_claim_status_and_join_metric_name_the_device_until_unprepare(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    claim_template(kube, namespace, "named", [])
    gpu_pod(kube, namespace, "named", "named")
    kube.wait_pod_phase("named", namespace)
    claim = pod_claim(kube, namespace, "named")
    name = claim["metadata"]["name"]
    [device] = allocated_devices(claim)
    published = _slice_devices(kube, cluster)[device]["attributes"]

    def entries() -> list[Obj]:
        # The claim made from the pod's template goes with the pod: then its entries went too.
        stored = kube.get_or_none("resource.k8s.io/v1", "ResourceClaim", name, namespace) or {}
        found: list[Obj] = (stored.get("status") or {}).get("devices") or []
        return found

    # Written in the first pause of the kubelet's calls after the prepare, at most a second later.
    [entry] = wait_for("the claim's status to name its device", lambda: entries() or None, timeout=10)
    # The test's client shows the fields the driver left out as None.
    assert {k: v for k, v in entry.items() if v is not None} == {
        "driver": DRIVER,
        "pool": cluster.node_name,
        "device": device,
        "data": {
            "uuid": published["uuid"]["string"],
            "pciBusID": published["resource.kubernetes.io/pciBusID"]["string"],
            "sharing": {"strategy": "Exclusive"},
        },
    }
    expected = {
        "UUID": published["uuid"]["string"],
        "GPU_I_ID": "",
        "GPU_I_PROFILE": "",
        "dra_claim_namespace": namespace,
        "dra_claim_name": name,
        "dra_device_name": device,
        "namespace": namespace,
        "pod": "named",
        "container": "main",
    }
    wait_for(
        "the join metric to name the pod (sampled every second)",
        lambda: expected in claim_device_info(driver),
        timeout=10,
    )
    shown = io.StringIO()
    assert anyio.run(top.run, cluster.kubeconfig, DRIVER, cluster.node_name, 1.0, True, shown) == 0
    # Not given the driver's /metrics: no usage columns.
    row = [
        namespace,
        "named",
        name,
        device,
        published["uuid"]["string"],
        "-",
        "Exclusive",
        "device",
        "-",
        "-",
    ]
    assert row in [line.split() for line in shown.getvalue().splitlines()], shown.getvalue()

    kube.delete("v1", "Pod", "named", namespace)
    wait_for("the claim and its entries to go with the pod", lambda: not entries(), timeout=60)
    wait_for(
        "the join metric to drop the claim",
        lambda: all(s["dra_claim_name"] != name for s in claim_device_info(driver)),
        timeout=10,
    )


def test_a_claim_that_outlives_its_pod_loses_our_entries_when_deallocated(
    driver: DriverProcess, kube: Kube, namespace: str
) -> None:
    """The unprepare writes no removal: the API server drops a deallocated device's entries itself."""
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "kept", "namespace": namespace},
            "spec": {"devices": {"requests": [request]}},
        }
    )
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kept", "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "kept"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        }
    )
    kube.wait_pod_phase("kept", namespace)

    def status() -> Obj:
        found: Obj = kube.get("resource.k8s.io/v1", "ResourceClaim", "kept", namespace).get("status") or {}
        return found

    wait_for("the claim's status to name its device", lambda: status().get("devices"), timeout=10)
    kube.delete("v1", "Pod", "kept", namespace)
    wait_for("the claim to be deallocated", lambda: "allocation" not in status(), timeout=60)
    assert not status().get("devices"), "the server drops the entries of a deallocated device"
    assert 'operation="remove"' not in driver.metrics()


def test_unsatisfiable_driver_version_stays_pending(
    driver: DriverProcess, kube: Kube, namespace: str
) -> None:
    claim_template(kube, namespace, "old", [f'{ATTR}.driverVersion.isLessThan(semver("500.0.0"))'])
    gpu_pod(kube, namespace, "waiting", "old")
    event = wait_for(
        "FailedScheduling",
        lambda: next(
            (e for e in kube.events_for("Pod", "waiting", namespace) if e["reason"] == "FailedScheduling"),
            None,
        ),
    )
    assert "cannot allocate all claims" in event["message"]
    assert kube.get("v1", "Pod", "waiting", namespace)["status"]["phase"] == "Pending"


def test_two_pods_never_share_a_gpu(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    claim_template(kube, namespace, "any", [])
    names = [f"p{i}" for i in range(5)]
    for name in names:
        gpu_pod(kube, namespace, name, "any")

    def four_running() -> list[Obj] | None:
        pods = kube.list_objects("v1", "Pod", namespace=namespace)
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running if len(running) == 4 else None

    running = wait_for("four pods running", four_running)
    claims = [pod_claim(kube, namespace, p["metadata"]["name"]) for p in running]
    devices = [d for c in claims for d in allocated_devices(c)]
    assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    uuids = {name: d["attributes"]["uuid"]["string"] for name, d in _slice_devices(kube, cluster).items()}
    seen = [
        visible_devices(container_record(cluster, namespace, p["metadata"]["name"]), uuids) for p in running
    ]
    assert sorted(d for devices in seen for d in devices) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    prepared = driver.checkpointed()
    held = [d["device"] for c in prepared.values() for d in c["devices"]]
    assert sorted(held) == sorted(devices)
    [pending] = [
        p
        for p in kube.list_objects("v1", "Pod", namespace=namespace)
        if p["status"].get("phase") != "Running"
    ]
    assert pending["status"]["phase"] == "Pending"
    delete_pods_and_wait(kube, cluster, namespace, claims)


def test_restart_after_sigkill_keeps_prepared_claims(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    claim_template(kube, namespace, "one", [f'{ATTR}.productName == "Tesla T4"'])
    gpu_pod(kube, namespace, "before", "one")
    kube.wait_pod_phase("before", namespace)
    before = pod_claim(kube, namespace, "before")
    stray = Path(cluster.cdi_dir) / f"k8s.{DRIVER}-claim_{uuid.uuid4()}.json"

    driver.kill()
    stray.write_text('{"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim", "devices": []}')
    driver.start()

    assert not stray.exists(), "the restarted driver removes specs of claims it has not prepared"
    prepared = driver.checkpointed()
    assert before["metadata"]["uid"] in prepared

    gpu_pod(kube, namespace, "after", "one")
    kube.wait_pod_phase("after", namespace)
    after = pod_claim(kube, namespace, "after")
    assert set(allocated_devices(before)) | set(allocated_devices(after)) == {"gpu-2", "gpu-3"}
    held = [d["device"] for c in driver.checkpointed().values() for d in c["devices"]]
    assert len(held) == len(set(held)) == 2

    delete_pods_and_wait(kube, cluster, namespace, [before, after])
    wait_for("an empty checkpoint", lambda: _checkpointed(driver) == {}, timeout=10)
    assert driver.proc is not None
    assert driver.proc.poll() is None
    os.kill(driver.proc.pid, signal.SIGTERM)
    assert driver.proc.wait(15) == 0
    assert not driver.registration_socket.exists()
    assert not driver.dra_socket.exists()
    driver.start()


def test_xid_error_shows_in_the_pod_status(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    # Kubelet 1.34 reports device health only for a pod claim named like its ResourceClaim,
    # so this pod references a claim created up front rather than one from a template.
    claim = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpu", "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        }
    )
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "victim", "namespace": namespace},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        }
    )
    kube.wait_pod_phase("victim", namespace)
    claim = kube.get("resource.k8s.io/v1", "ResourceClaim", "gpu", namespace)
    [device] = allocated_devices(claim)
    device_uuid = _slice_devices(kube, cluster)[device]["attributes"]["uuid"]["string"]
    events = next(a for a in driver.extra_args if a.startswith("--fake-gpu-events=")).split("=", 1)[1]

    def health() -> list[str]:
        statuses = kube.get("v1", "Pod", "victim", namespace)["status"].get("containerStatuses") or []
        return [
            r.get("health", "")
            for s in statuses
            for a in s.get("allocatedResourcesStatus") or []
            for r in a.get("resources") or []
        ]

    wait_for("the kubelet to report the device Healthy", lambda: health() == ["Healthy"] or None)
    with open(events, "a") as f:
        f.write(f"{device_uuid} 79\n")
    wait_for("the kubelet to report the device Unhealthy", lambda: health() == ["Unhealthy"] or None)
    assert "dra_gpu_unhealthy_devices 1.0" in driver.metrics()
    delete_pods_and_wait(kube, cluster, namespace, [claim])
    wait_for(
        "the device to be healthy and untainted again",
        lambda: (
            "dra_gpu_unhealthy_devices 0.0" in driver.metrics()
            and not _slice_devices(kube, cluster)[device].get("taints")
        ),
        timeout=60,
    )
