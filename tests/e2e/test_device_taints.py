"""Device taints end to end: an XID taints the GPU in the ResourceSlice, the real scheduler keeps
claims off it unless they tolerate the taint, the taint goes after a quiet period, and with
NoExecute the controller manager's device-taint eviction controller evicts the pod using it.

Runs on 1.34 (the harness turns DRADeviceTaints on everywhere) and on 1.37 (GA). On a 1.34
cluster started with the gates off (`--feature-gates=DRADeviceTaints=false,...`) the driver says
so once and publishes untainted, as before taints existed. Profile `mixed`: gpu-0 and gpu-1 are
L40S, gpu-2 and gpu-3 T4.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

from tests.skips import Lack, reason

KEY = f"{DRIVER}/unhealthy"
#: Long enough to ask for a clear inside it, short enough to wait for.
QUIET_S = 15


class TaintedDriver:
    """The driver with an XID events file of its own, and the command that clears a taint."""

    def __init__(self, cluster: ClusterInfo, workdir: Path, *flags: str) -> None:
        self.cluster = cluster
        self.events = workdir / "xid-events"
        self.events.touch()
        self.process = DriverProcess(
            cluster, "mixed", workdir / "driver.log", extra_args=(f"--fake-gpu-events={self.events}", *flags)
        )

    def xid(self, uuid: str, xid: int) -> None:
        with open(self.events, "a") as f:
            f.write(f"{uuid} {xid}\n")

    def clear(self, device: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "dra",
                "taint",
                "clear",
                f"--device={device}",
                f"--kubelet-root={self.cluster.kubelet_root}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def prepared(self) -> dict[str, Obj]:
        claims: dict[str, Obj] = self.process.checkpointed()
        return claims


@pytest.fixture
def start_driver(cluster: ClusterInfo, kube: Kube, tmp_path: Path) -> Iterator[Any]:
    """Starts the driver with extra flags; stopped (exit 0) after the test."""
    ensure_device_classes(kube)
    started: list[TaintedDriver] = []

    def start(*flags: str) -> TaintedDriver:
        driver = TaintedDriver(cluster, tmp_path, *flags)
        driver.process.start()
        started.append(driver)
        return driver

    yield start
    for driver in started:
        assert driver.process.stop() == 0, driver.process.log_path.read_text()


def _kept(cluster: ClusterInfo) -> dict[str, bool]:
    """Which gated features this cluster's API server keeps: GA ones, or those whose gate is on."""
    minor = int(cluster.kubernetes_version.lstrip("v").split(".")[1])
    gates = cluster.feature_gates
    return {
        "device taints": minor >= 37 or gates.get("DRADeviceTaints", False),
        "shared counters (partitionable devices)": gates.get("DRAPartitionableDevices", minor >= 36),
        "consumable capacity": gates.get("DRAConsumableCapacity", minor >= 36),
    }


def _needs_taints(cluster: ClusterInfo) -> None:
    if not _kept(cluster)["device taints"]:
        pytest.skip(
            reason(Lack.RELEASE, "this cluster's API server drops device taints (DRADeviceTaints off)")
        )


def _devices(kube: Kube, cluster: ClusterInfo) -> dict[str, Obj]:
    slices = kube.list_objects(
        "resource.k8s.io/v1",
        "ResourceSlice",
        field_selector=f"spec.driver={DRIVER},spec.nodeName={cluster.node_name}",
    )
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


def _taints(kube: Kube, cluster: ClusterInfo, device: str) -> list[Obj]:
    return list(_devices(kube, cluster)[device].get("taints") or [])


def _uuid(kube: Kube, cluster: ClusterInfo, device: str) -> str:
    return str(_devices(kube, cluster)[device]["attributes"]["uuid"]["string"])


def _pinned(uuid: str) -> str:
    return f'device.attributes["{DRIVER}"].uuid == "{uuid}"'


def _tolerating_template(kube: Kube, namespace: str, name: str, uuid: str) -> None:
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": DRIVER,
                                    "selectors": [{"cel": {"expression": _pinned(uuid)}}],
                                    "tolerations": [
                                        {"key": KEY, "operator": "Exists", "effect": "NoSchedule"}
                                    ],
                                },
                            }
                        ]
                    }
                }
            },
        }
    )


def _unschedulable(kube: Kube, namespace: str, pod: str) -> bool:
    conditions = kube.get("v1", "Pod", pod, namespace)["status"].get("conditions") or []
    return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


