"""Dynamic MIG on the local cluster: the scheduler picks profiles and placements through shared
counters, the driver makes the MIG devices on the fake GPUs at prepare and destroys them at unprepare.

Two fake H100s in MIG mode with no instance, --mig-mode=dynamic, offering the common profiles
(the default) and then all of them (--mig-profiles). Runs on 1.34 (the harness turns
DRAPartitionableDevices on) and, with KUBERNETES_VERSION=v1.37.2, on 1.37 (counters in slices of
their own).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, wait_for
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claims_pod,
    delete_pods_and_wait,
    ensure_device_classes,
    pod_claims,
)
from prometheus_client.parser import text_string_to_metric_families

TWO_H100 = {"gpus": [{"model": "h100-sxm5-80gb", "count": 2, "mig": []}]}
PARENT = f"{DRIVER}/parentUUID"


@pytest.fixture(scope="module", params=["common", "all"])
def driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[DriverProcess]:
    """The driver offering the default profiles (common), then every profile (all): same outcomes."""
    ensure_device_classes(kube)
    workdir = tmp_path_factory.mktemp("dynamic-mig")
    profile = workdir / "profile.yaml"
    profile.write_text(yaml.safe_dump(TWO_H100))
    args = ("--mig-mode=dynamic", f"--mig-profiles={request.param}", "--claim-metrics-interval=1")
    process = DriverProcess(cluster, str(profile), workdir / "driver.log", extra_args=args)
    process.fake_mig_state.unlink(missing_ok=True)
    process.start()
    yield process
    process.stop()


def _instances(driver: DriverProcess) -> dict[int, list[tuple[str, int, int]]]:
    """What the fake GPUs hold: per GPU, (profile, placement start, size) of each GPU instance."""
    path = driver.fake_mig_state
    data = json.loads(path.read_text()) if path.exists() else {"gpus": {}}
    return {
        int(gpu): sorted((i["profile"], i["start"], i["size"]) for i in found)
        for gpu, found in data["gpus"].items()
        if found
    }


def _template(kube: Kube, namespace: str, name: str, requests: dict[str, tuple[str, str, int]]) -> None:
    """A claim template with one request per entry (name: (class, profile or "", count)).

    MIG devices of one claim come from one GPU (they match on parentUUID, which whole GPUs lack).
    """
    entries = []
    for request, (device_class, profile, count) in requests.items():
        exactly: Obj = {"deviceClassName": device_class, "count": count}
        if profile:
            exactly["selectors"] = [
                {"cel": {"expression": f'device.attributes["{DRIVER}"].profile == "{profile}"'}}
            ]
        entries.append({"name": request, "exactly": exactly})
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": entries,
                        "constraints": [{"matchAttribute": PARENT}]
                        if any(p for _, p, _ in requests.values())
                        else [],
                    },
                }
            },
        }
    )


def _run(kube: Kube, namespace: str, pod: str, template: str) -> Obj:
    claims_pod(kube, namespace, pod, {"gpus": template}, {"main": [{"name": "gpus"}]})
    try:
        wait_for(
            f"pod {pod} running",
            lambda: kube.get("v1", "Pod", pod, namespace)["status"].get("phase") == "Running",
            timeout=60,
        )
    except Exception:
        events = [e.get("message") for e in kube.list_objects("v1", "Event", namespace=namespace)]
        raise AssertionError(f"pod {pod} is not running; events: {events}") from None
    return pod_claims(kube, namespace, pod)["gpus"]


def _gpu(device: str) -> int:
    return int(device.split("-")[1])


def _status_names_the_mig_devices_made(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str, claim: Obj, spec: str
) -> None:
    """The claim's status.devices and the join metric name the MIG devices made at prepare."""
    name = claim["metadata"]["name"]

    def entries() -> list[Obj] | None:
        stored = kube.get("resource.k8s.io/v1", "ResourceClaim", name, namespace)
        found: list[Obj] = (stored.get("status") or {}).get("devices") or []
        return found if len(found) == 3 else None

    status = wait_for("the claim's status to name its MIG devices", entries, timeout=10)
    slices = kube.list_objects(
        "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={cluster.node_name}"
    )
    offers = {d["name"]: d["attributes"] for s in slices for d in s["spec"].get("devices") or []}
    made = set(re.findall(r"_UUID=(MIG-[0-9a-f-]+)", spec))
    assert {e["data"]["uuid"] for e in status} == made, "the MIG UUIDs the container got"
    for entry in status:
        data, offer = entry["data"], offers[entry["device"]]
        assert data["parentUUID"] == offer["parentUUID"]["string"]
        assert data["profile"] == offer["profile"]["string"]
        assert isinstance(data["gpuInstanceID"], int)
        assert isinstance(data["computeInstanceID"], int)
        assert data["sharing"] == {"strategy": "Exclusive"}

    def joined() -> set[tuple[str, str, str]] | None:
        series = {
            (s.labels["UUID"], s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"])
            for family in text_string_to_metric_families(driver.metrics())
            if family.name == "dra_gpu_claim_device_info"
            for s in family.samples
            if s.labels["dra_claim_name"] == name and s.labels["pod"] == "mixed"
        }
        return series if len(series) == 3 else None

    series = wait_for("the join metric to name the MIG devices", joined, timeout=10)
    expected = {
        (e["data"]["parentUUID"], str(e["data"]["gpuInstanceID"]), e["data"]["profile"]) for e in status
    }
    assert series == expected


def test_mixed_profiles_share_one_gpu_and_a_whole_gpu_takes_the_other(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    _template(
        kube,
        namespace,
        "mixed",
        {
            "big": ("mig.nvidia.com", "3g.40gb", 1),
            "mid": ("mig.nvidia.com", "2g.20gb", 1),
            "small": ("mig.nvidia.com", "1g.10gb", 1),
        },
    )
    mixed = _run(kube, namespace, "mixed", "mixed")
    devices = allocated_devices(mixed)
    [gpu] = {_gpu(d) for d in devices}
    held = _instances(driver)
    assert sorted(held) == [gpu]
    assert sorted(p for p, _, _ in held[gpu]) == ["1g.10gb", "2g.20gb", "3g.40gb"]
    # The placements the scheduler chose are the ones made, and they do not overlap.
    assert sorted(d.rsplit("-at", 1)[1] for d in devices) == sorted(str(s) for _, s, _ in held[gpu])
    slices_used = sorted(i for _, start, size in held[gpu] for i in range(start, start + size))
    assert len(slices_used) == len(set(slices_used))
    spec = (Path(cluster.cdi_dir) / f"k8s.{DRIVER}-claim_{mixed['metadata']['uid']}.json").read_text()
    assert spec.count("_UUID=MIG-") == 3
    _status_names_the_mig_devices_made(driver, kube, cluster, namespace, mixed, spec)

    _template(kube, namespace, "whole", {"gpu": ("gpu.nvidia.com", "", 1)})
    whole = _run(kube, namespace, "whole", "whole")
    assert [_gpu(d) for d in allocated_devices(whole)] == [1 - gpu]

    delete_pods_and_wait(kube, cluster, namespace, [mixed, whole])
    wait_for("the MIG devices to be destroyed", lambda: _instances(driver) == {}, timeout=30)


def test_seven_small_fill_a_gpu_and_the_eighth_goes_to_the_other(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    _template(kube, namespace, "seven", {"small": ("mig.nvidia.com", "1g.10gb", 7)})
    seven = _run(kube, namespace, "seven", "seven")
    [gpu] = {_gpu(d) for d in allocated_devices(seven)}
    assert _instances(driver) == {gpu: [("1g.10gb", s, 1) for s in range(7)]}

    _template(kube, namespace, "eighth", {"small": ("mig.nvidia.com", "1g.10gb", 1)})
    eighth = _run(kube, namespace, "eighth", "eighth")
    assert [_gpu(d) for d in allocated_devices(eighth)] == [1 - gpu]
    assert len(_instances(driver)[1 - gpu]) == 1

    delete_pods_and_wait(kube, cluster, namespace, [seven, eighth])
    wait_for("the MIG devices to be destroyed", lambda: _instances(driver) == {}, timeout=30)


def test_whole_gpus_get_mig_mode_off_and_a_mig_claim_turns_it_on_again(
    driver: DriverProcess, kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    _template(kube, namespace, "both", {"gpus": ("gpu.nvidia.com", "", 2)})
    both = _run(kube, namespace, "both", "both")
    assert sorted(_gpu(d) for d in allocated_devices(both)) == [0, 1]
    # CUDA sees a whole GPU only with MIG off.
    assert driver.fake_mig_modes() == {0: 0, 1: 0}
    delete_pods_and_wait(kube, cluster, namespace, [both])

    # Still offered as MIG devices with MIG off: the first one turns it on.
    _template(kube, namespace, "part", {"big": ("mig.nvidia.com", "3g.40gb", 1)})
    part = _run(kube, namespace, "part", "part")
    [gpu] = {_gpu(d) for d in allocated_devices(part)}
    assert driver.fake_mig_modes()[gpu] == 1
    assert [p for p, _, _ in _instances(driver)[gpu]] == ["3g.40gb"]
    delete_pods_and_wait(kube, cluster, namespace, [part])
    wait_for("the MIG device to be destroyed", lambda: _instances(driver) == {}, timeout=30)
