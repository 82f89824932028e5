"""The kubelet-plugin daemon: discovery, state, slices, gRPC and metrics wired together."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

import anyio
import anyio.to_thread

from dra.adapters.assignmentrecord import AssignmentClaim, AssignmentConflictError, AssignmentRecord
from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import FILE_NAME, CheckpointError, CheckpointStore, PreparedClaim
from dra.adapters.kube import KubeClient, KubeError
from dra.core.assignment import (
    AssignmentError,
    GpuPath,
    Selector,
    assign,
    held_gpus,
    restrict,
    stranded_claims,
)
from dra.daemon import metrics
from dra.daemon.health import HealthMonitor, HealthTracker
from dra.daemon.lifecycle import Heartbeat, until_stopped
from dra.daemon.sockets import SocketPathError
from dra.gpu.discovery import discover
from dra.gpu.fake import FakeGpuLibrary
from dra.gpu.nvml import GpuLibrary, GpuLibraryError, NvmlLibrary
from dra.gpu.profiles import ProfileError, load_profile
from dra.kubeletplugin.publisher import SlicePublisher
from dra.kubeletplugin.server import PluginServer
from dra.kubeletplugin.service import DraService, HealthService
from dra.kubeletplugin.state import DeviceState
from dra.model.devices import Inventory

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The daemon cannot start; the message says what to fix."""


@dataclass(frozen=True)
class PluginSettings:
    """Everything the kubelet-plugin command is told."""

    driver_name: str
    node_name: str
    kubeconfig: str | None
    kubelet_root: Path
    cdi_root: Path
    state_dir: Path | None
    fake_gpus: str | None
    fake_gpu_events: Path | None
    http_address: str | None
    dra_gpus: Selector | None = None
    device_plugin_gpus: Selector | None = None
    rediscover_interval: float = 60.0
    host_root: Path = Path("/")

    @property
    def state_directory(self) -> Path:
        """Checkpoint and GPU assignment record (default: next to the plugin socket, on the host)."""
        return self.state_dir or default_state_dir(self.kubelet_root, self.driver_name)

    @property
    def checkpoint_path(self) -> Path:
        """The checkpoint file."""
        return self.state_directory / FILE_NAME


def default_state_dir(kubelet_root: Path, driver_name: str) -> Path:
    """Where both commands keep state by default: <kubelet root>/plugins/<driver>."""
    return kubelet_root / "plugins" / driver_name


def serve_http(
    address: str, ready: Callable[[], bool], alive: Callable[[], bool], **kwargs: Any
) -> WSGIServer:
    """The probes and metrics endpoint; StartupError when the address cannot be bound."""
    try:
        return metrics.serve(address, ready, alive, **kwargs)
    except (OSError, ValueError) as err:
        raise StartupError(f"cannot serve /metrics, /healthz and /readyz on {address!r}: {err}") from None


def gpu_library(
    fake_gpus: str | None, node_name: str, events: Path | None = None, host_root: Path = Path("/")
) -> GpuLibrary:
    """NVML (device nodes looked up under host_root), or fake GPUs from a profile name or file."""
    if not fake_gpus:
        return NvmlLibrary(dev=host_root)
    try:
        profile = load_profile(fake_gpus, node_name)
    except ProfileError as err:
        raise StartupError(f"--fake-gpus: {err}") from None
    return FakeGpuLibrary(profile, node_name, events)


def load_inventory(lib: GpuLibrary) -> Inventory:
    """Initialise the library and discover the node's devices."""
    try:
        lib.init()
        return discover(lib)
    except GpuLibraryError as err:
        raise StartupError(
            f"cannot read GPUs through NVML ({err}); is the NVIDIA driver installed and "
            "libnvidia-ml.so.1 visible to the driver? For testing without GPUs use --fake-gpus"
        ) from None


