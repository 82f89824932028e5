"""The plugin's two unix sockets and their gRPC servers.

``plugins/<driver>/dra.sock`` (DRA v1, v1beta1, health v1, v1alpha1) and
``plugins_registry/<driver>-reg.sock`` (registration), each with the instance ID in its name
under rolling updates (docs/operations.md, "Upgrades"). The registration socket is made last,
since the kubelet calls the service as soon as it registers the plugin, and made again if it
disappears, so that the kubelet finds the plugin at its next scan.

Both are grpcio's synchronous servers: a call runs on a thread of the server's pool from the
request to the answer (issue 44, docs/testing.md: a fifth less CPU per call than grpc.aio with
the state on a worker thread). The daemon's event loop only starts and stops them.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import anyio.to_thread
import grpc

from dra.adapters.nodefiles import ensure_dir
from dra.daemon.sockets import check_socket_path, instance_tag, is_abandoned, owner_only
from dra.kubeletplugin.registration import RegistrationService
from dra.kubeletplugin.service import DraService, HealthService
from dra.pb.dra.v1 import dra_pb2_grpc as v1_grpc
from dra.pb.dra.v1beta1 import dra_pb2_grpc as v1beta1_grpc
from dra.pb.drahealth.v1 import health_pb2_grpc as health_v1_grpc
from dra.pb.drahealth.v1alpha1 import health_pb2_grpc
from dra.pb.pluginregistration.v1 import registration_pb2_grpc

log = logging.getLogger(__name__)

#: Threads serving the DRA socket: the kubelet makes a few calls at once, and each health stream
#: it keeps open holds one; more calls wait in the server's queue.
WORKERS = 16


def plugin_socket(kubelet_root: Path, driver: str, instance: str | None = None) -> Path:
    """Path of the DRA service socket (of one instance, with rolling updates)."""
    return kubelet_root / "plugins" / driver / (f"dra-{instance}.sock" if instance else "dra.sock")


def registration_socket(kubelet_root: Path, driver: str, instance: str | None = None) -> Path:
    """Path of the registration socket the kubelet watches for (of one instance, with rolling updates)."""
    name = f"{driver}-{instance}-reg.sock" if instance else f"{driver}-reg.sock"
    return kubelet_root / "plugins_registry" / name


def sockets(kubelet_root: Path, driver: str, instance_id: str | None) -> tuple[Path, Path]:
    """The DRA service socket and the registration socket of an instance (None: the one instance)."""
    tag = None
    if instance_id:
        tag = instance_tag(
            instance_id,
            lambda t: plugin_socket(kubelet_root, driver, t),
            lambda t: registration_socket(kubelet_root, driver, t),
        )
    return plugin_socket(kubelet_root, driver, tag), registration_socket(kubelet_root, driver, tag)


class PluginServer:
    """Starts, keeps and stops the plugin's sockets."""

    def __init__(
        self,
        kubelet_root: Path,
        driver: str,
        dra: DraService,
        health: HealthService,
        instance_id: str | None = None,
    ) -> None:
        self.dra_socket, self.registration_socket = sockets(kubelet_root, driver, instance_id)
        self._driver = driver
        for path in (self.dra_socket, self.registration_socket):
            check_socket_path(path, "--kubelet-root")
        self.registration = RegistrationService(driver, str(self.dra_socket))
        self._dra = dra
        self._health = health
        self._service_server: grpc.Server | None = None
        self._registration_server: grpc.Server | None = None

    def _serve_registration(self) -> None:
        ensure_dir(self.registration_socket.parent)
        self.registration_socket.unlink(missing_ok=True)
        # The kubelet asks twice per registration: GetInfo, then NotifyRegistrationStatus.
        server = grpc.server(ThreadPoolExecutor(1, thread_name_prefix="dra-registration"))
        registration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, server)
        server.add_insecure_port(f"unix://{self.registration_socket}")
        owner_only(self.registration_socket)
        server.start()
        self._registration_server = server

    def remove_abandoned(self) -> None:
        """Remove sockets that killed instances left behind, so that the kubelet drops them."""
        leftovers = [
            *self.registration_socket.parent.glob(f"{self._driver}-*reg.sock"),
            *self.dra_socket.parent.glob("dra*.sock"),
        ]
        for path in leftovers:
            if path not in (self.dra_socket, self.registration_socket) and is_abandoned(path):
                log.info("removing %s: no instance serves it any more", path)
                path.unlink(missing_ok=True)

    def start(self) -> None:
        """Serve the DRA services, then offer the plugin to the kubelet."""
        self.remove_abandoned()
        ensure_dir(self.dra_socket.parent, 0o750)
        self.dra_socket.unlink(missing_ok=True)
        server = grpc.server(ThreadPoolExecutor(WORKERS, thread_name_prefix="dra-call"))
        v1_grpc.add_DRAPluginServicer_to_server(self._dra, server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(self._dra, server)
        health_v1_grpc.add_DRAResourceHealthServicer_to_server(self._health, server)
        health_pb2_grpc.add_DRAResourceHealthServicer_to_server(self._health.alpha, server)
        server.add_insecure_port(f"unix://{self.dra_socket}")
        owner_only(self.dra_socket)
        server.start()
        self._service_server = server
        self._serve_registration()
        log.info("serving %s; registration socket %s", self.dra_socket, self.registration_socket)

    async def keep_registration_socket(self, interval: float = 5.0) -> None:
        """Re-create the registration socket whenever it goes missing."""
        while True:
            await anyio.sleep(interval)
            if not self.registration_socket.exists():
                log.warning("registration socket %s vanished; re-creating it", self.registration_socket)
                if self._registration_server is not None:
                    self._registration_server.stop(None)
                self._serve_registration()

    async def stop(self, drain: float = 20.0, grace: float = 2.0) -> None:
        """Finish the calls in flight, withdraw the registration, then remove both sockets.

        The kubelet closes its connection when it sees the registration socket go,
        which would cut a call in flight; so calls are drained first, for at most
        `drain` seconds. A newer instance registered meanwhile gets the new calls.
        """
        await anyio.to_thread.run_sync(self._dra.wait_idle, drain, abandon_on_cancel=True)
        if self._registration_server is not None:
            self.registration_socket.unlink(missing_ok=True)
            self._registration_server.stop(None)
            self._registration_server = None
        if self._service_server is not None:
            stopped = self._service_server.stop(grace)
            self._service_server = None
            await anyio.to_thread.run_sync(stopped.wait, abandon_on_cancel=True)
        self.dra_socket.unlink(missing_ok=True)
