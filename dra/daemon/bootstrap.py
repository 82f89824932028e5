"""One bootstrap for every daemon subcommand: settings, GPUs, the GPU split, probes, signals.

Every daemon starts the same way (GPUs discovered, this path's share leased on the host,
probes, metrics and the XID watch served, its own tasks run until SIGTERM or SIGINT) and stops
in reverse, NVML last (docs/architecture.md, "One bootstrap"). Anything that stops a start-up
is a StartupError whose message says what to fix; the command line prints it as one line.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

import anyio
from anyio.abc import TaskGroup

from dra.adapters.assignmentrecord import AssignmentConflictError, AssignmentLease, AssignmentRecord
from dra.adapters.checkpoint import FILE_NAME
from dra.core.assignment import (
    AssignmentError,
    GpuPath,
    Selector,
    assign,
    held_gpus,
    restrict,
    stranded_claims,
)
from dra.daemon import cdihook, metrics
from dra.daemon.health import APPLICATION_XIDS, HealthMonitor, HealthTracker
from dra.daemon.lifecycle import Heartbeat, until_stopped
from dra.gpu.discovery import discover
from dra.gpu.driverfiles import device_root, find_driver_files, nvml_library
from dra.gpu.library import GpuLibrary, GpuLibraryError
from dra.gpu.nvml import NvmlLibrary
from dra.model.devices import ContainerHook, Inventory
from dra.model.migmode import MigModes
from dra.model.prepared import PreparedClaim

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The daemon cannot start; the message says what to fix."""

    #: The process's exit status.
    exit_code = 1


class GpuInitError(StartupError):
    """The GPU library could not start or list the GPUs (no driver, no NVML on this node)."""


@dataclass(frozen=True)
class DaemonSettings:
    """What every daemon subcommand is told (flags, or DRA_GPU_* variables)."""

    driver_name: str
    node_name: str
    kubelet_root: Path
    cdi_root: Path
    state_dir: Path | None
    fake_gpus: str | None = None
    fake_gpu_events: Path | None = None
    http_address: str | None = None
    dra_gpus: Selector | None = None
    device_plugin_gpus: Selector | None = None
    host_root: Path = Path("/")
    #: Where the NVIDIA driver's user-space files are installed, as the container runtime sees it.
    driver_root: Path = Path("/")
    #: Whether the CDI specs mount the driver's files (False: the node's NVIDIA runtime hook does).
    cdi_driver_files: bool = True
    #: The node's own nvidia-cdi-hook (a host path); None: the image's, copied to the plugin directory.
    nvidia_cdi_hook_path: Path | None = None
    #: With fake GPUs: where their device nodes and stand-in driver are made, for real containers.
    fake_gpu_root: Path | None = None
    #: Seconds without a critical XID or NVML error after which an unhealthy device is healthy
    #: again; 0 keeps it unhealthy until the driver restarts.
    health_recovery_period: float = 300.0
    #: XIDs that leave device health alone (by default the application errors).
    ignored_xids: frozenset[int] = APPLICATION_XIDS
    #: Seconds between looks at the GPUs for changes (dra.daemon.rediscovery); 0 disables.
    rediscover_interval: float = 60.0
    #: How each GPU's MIG is published: static (MIG devices made beforehand), dynamic, whole.
    mig_modes: MigModes = field(default_factory=MigModes)
    #: This instance's ID when instances may overlap on a node (a rolling update, the pod UID);
    #: None runs exclusively: a second instance is refused.
    instance_id: str | None = None

    @property
    def state_directory(self) -> Path:
        """Checkpoint and GPU assignment record (default: next to the plugin socket, on the host)."""
        return self.state_dir or default_state_dir(self.kubelet_root, self.driver_name)

    @property
    def checkpoint_path(self) -> Path:
        """The kubelet-plugin's checkpoint of prepared claims."""
        return self.state_directory / FILE_NAME

    def library(self, *, with_events: bool = False) -> GpuLibrary:
        """This node's GPU library (NVML, or the fake profile keeping its state in the state directory).

        with_events: the fake's injected-event file too, for the one library that watches health.
        """
        return gpu_library(
            self.fake_gpus,
            self.node_name,
            self.fake_gpu_events if with_events else None,
            self.host_root,
            self.state_directory,
            self.fake_gpu_root,
            self.driver_root,
        )


