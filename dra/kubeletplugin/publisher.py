"""Keeps the node's ResourceSlices equal to the inventory, with the fewest writes.

Reconciles on start, on an inventory or health change and whenever a slice of this driver and
node changes on the server (the watch only signals; the reconcile lists and compares). Only the
instance holding the flock on ``publisher.lock`` publishes, so two instances of a rolling
update never undo each other's writes (docs/architecture.md, "ResourceSlices"). After a claim
takes a share of a device, it touches a slice so that the scheduler tries its pending pods again
(SlicePublisher.retry_pending_pods): one small merge patch of an annotation, at most one a second,
which its own watch then leaves alone.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio

from dra.adapters.kube import ConflictError, KubeClient, KubeError, NotFoundError
from dra.adapters.nodefiles import open_lock, try_lock
from dra.core import sliceplan, slices
from dra.core.assignment import Selector, select
from dra.core.deviceentries import ShareMode, SliceError
from dra.core.taints import DeviceTaint
from dra.core.versions import ApiFeatures
from dra.daemon import metrics
from dra.model.devices import Inventory, MigDevice, gpu_of
from dra.model.prepared import PreparedClaim

log = logging.getLogger(__name__)


def shareable_devices(selector: Selector | None, inventory: Inventory) -> frozenset[str]:
    """Names of the devices --shareable-gpus picks (none by default: devices are exclusive).

    A picked GPU is shared whole, or, in MIG mode, as its MIG devices or its dynamic-MIG
    offers, as NVIDIA's driver shares its GPUs and MIG devices (docs/sharing.md).
    """
    if selector is None:
        return frozenset()
    chosen = {gpu.uuid for gpu in select(selector, inventory)[0]}
    devices = (
        d.name
        for d in inventory
        if gpu_of(d).uuid in chosen and (isinstance(d, MigDevice) or not d.mig_enabled)
    )
    offers = (p.name for p in inventory.partitions if p.parent.uuid in chosen)
    return frozenset((*devices, *offers))


_BACKOFF_START = 0.5
_BACKOFF_MAX = 30.0
#: Seconds between looks at whether the instance publishing before this one has ended.
_TURN_POLL = 0.5


#: The annotation a slice gets when the scheduler should try its pending pods again: the time of that
#: request (any change of a slice requeues them; the driver's own content stays untouched).
RETRY_ANNOTATION = "retry-pending-pods"
#: The least time between two such touches. Each makes the scheduler try every pending DRA pod
#: again, and each was a slice write: a burst of share prepares needs one touch after its last.
RETRY_SPACING_S = 1.0
#: How many of its own touches the watch remembers, to leave their events alone.
_OWN_TOUCHES = 16

#: The first release whose scheduler checks a shared device's capacity on that device
#: (kubernetes/kubernetes#133706).
FIXED_SHARES_MINOR = 35


class SlicePublisher:
    """Publishes one pool (named after the node) for one driver.

    `features` says which gated fields the API server keeps; `taints` gives the
    devices' taints at each reconcile (call trigger() when they change);
    `shareable` picks the GPUs published for several claims (consumable shares).
    """

    def __init__(
        self,
        kube: KubeClient,
        driver: str,
        node_name: str,
        inventory: Inventory,
        features: ApiFeatures,
        taints: Callable[[], Mapping[str, DeviceTaint]] = dict,
        turn: Path | None = None,
        shareable: Selector | None = None,
        share_mode: ShareMode = "memory",
        vfio: bool = False,
    ) -> None:
        self._kube = kube
        self._vfio = vfio
        self._turn = turn
        self._shareable = shareable
        self._share_mode = share_mode
        # Named by GPU in what is said: a GPU in dynamic MIG mode has hundreds of offers.
        shared = shareable_devices(shareable, inventory)
        chosen = sorted(
            {gpu_of(d).name for d in inventory if d.name in shared}
            | {p.parent.name for p in inventory.partitions if p.name in shared}
        )
        if chosen and not features.consumable_capacity:
            # Said once here; build_slices then publishes these GPUs exclusive at every reconcile.
            log.warning(
                "--shareable-gpus: the API server drops consumable capacity (feature gate "
                "DRAConsumableCapacity off): publishing %s exclusive",
                ", ".join(chosen),
            )
        elif chosen and features.minor < FIXED_SHARES_MINOR:
            log.warning(
                "--shareable-gpus: Kubernetes 1.%d's scheduler checks a request against the capacity "
                "left on the device at the request's own index in the candidate's ResourceSlice, not on "
                "the candidate (kubernetes/kubernetes#133705, fixed in 1.%d): once %s are allocated, "
                "claims for other devices of this node may stay pending. Run 1.%d or later to share GPUs; "
                "see docs/sharing.md (Consumable shares)",
                features.minor,
                FIXED_SHARES_MINOR,
                ", ".join(chosen),
                FIXED_SHARES_MINOR,
            )
        dynamic = set(inventory.dynamic_gpus)
        partitioned = [g.name for g in select(shareable, inventory)[0] if g in dynamic] if shareable else []
        if partitioned and features.consumable_capacity and features.minor < slices.SHARED_OFFERS_MINOR:
            log.warning(
                "--shareable-gpus: %s are in dynamic MIG mode: publishing their MIG offers exclusive, as "
                "Kubernetes 1.%d's scheduler would charge a shared offer's GPU slices at each allocation "
                "and forget them once allocated (1.%d charges them once); see docs/sharing.md",
                ", ".join(partitioned),
                features.minor,
                slices.SHARED_OFFERS_MINOR,
            )
        if vfio and not features.partitionable_devices:
            log.warning(
                "--vfio: the API server does not accept shared counters (DRAPartitionableDevices is off "
                "before 1.36), which keep a GPU and its passthrough twin from being allocated together: "
                "the twins (type vfio, class vfio.gpu.nvidia.com) are not published; claims with a "
                "VfioDeviceConfig on a whole GPU still pass it through"
            )
        elif vfio and chosen and features.minor < slices.SHARED_OFFERS_MINOR:
            log.warning(
                "--vfio with --shareable-gpus: a GPU shares a counter set with its passthrough twin, and "
                "Kubernetes 1.%d's scheduler would charge a shared GPU's counters at each allocation (1.%d "
                "charges them once): publishing whole GPUs exclusive",
                features.minor,
                slices.SHARED_OFFERS_MINOR,
            )
        self.driver = driver
        self.node_name = node_name
        self.features = features
        self._taints = taints
        self._inventory = inventory
        # Bumped by set_inventory, so a reconcile that ran on an older inventory does not
        # record its generation as the one the new inventory was published under.
        self._inventory_version = 0
        self._node_uid: str | None = None
        self._generation: int | None = None
        self._send, self._receive = anyio.create_memory_object_stream[None](1)
        self.published = anyio.Event()
        self._told_whole = False
        self._retry_asked = anyio.Event()
        #: resourceVersions of the touches this instance made: no reconcile needed on their events.
        self._own_touches: collections.deque[str] = collections.deque(maxlen=_OWN_TOUCHES)
        #: Set while another instance holds the turn to publish this pool.
        self.standing_by = False
        #: Set once this instance published, or found another one publishing the pool.
        self.settled = anyio.Event()

    def trigger(self) -> None:
        """Ask for a reconcile soon; several triggers before it runs count once."""
        with contextlib.suppress(anyio.WouldBlock):
            self._send.send_nowait(None)

    def claim_prepared(self, claim: PreparedClaim) -> None:
        """A claim was prepared: if it holds a share of a device, retry_pending_pods."""
        if any(device.share_id for device in claim.devices):
            self.retry_pending_pods()

    def retry_pending_pods(self) -> None:
        """Have the scheduler try again the pods it found unschedulable: a claim just took a share.

        The scheduler counts a share it has just allocated twice for a moment (once as seen by its
        informer, once as still being written), so a pod tried in that moment can be judged not to
        fit on a device that has room; it is tried again only on an event such as a slice change
        (else after up to 5 minutes). By the time a claim is prepared, its allocation is written:
        a slice change then finds the right count (docs/sharing.md, "Consumable shares"). Those asked
        within RETRY_SPACING_S of a touch make one more, at the end of it.
        """
        self._retry_asked.set()

    def set_inventory(self, inventory: Inventory) -> None:
        """Publish a new inventory (under a new pool generation)."""
        self._inventory = inventory
        self._inventory_version += 1
        self._generation = None
        self.trigger()

    async def reconcile(self) -> sliceplan.Plan:
        """List, compare, write. Returns what was written."""
        if self._node_uid is None:
            node = await self._kube.get_node(self.node_name)
            self._node_uid = str(node["metadata"]["uid"])
        version, inventory = self._inventory_version, self._inventory
        existing, _ = await self._kube.list_resource_slices(self.driver, self.node_name)
        if inventory.partitions and not self.features.partitionable_devices and not self._told_whole:
            self._told_whole = True
            log.warning(
                "the API server does not accept shared counters (DRAPartitionableDevices is off before "
                "1.36): dynamic-MIG GPUs %s are published whole, without their MIG partitions",
                ", ".join(g.name for g in inventory.dynamic_gpus),
            )
        desired = slices.build_slices(
            inventory,
            self.driver,
            self.node_name,
            self._node_uid,
            generation=0,
            features=self.features,
            taints=self._taints(),
            shareable=shareable_devices(self._shareable, inventory),
            share_mode=self._share_mode,
            vfio=self._vfio,
        )
        plan = sliceplan.plan(desired, existing, self._generation)
        for obj in plan.create:
            await self._kube.create_resource_slice(obj)
            metrics.SLICE_WRITES.labels("create").inc()
        for obj in plan.update:
            await self._kube.replace_resource_slice(obj)
            metrics.SLICE_WRITES.labels("update").inc()
        for obj in plan.delete:
            meta = obj["metadata"]
            await self._kube.delete_resource_slice(meta["name"], meta.get("uid"))
            metrics.SLICE_WRITES.labels("delete").inc()
        if plan.writes:
            log.info(
                "published %d devices in %d slice(s), generation %d (%d created, %d updated, %d deleted)",
                sum(len(s["spec"].get("devices", ())) for s in desired),
                len(desired),
                plan.generation,
                len(plan.create),
                len(plan.update),
                len(plan.delete),
            )
        if version == self._inventory_version:
            self._generation = plan.generation
        metrics.PUBLISHED_DEVICES.set(len(inventory))
        return plan

    async def _retries(self) -> None:
        """Touch a slice whenever a retry was asked, at most once per RETRY_SPACING_S."""
        while True:
            await self._retry_asked.wait()
            self._retry_asked = anyio.Event()
            try:
                await self._touch()
            except NotFoundError:
                # Not published yet (or being replaced): the reconcile's create is a slice event itself.
                pass
            except KubeError as err:
                log.warning("could not have the scheduler retry pending pods, trying again: %s", err)
                self._retry_asked.set()
            except Exception:
                # Like the watch, this task must outlive any surprise: publishing runs beside it.
                log.exception("asking the scheduler to retry pending pods failed unexpectedly; trying again")
                self._retry_asked.set()
            await anyio.sleep(RETRY_SPACING_S)

    async def _touch(self) -> None:
        """Set the retry annotation of the pool's first slice: one merge patch, the spec untouched.

        The time has microseconds: a write that changes nothing is no event.
        """
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
        result = await self._kube.annotate_resource_slice(
            slices.slice_name(self.node_name, self.driver, 0), {f"{self.driver}/{RETRY_ANNOTATION}": now}
        )
        self._own_touches.append(str(result["metadata"].get("resourceVersion", "")))
        metrics.SLICE_WRITES.labels("retry").inc()

    async def _watch(self) -> None:
        backoff = _BACKOFF_START
        while True:
            try:
                _, version = await self._kube.list_resource_slices(self.driver, self.node_name)
                async for kind, obj in self._kube.watch_resource_slices(
                    self.driver, self.node_name, version, 60
                ):
                    # A touch of this instance's changes no spec: nothing to compare.
                    seen = obj["metadata"].get("resourceVersion")
                    touched = kind == "MODIFIED" and seen in self._own_touches
                    if kind != "BOOKMARK" and not touched:
                        self.trigger()
                backoff = _BACKOFF_START
            except KubeError as err:
                if err.status != 410:
                    log.warning("watching ResourceSlices failed, retrying in %.1fs: %s", backoff, err)
                    await anyio.sleep(backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX)
            except Exception:
                # The watch is what repairs edited or deleted slices: it must outlive any surprise.
                log.exception("watching ResourceSlices failed unexpectedly, retrying in %.1fs", backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
            # A missed event while re-listing is covered by reconciling after every (re)connect.
            self.trigger()

    async def run(self) -> None:
        """Wait for the turn to publish, then reconcile until cancelled, retrying failures with backoff.

        Retries of pending pods go out from the start: an instance standing by prepares claims too.
        """
        async with anyio.create_task_group() as group:
            group.start_soon(self._retries)
            await self._publish()

    async def _publish(self) -> None:
        with contextlib.ExitStack() as stack:
            if self._turn is not None:
                # Held until this process ends; closing the file lets the next instance publish.
                turn = stack.enter_context(open_lock(self._turn))
                while not try_lock(turn):
                    if not self.standing_by:
                        log.info(
                            "another instance publishes pool %s (it holds %s); publishing when it ends",
                            self.node_name,
                            self._turn,
                        )
                        self.standing_by = True
                        self.settled.set()
                    await anyio.sleep(_TURN_POLL)
                if self.standing_by:
                    log.info("the previous instance ended; publishing pool %s", self.node_name)
                    self.standing_by = False
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch)
                self.trigger()
                await self._reconcile_on_trigger()

    async def _reconcile_on_trigger(self) -> None:
        backoff = _BACKOFF_START
        async for _ in self._receive:
            try:
                await self.reconcile()
                self.published.set()
                self.settled.set()
                backoff = _BACKOFF_START
            except Exception as err:
                # Publishing must go on whatever one attempt ran into.
                metrics.RECONCILE_ERRORS.inc()
                if isinstance(err, ConflictError):
                    log.info("ResourceSlice changed under us, reconciling again: %s", err)
                    backoff = 0
                elif isinstance(err, (KubeError, SliceError)):
                    log.error("publishing ResourceSlices failed, retrying in %.1fs: %s", backoff, err)
                else:
                    log.exception("publishing ResourceSlices failed, retrying in %.1fs", backoff)
                await anyio.sleep(backoff)
                backoff = min(max(backoff, _BACKOFF_START) * 2, _BACKOFF_MAX)
                self.trigger()