def take_assignment(
    inventory: Inventory,
    dra_gpus: Selector | None,
    device_plugin_gpus: Selector | None,
    running: GpuPath,
    state_dir: Path,
    node_name: str,
) -> tuple[Inventory, AssignmentClaim]:
    """This path's part of the inventory, recorded on the host; StartupError naming a GPU on overlap.

    Refused when the selectors give a GPU to both paths, or when the other
    path's process runs on this node and already advertises one of ours.
    """
    try:
        assignment = assign(inventory, dra_gpus, device_plugin_gpus, running)
    except AssignmentError as err:
        raise StartupError(str(err)) from None
    for warning in assignment.warnings:
        log.warning("%s", warning)
    mine = assignment.gpus(running)
    try:
        claim = AssignmentRecord(state_dir).claim(running, mine, node_name)
    except AssignmentConflictError as err:
        raise StartupError(str(err)) from None
    except OSError as err:
        raise StartupError(f"cannot use the GPU assignment record in {state_dir}: {err}") from None
    other = assignment.gpus(running.other)
    log.info(
        "%s advertises %d of %d GPUs (%s)%s",
        running.title,
        len(mine),
        len(inventory.gpus),
        ", ".join(str(g.index) for g in mine) or "none",
        f"; {running.other.title} has {', '.join(str(g.index) for g in other)}" if other else "",
    )
    return restrict(inventory, mine), claim


def warn_about_stranded_claims(
    everything: Inventory, mine: Inventory, claims: Iterable[PreparedClaim]
) -> None:
    """Log each prepared claim whose devices are on GPUs that are no longer DRA's.

    Such a claim stays prepared until the kubelet unprepares it when its pods
    end; until then the device plugin refuses to start with those GPUs. This
    only says so: refusing here would not free the GPUs any sooner.
    """
    others = restrict(everything, [gpu for gpu in everything.gpus if gpu not in mine.gpus])
    for warning in stranded_claims(held_gpus(claims, others)):
        log.warning("%s", warning)


def _discover_again(settings: PluginSettings) -> Inventory:
    # A fresh library, so that a changed fake profile file is read again too; NVML's
    # init and shutdown are reference-counted, so this leaves the health watch alone.
    lib = gpu_library(settings.fake_gpus, settings.node_name, host_root=settings.host_root)
    try:
        return load_inventory(lib)
    finally:
        lib.shutdown()


class Rediscovery:
    """Looks at the GPUs again now and then: a MIG layout changed, a GPU vanished or came back.

    Only GPUs this path was given at start-up are followed; a GPU that appears
    later is not advertised until a restart assigns it (to DRA or the device plugin).
    """

    def __init__(self, settings: PluginSettings, inventory: Inventory) -> None:
        self._settings = settings
        self._assigned = {gpu.uuid for gpu in inventory.gpus}
        self.current = inventory
        self._reported: set[str] = set()

    def follow(self, fresh: Inventory) -> Inventory | None:
        """This path's part of a fresh discovery, or None when nothing changed."""
        for gpu in fresh.gpus:
            if gpu.uuid not in self._assigned and gpu.uuid not in self._reported:
                self._reported.add(gpu.uuid)
                log.warning(
                    "GPU %d (%s) appeared after start-up: restart the driver to assign it",
                    gpu.index,
                    gpu.uuid,
                )
        mine = restrict(fresh, [gpu for gpu in fresh.gpus if gpu.uuid in self._assigned])
        if mine == self.current:
            return None
        names = {d.uuid: d.name for d in self.current}
        renamed = [
            f"{d.uuid} was {names[d.uuid]}, is {d.name}" for d in mine if names.get(d.uuid, d.name) != d.name
        ]
        if renamed:
            # Claims and slices name devices; a device under another name is another device to the
            # scheduler. Keep the names until a restart re-publishes everything at once.
            log.error(
                "GPU indexes changed (%s): keeping the devices published so far; restart to re-index",
                "; ".join(renamed),
            )
            return None
        before, after = {d.name for d in self.current}, {d.name for d in mine}
        log.info(
            "devices changed: added %s, removed %s",
            ", ".join(sorted(after - before)) or "none",
            ", ".join(sorted(before - after)) or "none",
        )
        self.current = mine
        return mine

    async def run(self, apply: Callable[[Inventory], Awaitable[None]]) -> None:
        """Discover every interval and apply what changed, until cancelled."""
        while True:
            await anyio.sleep(self._settings.rediscover_interval)
            try:
                fresh = await anyio.to_thread.run_sync(_discover_again, self._settings)
            except StartupError as err:
                log.warning("re-discovering GPUs failed, keeping the last inventory: %s", err)
                continue
            changed = self.follow(fresh)
            if changed is not None:
                await apply(changed)


