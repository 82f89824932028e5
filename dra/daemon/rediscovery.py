"""Looking at the GPUs again while a daemon runs: a new MIG layout, a GPU that vanished or came back.

Both daemons follow only the GPUs their path was given at start-up; the
caller applies what changed (slices for DRA, resources for the device plugin).
A GPU of the path may be held back for a while (the kubelet plugin holds one
that a device-plugin container still uses) and joins when it is released.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace

import anyio
import anyio.to_thread

from dra.core.assignment import restrict
from dra.daemon.bootstrap import DaemonSettings, StartupError, rediscover
from dra.model.devices import Inventory, gpu_of
from dra.model.migmode import MigModes

log = logging.getLogger(__name__)


class Rediscovery:
    """Looks at the GPUs again now and then: a MIG layout changed, a GPU vanished or came back.

    Only GPUs this path was given at start-up are followed; a GPU that appears
    later is not advertised until a restart assigns it (to DRA or the device plugin).
    """

    def __init__(
        self,
        settings: DaemonSettings,
        inventory: Inventory,
        held: Collection[str] = (),
        everything: Inventory | None = None,
    ) -> None:
        """`inventory` is what the path was given; the GPUs with UUIDs in `held` are not published yet.

        `everything`: every GPU on the node at start; those given to the other path did not appear
        later, and are neither followed nor reported.
        """
        self._settings = settings
        #: Held while discovering and applying, so that a MIG layout applied in between (which
        #: changes the MIG modes discovery uses) is never undone by a discovery started before it.
        self.lock = anyio.Lock()
        self._assigned = {gpu.uuid for gpu in inventory.gpus}
        self.current = restrict(inventory, [gpu for gpu in inventory.gpus if gpu.uuid not in held])
        self._reported = {gpu.uuid for gpu in (everything or inventory).gpus} - self._assigned

    def discover(self, mig_modes: MigModes | None = None) -> Inventory:
        """Discover the GPUs now (blocking), from now on with `mig_modes` when given; StartupError."""
        if mig_modes is not None:
            self._settings = replace(self._settings, mig_modes=mig_modes)
        return rediscover(self._settings)

    def withhold(self, uuids: Collection[str]) -> Inventory:
        """The current inventory without these GPUs (their devices changed and could not be read
        again), from now on; the next discovery that succeeds brings them back."""
        self.current = restrict(self.current, [gpu for gpu in self.current.gpus if gpu.uuid not in uuids])
        return self.current

    def follow(
        self, fresh: Inventory, held: Collection[str] = (), kept: Collection[str] = ()
    ) -> Inventory | None:
        """This path's part of a fresh discovery, less the `held` GPUs; None when nothing changed.

        A GPU of `kept` (passed through to vfio-pci, which NVML cannot see) that the discovery
        misses stays as it was: the claim holding it is served, and the slice keeps offering it.
        """
        fresh = _with_kept(fresh, self.current, kept)
        for gpu in fresh.gpus:
            if gpu.uuid not in self._assigned and gpu.uuid not in self._reported:
                self._reported.add(gpu.uuid)
                log.warning(
                    "GPU %d (%s) appeared after start-up: restart the driver to assign it",
                    gpu.index,
                    gpu.uuid,
                )
        mine = restrict(
            fresh, [gpu for gpu in fresh.gpus if gpu.uuid in self._assigned and gpu.uuid not in held]
        )
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

    async def run(
        self,
        apply: Callable[[Inventory], Awaitable[None]],
        held: Callable[[Inventory], Awaitable[Collection[str]]] | None = None,
        kept: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        """Discover every --rediscover-interval and apply what changed, until cancelled.

        `held`, when given, is asked each time which GPUs of the fresh inventory to hold back;
        `kept` which GPUs stay though the discovery misses them (see `follow`).
        """
        while True:
            await anyio.sleep(self._settings.rediscover_interval)
            async with self.lock:
                try:
                    fresh = await anyio.to_thread.run_sync(self.discover)
                except StartupError as err:
                    log.warning("re-discovering GPUs failed, keeping the last inventory: %s", err)
                    continue
                changed = self.follow(fresh, await held(fresh) if held is not None else (), kept())
                if changed is not None:
                    await apply(changed)


def _with_kept(fresh: Inventory, current: Inventory, kept: Collection[str]) -> Inventory:
    """`fresh` plus the GPUs of `kept` it lacks, with their devices, as `current` has them."""
    present = {gpu.uuid for gpu in fresh.gpus}
    away = restrict(current, [gpu for gpu in current.gpus if gpu.uuid in kept and gpu.uuid not in present])
    if not away.gpus:
        return fresh
    # Ordered by GPU index, as a discovery that found them would list them.
    return replace(
        fresh,
        devices=tuple(sorted((*fresh.devices, *away.devices), key=lambda d: gpu_of(d).index)),
        gpus=tuple(sorted((*fresh.gpus, *away.gpus), key=lambda g: g.index)),
        partitions=tuple(sorted((*fresh.partitions, *away.partitions), key=lambda p: p.parent.index)),
        instances=tuple(sorted((*fresh.instances, *away.instances), key=lambda m: m.parent.index)),
    )
