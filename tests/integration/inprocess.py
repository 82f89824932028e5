"""The DRA kubelet plugin in-process on a real unix socket, with an in-memory API server.

`serving` runs the real service, state (on real files) and gRPC server in a
thread of their own with an asyncio loop, as the daemon does, and yields a
channel to the socket. `StubKube` stands in for the API server behind
dra.kubeletplugin.service.ClaimSource. It answers the two calls the DRA
service makes the way dra.adapters.kube.KubeClient does against a real API
server: read_resource_claim (and get_resource_claim, its event-loop twin) returns
the stored object as JSON would decode it,
raises NotFoundError (status 404, message "GET <path>: 404 <reason>", as
KubeClient._call builds it) for a name it does not hold, and UnreachableError
(status 0) while `reachable` is False; write_event records the event. The
API server validates names on create, so a stored claim always has a valid
name; any other name is simply not found, as on a real server.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.from_thread
import grpc

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.kube import NotFoundError, UnreachableError
from dra.adapters.nodefiles import CdiStore
from dra.daemon.health import HealthTracker
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.server import PluginServer
from dra.kubeletplugin.service import DraService, HealthService
from dra.kubeletplugin.state import DeviceState
from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc

RESOURCE_API = "/apis/resource.k8s.io/v1"


class StubKube:
    """ResourceClaims by (namespace, name), and the events recorded about them."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.reachable = True

    def add_claim(
        self, namespace: str, name: str, driver: str, pool: str, devices: list[str], admin: bool = False
    ) -> dict[str, Any]:
        """Store a claim allocated `devices` of `driver` in `pool`, as the scheduler leaves it."""
        results: list[dict[str, Any]] = [
            {"request": "gpu", "driver": driver, "pool": pool, "device": d} for d in devices
        ]
        for result in results:
            if admin:
                result["adminAccess"] = True
        claim: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": str(uuid.uuid4())},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
            "status": {"allocation": {"devices": {"results": results, "config": []}}},
        }
        self.claims[(namespace, name)] = claim
        return claim

    async def get_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored claim, as the event loop's GET answers it."""
        return self.read_resource_claim(namespace, name)

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored claim (a copy, as every GET decodes a fresh one)."""
        path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}"
        if not self.reachable:
            raise UnreachableError(
                f"API server https://127.0.0.1:6443 unreachable (GET {path}): connection refused"
            )
        try:
            return copy.deepcopy(self.claims[(namespace, name)])
        except KeyError:
            raise NotFoundError(
                f'GET {path}: 404 resourceclaims.resource.k8s.io "{name}" not found', 404
            ) from None

    def write_event(self, involved: dict[str, Any], reason: str, message: str, *, host: str = "") -> None:
        """Record a Warning event about an object."""
        self.events.append((involved["metadata"]["name"], reason, message))


@dataclass
class Node:
    """The plugin under test: its state, files, API server and a client on its socket."""

    driver: str
    name: str
    state: DeviceState
    cdi: CdiStore
    checkpoint: CheckpointStore
    kube: StubKube
    channel: grpc.Channel

    @property
    def stub(self) -> dra_pb2_grpc.DRAPluginStub:
        """The DRA v1 client, as the kubelet calls it."""
        return dra_pb2_grpc.DRAPluginStub(self.channel)

    def claim(self, name: str, devices: list[str], namespace: str = "ns") -> dra_pb2.Claim:
        """A claim of this driver on this node in the API server; its reference as the kubelet sends it."""
        stored = self.kube.add_claim(namespace, name, self.driver, self.name, devices)
        return dra_pb2.Claim(namespace=namespace, name=name, uid=stored["metadata"]["uid"])


@contextmanager
def serving(driver: str, profile: str = "h100x8", node_name: str = "node-a") -> Iterator[Node]:
    """The plugin serving in a thread of its own; its files in a new directory in /tmp (short paths)."""
    root = Path(tempfile.mkdtemp(prefix="dra-inproc-", dir="/tmp"))
    inventory = discover(FakeGpuLibrary(load_profile(profile), node_name))
    cdi = CdiStore(root / "cdi", driver)
    checkpoint = CheckpointStore(root / "state" / "checkpoint.json")
    state = DeviceState(driver, node_name, inventory, cdi, checkpoint)
    kube = StubKube()
    service = DraService(driver, node_name, state, kube)
    server = PluginServer(
        root / "kubelet", driver, service, HealthService(node_name, HealthTracker(inventory))
    )
    try:
        with anyio.from_thread.start_blocking_portal() as portal:
            portal.call(server.start)
            try:
                with grpc.insecure_channel(f"unix://{server.dra_socket}") as channel:
                    yield Node(driver, node_name, state, cdi, checkpoint, kube, channel)
            finally:
                portal.call(server.stop)
    finally:
        shutil.rmtree(root)