async def run_kubelet_plugin(settings: PluginSettings) -> None:
    """Run until SIGTERM or SIGINT."""
    started = time.monotonic()
    lib = gpu_library(settings.fake_gpus, settings.node_name, settings.fake_gpu_events, settings.host_root)
    everything = load_inventory(lib)
    inventory, claim = take_assignment(
        everything,
        settings.dra_gpus,
        settings.device_plugin_gpus,
        GpuPath.DRA,
        settings.state_directory,
        settings.node_name,
    )
    try:
        await _run_kubelet_plugin(settings, lib, everything, inventory, started)
    finally:
        claim.release()


async def _run_kubelet_plugin(
    settings: PluginSettings, lib: GpuLibrary, everything: Inventory, inventory: Inventory, started: float
) -> None:
    log.info("publishing %d allocatable devices on node %s", len(inventory), settings.node_name)
    try:
        kube = KubeClient(settings.kubeconfig)
        state = DeviceState(
            settings.driver_name,
            settings.node_name,
            inventory,
            CdiStore(settings.cdi_root, settings.driver_name),
            CheckpointStore(settings.checkpoint_path),
        )
        state.recover()
    except (KubeError, CheckpointError) as err:
        raise StartupError(str(err)) from None
    except OSError as err:
        raise StartupError(f"cannot restore the CDI specs in {settings.cdi_root}: {err}") from None
    metrics.PREPARED_CLAIMS.set(len(state.prepared))
    warn_about_stranded_claims(everything, inventory, state.prepared.values())

    tracker = HealthTracker(inventory)
    publisher = SlicePublisher(kube, settings.driver_name, settings.node_name, inventory)

    dra = DraService(settings.driver_name, settings.node_name, state, kube)
    try:
        server = PluginServer(
            settings.kubelet_root, settings.driver_name, dra, HealthService(settings.node_name, tracker)
        )
    except SocketPathError as err:
        raise StartupError(str(err)) from None

    def ready() -> bool:
        return server.registration.registered.is_set() and publisher.published.is_set()

    async def apply(changed: Inventory) -> None:
        # The state's lock may be held across fsyncs by a prepare: wait for it off the loop.
        await anyio.to_thread.run_sync(state.set_inventory, changed)
        tracker.set_inventory(changed)
        publisher.set_inventory(changed)

    heartbeat = Heartbeat()
    http = serve_http(settings.http_address, ready, heartbeat.alive) if settings.http_address else None
    monitor = HealthMonitor(lib, tracker, inventory)
    try:
        try:
            await server.start()
        except (OSError, RuntimeError) as err:
            raise StartupError(f"cannot serve the plugin's sockets ({server.dra_socket}): {err}") from None
        async with anyio.create_task_group() as group:
            group.start_soon(heartbeat.run)
            group.start_soon(publisher.run)
            if settings.rediscover_interval > 0:
                group.start_soon(Rediscovery(settings, inventory).run, apply)
            group.start_soon(server.keep_registration_socket)
            unwatched = monitor.start(
                on_change=lambda _: metrics.UNHEALTHY_DEVICES.set(
                    sum(not h.healthy for h in tracker.snapshot().values())
                )
            )
            metrics.UNWATCHED_GPUS.set(len(unwatched))

            async def report_ready() -> None:
                await server.registration.registered.wait()
                await publisher.published.wait()
                log.info(
                    "ready: registered with the kubelet and published %d devices in %.2fs",
                    len(inventory),
                    time.monotonic() - started,
                )

            group.start_soon(report_ready)
            await until_stopped()
            group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await server.stop()
            # NVML frees the event set at shutdown: not while the XID thread may still wait on it.
            watch_ended = await monitor.stop()
        if http is not None:
            http.shutdown()
        kube.close()
        if watch_ended:
            lib.shutdown()
