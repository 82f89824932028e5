"""The API server unreachable for 30 s: per-claim errors meanwhile, then prepares work again, no restart.

The driver (a real process) reaches the API server through a TCP relay in
this test. Cutting the relay resets every open connection and every new one,
as a restarting or partitioned API server would (connection refused or reset);
TLS passes through it untouched, so the driver's credentials are the cluster's.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import grpc
import pytest
import yaml
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube, Obj, wait_for

from dra.pb.dra.v1 import dra_pb2, dra_pb2_grpc

DRIVER = "outage.dra-gpu.test"
OUTAGE_S = 30.0


class Relay:
    """Forwards 127.0.0.1:<port> to `target` until cut; while cut, resets every connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.up = True
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every open connection and refuse new ones."""
        self.up = False
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._open.clear()

    def mend(self) -> None:
        """Relay new connections again."""
        self.up = True

    def close(self) -> None:
        """Stop listening."""
        self.cut()
        self.listener.close()


@pytest.fixture
def relayed(cluster: ClusterInfo, tmp_path: Path) -> Iterator[tuple[Relay, DriverProcess]]:
    """The driver, started, whose kubeconfig points at a relay to the API server."""
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = urlparse(config["clusters"][0]["cluster"]["server"])
    assert server.hostname is not None
    assert server.port is not None
    relay = Relay((server.hostname, server.port))
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    kubeconfig = tmp_path / "relayed.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    driver = DriverProcess(cluster, "h100x8", tmp_path / "driver.log", DRIVER, kubeconfig=str(kubeconfig))
    try:
        yield relay, driver.start()
    finally:
        driver.stop()
        relay.close()


def _claim(kube: Kube, namespace: str, node: str, device: str) -> Obj:
    claim = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"claim-{uuid.uuid4().hex[:6]}", "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "any"}}]}},
        }
    )
    result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
    claim["status"] = {"allocation": {"devices": {"results": [result]}}}
    return kube.replace_status(claim)


def _prepare(driver: DriverProcess, claim: Obj) -> str:
    meta = claim["metadata"]
    ref = dra_pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])
    socket_path = driver.dra_socket
    with grpc.insecure_channel(f"unix://{socket_path}") as channel:
        # The kubelet gives a prepare call 45 s; an outage must not make the driver hang past it.
        answer = dra_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=45
        )
    return answer.claims[ref.uid].error


def test_prepares_fail_per_claim_while_the_api_server_is_away_then_work_again(
    relayed: tuple[Relay, DriverProcess], kube: Kube, namespace: str, cluster: ClusterInfo
) -> None:
    relay, driver = relayed
    assert driver.proc is not None
    pid = driver.proc.pid
    claims = [_claim(kube, namespace, cluster.node_name, f"gpu-{i}") for i in range(4)]

    relay.cut()
    ends = time.monotonic() + OUTAGE_S
    errors: list[str] = []
    while time.monotonic() < ends:
        errors.append(_prepare(driver, claims[len(errors) % 2]))
        time.sleep(2)
    relay.mend()

    assert len(errors) >= 5
    for error in errors:
        assert "cannot read ResourceClaim" in error
        assert "unreachable" in error
    assert driver.proc.poll() is None

    # The kubelet retries; the first calls may still meet a connection the outage broke.
    wait_for("a prepare to succeed after the outage", lambda: _prepare(driver, claims[0]) == "", timeout=30)
    assert [_prepare(driver, c) for c in claims[1:]] == ["", "", ""]
    assert driver.proc.pid == pid, "the driver recovered without a restart"
    assert driver.ready()