def test_an_unhealthy_gpu_is_tainted_tolerated_and_untainted_after_the_quiet_period(
    start_driver: Any, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    _needs_taints(cluster)
    driver: TaintedDriver = start_driver(f"--health-recovery-period={QUIET_S}")
    assert all(not _taints(kube, cluster, d) for d in _devices(kube, cluster))
    uuid = _uuid(kube, cluster, "gpu-3")

    driver.xid(uuid, 79)
    [taint] = wait_for("gpu-3's taint", lambda: _taints(kube, cluster, "gpu-3") or None, timeout=20)
    assert {k: taint[k] for k in ("key", "value", "effect")} == {
        "key": KEY,
        "value": "XID-79",
        "effect": "NoSchedule",
    }
    assert taint["timeAdded"]
    assert [d for d in _devices(kube, cluster) if _taints(kube, cluster, d)] == ["gpu-3"]

    refused = driver.clear("gpu-3")
    assert refused.returncode == 1
    assert "gpu-3 not cleared: gpu-3 reported XID 79" in refused.stderr
    assert "within the quiet period" in refused.stderr

    # A claim that does not tolerate the taint cannot have the GPU...
    claim_template(kube, namespace, "plain", [_pinned(uuid)])
    gpu_pod(kube, namespace, "plain", "plain")
    wait_for("the untolerating pod to be unschedulable", lambda: _unschedulable(kube, namespace, "plain"))
    # ...one that tolerates it can.
    _tolerating_template(kube, namespace, "tolerant", uuid)
    gpu_pod(kube, namespace, "tolerant", "tolerant")
    kube.wait_pod_phase("tolerant", namespace)
    tolerant = pod_claim(kube, namespace, "tolerant")
    assert allocated_devices(tolerant) == ["gpu-3"]
    kube.delete("v1", "Pod", "tolerant", namespace, grace_period=0)

    # Quiet for the period: the taint goes without a restart, and the waiting pod gets the GPU.
    wait_for("gpu-3's taint to go", lambda: not _taints(kube, cluster, "gpu-3"), timeout=QUIET_S + 30)
    kube.wait_pod_phase("plain", namespace, timeout=60)
    plain = pod_claim(kube, namespace, "plain")
    assert allocated_devices(plain) == ["gpu-3"]
    delete_pods_and_wait(kube, cluster, namespace, [plain])


def test_with_no_execute_the_pod_on_the_unhealthy_gpu_is_evicted_and_its_claim_unprepared(
    start_driver: Any, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    _needs_taints(cluster)
    driver: TaintedDriver = start_driver("--unhealthy-taint-effect=NoExecute")
    uuid = _uuid(kube, cluster, "gpu-2")
    claim_template(kube, namespace, "pinned", [_pinned(uuid)])
    gpu_pod(kube, namespace, "victim", "pinned")
    kube.wait_pod_phase("victim", namespace)
    claim_uid = pod_claim(kube, namespace, "victim")["metadata"]["uid"]
    assert claim_uid in driver.prepared()

    driver.xid(uuid, 48)
    [taint] = wait_for("gpu-2's taint", lambda: _taints(kube, cluster, "gpu-2") or None, timeout=20)
    assert (taint["value"], taint["effect"]) == ("XID-48", "NoExecute")
    wait_for(
        "the pod to be evicted",
        lambda: kube.get_or_none("v1", "Pod", "victim", namespace) is None,
        timeout=60,
    )
    wait_for("its claim to be unprepared", lambda: claim_uid not in driver.prepared(), timeout=30)


def test_the_driver_says_at_start_what_the_server_keeps_and_publishes_only_that(
    start_driver: Any, kube: Kube, cluster: ClusterInfo
) -> None:
    kept = _kept(cluster)
    driver: TaintedDriver = start_driver()
    log = driver.process.log_path.read_text()
    gates = {
        "device taints": "DRADeviceTaints",
        "shared counters (partitionable devices)": "DRAPartitionableDevices",
        "consumable capacity": "DRAConsumableCapacity",
    }
    for what, on in kept.items():
        line = f"drops {what} from ResourceSlices (feature gate {gates[what]} off)"
        assert log.count(line) == (0 if on else 1), log
    keeps = next(
        line for line in log.splitlines() if f"API server {cluster.kubernetes_version} keeps" in line
    )
    assert [what for what in gates if what in keeps] == [what for what, on in kept.items() if on]

    driver.xid(_uuid(kube, cluster, "gpu-0"), 79)
    wait_for("gpu-0 unhealthy", lambda: "dra_gpu_unhealthy_devices 1.0" in driver.process.metrics())
    expected = [{"key": KEY, "value": "XID-79", "effect": "NoSchedule"}] if kept["device taints"] else []
    wait_for(
        "the slice to show gpu-0 as the server allows",
        lambda: (
            [{k: t[k] for k in ("key", "value", "effect")} for t in _taints(kube, cluster, "gpu-0")]
            == expected
        ),
        timeout=20,
    )


def test_an_admins_device_taint_rule_works_beside_the_drivers_taints(
    start_driver: Any, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    # The example of docs/health.md: the driver neither reads nor removes the rule's taint.
    _needs_taints(cluster)
    minor = int(cluster.kubernetes_version.lstrip("v").split(".")[1])
    api = "resource.k8s.io/v1alpha3" if minor < 37 else "resource.k8s.io/v1"
    start_driver()
    uuid = _uuid(kube, cluster, "gpu-1")
    rule = kube.create(
        {
            "apiVersion": api,
            "kind": "DeviceTaintRule",
            "metadata": {"name": f"{namespace}-gpu-1-maintenance"},
            "spec": {
                "deviceSelector": {"driver": DRIVER, "pool": cluster.node_name, "device": "gpu-1"},
                "taint": {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"},
            },
        }
    )
    try:
        claim_template(kube, namespace, "pinned", [_pinned(uuid)])
        gpu_pod(kube, namespace, "waiting", "pinned")
        wait_for("the pod to be unschedulable", lambda: _unschedulable(kube, namespace, "waiting"))
        assert not _taints(kube, cluster, "gpu-1"), "the rule's taint is not written into the slice"
    finally:
        kube.delete(api, "DeviceTaintRule", rule["metadata"]["name"])
    kube.wait_pod_phase("waiting", namespace, timeout=60)
    claim = pod_claim(kube, namespace, "waiting")
    assert allocated_devices(claim) == ["gpu-1"]
    delete_pods_and_wait(kube, cluster, namespace, [claim])
