"""The `dra-gpu device-plugin` process: inventory, assignment, CDI spec, one server per resource."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import TaskGroup

from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import CheckpointError, CheckpointStore
from dra.core import cdi
from dra.core.assignment import GpuPath, describe, held_gpus, held_refusal
from dra.daemon import metrics
from dra.daemon.bootstrap import (
    DaemonSettings,
    GpuInitError,
    Node,
    StartupError,
    open_node,
    serve_until_stopped,
)
from dra.daemon.lifecycle import until_stopped
from dra.daemon.sockets import SocketPathError
from dra.deviceplugin.allocate import Strategy, uses_cdi
from dra.deviceplugin.config import DEFAULT_MIG_STRATEGY, DEFAULT_STRATEGIES, MigStrategy, TimeSlicing
from dra.deviceplugin.resources import DEFAULT_RESOURCE, ResourceError, resources, unshared
from dra.deviceplugin.server import ResourceServer
from dra.deviceplugin.service import CallLog, DevicePluginService
from dra.model.devices import Inventory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DevicePluginSettings(DaemonSettings):
    """Everything the device-plugin command is told."""

    device_plugin_dir: Path | None = None
    resource_name: str = DEFAULT_RESOURCE
    strategies: frozenset[Strategy] = DEFAULT_STRATEGIES
    call_log: Path | None = None
    watch_interval: float = 1.0
    mig_strategy: MigStrategy = DEFAULT_MIG_STRATEGY
    time_slicing: TimeSlicing = field(default_factory=TimeSlicing)
    #: False: when NVML cannot start, log it and serve nothing instead of exiting (non-GPU nodes).
    fail_on_init_error: bool = True

    @property
    def plugin_directory(self) -> Path:
        """The kubelet's device-plugin directory (kubelet.sock and the plugins' sockets)."""
        return self.device_plugin_dir or self.kubelet_root / "device-plugins"


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
    try:
        async with open_node(settings, GpuPath.DEVICE_PLUGIN) as node:
            await _serve(settings, node)
    except GpuInitError as err:
        if settings.fail_on_init_error:
            raise
        log.error("%s; failOnInitError is false, so this plugin serves nothing until it is stopped", err)
        await until_stopped()


async def _serve(settings: DevicePluginSettings, node: Node) -> None:
    inventory = node.inventory
    refuse_gpus_in_dra_use(inventory, settings.checkpoint_path)
    try:
        offered = resources(inventory, settings.resource_name, settings.mig_strategy, settings.time_slicing)
    except ResourceError as err:
        raise StartupError(str(err)) from None
    for name in unshared(offered, settings.time_slicing):
        log.warning("time-slicing config names %s, which this node does not offer: nothing to share", name)
    if settings.mig_strategy is MigStrategy.NONE:
        in_mig_mode = [g.name for g in inventory.gpus if g.mig_enabled]
        if in_mig_mode:
            log.warning("MIG strategy none: %s in MIG mode, not offered", ", ".join(in_mig_mode))
    keep_cdi_spec(settings, inventory)
    calls = CallLog(settings.call_log)
    try:
        servers = [
            ResourceServer(
                settings.plugin_directory,
                resource,
                DevicePluginService(resource, node.tracker, settings.strategies, settings.driver_name, calls),
                calls,
            )
            for resource in offered
        ]
    except SocketPathError as err:
        raise StartupError(str(err)) from None

    async def report_ready() -> None:
        for server in servers:
            await server.first_registration.wait()
        log.info(
            "ready: %s registered with the kubelet in %.2fs",
            ", ".join(f"{s.resource.name} ({s.resource.advertised})" for s in servers),
            time.monotonic() - node.started,
        )

    def tasks(group: TaskGroup) -> None:
        for server in servers:
            group.start_soon(server.keep_registered, settings.watch_interval)
        group.start_soon(report_ready)

    try:
        await serve_until_stopped(
            node,
            ready=lambda: all(s.registered for s in servers),
            registry=metrics.DEVICE_PLUGIN_REGISTRY,
            unwatched=metrics.DP_UNWATCHED_GPUS,
            tasks=tasks,
        )
    finally:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as stopping:
                for server in servers:
                    stopping.start_soon(server.stop)
