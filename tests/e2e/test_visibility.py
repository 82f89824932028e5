"""Which devices a container sees when claims, requests and devices combine (issue 16).

The kubelet hands each container the CDI devices of the claims, or of the one
request of a claim, that it references; the fake runtime merges the driver's
specs as a CDI runtime does. Each container must see exactly the union of the
devices of what it references: by the env each device sets (fake GPUs have no
device nodes) together with what NVIDIA's runtime hook would add from
NVIDIA_VISIBLE_DEVICES, by the CDI devices passed, and by the per-claim
variables.

Profile h100x8-mig: gpu-0..gpu-3 are whole H100s; gpu-4..gpu-7 are split into
3g.40gb, 2g.20gb and two 1g.10gb MIG devices each.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj
from localcluster.workloads import (
    DRIVER,
    allocated_devices,
    claims_pod,
    container_record,
    delete_pods_and_wait,
    ensure_device_classes,
    pod_claims,
    published_devices,
    visible_devices,
)

from dra.core import cdi

ATTR = f'device.attributes["{DRIVER}"]'
GPU: Obj = {"deviceClassName": "gpu.nvidia.com"}


def _mig(profile: str) -> Obj:
    return {
        "deviceClassName": "mig.nvidia.com",
        "selectors": [{"cel": {"expression": f'{ATTR}.profile == "{profile}"'}}],
    }


@pytest.fixture(scope="module")
def driver(
    cluster: ClusterInfo, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DriverProcess]:
    """The driver on profile h100x8-mig, registered with the kubelet."""
    ensure_device_classes(kube)
    process = DriverProcess(
        cluster, "h100x8-mig", tmp_path_factory.mktemp("visibility") / "driver.log"
    ).start()
    yield process
    assert process.stop() == 0, process.log_path.read_text()


@pytest.fixture(scope="module")
def uuids(driver: DriverProcess, kube: Kube, cluster: ClusterInfo) -> dict[str, str]:
    """Each published device's UUID, by device name."""
    return {d["name"]: d["attributes"]["uuid"]["string"] for d in published_devices(kube, cluster)}


def _template(kube: Kube, namespace: str, name: str, requests: Sequence[Obj]) -> None:
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": list(requests)}}},
        }
    )


def _one(request: str, exactly: Obj, count: int = 1) -> Obj:
    return {"name": request, "exactly": {**exactly, "count": count}}


def _run(
    kube: Kube,
    cluster: ClusterInfo,
    namespace: str,
    templates: dict[str, str],
    containers: dict[str, list[Any]],
    uuids: dict[str, str],
) -> dict[str, Obj]:
    """Run the pod, check every container against what it references; return the pod's claims."""
    claims_pod(kube, namespace, "pod", templates, containers)
    kube.wait_pod_phase("pod", namespace)
    claims = pod_claims(kube, namespace, "pod")
    for container, refs in containers.items():
        record = container_record(cluster, namespace, "pod", container)
        wanted = {
            (claims[ref["name"]]["metadata"]["uid"], device)
            for ref in refs
            for device in allocated_devices(claims[ref["name"]], ref.get("request"))
        }
        names = sorted({device for _, device in wanted})
        assert visible_devices(record, uuids) == names, container
        assert sorted(record["cdiDevices"]) == sorted(cdi.qualified_name(DRIVER, u, d) for u, d in wanted)
        for device in names:
            assert record["env"][f"{cdi.env_key(device)}_UUID"] == uuids[device]
        claim_vars = {k: v for k, v in record["env"].items() if k.startswith("DRA_GPU_CLAIM_")}
        assert claim_vars == {cdi.claim_env_key(uid): uid for uid, _ in wanted}, container
        if wanted:
            assert record["env"]["NVIDIA_VISIBLE_DEVICES"] == "none", container
        else:
            assert "NVIDIA_VISIBLE_DEVICES" not in record["env"], container
    return claims


