"""NodePrepareResources / NodeUnprepareResources over a real unix socket, claims on a real API server.

The plugin runs in-process (not registered with the kubelet: its kubelet root
is a directory of its own), so each test sends exactly the requests it means
and reads the per-claim answers, as the kubelet would.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import grpc
import pytest
import yaml
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import free_port
from localcluster.kube import Kube, Obj

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.kube import KubeClient
from dra.adapters.nodefiles import CdiStore
from dra.daemon.health import HealthTracker
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.server import PluginServer
from dra.kubeletplugin.service import DraService, HealthService
from dra.kubeletplugin.state import DeviceState
from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc
from dra.pb.dra.v1beta1 import dra_pb2_grpc as v1beta1_grpc
from dra.pb.drahealth.v1 import health_pb2 as health_v1
from dra.pb.drahealth.v1 import health_pb2_grpc as health_v1_grpc
from dra.pb.drahealth.v1alpha1 import health_pb2, health_pb2_grpc
from dra.pb.pluginregistration.v1 import registration_pb2, registration_pb2_grpc

DRIVER = "grpc-test.dra-gpu.test"

pytestmark = pytest.mark.anyio


@dataclass
class Plugin:
    """A plugin instance and a client for it."""

    server: PluginServer
    state: DeviceState
    cdi: CdiStore
    v1: dra_pb2_grpc.DRAPluginAsyncStub
    v1beta1: v1beta1_grpc.DRAPluginAsyncStub


async def _start_plugin(
    cluster: ClusterInfo, root: Path, kubeconfig: str
) -> tuple[PluginServer, DeviceState, CdiStore, KubeClient]:
    inventory = discover(FakeGpuLibrary(load_profile("h100x8"), cluster.node_name))
    cdi = CdiStore(root / "cdi", DRIVER)
    state = DeviceState(
        DRIVER, cluster.node_name, inventory, cdi, CheckpointStore(root / "state" / "checkpoint.json")
    )
    kube = KubeClient(kubeconfig)
    dra = DraService(DRIVER, cluster.node_name, state, kube)
    server = PluginServer(
        root / "kubelet", DRIVER, dra, HealthService(cluster.node_name, HealthTracker(inventory))
    )
    server.start()
    return server, state, cdi, kube


@pytest.fixture
async def plugin(cluster: ClusterInfo) -> AsyncIterator[Plugin]:
    """A plugin talking to the local API server."""
    root = Path(tempfile.mkdtemp(prefix="dra-it-", dir="/tmp"))
    server, state, cdi, kube = await _start_plugin(cluster, root, cluster.kubeconfig)
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.dra_socket}") as channel:
            yield Plugin(
                server, state, cdi, dra_pb2_grpc.DRAPluginStub(channel), v1beta1_grpc.DRAPluginStub(channel)
            )
    finally:
        await server.stop()
        await kube.aclose()
        shutil.rmtree(root)


@pytest.fixture
def allocated_claim(kube: Kube, namespace: str, cluster: ClusterInfo) -> Callable[..., Obj]:
    """Create a ResourceClaim and write an allocation into its status, as the scheduler would."""

    def make(
        devices: list[str],
        driver: str = DRIVER,
        pool: str | None = None,
        request: str = "gpu",
        config: list[Obj] | None = None,
        admin: bool = False,
    ) -> Obj:
        name = f"claim-{uuid.uuid4().hex[:6]}"
        if "/" in request:
            parent, sub = request.split("/")
            spec_request: Obj = {"name": parent, "firstAvailable": [{"name": sub, "deviceClassName": "any"}]}
        else:
            spec_request = {"name": request, "exactly": {"deviceClassName": "any", "count": len(devices)}}
            if admin:
                spec_request["exactly"]["adminAccess"] = True
        claim = kube.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"devices": {"requests": [spec_request]}},
            }
        )
        results: list[Obj] = [
            {"request": request, "driver": driver, "pool": pool or cluster.node_name, "device": d}
            for d in devices
        ]
        if admin:
            for result in results:
                result["adminAccess"] = True
        claim["status"] = {"allocation": {"devices": {"results": results, "config": config or []}}}
        return kube.replace_status(claim)

    return make


def _ref(claim: Obj, uid: str | None = None) -> dra_pb2.Claim:
    meta = claim["metadata"]
    return dra_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=uid or meta["uid"])


async def _prepare(
    stub: dra_pb2_grpc.DRAPluginAsyncStub | v1beta1_grpc.DRAPluginAsyncStub, *claims: dra_pb2.Claim
) -> dict[str, dra_pb2.NodePrepareResourceResponse]:
    response = await stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=list(claims)))
    return dict(response.claims)


async def test_prepare_returns_cdi_devices_and_is_idempotent(
    plugin: Plugin, allocated_claim: Callable[..., Obj]
) -> None:
    claim = allocated_claim(["gpu-1", "gpu-2"])
    uid = claim["metadata"]["uid"]
    first = (await _prepare(plugin.v1, _ref(claim)))[uid]
    assert first.error == ""
    assert [(d.device_name, d.pool_name, list(d.request_names)) for d in first.devices] == [
        ("gpu-1", claim["status"]["allocation"]["devices"]["results"][0]["pool"], ["gpu"]),
        ("gpu-2", claim["status"]["allocation"]["devices"]["results"][1]["pool"], ["gpu"]),
    ]
    assert [list(d.cdi_device_ids) for d in first.devices] == [
        [f"k8s.{DRIVER}/claim={uid}-gpu-1"],
        [f"k8s.{DRIVER}/claim={uid}-gpu-2"],
    ]
    spec = plugin.cdi.path(uid)
    written = spec.stat().st_mtime_ns
    again = (await _prepare(plugin.v1beta1, _ref(claim)))[uid]
    assert again == first
    assert spec.stat().st_mtime_ns == written

    unprepared = await plugin.v1.NodeUnprepareResources(
        dra_pb2.NodeUnprepareResourcesRequest(claims=[_ref(claim)])
    )
    assert unprepared.claims[uid].error == ""
    assert not spec.exists()
    assert uid not in plugin.state.prepared


async def test_prioritized_list_result_is_reported_under_its_request(
    plugin: Plugin, allocated_claim: Callable[..., Obj]
) -> None:
    claim = allocated_claim(["gpu-3"], request="gpu/h100")
    answer = (await _prepare(plugin.v1, _ref(claim)))[claim["metadata"]["uid"]]
    assert answer.error == ""
    assert [list(d.request_names) for d in answer.devices] == [["gpu"]]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("unknown claim", "not found"),
        ("uid mismatch", "the claim was deleted and re-created"),
        ("other driver", f"has no device allocated by driver {DRIVER} (allocated by: other.example.com)"),
        ("missing device", "device gpu-9 does not exist on node"),
        ("other pool", "is in pool 'another-node', not this node's pool"),
        ("bad config", 'GpuConfig.sharing.timeSlicingConfig.interval: "VeryLong" is not one of'),
    ],
)
async def test_bad_claims_get_their_own_error(
    plugin: Plugin, allocated_claim: Callable[..., Obj], kube: Kube, namespace: str, case: str, expected: str
) -> None:
    good = allocated_claim(["gpu-0"])
    if case == "unknown claim":
        bad = _ref(good, uid=str(uuid.uuid4()))
        bad.name = "no-such-claim"
    elif case == "uid mismatch":
        bad = _ref(good, uid=str(uuid.uuid4()))
    elif case == "other driver":
        bad = _ref(allocated_claim(["gpu-4"], driver="other.example.com"))
    elif case == "missing device":
        bad = _ref(allocated_claim(["gpu-9"]))
    elif case == "other pool":
        bad = _ref(allocated_claim(["gpu-4"], pool="another-node"))
    else:
        mps = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"timeSlicingConfig": {"interval": "VeryLong"}},
        }
        bad = _ref(
            allocated_claim(
                ["gpu-4"], config=[{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": mps}}]
            )
        )

    answers = await _prepare(plugin.v1, _ref(good), bad)
    assert set(answers) == {good["metadata"]["uid"], bad.uid}
    assert answers[good["metadata"]["uid"]].error == ""
    assert expected in answers[bad.uid].error
    assert not answers[bad.uid].devices
    if case in ("missing device", "other pool", "bad config"):
        events = kube.events_for("ResourceClaim", bad.name, namespace)
        assert any(e["reason"] == "PrepareFailed" and expected in e["message"] for e in events)


async def test_device_prepared_for_another_claim_is_refused_unless_admin(
    plugin: Plugin, allocated_claim: Callable[..., Obj], kube: Kube, namespace: str
) -> None:
    # Admin access is only allowed in namespaces labelled for it.
    kube.patch(
        "v1",
        "Namespace",
        namespace,
        {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}},
    )
    first = allocated_claim(["gpu-5"])
    second = allocated_claim(["gpu-5"])
    monitor = allocated_claim(["gpu-5"], admin=True)
    answers = await _prepare(plugin.v1, _ref(first))
    assert answers[first["metadata"]["uid"]].error == ""
    answers = await _prepare(plugin.v1, _ref(second), _ref(monitor))
    error = answers[second["metadata"]["uid"]].error
    holder = f"{first['metadata']['namespace']}/{first['metadata']['name']}"
    assert f"device gpu-5 is already prepared for claim {holder}" in error
    assert answers[monitor["metadata"]["uid"]].error == ""


async def test_unprepare_of_an_unknown_claim_succeeds(plugin: Plugin) -> None:
    ref = dra_pb2.Claim(namespace="default", name="gone", uid=str(uuid.uuid4()))
    answer = await plugin.v1.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]))
    assert answer.claims[ref.uid].error == ""


async def test_unreachable_api_server_is_a_per_claim_error(cluster: ClusterInfo) -> None:
    config = yaml.safe_load(await anyio.Path(cluster.kubeconfig).read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    root = Path(tempfile.mkdtemp(prefix="dra-it-", dir="/tmp"))
    kubeconfig = root / "dead.kubeconfig"
    await anyio.Path(kubeconfig).write_text(yaml.safe_dump(config))
    server, _, _, kube = await _start_plugin(cluster, root, str(kubeconfig))
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.dra_socket}") as channel:
            ref = dra_pb2.Claim(namespace="default", name="c", uid=str(uuid.uuid4()))
            answers = await _prepare(dra_pb2_grpc.DRAPluginStub(channel), ref)
        assert answers[ref.uid].error.startswith("cannot read ResourceClaim default/c: API server")
        assert "unreachable" in answers[ref.uid].error
    finally:
        await server.stop()
        await kube.aclose()
        shutil.rmtree(root)


async def test_registration_advertises_v1_first(plugin: Plugin) -> None:
    async with grpc.aio.insecure_channel(f"unix://{plugin.server.registration_socket}") as channel:
        info = await registration_pb2_grpc.RegistrationStub(channel).GetInfo(registration_pb2.InfoRequest())
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(plugin.server.dra_socket)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


async def test_health_is_served_as_v1_and_v1alpha1(plugin: Plugin) -> None:
    """A 1.37 kubelet asks v1, a 1.34 kubelet v1alpha1: both get the same list on the same socket."""
    async with grpc.aio.insecure_channel(f"unix://{plugin.server.dra_socket}") as channel:
        v1 = health_v1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1.NodeWatchResourcesRequest()
        )
        alpha = health_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        first_v1 = await v1.read()
        first_alpha = await alpha.read()
        v1.cancel()
        alpha.cancel()
    assert isinstance(first_v1, health_v1.NodeWatchResourcesResponse)
    assert isinstance(first_alpha, health_pb2.NodeWatchResourcesResponse)
    assert [(d.device.device_name, int(d.health)) for d in first_v1.devices] == [
        (d.device.device_name, int(d.health)) for d in first_alpha.devices
    ]
    assert len(first_v1.devices) == 8
    assert len({d.device.pool_name for d in first_v1.devices}) == 1


async def test_a_stale_holder_is_released_and_a_live_one_is_not(
    plugin: Plugin, allocated_claim: Callable[..., Obj], kube: Kube, namespace: str
) -> None:
    """A claim deleted while prepared (the kubelet never unprepared it) must not hold its GPU forever."""
    gone = allocated_claim(["gpu-6"])
    assert (await _prepare(plugin.v1, _ref(gone)))[gone["metadata"]["uid"]].error == ""
    kube.delete("resource.k8s.io/v1", "ResourceClaim", gone["metadata"]["name"], namespace)

    live = allocated_claim(["gpu-6"])
    answer = (await _prepare(plugin.v1, _ref(live)))[live["metadata"]["uid"]]
    assert answer.error == ""
    assert gone["metadata"]["uid"] not in plugin.state.prepared
    assert not plugin.cdi.path(gone["metadata"]["uid"]).exists()

    third = allocated_claim(["gpu-6"])
    refused = (await _prepare(plugin.v1, _ref(third)))[third["metadata"]["uid"]]
    assert f"already prepared for claim {namespace}/{live['metadata']['name']}" in refused.error
