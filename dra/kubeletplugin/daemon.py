"""The kubelet-plugin daemon: state, slices and gRPC wired together on the shared bootstrap."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from dra import __version__
from dra.adapters.checkpoint import CheckpointError, CheckpointStore
from dra.adapters.kube import KubeClient, KubeError
from dra.adapters.metadatastore import MetadataStore
from dra.adapters.nodefiles import CdiStore, open_lock
from dra.adapters.pcisysfs import PciSysfs
from dra.core import devicemetadata, versions
from dra.core.assignment import GpuPath, Selector, select
from dra.core.deviceentries import ShareMode
from dra.core.migconfig import MigConfigs
from dra.core.miglayout import Applied
from dra.core.taints import Effect
from dra.core.usage import DEFAULT_MAX_SERIES
from dra.daemon import metrics
from dra.daemon.bootstrap import (
    DaemonSettings,
    Node,
    StartupError,
    open_node,
    serve_until_stopped,
    warn_about_stranded_claims,
)
from dra.daemon.rediscovery import Rediscovery
from dra.daemon.sockets import SocketPathError
from dra.gpu.discovery import supports_mig
from dra.gpu.library import GpuLibrary
from dra.kubeletplugin import miglabel, miglayout
from dra.kubeletplugin.claimmetrics import ClaimDeviceInfo
from dra.kubeletplugin.claimstatus import ClaimStatusWriter
from dra.kubeletplugin.features import detect_features
from dra.kubeletplugin.healthctl import HealthControl, socket_path
from dra.kubeletplugin.mps import MpsDaemons
from dra.kubeletplugin.mpsprivsep import Launcher
from dra.kubeletplugin.podresources import DevicePluginHoldback
from dra.kubeletplugin.publisher import SlicePublisher
from dra.kubeletplugin.server import PluginServer
from dra.kubeletplugin.service import DraService, HealthService
from dra.kubeletplugin.state import DeviceState
from dra.kubeletplugin.timeslice import TimeSlicer
from dra.kubeletplugin.usage import ProcessOwners, UsageSampler
from dra.model.devices import Inventory
from dra.model.migmode import MigModes
from dra.model.prepared import DeviceAction, PreparedClaim

log = logging.getLogger(__name__)

#: The file in the state directory whose flock says which instance publishes the node's slices.
PUBLISHER_TURN = "publisher.lock"


@dataclass(frozen=True)
class PluginSettings(DaemonSettings):
    """Everything the kubelet-plugin command is told."""

    kubeconfig: str | None = None
    #: What the taint of an unhealthy device does (where the API server keeps device taints).
    unhealthy_taint_effect: Effect = Effect.NO_SCHEDULE
    #: Full GPUs published for several claims at once (consumable shares); None: all exclusive.
    shareable_gpus: Selector | None = None
    #: How a shareable GPU is divided (--consumable-shares).
    share_mode: ShareMode = "memory"
    #: The MPS control binary; None: nvidia-cuda-mps-control on PATH, or the fake one with fake GPUs.
    mps_control: str | None = None
    #: Static MIG layouts in mig-parted's format, applied at start; None: the GPUs stay as they are.
    mig_config_file: Path | None = None
    #: The layout for a node without the nvidia.com/mig.config label.
    mig_config: str | None = None
    #: Seconds between samples of dra_gpu_claim_device_info; 0: not sampled.
    claim_metrics_interval: float = 10.0
    #: Whether claims prepared get device metadata files (KEP-5304, --device-metadata).
    device_metadata: bool = False
    #: Attribute shared GPUs' use per process (/proc/<pid>/cgroup and the node's pods).
    usage_processes: bool = False
    #: The host's /proc, for usage_processes.
    usage_procfs: Path = Path("/proc")
    #: Claim usage series kept at most.
    usage_max_series: int = DEFAULT_MAX_SERIES
    #: Claims may pass whole GPUs through (VfioDeviceConfig; --vfio).
    vfio: bool = False

    @property
    def mps_command(self) -> list[str]:
        """How to run nvidia-cuda-mps-control (the fake one, dra.fakegpus.mpscontrol, with fake GPUs)."""
        if self.mps_control:
            return [self.mps_control]
        if self.fake_gpus:
            return [sys.executable, "-m", "dra.fakegpus.mpscontrol"]
        return ["nvidia-cuda-mps-control"]


async def check_server(kube: KubeClient) -> versions.ServerInfo | None:
    """What the API server says about itself; StartupError for one this driver cannot serve.

    A server newer than tested is only a warning. An API server that does not
    answer is not a start-up error (None): the publisher and prepare retry on
    their own, and the kubelet expects the plugin to come up.
    """
    try:
        info = versions.server_info(await kube.server_version(), await kube.resource_api_group())
    except KubeError as err:
        log.warning("cannot ask the API server which version it is (%s); going on", err)
        return None
    try:
        warnings = versions.check(info)
    except versions.UnsupportedServerError as err:
        raise StartupError(str(err)) from None
    for warning in warnings:
        log.warning("%s", warning)
    log.info("API server %s serves resource.k8s.io %s", info.git_version, ", ".join(info.resource_versions))
    return info


async def check_kubelet(kube: KubeClient, node_name: str) -> None:
    """StartupError when rolling updates are on and this node's kubelet cannot take two instances.

    An unanswered question is not an error, as in check_server.
    """
    try:
        node = await kube.get_node(node_name)
    except KubeError as err:
        log.warning("cannot read node %s for its kubelet version (%s); going on", node_name, err)
        return
    kubelet = str(((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion") or "")
    refusal = versions.rolling_update_refusal(kubelet)
    if refusal is not None:
        raise StartupError(refusal)


async def run_kubelet_plugin(settings: PluginSettings, launcher: Launcher | None = None) -> None:
    """Run until SIGTERM or SIGINT; first, the node's static MIG layout when there is a layout file.

    `launcher`: the process that starts MPS control daemons (mpsprivsep.separate), else they
    are started from this one.
    """
    if launcher is not None:
        log.info("CAP_SYS_ADMIN dropped for good; MPS control daemons start from launcher %d", launcher.pid)
    layout: _Layout | None = None
    if settings.mig_config_file is not None:
        try:
            kube = KubeClient(settings.kubeconfig)
        except KubeError as err:
            raise StartupError(str(err)) from None
        try:
            modes, name = await miglabel.apply_at_start(
                settings, kube, settings.mig_config_file, settings.mig_config
            )
        finally:
            await kube.aclose()
        layout = _Layout(settings.mig_config_file, settings.mig_modes, name)
        settings = replace(settings, mig_modes=modes)
    async with open_node(settings, GpuPath.DRA) as node:
        await _serve(settings, node, layout, launcher)


@dataclass(frozen=True)
class _Layout:
    """The static MIG layouts file, the MIG modes before any layout, and the layout applied at start."""

    path: Path
    base_modes: MigModes
    applied: str | None


def mig_library(lib: GpuLibrary) -> GpuLibrary | None:
    """The library the state makes and destroys MIG devices with (Node.mig): none where no GPU can do
    MIG, so that no prepare, unprepare or start-up repair on such a node enters MIG code."""
    return lib if supports_mig(lib) else None


def _pci_sysfs(settings: PluginSettings, inventory: Inventory) -> PciSysfs:
    """The sysfs GPUs are passed through by: the host's, or with fake GPUs a fake tree under their root."""
    if not settings.fake_gpus:
        return PciSysfs(settings.host_root)
    if settings.fake_gpu_root is None:
        if settings.vfio:
            raise StartupError(
                "--vfio=true with --fake-gpus needs --fake-gpu-root (the fake sysfs and /dev/vfio go there)"
            )
        return PciSysfs(settings.host_root)
    from dra.fakegpus import node as fakegpus

    try:
        return fakegpus.pci_tree(inventory, settings.fake_gpu_root)
    except OSError as err:
        raise StartupError(
            f"--fake-gpu-root={settings.fake_gpu_root}: cannot make the fake sysfs tree: {err}"
        ) from None


