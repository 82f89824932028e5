"""The node labeller: keeps the Node's GPU labels in line with discovery and device health.

Every `interval`, and at once when a device's health changes, it computes the
labels, reads the Node, and patches only what differs: labels to set, and
labels it owns (dra.core.labels.owned) that no longer apply. Labels it does
not own are never written. A failed read or patch is logged and retried at the
round, sooner with backoff; the labels stay as they were meanwhile.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from dra import __version__
from dra.adapters.kube import KubeClient, KubeError
from dra.core.labels import AdminTemplate, LabelError, Sharing, admin_labels, gfd_labels, owned
from dra.daemon import metrics
from dra.daemon.bootstrap import (
    DaemonSettings,
    Node,
    StartupError,
    open_node,
    rediscover,
    serve_until_stopped,
)
from dra.daemon.health import HealthTracker
from dra.daemon.nodewatch import labels_of
from dra.model.devices import Inventory

log = logging.getLogger(__name__)

#: The first retry of a failed write, in seconds (doubling up to the interval).
RETRY_MIN_S = 1.0


@dataclass(frozen=True)
class LabellerSettings(DaemonSettings):
    """Everything the node-labeller command is told."""

    kubeconfig: str | None = None
    #: Seconds between rounds (re-discovery, and a re-check of labels someone else changed).
    interval: float = 60.0
    sharing: Sharing = field(default_factory=Sharing)
    admin: AdminTemplate = field(default_factory=AdminTemplate)


def label_changes(
    current: dict[str, str], wanted: dict[str, str], admin_keys: frozenset[str]
) -> tuple[dict[str, str], list[str]]:
    """What to set and what to remove so that the owned labels of `current` become `wanted`."""
    changed = {key: value for key, value in wanted.items() if current.get(key) != value}
    stale = sorted(key for key in current if key not in wanted and owned(key, admin_keys))
    return changed, stale


class Labeller:
    """One node's labels: computed from the inventory and health, written when they differ."""

    def __init__(
        self, kube: KubeClient, settings: LabellerSettings, inventory: Inventory, tracker: HealthTracker
    ) -> None:
        self._kube = kube
        self._settings = settings
        self._tracker = tracker
        self.inventory = inventory
        #: Set once the labels were written (or found right) the first time.
        self.synced = anyio.Event()

    def wanted(self) -> dict[str, str]:
        """The labels the node should carry now: GFD's, then the admin scheme's."""
        settings = self._settings
        unhealthy = {name for name, health in self._tracker.snapshot().items() if not health.healthy}
        labels = gfd_labels(self.inventory, unhealthy, settings.sharing)
        try:
            return {**labels, **admin_labels(settings.admin, labels, self.inventory)}
        except LabelError as err:
            # Checked at start-up; GPUs found since render an illegal value. GFD's labels still go out.
            log.error("admin labels left out: %s", err)
            return labels

    async def sync(self) -> bool:
        """Bring the Node's labels in line; False (logged) when the API server refused or was away."""
        settings = self._settings
        wanted = self.wanted()
        try:
            node = await self._kube.get_node(settings.node_name)
            current = labels_of(node)
            changed, stale = label_changes(current, wanted, settings.admin.keys)
            if changed or stale:
                await self._kube.patch_node_labels(settings.node_name, changed, stale)
                metrics.LABEL_WRITES.inc()
                log.info(
                    "node %s labels: set %s; removed %s",
                    settings.node_name,
                    ", ".join(f"{k}={v}" for k, v in sorted(changed.items())) or "none",
                    ", ".join(stale) or "none",
                )
        except KubeError as err:
            metrics.LABEL_ERRORS.inc()
            log.warning("cannot label node %s: %s", settings.node_name, err)
            return False
        self.synced.set()
        return True

    async def run(self) -> None:
        """Label now, then at every health change and every interval, until cancelled.

        Each interval also discovers the GPUs again. A failed write is retried
        sooner, with backoff from RETRY_MIN_S up to the interval.
        """
        interval = self._settings.interval
        retry = RETRY_MIN_S
        discovered = time.monotonic()
        while True:
            changed = self._tracker.next_change()
            if await self.sync():
                retry, wait = RETRY_MIN_S, interval
            else:
                wait, retry = min(retry, interval), min(retry * 2, interval)
                log.info("labelling node %s again in %gs", self._settings.node_name, wait)
            with anyio.move_on_after(wait):
                await changed.wait()
            if time.monotonic() - discovered >= interval:
                discovered = time.monotonic()
                await self._rediscover()

    async def _rediscover(self) -> None:
        try:
            fresh = await anyio.to_thread.run_sync(rediscover, self._settings)
        except StartupError as err:
            log.warning("re-discovering GPUs failed, keeping the last inventory: %s", err)
            return
        if fresh != self.inventory:
            self.inventory = fresh
            self._tracker.set_inventory(fresh)


async def run_node_labeller(settings: LabellerSettings) -> None:
    """Run until SIGTERM or SIGINT."""
    async with open_node(settings, None) as node:
        await _serve(settings, node)


async def _serve(settings: LabellerSettings, node: Node) -> None:
    try:
        # A template that renders an illegal value for these GPUs is a configuration error: say so now.
        labels = gfd_labels(node.everything, (), settings.sharing)
        labels.update(admin_labels(settings.admin, labels, node.everything))
        kube = KubeClient(settings.kubeconfig)
    except (LabelError, KubeError) as err:
        raise StartupError(str(err)) from None
    log.info(
        "labelling node %s with %d labels of %d GPUs",
        settings.node_name,
        len(labels),
        len(node.everything.gpus),
    )
    labeller = Labeller(kube, settings, node.everything, node.tracker)

    async def report_ready() -> None:
        await labeller.synced.wait()
        log.info(
            "dra-gpu %s ready: node %s labelled in %.2fs",
            __version__,
            settings.node_name,
            time.monotonic() - node.started,
        )

    def tasks(group: TaskGroup) -> None:
        group.start_soon(labeller.run)
        group.start_soon(report_ready)

    try:
        await serve_until_stopped(
            node,
            ready=labeller.synced.is_set,
            registry=metrics.LABELLER_REGISTRY,
            unwatched=metrics.LABELLER_UNWATCHED_GPUS,
            tasks=tasks,
        )
    finally:
        with anyio.CancelScope(shield=True):
            await kube.aclose()