def test_one_container_with_two_and_with_three_claims(
    uuids: dict[str, str], kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    _template(kube, namespace, "one-gpu", [_one("gpu", GPU)])
    _template(kube, namespace, "one-mig", [_one("mig", _mig("1g.10gb"))])
    claims = _run(
        kube,
        cluster,
        namespace,
        {"a": "one-gpu", "b": "one-gpu", "m": "one-mig"},
        {
            "two": [{"name": "a"}, {"name": "b"}],
            "three": [{"name": "a"}, {"name": "b"}, {"name": "m"}],
        },
        uuids,
    )
    record = container_record(cluster, namespace, "pod", "two")
    assert len(visible_devices(record, uuids)) == 2, (
        "the GPUs of both claims, not only of the last one merged"
    )
    delete_pods_and_wait(kube, cluster, namespace, list(claims.values()))


def test_a_claim_of_two_gpus_beside_a_mig_claim(
    uuids: dict[str, str], kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    _template(kube, namespace, "two-gpus", [_one("gpus", GPU, count=2)])
    _template(kube, namespace, "mig", [_one("mig", _mig("3g.40gb"))])
    claims = _run(
        kube,
        cluster,
        namespace,
        {"gpus": "two-gpus", "mig": "mig"},
        {"main": [{"name": "gpus"}, {"name": "mig"}]},
        uuids,
    )
    assert len(visible_devices(container_record(cluster, namespace, "pod", "main"), uuids)) == 3
    delete_pods_and_wait(kube, cluster, namespace, list(claims.values()))


def test_two_containers_each_with_its_own_claim(
    uuids: dict[str, str], kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    _template(kube, namespace, "one-mig", [_one("mig", _mig("1g.10gb"))])
    claims = _run(
        kube,
        cluster,
        namespace,
        {"a": "one-mig", "b": "one-mig"},
        {"a": [{"name": "a"}], "b": [{"name": "b"}], "sidecar": []},
        uuids,
    )
    [a] = visible_devices(container_record(cluster, namespace, "pod", "a"), uuids)
    [b] = visible_devices(container_record(cluster, namespace, "pod", "b"), uuids)
    assert a != b
    assert visible_devices(container_record(cluster, namespace, "pod", "sidecar"), uuids) == []
    delete_pods_and_wait(kube, cluster, namespace, list(claims.values()))


def test_two_containers_each_naming_one_request_of_a_claim(
    uuids: dict[str, str], kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    _template(kube, namespace, "split", [_one("mig1", _mig("1g.10gb")), _one("mig2", _mig("2g.20gb"))])
    claims = _run(
        kube,
        cluster,
        namespace,
        {"migdevs": "split"},
        {
            "first": [{"name": "migdevs", "request": "mig1"}],
            "second": [{"name": "migdevs", "request": "mig2"}],
            "whole": [{"name": "migdevs"}],
        },
        uuids,
    )
    [first] = visible_devices(container_record(cluster, namespace, "pod", "first"), uuids)
    [second] = visible_devices(container_record(cluster, namespace, "pod", "second"), uuids)
    assert "1g10gb" in first
    assert "2g20gb" in second
    assert visible_devices(container_record(cluster, namespace, "pod", "whole"), uuids) == sorted(
        [first, second]
    )
    delete_pods_and_wait(kube, cluster, namespace, list(claims.values()))


def test_a_first_available_request(
    uuids: dict[str, str], kube: Kube, cluster: ClusterInfo, namespace: str
) -> None:
    no_such_gpu = {
        **GPU,
        "selectors": [{"cel": {"expression": f'{ATTR}.productName == "NVIDIA B200"'}}],
    }
    _template(
        kube,
        namespace,
        "fallback",
        [
            {
                "name": "pick",
                "firstAvailable": [
                    {"name": "b200", **no_such_gpu},
                    {"name": "small", **_mig("1g.10gb")},
                ],
            },
            _one("other", _mig("3g.40gb")),
        ],
    )
    claims = _run(
        kube,
        cluster,
        namespace,
        {"fb": "fallback"},
        {"picked": [{"name": "fb", "request": "pick"}], "other": [{"name": "fb", "request": "other"}]},
        uuids,
    )
    results = claims["fb"]["status"]["allocation"]["devices"]["results"]
    assert sorted(r["request"] for r in results) == ["other", "pick/small"]
    [picked] = visible_devices(container_record(cluster, namespace, "pod", "picked"), uuids)
    assert "1g10gb" in picked
    delete_pods_and_wait(kube, cluster, namespace, list(claims.values()))