async def _serve(
    settings: PluginSettings, node: Node, layout: _Layout | None = None, launcher: Launcher | None = None
) -> None:
    tracker = node.tracker
    holdback = DevicePluginHoldback(settings.kubelet_root)
    rediscovery = Rediscovery(
        settings, node.inventory, await holdback.held(node.inventory), everything=node.everything
    )
    inventory = rediscovery.current
    if inventory != node.inventory and settings.rediscover_interval <= 0:
        log.warning("--rediscover-interval is 0: GPUs held back stay unpublished until a restart")
    log.info("publishing %d allocatable devices on node %s", len(inventory), settings.node_name)
    try:
        kube = KubeClient(settings.kubeconfig)
        state = DeviceState(
            settings.driver_name,
            settings.node_name,
            inventory,
            CdiStore(settings.cdi_root, settings.driver_name, settings.host_root),
            CheckpointStore(settings.checkpoint_path),
            mig_library(node.lib),
            time_slicer=TimeSlicer(node.lib),
            mps=MpsDaemons(
                settings.state_directory / "mps", settings.mps_command, launcher.start if launcher else None
            ),
            pci=_pci_sysfs(settings, node.inventory),
            vfio=settings.vfio,
            # MPS limits follow a counted share (docs/sharing.md, NVIDIA's share modes).
            equal_shares=settings.share_mode if isinstance(settings.share_mode, int) else 0,
            metadata=MetadataStore(settings.state_directory / devicemetadata.HOST_SUBDIR),
            device_metadata=settings.device_metadata,
        )
        # A GPU on vfio-pci is lost to NVML on purpose: not a health problem.
        tracker.passed_through = state.passed_through
        state.recover()
    except (KubeError, CheckpointError) as err:
        raise StartupError(str(err)) from None
    except OSError as err:
        raise StartupError(f"cannot restore the CDI specs in {settings.cdi_root}: {err}") from None
    warn_about_stranded_claims(node.everything, inventory, state.prepared.values())

    if settings.shareable_gpus is not None:
        _, unmatched = select(settings.shareable_gpus, inventory)
        if unmatched:
            log.warning("--shareable-gpus: no DRA GPU of this node matches %s", ", ".join(unmatched))
    status = ClaimStatusWriter(kube, settings.driver_name, settings.node_name)
    status.resync(state.prepared.values(), state.inventory)
    # The publisher is made once the API server's features are known; no claim is prepared before.
    # The gRPC servers' threads tell the loop (asyncio, command.py) without waiting for it to run
    # what they hand it: a busy loop must not hold up the kubelet's call.
    loop = asyncio.get_running_loop()

    def on_prepared(claim: PreparedClaim) -> None:
        # Only a claim holding a share is worth telling the publisher about.
        if any(device.share_id for device in claim.devices):
            loop.call_soon_threadsafe(publisher.claim_prepared, claim)

    dra = DraService(settings.driver_name, settings.node_name, state, kube, status, on_prepared)
    owners = None
    if settings.usage_processes:
        owners = ProcessOwners(settings.usage_procfs, lambda: kube.list_node_pods(settings.node_name))
    claim_info = ClaimDeviceInfo(
        state,
        settings.driver_name,
        settings.kubelet_root,
        settings.claim_metrics_interval,
        UsageSampler(node.lib, owners, settings.usage_max_series),
    )

    def on_health_change(_: list[str]) -> None:
        metrics.UNHEALTHY_DEVICES.set(sum(not h.healthy for h in tracker.snapshot().values()))
        # A device's taint follows its health.
        publisher.trigger()

    try:
        server = PluginServer(
            settings.kubelet_root,
            settings.driver_name,
            dra,
            HealthService(settings.node_name, tracker),
            settings.instance_id,
        )
        control = HealthControl(
            socket_path(settings.state_directory),
            tracker,
            node.lib,
            settings.health_recovery_period,
            on_health_change,
        )
    except SocketPathError as err:
        raise StartupError(str(err)) from None

    def ready() -> bool:
        # Standing by, the instance before this one still publishes the same pool: ready all the same.
        return server.registration.registered.is_set() and publisher.settled.is_set()

    def offer(changed: Inventory) -> None:
        """Health and the ResourceSlices follow an inventory the state has taken."""
        tracker.set_inventory(changed)
        publisher.set_inventory(changed)

    async def apply(changed: Inventory) -> None:
        # The state's lock may be held across fsyncs by a prepare: wait for it off the loop.
        await anyio.to_thread.run_sync(state.set_inventory, changed)
        offer(changed)

    async def relayout(configs: MigConfigs, name: str) -> Applied:
        """Apply a MIG layout while serving: layout and inventory change under the state's lock."""
        assert layout is not None
        held = await holdback.held(node.inventory)

        def change(
            claims: Mapping[str, PreparedClaim], actions: Sequence[DeviceAction]
        ) -> tuple[Applied, Inventory | None]:
            applied = miglayout.apply_with_own_library(
                settings, configs, name, layout.base_modes, claims.values(), actions
            )
            try:
                fresh = rediscovery.discover(miglayout.static_modes(layout.base_modes, applied))
            except StartupError as err:
                # The old devices of these GPUs may be gone: offer none of them until a discovery
                # reads them again (the next --rediscover-interval, else a restart).
                applied.warnings.append(
                    f"cannot read the GPUs after applying MIG layout {name!r} ({err}); the GPUs it "
                    f"selects are not published until a re-discovery reads them"
                )
                return applied, rediscovery.withhold(applied.uuids)
            return applied, rediscovery.follow(fresh, held, state.passed_through())

        async with rediscovery.lock:
            try:
                done, changed = await anyio.to_thread.run_sync(state.relayout, change)
            except miglayout.MigLayoutError:
                raise
            except (CheckpointError, StartupError) as err:
                raise miglayout.MigLayoutError(f"MIG layout {name!r}: {err}") from None
            if changed is not None:
                offer(changed)
        return done

    registered = anyio.Event()
    # Told by the registration server's thread. Not a worker thread waiting on it: that would keep
    # the process from exiting while no kubelet registers it.
    server.registration.on_registered = lambda: loop.call_soon_threadsafe(registered.set)

    async def report_ready() -> None:
        await registered.wait()
        await publisher.settled.wait()
        log.info(
            "dra-gpu %s ready: registered with the kubelet and %s %d devices in %.2fs",
            __version__,
            "published" if publisher.published.is_set() else "left to the previous instance to publish",
            len(inventory),
            time.monotonic() - node.started,
        )
        # Now, not at the first calls: a burst of prepares right after start-up (a node that joins with
        # pods waiting for it) opened one connection per concurrent claim GET, a TLS handshake each, a
        # fifth of the first burst's CPU (docs/testing.md, issue 57). Nothing more is sent at idle.
        try:
            log.debug("opened %d connections to the API server", await kube.open_connections())
        except KubeError as err:
            log.debug("cannot open connections to the API server ahead of the calls: %s", err)

    def tasks(group: TaskGroup) -> None:
        group.start_soon(publisher.run)
        if settings.rediscover_interval > 0:
            group.start_soon(rediscovery.run, apply, holdback.held, state.passed_through)
        group.start_soon(server.keep_registration_socket)
        group.start_soon(control.run)
        group.start_soon(report_ready)
        group.start_soon(status.run)
        if settings.claim_metrics_interval > 0:
            group.start_soon(claim_info.run)
        if launcher is not None:
            group.start_soon(launcher.watch)
        if layout is not None:
            follower = miglabel.LayoutFollower(
                kube, settings.node_name, layout.path, settings.mig_config, layout.applied, relayout
            )
            group.start_soon(follower.run)

    try:
        info = await check_server(kube)
        if settings.instance_id is not None:
            await check_kubelet(kube, settings.node_name)
        features = await detect_features(kube, info, settings.driver_name, settings.node_name)
        turn = settings.state_directory / PUBLISHER_TURN
        try:
            # Tried here: the publisher takes it in a task, where a failure is no one-line exit.
            open_lock(turn).close()
        except OSError as err:
            raise StartupError(f"cannot take the turn to publish: {err}") from None
        publisher = SlicePublisher(
            kube,
            settings.driver_name,
            settings.node_name,
            inventory,
            features,
            lambda: tracker.taints(settings.driver_name, settings.unhealthy_taint_effect),
            turn,
            shareable=settings.shareable_gpus,
            share_mode=settings.share_mode,
            vfio=settings.vfio,
        )
        try:
            server.start()
        except (OSError, RuntimeError) as err:
            raise StartupError(f"cannot serve the plugin's sockets ({server.dra_socket}): {err}") from None
        await serve_until_stopped(
            node,
            ready=ready,
            registry=metrics.REGISTRY,
            unwatched=metrics.UNWATCHED_GPUS,
            tasks=tasks,
            on_health_change=on_health_change,
        )
    finally:
        with anyio.CancelScope(shield=True):
            await server.stop()
            await kube.aclose()
