"""The `dra-gpu device-plugin` process: inventory, assignment, CDI spec, one server per resource.

The resources follow the devices while the process runs: every
--rediscover-interval the GPUs are discovered again (dra.daemon.rediscovery),
and the ResourceSet starts, stops or re-announces resources to match.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import anyio
from anyio.abc import TaskGroup

from dra import __version__
from dra.adapters.checkpoint import CheckpointError, CheckpointStore
from dra.adapters.kube import KubeClient, KubeError
from dra.adapters.nodefiles import CdiStore
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
from dra.daemon.health import HealthTracker
from dra.daemon.lifecycle import until_stopped
from dra.daemon.nodewatch import labels_of
from dra.daemon.rediscovery import Rediscovery
from dra.daemon.sockets import SocketPathError
from dra.deviceplugin import config as dpconfig
from dra.deviceplugin.allocate import Strategy, uses_cdi
from dra.deviceplugin.config import DEFAULT_MIG_STRATEGY, DEFAULT_STRATEGIES, MigStrategy, TimeSlicing
from dra.deviceplugin.configwatch import ConfigFollower, NamedConfigs
from dra.deviceplugin.named import LABEL
from dra.deviceplugin.resources import (
    DEFAULT_RESOURCE,
    Resource,
    ResourceError,
    changes,
    resources,
    unshared,
)
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
    #: --config-dir: the config is the one the Node's label names, followed while the plugin runs.
    named: NamedConfigs | None = None
    #: Only used with named configs (the plugin otherwise talks to the kubelet alone).
    kubeconfig: str | None = None

    @property
    def plugin_config(self) -> dpconfig.Settings:
        """The settings NVIDIA's config file can change, as given at start-up."""
        return dpconfig.Settings(
            resource_name=self.resource_name,
            mig_strategy=self.mig_strategy,
            fail_on_init_error=self.fail_on_init_error,
            strategies=self.strategies,
            time_slicing=self.time_slicing,
        )

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


def keep_cdi_spec(
    settings: DevicePluginSettings, inventory: Inventory, strategies: frozenset[Strategy] | None = None
) -> None:
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
    if not uses_cdi(settings.strategies if strategies is None else strategies):
        return
    spec = cdi.build_device_spec(settings.driver_name, list(inventory), inventory)
    try:
        path = store.write_device_spec(spec)
    except OSError as err:
        raise StartupError(f"cannot write the CDI spec in {settings.cdi_root}: {err}") from None
    log.info("wrote CDI spec %s (kind %s)", path, cdi.device_kind(settings.driver_name))


async def run_device_plugin(settings: DevicePluginSettings) -> None:
    """Run until SIGTERM or SIGINT."""
    kube, in_force = None, None
    if settings.named is not None:
        kube, in_force, config = await _named_config(settings, settings.named)
        settings = replace(
            settings,
            resource_name=config.resource_name,
            strategies=config.strategies,
            mig_strategy=config.mig_strategy,
            time_slicing=config.time_slicing,
            fail_on_init_error=config.fail_on_init_error,
        )
    try:
        async with open_node(settings, GpuPath.DEVICE_PLUGIN) as node:
            await _serve(settings, node, kube, in_force)
    except GpuInitError as err:
        if settings.fail_on_init_error:
            raise
        log.error("%s; failOnInitError is false, so this plugin serves nothing until it is stopped", err)
        await until_stopped()
    finally:
        if kube is not None:
            with anyio.CancelScope(shield=True):
                await kube.aclose()


async def _named_config(
    settings: DevicePluginSettings, named: NamedConfigs
) -> tuple[KubeClient, tuple[str, str], dpconfig.Settings]:
    """The API client and the config the Node's label names at start-up; StartupError why not."""
    try:
        kube = KubeClient(settings.kubeconfig)
    except KubeError as err:
        raise StartupError(f"--config-dir needs the API server to read the node's labels: {err}") from None
    try:
        node = await kube.get_node(settings.node_name)
        name, text, config = named.load(labels_of(node))
    except (KubeError, dpconfig.ConfigError) as err:
        await kube.aclose()
        raise StartupError(f"cannot choose the node's device-plugin config: {err}") from None
    log.info("config %s chosen (%s=%s)", name, LABEL, labels_of(node).get(LABEL, "unset"))
    return kube, (name, text), config


def offer(inventory: Inventory, config: dpconfig.Settings) -> list[Resource]:
    """The resources a config makes of the inventory, with warnings for what it leaves out.

    ResourceError when the kubelet would refuse them or the MIG layout does not fit the strategy.
    """
    offered = resources(inventory, config.resource_name, config.mig_strategy, config.time_slicing)
    for name in unshared(offered, config.time_slicing):
        log.warning("time-slicing config names %s, which this node does not offer: nothing to share", name)
    if config.mig_strategy is MigStrategy.NONE:
        in_mig_mode = [g.name for g in inventory.gpus if g.mig_enabled]
        if in_mig_mode:
            log.warning("MIG strategy none: %s in MIG mode, not offered", ", ".join(in_mig_mode))
    return offered


