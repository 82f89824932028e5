"""The Node's side of static MIG layouts: which layout its ``nvidia.com/mig.config`` label names,
applying it at start and again whenever the label names another one (LayoutFollower), and
what the admin sees of it: the ``nvidia.com/mig.config.state`` label and Events.

The GPU side (plan, destroy, create, undo) is dra.core.miglayout's program, which
dra.kubeletplugin.miglayout runs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio.to_thread

from dra.adapters.checkpoint import CheckpointError, CheckpointStore
from dra.adapters.kube import KubeClient, KubeError, Obj
from dra.core.migconfig import (
    LAYOUT_LABEL,
    STATE_FAILED,
    STATE_LABEL,
    STATE_PENDING,
    STATE_SUCCESS,
    MigConfigs,
)
from dra.core.miglayout import Applied
from dra.daemon.bootstrap import DaemonSettings, StartupError
from dra.daemon.nodewatch import follow_node, labels_of
from dra.kubeletplugin.miglayout import MigLayoutError, apply_with_own_library, load_configs, static_modes
from dra.model.migmode import MigModes

log = logging.getLogger(__name__)


async def layout_name(
    kube: KubeClient, node_name: str, fallback: str | None
) -> tuple[str | None, Obj | None]:
    """The layout the Node's nvidia.com/mig.config label names, else the fallback; and the Node, if read."""
    try:
        node = await kube.get_node(node_name)
    except KubeError as err:
        log.warning(
            "cannot read node %s for its %s label (%s); using --mig-config %s",
            node_name,
            LAYOUT_LABEL,
            err,
            fallback or "(none)",
        )
        return fallback, None
    return labels_of(node).get(LAYOUT_LABEL) or fallback, node


class _NodeReport:
    """What the admin sees of a layout on the Node: the state label and Events, each where RBAC allows.

    A refused or failed write is logged once and not tried again: both serve
    people and automation, and the layout is applied whether or not they can be written.
    """

    def __init__(self, kube: KubeClient, node: Obj | None, node_name: str) -> None:
        self._kube = kube
        self._node = node
        self._node_name = node_name
        self._labels = self._events = node is not None

    async def state(self, state: str) -> None:
        """Set nvidia.com/mig.config.state."""
        if not self._labels:
            return
        try:
            await self._kube.patch_node_labels(self._node_name, {STATE_LABEL: state})
        except KubeError as err:
            self._labels = False
            log.warning(
                "cannot set %s=%s on node %s (%s); the chart grants it when mig.configs is set",
                STATE_LABEL,
                state,
                self._node_name,
                err,
            )

    async def event(self, reason: str, message: str) -> None:
        """A Warning Event on the Node."""
        if not self._events or self._node is None:
            return
        try:
            await self._kube.create_event(self._node, reason, message, host=self._node_name)
        except KubeError as err:
            self._events = False
            log.info("cannot record an Event on node %s (%s)", self._node_name, err)

    async def applied(self, applied: Applied, path: Path) -> None:
        """Log what a layout did, its warnings as Events; the state: success, or pending while incomplete."""
        log.info("MIG layout %r from %s applied to %d GPUs", applied.layout, path, len(applied.plans))
        for plan in applied.plans:
            log.info("%s", plan.describe())
        for warning in applied.warnings:
            log.warning("%s", warning)
            await self.event("MigLayoutIncomplete", warning)
        await self.state(STATE_PENDING if applied.warnings else STATE_SUCCESS)


async def apply_at_start(
    settings: DaemonSettings, kube: KubeClient, path: Path, fallback: str | None
) -> tuple[MigModes, str | None]:
    """Apply the node's layout from the file (before discovery); the MIG modes to publish with, and
    the layout's name (None: no layout named, the GPUs left as they are).

    MigLayoutError (exit status 2) when the file is invalid or the layout cannot be
    applied. Warnings (a pending MIG mode change, instances kept for claims) are
    logged and, where RBAC allows, recorded as Events on the Node. The Node's
    nvidia.com/mig.config.state label follows, as NVIDIA's MIG manager sets it:
    pending while applying (and after, while warnings leave it incomplete),
    then success, or failed before the exit.
    """
    name, node = await layout_name(kube, settings.node_name, fallback)
    report = _NodeReport(kube, node if name is not None else None, settings.node_name)
    try:
        configs = load_configs(path)
        if name is None:
            log.info(
                "no MIG layout for this node: no %s label and no --mig-config; the GPUs stay as they are",
                LAYOUT_LABEL,
            )
            return settings.mig_modes, None
        await report.state(STATE_PENDING)
        store = CheckpointStore(settings.checkpoint_path)

        def apply() -> Applied:
            # Under the checkpoint's lock: in a rolling update the running instance may be applying
            # a layout too (LayoutFollower), to the same GPUs.
            try:
                with store.exclusive():
                    claims, actions = store.load_state()
                    return apply_with_own_library(
                        settings, configs, name, settings.mig_modes, claims.values(), actions
                    )
            except CheckpointError as err:
                raise StartupError(str(err)) from None

        applied = await anyio.to_thread.run_sync(apply)
    except StartupError:
        await report.state(STATE_FAILED)
        raise
    await report.applied(applied, path)
    return static_modes(settings.mig_modes, applied), name


class LayoutFollower:
    """Applies the layout the Node's label names again whenever that name changes, while the plugin runs.

    `relayout` applies a layout (MigLayoutError when it cannot; nothing of the
    attempt is left) and publishes what it made. A layout that fails is not
    tried again until the label names another one or the plugin restarts; the
    GPUs stay as they were and the plugin goes on serving them.
    """

    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        path: Path,
        fallback: str | None,
        current: str | None,
        relayout: Callable[[MigConfigs, str], Awaitable[Applied]],
    ) -> None:
        self._kube = kube
        self._node_name = node_name
        self._path = path
        self._fallback = fallback
        #: The layout last applied or tried.
        self.current = current
        self._relayout = relayout

    async def run(self) -> None:
        """Watch the Node until cancelled."""
        await follow_node(self._kube, self._node_name, self.consider)

    async def consider(self, node: Obj) -> None:
        """Apply the layout this Node state names, if it is not the one applied last."""
        name = labels_of(node).get(LAYOUT_LABEL) or self._fallback
        # Without a name the GPUs stay as they are, as at start.
        if not name or name == self.current:
            return
        log.info("%s changed from %s to %s: applying the layout", LAYOUT_LABEL, self.current or "none", name)
        self.current = name
        report = _NodeReport(self._kube, node, self._node_name)
        await report.state(STATE_PENDING)
        try:
            applied = await self._relayout(load_configs(self._path), name)
        except MigLayoutError as err:
            message = f"{err}; the GPUs stay as they were"
            log.error("%s", message)
            await report.event("MigLayoutFailed", message)
            await report.state(STATE_FAILED)
            return
        await report.applied(applied, self._path)
