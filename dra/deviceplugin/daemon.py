"""The `dra-gpu device-plugin` process: inventory, assignment, CDI spec, one server per resource."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import FILE_NAME, CheckpointError, CheckpointStore
from dra.core import cdi
from dra.core.assignment import GpuPath, Selector, describe, held_gpus, held_refusal
from dra.daemon import metrics
from dra.daemon.health import HealthMonitor, HealthTracker
from dra.daemon.lifecycle import Heartbeat, until_stopped
from dra.daemon.sockets import SocketPathError
from dra.deviceplugin.allocate import Strategy, uses_cdi
from dra.deviceplugin.resources import DEFAULT_RESOURCE, ResourceError, resources
from dra.deviceplugin.server import ResourceServer
from dra.deviceplugin.service import CallLog, DevicePluginService
from dra.kubeletplugin.daemon import (
    StartupError,
    default_state_dir,
    gpu_library,
    load_inventory,
    serve_http,
    take_assignment,
)
from dra.model.devices import Inventory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DevicePluginSettings:
    """Everything the device-plugin command is told."""

    node_name: str
    driver_name: str
    kubelet_root: Path
    device_plugin_dir: Path | None
    cdi_root: Path
    state_dir: Path | None
    resource_name: str = DEFAULT_RESOURCE
    strategies: frozenset[Strategy] = frozenset({Strategy.CDI_CRI})
    dra_gpus: Selector | None = None
    device_plugin_gpus: Selector | None = None
    fake_gpus: str | None = None
    fake_gpu_events: Path | None = None
    http_address: str | None = None
    call_log: Path | None = None
    watch_interval: float = 1.0
    host_root: Path = Path("/")

    @property
    def plugin_directory(self) -> Path:
        """The kubelet's device-plugin directory (kubelet.sock and the plugins' sockets)."""
        return self.device_plugin_dir or self.kubelet_root / "device-plugins"

    @property
    def state_directory(self) -> Path:
        """Where the GPU assignment record is shared with the kubelet-plugin."""
        return self.state_dir or default_state_dir(self.kubelet_root, self.driver_name)

    @property
    def checkpoint_path(self) -> Path:
        """The kubelet-plugin's checkpoint of prepared claims, in the same state directory."""
        return self.state_directory / FILE_NAME


def refuse_gpus_in_dra_use(inventory: Inventory, checkpoint: Path) -> None:
    """StartupError naming a GPU of `inventory` that a claim prepared for DRA still uses.

    Moving a GPU from DRA to the device plugin restarts both containers while
    the pods DRA gave it to may still run; advertising it then could give it to
    a second pod. Refusing is enough: the DaemonSet restarts this container with
    backoff, and it starts once the kubelet has unprepared the claim.
    """
    try:
        claims = CheckpointStore(checkpoint).load()
    except CheckpointError as err:
        raise StartupError(str(err)) from None
    message = held_refusal(held_gpus(claims.values(), inventory), where=f" (checkpoint {checkpoint})")
    if message is not None:
        raise StartupError(message)
    for shared in held_gpus(claims.values(), inventory, admin_access=True):
        log.warning(
            "%s is advertised while ResourceClaim %s/%s (UID %s), prepared for DRA with admin access, "
            "still has access to it through %s",
            describe(shared.gpu),
            shared.claim.namespace,
            shared.claim.name,
            shared.claim.uid,
            shared.device,
        )


def keep_cdi_spec(settings: DevicePluginSettings, inventory: Inventory) -> None:
    """Write the plugin's CDI spec for its devices; with no device, remove one left from before.

    CDI specs must name at least one device, so a plugin with no GPU writes none.
    A spec from an earlier configuration would then stay and name GPUs that may
    now be DRA's, resolvable by any container that asks for them.
    """
    store = CdiStore(settings.cdi_root, settings.driver_name)
    if not len(inventory):
        try:
            removed = store.remove_device_spec()
        except OSError as err:
            raise StartupError(
                f"cannot remove the stale CDI spec {store.device_spec_path()}: {err}"
            ) from None
        if removed:
            log.info("removed CDI spec %s: this plugin has no device", store.device_spec_path())
        return
    if not uses_cdi(settings.strategies):
        return
    spec = cdi.build_device_spec(settings.driver_name, list(inventory), inventory)
    try:
        path = store.write_device_spec(spec)
    except OSError as err:
        raise StartupError(f"cannot write the CDI spec in {settings.cdi_root}: {err}") from None
    log.info("wrote CDI spec %s (kind %s)", path, cdi.device_kind(settings.driver_name))


async def run_device_plugin(settings: DevicePluginSettings) -> None:
    """Run until SIGTERM or SIGINT."""
    started = time.monotonic()
    lib = gpu_library(settings.fake_gpus, settings.node_name, settings.fake_gpu_events, settings.host_root)
    inventory = load_inventory(lib)
    inventory, claim = take_assignment(
        inventory,
        settings.dra_gpus,
        settings.device_plugin_gpus,
        GpuPath.DEVICE_PLUGIN,
        settings.state_directory,
        settings.node_name,
    )
    servers: list[ResourceServer] = []
    monitor: HealthMonitor | None = None
    http = None
    try:
        refuse_gpus_in_dra_use(inventory, settings.checkpoint_path)
        try:
            offered = resources(inventory, settings.resource_name)
        except ResourceError as err:
            raise StartupError(str(err)) from None
        keep_cdi_spec(settings, inventory)
        tracker = HealthTracker(inventory)
        calls = CallLog(settings.call_log)
        try:
            servers = [
                ResourceServer(
                    settings.plugin_directory,
                    resource,
                    DevicePluginService(resource, tracker, settings.strategies, settings.driver_name, calls),
                    calls,
                )
                for resource in offered
            ]
        except SocketPathError as err:
            raise StartupError(str(err)) from None
        heartbeat = Heartbeat()
        if settings.http_address:
            http = serve_http(
                settings.http_address,
                lambda: all(s.registered for s in servers),
                heartbeat.alive,
                registry=metrics.DEVICE_PLUGIN_REGISTRY,
            )
        monitor = HealthMonitor(lib, tracker, inventory)
        async with anyio.create_task_group() as group:
            group.start_soon(heartbeat.run)
            for server in servers:
                group.start_soon(server.keep_registered, settings.watch_interval)
            metrics.DP_UNWATCHED_GPUS.set(len(monitor.start()))

            async def report_ready() -> None:
                for server in servers:
                    await server.first_registration.wait()
                log.info(
                    "ready: %s registered with the kubelet in %.2fs",
                    ", ".join(f"{s.resource.name} ({len(s.resource.devices)})" for s in servers),
                    time.monotonic() - started,
                )

            group.start_soon(report_ready)
            await until_stopped()
            group.cancel_scope.cancel()
    finally:
        watch_ended = True
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as stopping:
                for server in servers:
                    stopping.start_soon(server.stop)
            if monitor is not None:
                # NVML frees the event set at shutdown: not while the XID thread may still wait on it.
                watch_ended = await monitor.stop()
        if http is not None:
            http.shutdown()
        claim.release()
        if watch_ended:
            lib.shutdown()