class ResourceSet:
    """One ResourceServer per offered resource, changed in place when the devices or the config change.

    A resource that appears gets its own server and registration, one that is no
    longer offered loses them (the kubelet then marks its devices unhealthy and
    drops them from allocatable), and one whose devices or replicas changed sends
    the new list on its open ListAndWatch streams.
    """

    def __init__(
        self, settings: DevicePluginSettings, tracker: HealthTracker, inventory: Inventory, calls: CallLog
    ) -> None:
        self._settings = settings
        self._tracker = tracker
        self._calls = calls
        self.inventory = inventory
        self.config = settings.plugin_config
        self.servers: dict[str, ResourceServer] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._group: TaskGroup | None = None
        self._lock = anyio.Lock()

    @property
    def registered(self) -> bool:
        """Whether the kubelet accepted every resource."""
        return all(s.registered for s in self.servers.values())

    def _server(self, resource: Resource) -> ResourceServer:
        service = DevicePluginService(
            resource, self._tracker, self.config.strategies, self._settings.driver_name, self._calls
        )
        return ResourceServer(self._settings.plugin_directory, resource, service, self._calls)

    def _start(self, resource: Resource) -> None:
        server = self._server(resource)
        self.servers[resource.name] = server
        if self._group is not None:
            scope = self._scopes[resource.name] = anyio.CancelScope()
            self._group.start_soon(self._keep, server, scope)

    async def _keep(self, server: ResourceServer, scope: anyio.CancelScope) -> None:
        with scope:
            await server.keep_registered(self._settings.watch_interval)

    def begin(self, offered: list[Resource]) -> None:
        """Build the first servers; SocketPathError when a socket path cannot be used."""
        for resource in offered:
            self._start(resource)

    def run(self, group: TaskGroup) -> None:
        """Keep every server registered in `group`; later resources start there too."""
        self._group = group
        for name, server in self.servers.items():
            scope = self._scopes[name] = anyio.CancelScope()
            group.start_soon(self._keep, server, scope)

    async def apply(self, inventory: Inventory, config: dpconfig.Settings) -> str | None:
        """Offer `inventory` under `config`; None when done, else why nothing changed.

        A refused change keeps everything as it was: the last good resources stay served.
        """
        # Re-discovery and a new config may both apply at once; each sees the other's result.
        async with self._lock:
            return await self._apply(inventory, config)

    async def reconfigure(self, config: dpconfig.Settings) -> str | None:
        """Offer the current devices under another config; None when done, else why not."""
        async with self._lock:
            return await self._apply(self.inventory, config)

    async def _apply(self, inventory: Inventory, config: dpconfig.Settings) -> str | None:
        try:
            offered = offer(inventory, config)
        except ResourceError as err:
            return str(err)
        try:
            keep_cdi_spec(self._settings, inventory, config.strategies)
        except StartupError as err:
            return str(err)
        diff = changes([s.resource for s in self.servers.values()], offered)
        self.inventory, self.config = inventory, config
        self._tracker.set_inventory(inventory)
        for resource in diff.removed:
            self._scopes.pop(resource.name).cancel()
            await self.servers.pop(resource.name).stop()
            log.info("stopped offering %s", resource.name)
        for server in self.servers.values():
            updated = next((r for r in diff.changed if r.name == server.resource.name), server.resource)
            server.update(updated, config.strategies)
        for resource in diff.added:
            try:
                self._start(resource)
            except SocketPathError as err:
                log.error("cannot offer %s: %s", resource.name, err)
                continue
            log.info("now offering %s (%d devices)", resource.name, resource.advertised)
        for resource in diff.changed:
            log.info("%s now has %d devices", resource.name, resource.advertised)
        return None

    async def stop(self) -> None:
        """Stop every server and remove its socket."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as stopping:
                for server in self.servers.values():
                    stopping.start_soon(server.stop)


async def _serve(
    settings: DevicePluginSettings, node: Node, kube: KubeClient | None, in_force: tuple[str, str] | None
) -> None:
    inventory = node.inventory
    refuse_gpus_in_dra_use(inventory, settings.checkpoint_path)
    config = settings.plugin_config
    try:
        offered = offer(inventory, config)
    except ResourceError as err:
        raise StartupError(str(err)) from None
    keep_cdi_spec(settings, inventory)
    offering = ResourceSet(settings, node.tracker, inventory, CallLog(settings.call_log))
    try:
        offering.begin(offered)
    except SocketPathError as err:
        raise StartupError(str(err)) from None

    async def report_ready() -> None:
        servers = list(offering.servers.values())
        for server in servers:
            await server.first_registration.wait()
        log.info(
            "dra-gpu %s ready: %s registered with the kubelet in %.2fs",
            __version__,
            ", ".join(f"{s.resource.name} ({s.resource.advertised})" for s in servers),
            time.monotonic() - node.started,
        )

    async def rediscovered(changed: Inventory) -> None:
        refused = await offering.apply(changed, offering.config)
        if refused is not None:
            log.error("cannot offer the re-discovered devices, keeping the last ones: %s", refused)

    def tasks(group: TaskGroup) -> None:
        offering.run(group)
        group.start_soon(report_ready)
        if settings.rediscover_interval > 0:
            group.start_soon(Rediscovery(settings, inventory, everything=node.everything).run, rediscovered)
        if kube is not None and settings.named is not None and in_force is not None:
            follower = ConfigFollower(
                settings.named,
                kube,
                settings.node_name,
                offering.reconfigure,
                in_force,
                settings.watch_interval,
            )
            group.start_soon(follower.run)

    try:
        await serve_until_stopped(
            node,
            ready=lambda: offering.registered,
            registry=metrics.DEVICE_PLUGIN_REGISTRY,
            unwatched=metrics.DP_UNWATCHED_GPUS,
            tasks=tasks,
        )
    finally:
        await offering.stop()
