"""The DevicePlugin gRPC service (v1beta1) for one extended resource.

ListAndWatch streams the resource's devices with their health and NUMA node,
once on connect and again whenever a device's health changes (XID errors,
through the same HealthTracker as the DRA health stream) or the devices
themselves change (re-discovery, a new config: `update`). GetPreferredAllocation
and Allocate are answered by the pure modules `preferred` and `allocate`; a
time-sliced resource lists each device once per replica, and Allocate maps
replicas back to their devices.
Every call can be appended to a JSON-lines call log (--call-log), which is how
the end-to-end tests see what the real kubelet asked.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import grpc

from dra.daemon import metrics
from dra.daemon.health import DeviceHealth, HealthTracker
from dra.deviceplugin.allocate import Strategy, container_response
from dra.deviceplugin.preferred import preferred_allocation, spread_allocation
from dra.deviceplugin.resources import Resource, numa_node, placements
from dra.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

#: What the plugin tells the kubelet it supports (in Register and GetDevicePluginOptions).
OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class CallLog:
    """Appends one JSON object per kubelet call to a file; does nothing without one."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        """Record one event."""
        if self.path is None:
            return
        line = json.dumps({"time": time.time(), "event": event, **fields}, sort_keys=True)
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")


async def _first_of(*events: anyio.Event) -> None:
    """Return as soon as one of the events is set."""
    async with anyio.create_task_group() as group:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            group.cancel_scope.cancel()

        for event in events:
            group.start_soon(wait, event)


class DevicePluginService(pb_grpc.DevicePluginServicer):
    """Serves one resource's devices."""

    def __init__(
        self,
        resource: Resource,
        tracker: HealthTracker,
        strategies: frozenset[Strategy],
        driver: str,
        calls: CallLog | None = None,
    ) -> None:
        self._tracker = tracker
        self._driver = driver
        self._calls = calls or CallLog(None)
        self._end_streams = anyio.Event()
        self._changed = anyio.Event()
        self.update(resource, strategies)

    def update(self, resource: Resource, strategies: frozenset[Strategy]) -> None:
        """Serve the resource's new devices (or replicas, or strategies); open streams send the new list."""
        self.resource = resource
        self._strategies = strategies
        self._by_id = resource.device_ids()
        self._parents = {key: device.uuid for key, device in self._by_id.items()}
        self._placements = placements(resource.devices)
        self._changed.set()
        self._changed = anyio.Event()

    def end_streams(self) -> None:
        """Let every open ListAndWatch stream finish (before its server stops); new ones stay open."""
        self._end_streams.set()
        self._end_streams = anyio.Event()

    def devices(self, health: dict[str, DeviceHealth]) -> list[pb.Device]:
        """The ListAndWatch device list for a health snapshot."""
        result = []
        for device_key, device in self._by_id.items():
            status = health.get(device.name)
            entry = pb.Device(
                ID=device_key, health=HEALTHY if status is None or status.healthy else UNHEALTHY
            )
            numa = numa_node(device)
            if numa is not None:
                entry.topology.nodes.append(pb.NUMANode(ID=numa))
            result.append(entry)
        return result

    async def GetDevicePluginOptions(  # noqa: N802 (gRPC method name)
        self, request: pb.Empty, context: Context
    ) -> pb.DevicePluginOptions:
        """No PreStartContainer; GetPreferredAllocation is available."""
        return OPTIONS

    async def ListAndWatch(  # noqa: N802
        self, request: pb.Empty, context: Context
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        """The device list now, and again after every change of its devices or their health."""
        end = self._end_streams
        last: list[tuple[str, str]] | None = None
        while not end.is_set():
            changed, updated = self._tracker.next_change(), self._changed
            devices = self.devices(self._tracker.snapshot())
            summary = [(d.ID, d.health) for d in devices]
            if summary == last:
                await _first_of(changed, updated, end)
                continue
            last = summary
            for health in (HEALTHY, UNHEALTHY):
                metrics.DP_DEVICES.labels(self.resource.name, health).set(
                    sum(d.health == health for d in devices)
                )
            unhealthy = [d.ID for d in devices if d.health != HEALTHY]
            log.info(
                "ListAndWatch %s: %d devices%s",
                self.resource.name,
                len(devices),
                f", unhealthy: {', '.join(unhealthy)}" if unhealthy else "",
            )
            listed = [
                {"id": d.ID, "health": d.health, "numa": [n.ID for n in d.topology.nodes]} for d in devices
            ]
            self._calls("ListAndWatch", resource=self.resource.name, devices=listed)
            yield pb.ListAndWatchResponse(devices=devices)
            await _first_of(changed, updated, end)

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: Context
    ) -> pb.PreferredAllocationResponse:
        """Keep must_include, then prefer devices that share a GPU, a PCIe root, a NUMA node.

        Replicas of a time-sliced resource are spread over GPUs instead.
        """
        responses = []
        for container in request.container_requests:
            available = list(container.available_deviceIDs)
            must_include = list(container.must_include_deviceIDs)
            size = container.allocation_size
            if self.resource.shared:
                chosen = spread_allocation(available, must_include, size, self._parents)
            else:
                chosen = preferred_allocation(available, must_include, size, self._placements)
            self._calls(
                "GetPreferredAllocation",
                resource=self.resource.name,
                available=list(container.available_deviceIDs),
                mustInclude=list(container.must_include_deviceIDs),
                size=container.allocation_size,
                preferred=chosen,
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(  # noqa: N802
        self, request: pb.AllocateRequest, context: Context
    ) -> pb.AllocateResponse:
        """CDI device names and/or NVIDIA_VISIBLE_DEVICES for each container, per the strategy."""
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            message = self._refusal(ids)
            if message is not None:
                metrics.DP_ALLOCATIONS.labels(self.resource.name, "error").inc()
                log.error("Allocate: %s", message)
                self._calls("Allocate", resource=self.resource.name, devices=ids, error=message)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
            # Replicas of one device name it once.
            devices = list({self._by_id[i].uuid: self._by_id[i] for i in ids}.values())
            response = container_response(devices, self._strategies, self._driver, self.resource.name)
            metrics.DP_ALLOCATIONS.labels(self.resource.name, "success").inc()
            log.info(
                "Allocate %s: %s", self.resource.name, ", ".join(f"{d.name} ({d.uuid})" for d in devices)
            )
            self._calls(
                "Allocate",
                resource=self.resource.name,
                devices=ids,
                cdiDevices=[c.name for c in response.cdi_devices],
                envs=dict(response.envs),
                annotations=dict(response.annotations),
            )
            responses.append(response)
        return pb.AllocateResponse(container_responses=responses)

    def _refusal(self, ids: list[str]) -> str | None:
        """Why one container's device IDs cannot be allocated, or None."""
        unknown = [i for i in ids if i not in self._by_id]
        if unknown:
            return (
                f"{self.resource.name}: unknown device(s) {', '.join(unknown)}; this plugin advertises "
                f"{', '.join(self._by_id) or 'no device'}"
            )
        if self.resource.one_per_container and len(ids) > 1:
            return (
                f"{self.resource.name}: a container asked for {len(ids)} time-sliced devices, and "
                "sharing.timeSlicing.failRequestsGreaterThanOne allows 1 per container"
            )
        return None

    async def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: Context
    ) -> pb.PreStartContainerResponse:
        """Nothing to do before a container starts (not requested in the options)."""
        return pb.PreStartContainerResponse()