def daemon_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The DaemonSettings fields, from the flags every daemon shares (dra.cli.options.daemon_flags)."""
    return {
        "driver_name": args.driver_name,
        "node_name": args.node_name,
        "kubelet_root": args.kubelet_root,
        "cdi_root": args.cdi_root,
        "state_dir": args.state_dir,
        "fake_gpus": args.fake_gpus or None,
        "fake_gpu_events": args.fake_gpu_events,
        "http_address": args.http_address or None,
        "dra_gpus": getattr(args, "dra_gpus", None),
        "device_plugin_gpus": getattr(args, "device_plugin_gpus", None),
        "host_root": args.host_root,
        "driver_root": args.driver_root,
        "cdi_driver_files": args.cdi_driver_files,
        "nvidia_cdi_hook_path": args.nvidia_cdi_hook_path,
        "fake_gpu_root": args.fake_gpu_root,
        "health_recovery_period": args.health_recovery_period,
        "ignored_xids": args.ignored_xids,
        "rediscover_interval": getattr(args, "rediscover_interval", DaemonSettings.rediscover_interval),
        "mig_modes": args.mig_mode.for_node(args.node_name or ""),
    }


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
    fake_gpus: str | None,
    node_name: str,
    events: Path | None = None,
    host_root: Path = Path("/"),
    state_dir: Path | None = None,
    fake_gpu_root: Path | None = None,
    driver_root: Path = Path("/"),
) -> GpuLibrary:
    """NVML, or fake GPUs from a profile name or file.

    NVML is the driver root's libnvidia-ml.so.1 where it has one (as NVIDIA's plugin loads it),
    else the one the dynamic loader finds; device nodes are looked up in the driver root's dev/
    where it has one (a containerised driver's), else in the host's /dev, both under host_root.
    Fake GPUs keep the settings the driver changes and their MIG instances in `state_dir`, as
    real ones keep them across a driver restart, so that every process of the node (and a
    restarted one) sees the same. With fake_gpu_root their device nodes and stand-in driver are
    made there first.
    """
    if not fake_gpus:
        root = host_root / str(driver_root).lstrip("/")
        dev = root if device_root(driver_root, host_root) != "/" else host_root
        return NvmlLibrary(dev=dev, library=nvml_library(root))
    # Imported here so that a node with real GPUs never loads the fakes.
    from dra.fakegpus import node as fakegpus
    from dra.fakegpus.profiles import ProfileError

    try:
        return fakegpus.fake_gpu_library(fake_gpus, node_name, events, state_dir, fake_gpu_root)
    except ProfileError as err:
        raise StartupError(f"--fake-gpus: {err}") from None
    except fakegpus.FakeRootError as err:
        raise StartupError(str(err)) from None


def node_inventory(lib: GpuLibrary, settings: DaemonSettings) -> Inventory:
    """load_inventory, plus what the CDI specs need of the node: the driver's files, the device root."""
    inventory = load_inventory(lib, settings.mig_modes)
    if settings.fake_gpus and settings.fake_gpu_root is not None:
        from dra.fakegpus import node as fakegpus

        dev_root, driver_root, host_root = (
            settings.fake_gpu_root,
            settings.fake_gpu_root / fakegpus.DRIVER_ROOT,
            Path("/"),
        )
    elif settings.fake_gpus:
        return inventory
    else:
        driver_root, host_root = settings.driver_root, settings.host_root
        dev_root = Path(device_root(driver_root, host_root))
    version = lib.driver_version()
    files = find_driver_files(version, driver_root, host_root) if settings.cdi_driver_files else ()
    hook = None
    if files:
        plugin_dir = default_state_dir(settings.kubelet_root, settings.driver_name)
        path = cdihook.install(plugin_dir, settings.nvidia_cdi_hook_path, settings.host_root)
        hook = ContainerHook(path, version) if path else None
    return replace(inventory, driver_files=files, dev_root=str(dev_root), container_hook=hook)


def load_inventory(lib: GpuLibrary, mig_modes: MigModes | None = None) -> Inventory:
    """Initialise the library and discover the node's devices."""
    try:
        lib.init()
        return discover(lib, mig_modes)
    except GpuLibraryError as err:
        raise GpuInitError(
            f"cannot read GPUs through NVML ({err}); is the NVIDIA driver installed and "
            "libnvidia-ml.so.1 visible to the driver? For testing without GPUs use --fake-gpus"
        ) from None


def warn_about_unmatched_mig_modes(inventory: Inventory, modes: MigModes) -> None:
    """Log the --mig-mode overrides that name no GPU of this node (another node's UUID, or a mistake).

    Not refused: one value serves every node of a DaemonSet, and a UUID names a GPU of one node only.
    """
    unmatched = modes.unmatched((gpu.index, gpu.uuid) for gpu in inventory.gpus)
    if unmatched:
        log.warning(
            "--mig-mode: no GPU of this node matches %s (it has %s); ignored here",
            ", ".join(unmatched),
            f"GPUs {', '.join(str(gpu.index) for gpu in inventory.gpus)} and their UUIDs"
            if inventory.gpus
            else "no GPU",
        )


def take_assignment(
    inventory: Inventory,
    dra_gpus: Selector | None,
    device_plugin_gpus: Selector | None,
    running: GpuPath,
    state_dir: Path,
    node_name: str,
    overlapping: bool = False,
) -> tuple[Inventory, AssignmentLease]:
    """This path's part of the inventory, recorded on the host; StartupError naming a GPU on overlap.

    Refused when the selectors give a GPU to both paths, or when the other
    path's process runs on this node and already advertises one of ours.
    `overlapping`: another instance of this path may run (a rolling update).
    """
    try:
        assignment = assign(inventory, dra_gpus, device_plugin_gpus, running)
    except AssignmentError as err:
        raise StartupError(str(err)) from None
    for warning in assignment.warnings:
        log.warning("%s", warning)
    mine = assignment.gpus(running)
    try:
        lease = AssignmentRecord(state_dir).lease(running, mine, node_name, shared=overlapping)
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
    return restrict(inventory, mine), lease


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


@dataclass
class Node:
    """What a daemon starts from: the node's GPUs, this path's share of them, their health."""

    settings: DaemonSettings
    lib: GpuLibrary
    #: Every GPU on the node, whichever path advertises it.
    everything: Inventory
    #: This path's share.
    inventory: Inventory
    tracker: HealthTracker
    monitor: HealthMonitor
    #: time.monotonic() when the process began starting, for the "ready in" log line.
    started: float


def rediscover(settings: DaemonSettings) -> Inventory:
    """Discover the GPUs again, for a daemon that follows changes (MIG layout, lost GPUs)."""
    # A fresh library, so that a changed fake profile file is read again too; NVML's
    # init and shutdown are reference-counted, so this leaves the health watch alone.
    lib = settings.library()
    try:
        return node_inventory(lib, settings)
    finally:
        lib.shutdown()


@asynccontextmanager
async def open_node(settings: DaemonSettings, path: GpuPath | None) -> AsyncIterator[Node]:
    """Steps 1 and 2 of the bootstrap, undone in reverse when the daemon ends.

    With no path (a daemon that advertises nothing, such as the node labeller)
    no share is taken and no lease recorded: the daemon sees every GPU, and
    the GPU split is left to the two paths.
    """
    started = time.monotonic()
    lib = settings.library(with_events=True)
    everything = node_inventory(lib, settings)
    warn_about_unmatched_mig_modes(everything, settings.mig_modes)
    lease: AssignmentLease | None = None
    inventory = everything
    if path is not None:
        inventory, lease = take_assignment(
            everything,
            settings.dra_gpus,
            settings.device_plugin_gpus,
            path,
            settings.state_directory,
            settings.node_name,
            overlapping=settings.instance_id is not None,
        )
    tracker = HealthTracker(inventory, ignored_xids=settings.ignored_xids)
    node = Node(
        settings, lib, everything, inventory, tracker, HealthMonitor(lib, tracker, inventory), started
    )
    watch_ended = True
    try:
        yield node
    finally:
        with anyio.CancelScope(shield=True):
            watch_ended = await node.monitor.stop()
        if lease is not None:
            lease.release()
        if watch_ended:
            lib.shutdown()


async def serve_until_stopped(
    node: Node,
    *,
    ready: Callable[[], bool],
    registry: metrics.CollectorRegistry,
    unwatched: metrics.Gauge,
    tasks: Callable[[TaskGroup], None],
    on_health_change: Callable[[list[str]], None] | None = None,
) -> None:
    """Steps 3 and 4: probes and metrics, the XID watch and the daemon's tasks, until a signal."""
    heartbeat = Heartbeat()
    address = node.settings.http_address
    http = serve_http(address, ready, heartbeat.alive, registry=registry) if address else None
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(heartbeat.run)
            if node.settings.health_recovery_period > 0:
                group.start_soon(
                    node.tracker.keep_recovering, node.settings.health_recovery_period, on_health_change
                )
            tasks(group)
            unwatched.set(len(node.monitor.start(on_change=on_health_change)))
            await until_stopped()
            group.cancel_scope.cancel()
    finally:
        if http is not None:
            http.shutdown()
