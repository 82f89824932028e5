"""GPUs that device-plugin containers still use, asked of the kubelet's pod-resources service.

A node moves from the device plugin to DRA without a drain (docs/migration.md):
the device plugin stops, the kubelet plugin takes every GPU, and pods that got a
GPU as `nvidia.com/gpu` keep running on it. Such a GPU must not be published
through DRA until its last container ends, or the scheduler would hand it out a
second time. The kubelet records which device IDs each container was given and
serves them on `<kubelet root>/pod-resources/kubelet.sock` (List, GA since 1.28);
the driver asks at start and at each re-discovery, and publishes a held-back GPU
once no container holds it.

The same List also says which containers use which DRA claim's devices
(DynamicResources): `claim_consumers` gives the pod and container labels of
dra_gpu_claim_device_info.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread
import grpc

from dra.core.assignment import describe, gpus_behind
from dra.core.devicestatus import Consumer
from dra.model.devices import Inventory
from dra.pb.podresources.v1 import podresources_pb2, podresources_pb2_grpc

log = logging.getLogger(__name__)

#: The kubelet's socket, relative to its root directory.
SOCKET = Path("pod-resources") / "kubelet.sock"
_TIMEOUT = 5.0


@dataclass(frozen=True)
class Holder:
    """A container the kubelet gave a device-plugin device to."""

    namespace: str
    pod: str
    container: str
    resource: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container} ({self.resource})"


async def _list_pod_resources(socket: Path) -> podresources_pb2.ListPodResourcesResponse:
    """The kubelet's List: every running pod's containers and the devices they were given.

    grpcio's blocking client on a worker thread, not grpc.aio: the kubelet plugin serves on
    grpcio's synchronous server and keeps no grpc.aio object, so a grpc.aio channel would start
    grpc.aio's poller thread at each List and stop it at the channel's close, a stop that can
    hang the process (grpc/grpc#40989); a worker thread costs nothing of the sort.
    """
    return await anyio.to_thread.run_sync(_list_blocking, socket, abandon_on_cancel=True)


def _list_blocking(socket: Path) -> podresources_pb2.ListPodResourcesResponse:
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        answer: podresources_pb2.ListPodResourcesResponse = stub.List(
            podresources_pb2.ListPodResourcesRequest(), timeout=_TIMEOUT
        )
        return answer


def rpc_error_text(err: grpc.RpcError | OSError) -> str:
    """What a failed List says: the status's details, or the OS error."""
    return str(err.details()) if isinstance(err, grpc.Call) else str(err)


async def list_devices(socket: Path) -> list[tuple[Holder, str]]:
    """Every device-plugin device ID the kubelet has given to a running container, with the container."""
    response = await _list_pod_resources(socket)
    return [
        (Holder(pod.namespace, pod.name, container.name, devices.resource_name), device_id)
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        for device_id in devices.device_ids
    ]


async def claim_consumers(socket: Path, driver: str) -> list[Consumer]:
    """Every running container that uses a device of this driver's claims, once per device."""
    response = await _list_pod_resources(socket)
    return [
        Consumer(
            pod.namespace,
            pod.name,
            container.name,
            claim.claim_namespace,
            claim.claim_name,
            device.device_name,
        )
        for pod in response.pod_resources
        for container in pod.containers
        for claim in container.dynamic_resources
        for device in claim.claim_resources
        # A kubelet before 1.31 names no driver: the claim's name still finds it among ours.
        if device.driver_name in ("", driver)
    ]


class DevicePluginHoldback:
    """Which GPUs of the DRA path to keep unpublished while device-plugin containers use them."""

    def __init__(self, kubelet_root: Path) -> None:
        self.socket = kubelet_root / SOCKET
        self._held: dict[str, list[Holder]] = {}
        self._warned = False

    async def held(self, inventory: Inventory) -> set[str]:
        """UUIDs of the inventory's GPUs that a running device-plugin container holds (logged as it changes).

        When the kubelet cannot be asked, nothing is held (said once): a node that
        never ran the device plugin has nothing to hold, and the driver must start.
        """
        try:
            devices = await list_devices(self.socket)
        except (grpc.RpcError, OSError) as err:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot ask the kubelet (%s) which GPUs device-plugin pods still use: %s; "
                    "publishing every GPU (docs/migration.md)",
                    self.socket,
                    rpc_error_text(err),
                )
            return set(self._held)
        self._warned = False
        held = _holders(devices, inventory)
        for uuid, holders in held.items():
            if uuid not in self._held:
                log.warning(
                    "%s is still used by device-plugin container(s) %s: not publishing it through DRA "
                    "until they end",
                    _describe(uuid, inventory),
                    ", ".join(map(str, holders)),
                )
        for uuid in self._held.keys() - held.keys():
            log.info(
                "%s is no longer used by a device-plugin container: publishing it", _describe(uuid, inventory)
            )
        self._held = held
        return set(held)


def _holders(devices: Iterable[tuple[Holder, str]], inventory: Inventory) -> dict[str, list[Holder]]:
    held: dict[str, list[Holder]] = {}
    for holder, device_id in devices:
        for gpu in gpus_behind([(holder.resource, device_id)], inventory):
            if holder not in held.setdefault(gpu.uuid, []):
                held[gpu.uuid].append(holder)
    return held


def _describe(uuid: str, inventory: Inventory) -> str:
    gpu = next((g for g in inventory.gpus if g.uuid == uuid), None)
    return describe(gpu) if gpu is not None else uuid
