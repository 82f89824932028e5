"""One resource's plugin socket, and its registration with the kubelet, kept alive.

    <device-plugin dir>/dra-gpu-nvidia.com-gpu.sock   the DevicePlugin service (ours)
    <device-plugin dir>/kubelet.sock                   the kubelet's Registration service

The service socket serves before Register is called, because the kubelet
dials it during Register. A kubelet that starts removes every file of the
directory (its way of telling plugins to register again) and then creates
kubelet.sock anew. So the plugin watches both: when its own socket is gone it
serves again on a new one, and when kubelet.sock is not the file it
registered through (another inode, or re-created), it registers again. Both
checks are cheap stat calls, every `interval` seconds.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import anyio
import grpc

from dra.daemon import metrics
from dra.daemon.sockets import check_socket_path, owner_only
from dra.deviceplugin.allocate import Strategy
from dra.deviceplugin.resources import Resource
from dra.deviceplugin.service import OPTIONS, CallLog, DevicePluginService
from dra.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
_RETRY_MAX = 10.0


def _identity(path: Path) -> tuple[int, int, int] | None:
    """Which file a path is now (device, inode, change time), or None when it is absent or not a socket."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class ResourceServer:
    """Serves one resource and keeps it registered with the kubelet."""

    def __init__(
        self,
        directory: Path,
        resource: Resource,
        service: DevicePluginService,
        calls: CallLog | None = None,
    ) -> None:
        self.directory = directory
        self.resource = resource
        self.socket = directory / resource.socket_name
        self.kubelet_socket = directory / KUBELET_SOCKET
        for path in (self.socket, self.kubelet_socket):
            check_socket_path(path, "--device-plugin-dir")
        self._service = service
        self._calls = calls or CallLog(None)
        self._server: grpc.aio.Server | None = None
        self._serving: tuple[int, int, int] | None = None
        self._registered_with: tuple[int, int, int] | None = None
        self.registrations = 0
        #: Set at the first successful registration.
        self.first_registration = anyio.Event()

    def update(self, resource: Resource, strategies: frozenset[Strategy]) -> None:
        """Serve the resource with other devices or replicas; the kubelet sees them on ListAndWatch."""
        self.resource = resource
        self._service.update(resource, strategies)

    @property
    def registered(self) -> bool:
        """Whether the kubelet that owns kubelet.sock now accepted this plugin."""
        current = _identity(self.kubelet_socket)
        return current is not None and current == self._registered_with

    async def serve(self) -> None:
        """(Re)start the service on a fresh socket; RuntimeError or OSError when it cannot bind."""
        await self._stop_server(grace=1.0)
        # The directory is the kubelet's: when it is missing, binding fails and is retried.
        self.socket.unlink(missing_ok=True)
        server = grpc.aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self._service, server)
        server.add_insecure_port(f"unix://{self.socket}")  # raises RuntimeError when it cannot bind
        owner_only(self.socket)
        await server.start()
        self._server = server
        self._serving = _identity(self.socket)
        log.info("serving %s on %s", self.resource.name, self.socket)

    async def register(self) -> None:
        """Register with the kubelet through kubelet.sock; raises grpc.aio.AioRpcError or OSError."""
        kubelet = _identity(self.kubelet_socket)
        if kubelet is None:
            raise FileNotFoundError(f"{self.kubelet_socket} does not exist (is the kubelet running?)")
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket.name,
            resource_name=self.resource.name,
            options=OPTIONS,
        )
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            stub: pb_grpc.RegistrationAsyncStub = pb_grpc.RegistrationStub(channel)
            await stub.Register(request, timeout=15)
        self._registered_with = kubelet
        self.registrations += 1
        self.first_registration.set()
        metrics.DP_REGISTRATIONS.labels(self.resource.name).inc()
        self._calls(
            "Register",
            resource=self.resource.name,
            endpoint=self.socket.name,
            devices=self.resource.advertised,
            n=self.registrations,
        )
        log.info(
            "registered %s (%d devices) with the kubelet%s",
            self.resource.name,
            self.resource.advertised,
            " again" if self.registrations > 1 else "",
        )

    async def keep_registered(self, interval: float = 1.0) -> None:
        """Serve and register now, then again whenever the kubelet restarts or our socket disappears."""
        backoff = interval
        while True:
            try:
                if self._server is None or _identity(self.socket) != self._serving:
                    if self._server is not None:
                        log.warning("%s disappeared (kubelet restart?); serving on a new socket", self.socket)
                    self._registered_with = None
                    await self.serve()
                if not self.registered:
                    await self.register()
                backoff = interval
            except (grpc.aio.AioRpcError, OSError, RuntimeError) as err:
                # RuntimeError: grpc could not bind the socket; the others: no kubelet, or it refused.
                reason = err.details() if isinstance(err, grpc.aio.AioRpcError) else str(err)
                log.warning(
                    "serving or registering %s failed, retrying in %.0fs: %s",
                    self.resource.name,
                    backoff,
                    reason,
                )
                self._calls("RegisterFailed", resource=self.resource.name, error=reason)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _RETRY_MAX)
                continue
            await anyio.sleep(interval)

    async def _stop_server(self, grace: float | None) -> None:
        if self._server is not None:
            self._service.end_streams()
            await self._server.stop(grace)
            self._server = None

    async def stop(self, grace: float = 2.0) -> None:
        """Stop serving and remove our socket (the kubelet then marks the devices unhealthy)."""
        await self._stop_server(grace)
        if _identity(self.socket) == self._serving:
            self.socket.unlink(missing_ok=True)
