"""The plugin-registration service the kubelet calls on <kubelet root>/plugins_registry/<driver>-reg.sock."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from dra.pb.pluginregistration.v1 import registration_pb2, registration_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.ServicerContext

#: What the kubelet may choose from, newest first: the kubelet takes the first DRAPlugin it knows,
#: and (1.37) the first DRAResourceHealth it knows; 1.34 ignores v1 health and asks v1alpha1.
SUPPORTED_SERVICES = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)


class RegistrationService(registration_pb2_grpc.RegistrationServicer):
    """Tells the kubelet where the DRA service is, and remembers whether it accepted us."""

    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        #: Set from the gRPC server's thread once the kubelet accepted the plugin.
        self.registered = threading.Event()
        #: Called on that thread once it is set (the daemon wakes its event loop with it).
        self.on_registered: Callable[[], object] = lambda: None

    def GetInfo(  # noqa: N802 (gRPC method name)
        self, request: registration_pb2.InfoRequest, context: Context
    ) -> registration_pb2.PluginInfo:
        """Describe the plugin."""
        return registration_pb2.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_SERVICES),
        )

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: registration_pb2.RegistrationStatus, context: Context
    ) -> registration_pb2.RegistrationStatusResponse:
        """Record the kubelet's verdict; a refusal is logged with the kubelet's reason."""
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s", self.driver)
            self.registered.set()
            self.on_registered()
        else:
            log.error("the kubelet refused the registration of %s: %s", self.driver, request.error)
        return registration_pb2.RegistrationStatusResponse()
