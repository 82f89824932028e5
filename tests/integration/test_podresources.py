"""The driver asks a real gRPC pod-resources server which GPUs device-plugin containers hold."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import grpc.aio
import pytest

from dra.kubeletplugin.podresources import SOCKET, DevicePluginHoldback
from dra.pb.podresources.v1 import podresources_pb2 as pb
from dra.pb.podresources.v1 import podresources_pb2_grpc as pb_grpc
from tests.unit.helpers import inventory

pytestmark = pytest.mark.anyio


class Kubelet(pb_grpc.PodResourcesListerServicer):
    """The kubelet's List: one pod whose container holds the given device IDs."""

    def __init__(self) -> None:
        self.devices: list[pb.ContainerDevices] = []

    async def List(  # noqa: N802 - the gRPC method's name
        self, request: pb.ListPodResourcesRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> pb.ListPodResourcesResponse:
        container = pb.ContainerResources(name="main", devices=self.devices)
        pod = pb.PodResources(name="legacy", namespace="team-a", containers=[container])
        return pb.ListPodResourcesResponse(pod_resources=[pod])


async def test_held_gpus_follow_the_containers_and_are_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = inventory("h100x8")
    (tmp_path / SOCKET).parent.mkdir()
    kubelet = Kubelet()
    server = grpc.aio.server()
    pb_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{tmp_path / SOCKET}")
    await server.start()
    try:
        holdback = DevicePluginHoldback(tmp_path)
        assert await holdback.held(node) == set()
        kubelet.devices = [
            pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[node.gpus[3].uuid])
        ]
        with caplog.at_level(logging.INFO):
            assert await holdback.held(node) == {node.gpus[3].uuid}
            assert "team-a/legacy/main (nvidia.com/gpu): not publishing it through DRA" in caplog.text
            kubelet.devices = []
            assert await holdback.held(node) == set()
            assert "no longer used by a device-plugin container: publishing it" in caplog.text
    finally:
        await server.stop(None)


async def test_a_kubelet_that_cannot_be_asked_holds_nothing_and_is_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    holdback = DevicePluginHoldback(tmp_path)
    assert await holdback.held(inventory("h100x8")) == set()
    assert await holdback.held(inventory("h100x8")) == set()
    assert caplog.text.count("which GPUs device-plugin pods still use") == 1
