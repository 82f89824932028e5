"""The device plugin's gRPC side over real unix sockets, with a stand-in for the kubelet's Registration.

No cluster: the stand-in records Register calls on <dir>/kubelet.sock and can be
"restarted" the way a kubelet restarts (every file of the directory removed,
kubelet.sock created anew), so each test sees exactly what the plugin does.
The real kubelet is in tests/e2e/test_deviceplugin.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest

from dra.daemon.health import HealthTracker
from dra.deviceplugin.allocate import Strategy
from dra.deviceplugin.config import MigStrategy, SharedResource, TimeSlicing
from dra.deviceplugin.daemon import DevicePluginSettings, ResourceSet, offer
from dra.deviceplugin.resources import Resource, resources
from dra.deviceplugin.server import ResourceServer
from dra.deviceplugin.service import CallLog, DevicePluginService
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile, parse_profile
from dra.gpu.discovery import discover
from dra.model.devices import Inventory
from dra.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

pytestmark = pytest.mark.anyio

Context = grpc.aio.ServicerContext[Any, Any]


class FakeKubelet(pb_grpc.RegistrationServicer):
    """Records Register requests on <dir>/kubelet.sock."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.requests: list[pb.RegisterRequest] = []
        self._server: grpc.aio.Server | None = None

    async def Register(self, request: pb.RegisterRequest, context: Context) -> pb.Empty:  # noqa: N802
        self.requests.append(request)
        return pb.Empty()

    async def start(self) -> None:
        """Remove every file of the directory, as a starting kubelet does, then serve kubelet.sock."""
        for path in self.directory.iterdir():
            if not path.is_dir():
                path.unlink()
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving (the socket file stays, as after a crash)."""
        if self._server is not None:
            await self._server.stop(None)
            self._server = None


@dataclass
class Plugin:
    """One resource's server, its service and the tracker behind it."""

    server: ResourceServer
    service: DevicePluginService
    tracker: HealthTracker
    inventory: Inventory
    resource: Resource


async def wait_until(what: str, probe: Callable[[], bool]) -> None:
    """Poll (files, the stand-in's list) for up to 10 s."""
    try:
        with anyio.fail_after(10):
            while not probe():  # noqa: ASYNC110 (nothing to wait on but the files themselves)
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@pytest.fixture
async def directory() -> AsyncIterator[Path]:
    """A short directory (unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def plugin(directory: Path) -> AsyncIterator[Plugin]:
    """nvidia.com/gpu of the fake h100x8 node, kept registered every 50 ms, until the test ends."""
    inventory = discover(FakeGpuLibrary(load_profile("h100x8"), "node-a"))
    [resource] = resources(inventory)
    tracker = HealthTracker(inventory)
    service = DevicePluginService(
        resource, tracker, frozenset({Strategy.CDI_CRI}), "gpu.nvidia.com", CallLog(None)
    )
    server = ResourceServer(directory, resource, service)
    async with anyio.create_task_group() as group:
        group.start_soon(server.keep_registered, 0.05)
        yield Plugin(server, service, tracker, inventory, resource)
        group.cancel_scope.cancel()
    await server.stop()


async def test_registers_and_registers_again_after_a_kubelet_restart(directory: Path, plugin: Plugin) -> None:
    kubelet = FakeKubelet(directory)
    # No kubelet yet: the plugin serves and retries.
    await wait_until("the plugin socket", plugin.server.socket.is_socket)
    assert not plugin.server.registered
    await kubelet.start()
    await wait_until("a registration", lambda: len(kubelet.requests) == 1)
    [request] = kubelet.requests
    assert request.version == "v1beta1"
    assert request.endpoint == "dra-gpu-nvidia.com-gpu.sock"
    assert request.resource_name == "nvidia.com/gpu"
    assert request.options.get_preferred_allocation_available
    assert not request.options.pre_start_required
    # The kubelet records the request before its answer reaches the plugin.
    await wait_until("the plugin to see its registration accepted", lambda: plugin.server.registered)

    # The kubelet restarts: its start removes our socket and creates kubelet.sock anew.
    await kubelet.stop()
    await kubelet.start()
    await wait_until("a second registration", lambda: len(kubelet.requests) == 2)
    assert plugin.server.socket.is_socket()
    async with grpc.aio.insecure_channel(f"unix://{plugin.server.socket}") as channel:
        stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(channel)
        options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert options.get_preferred_allocation_available
    await kubelet.stop()


async def test_registers_again_when_only_its_socket_disappears(directory: Path, plugin: Plugin) -> None:
    kubelet = FakeKubelet(directory)
    await kubelet.start()
    await wait_until("a registration", lambda: len(kubelet.requests) == 1)
    plugin.server.socket.unlink()
    await wait_until("a second registration", lambda: len(kubelet.requests) == 2)
    assert plugin.server.socket.is_socket()
    # The kubelet records the request before its answer reaches the plugin, which counts it then.
    await wait_until("the plugin to count its second registration", lambda: plugin.server.registrations == 2)
    await kubelet.stop()


async def test_list_and_watch_sends_health_changes(directory: Path, plugin: Plugin) -> None:
    await wait_until("the plugin socket", plugin.server.socket.is_socket)
    async with grpc.aio.insecure_channel(f"unix://{plugin.server.socket}") as channel:
        stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(channel)
        stream = stub.ListAndWatch(pb.Empty())
        first = await stream.read()
        assert isinstance(first, pb.ListAndWatchResponse)
        assert [d.ID for d in first.devices] == [d.uuid for d in plugin.inventory]
        assert {d.health for d in first.devices} == {"Healthy"}
        assert [[n.ID for n in d.topology.nodes] for d in first.devices] == [[0]] * 4 + [[1]] * 4

        plugin.tracker.mark_unhealthy(["gpu-5"], "XID 79")
        second = await stream.read()
        assert isinstance(second, pb.ListAndWatchResponse)
        unhealthy = [d.ID for d in second.devices if d.health == "Unhealthy"]
        assert unhealthy == [plugin.inventory.devices[5].uuid]

        # The stream ends (instead of being cut) when its server is replaced.
        plugin.service.end_streams()
        assert await stream.read() == grpc.aio.EOF


async def test_allocate_and_preferred_allocation(directory: Path, plugin: Plugin) -> None:
    await wait_until("the plugin socket", plugin.server.socket.is_socket)
    uuids = [d.uuid for d in plugin.inventory]
    async with grpc.aio.insecure_channel(f"unix://{plugin.server.socket}") as channel:
        stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(channel)
        preferred = await stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=uuids[1:], allocation_size=2)
                ]
            )
        )
        assert list(preferred.container_responses[0].deviceIDs) == [uuids[2], uuids[3]]

        answer = await stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=uuids[2:4])])
        )
        [container] = answer.container_responses
        assert [c.name for c in container.cdi_devices] == [
            f"k8s.gpu.nvidia.com/device={u}" for u in uuids[2:4]
        ]

        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-nope"])])
            )
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "nvidia.com/gpu: unknown device(s) GPU-nope" in str(raised.value.details())


async def test_a_plugin_without_gpus_registers_zero_and_writes_no_spec(directory: Path) -> None:
    kubelet = FakeKubelet(directory / "device-plugins")
    kubelet.directory.mkdir()
    await kubelet.start()
    command = [
        sys.executable,
        "-m",
        "dra",
        "device-plugin",
        "--node-name=node-a",
        "--fake-gpus=mixed",
        "--device-plugin-gpus=none",
        f"--kubelet-root={directory}",
        f"--cdi-root={directory / 'cdi'}",
        "--http-address=",
    ]
    async with await anyio.open_process(command, stderr=subprocess.PIPE) as process:
        try:
            await wait_until("a registration", lambda: len(kubelet.requests) == 1)
        finally:
            process.terminate()
            await process.wait()
        assert process.returncode == 0
    [request] = kubelet.requests
    assert request.resource_name == "nvidia.com/gpu"
    assert not (directory / "cdi").exists(), "a spec with no device would be invalid"
    record = json.loads((directory / "plugins" / "gpu.nvidia.com" / "gpu-assignment.json").read_text())
    assert record["paths"] == {}, "a clean exit removes the plugin's entry"
    await kubelet.stop()


async def test_time_sliced_replicas_are_listed_spread_and_mapped_back(directory: Path) -> None:
    inventory = discover(FakeGpuLibrary(load_profile("mixed"), "node-a"))
    sharing = TimeSlicing(
        rename_by_default=True,
        fail_requests_greater_than_one=True,
        resources=(SharedResource("nvidia.com/gpu", 2),),
    )
    [resource] = resources(inventory, time_slicing=sharing)
    service = DevicePluginService(
        resource, HealthTracker(inventory), frozenset({Strategy.ENVVAR}), "gpu.nvidia.com", CallLog(None)
    )
    server = ResourceServer(directory, resource, service)
    await server.serve()
    first, second = (d.uuid for d in inventory.devices[:2])
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.socket}") as channel:
            stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(channel)
            stream = stub.ListAndWatch(pb.Empty())
            listed = await stream.read()
            assert isinstance(listed, pb.ListAndWatchResponse)
            stream.cancel()
            assert len(listed.devices) == 8
            assert [d.ID for d in listed.devices[:2]] == [f"{first}::0", f"{first}::1"]

            preferred = await stub.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[f"{first}::0", f"{first}::1", f"{second}::1"],
                            allocation_size=2,
                        )
                    ]
                )
            )
            assert list(preferred.container_responses[0].deviceIDs) == [f"{first}::0", f"{second}::1"]

            answer = await stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=[f"{second}::1"])]
                )
            )
            assert answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == second

            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.Allocate(
                    pb.AllocateRequest(
                        container_requests=[
                            pb.ContainerAllocateRequest(devices_ids=[f"{first}::0", f"{first}::1"])
                        ]
                    )
                )
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert str(raised.value.details()) == (
                "nvidia.com/gpu.shared: a container asked for 2 time-sliced devices, and "
                "sharing.timeSlicing.failRequestsGreaterThanOne allows 1 per container"
            )
    finally:
        await server.stop()


async def test_two_replicas_of_one_gpu_give_the_container_that_gpu_once(directory: Path) -> None:
    inventory = discover(FakeGpuLibrary(load_profile("mixed"), "node-a"))
    sharing = TimeSlicing(resources=(SharedResource("nvidia.com/gpu", 2),))
    [resource] = resources(inventory, time_slicing=sharing)
    strategies = frozenset({Strategy.CDI_CRI, Strategy.ENVVAR})
    service = DevicePluginService(resource, HealthTracker(inventory), strategies, "gpu.nvidia.com")
    server = ResourceServer(directory, resource, service)
    await server.serve()
    first = inventory.devices[0].uuid
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.socket}") as channel:
            stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(channel)
            answer = await stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=[f"{first}::0", f"{first}::1"])
                    ]
                )
            )
    finally:
        await server.stop()
    [container] = answer.container_responses
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == first
    assert [c.name for c in container.cdi_devices] == [f"k8s.gpu.nvidia.com/device={first}"]


def _fake_node(*gpus: dict[str, Any]) -> Inventory:
    return discover(FakeGpuLibrary(parse_profile({"gpus": list(gpus)}, "test"), "node-a"))


SEVEN_SMALL = {"model": "a100-sxm4-40gb", "mig": ["1g.5gb"] * 7}
TWO_LARGE = {"model": "a100-sxm4-40gb", "mig": ["3g.20gb", "4g.20gb"]}
T4 = {"model": "t4"}


async def test_resources_follow_changed_devices_without_a_restart(directory: Path, tmp_path: Path) -> None:
    settings = DevicePluginSettings(
        driver_name="gpu.nvidia.com",
        node_name="node-a",
        kubelet_root=tmp_path,
        cdi_root=tmp_path / "cdi",
        state_dir=None,
        device_plugin_dir=directory,
        watch_interval=0.05,
    )
    before = _fake_node(SEVEN_SMALL, T4)
    tracker = HealthTracker(before)
    offering = ResourceSet(settings, tracker, before, CallLog(None))
    offering.begin(offer(before, settings.plugin_config))
    kubelet = FakeKubelet(directory)
    await kubelet.start()
    small = directory / "dra-gpu-nvidia.com-mig-1g.5gb.sock"
    async with anyio.create_task_group() as group:
        offering.run(group)
        await wait_until("two registrations", lambda: offering.registered and len(kubelet.requests) == 2)
        gpu = offering.servers["nvidia.com/gpu"]
        async with grpc.aio.insecure_channel(f"unix://{gpu.socket}") as channel:
            stub: pb_grpc.DevicePluginAsyncStub = pb_grpc.DevicePluginStub(channel)
            stream = stub.ListAndWatch(pb.Empty())
            first = await stream.read()
            assert isinstance(first, pb.ListAndWatchResponse)
            assert len(first.devices) == 1

            # A new MIG layout: the 1g.5gb resource goes, 3g.20gb and 4g.20gb come; the T4 stays.
            after = _fake_node(TWO_LARGE, T4)
            assert await offering.apply(after, offering.config) is None
            await wait_until("four registrations", lambda: offering.registered and len(kubelet.requests) == 4)
            # The two new servers register concurrently, in either order.
            assert sorted(r.resource_name for r in kubelet.requests[2:]) == [
                "nvidia.com/mig-3g.20gb",
                "nvidia.com/mig-4g.20gb",
            ]
            assert sorted(offering.servers) == [
                "nvidia.com/gpu",
                "nvidia.com/mig-3g.20gb",
                "nvidia.com/mig-4g.20gb",
            ]
            assert not small.exists(), "the gone resource's socket is removed"
            spec = json.loads((settings.cdi_root / "k8s.gpu.nvidia.com-device.json").read_text())
            assert {d["name"] for d in spec["devices"]} == {d.uuid for d in after}

            # An XID marks the T4 unhealthy; it vanishes (the open stream of nvidia.com/gpu lists no
            # device) and comes back: a fresh device to the health tracker, healthy again.
            assert tracker.mark_unhealthy(["gpu-1"], "XID 79") == ["gpu-1"]
            unhealthy = await stream.read()
            assert isinstance(unhealthy, pb.ListAndWatchResponse)
            assert [d.health for d in unhealthy.devices] == ["Unhealthy"]
            t4_gone = _fake_node(TWO_LARGE)
            assert await offering.apply(t4_gone, offering.config) is None
            second = await stream.read()
            assert isinstance(second, pb.ListAndWatchResponse)
            assert list(second.devices) == []
            assert await offering.apply(after, offering.config) is None
            third = await stream.read()
            assert isinstance(third, pb.ListAndWatchResponse)
            assert [d.ID for d in third.devices] == [d.ID for d in first.devices]
            assert {d.health for d in third.devices} == {"Healthy"}

            # A layout the MIG strategy cannot offer is refused, and the last resources stay.
            single = replace(offering.config, mig_strategy=MigStrategy.SINGLE)
            refused = await offering.apply(after, single)
            assert refused is not None
            assert "MIG strategy single" in refused
            assert offering.config.mig_strategy is MigStrategy.MIXED
            assert len(offering.servers) == 3
        group.cancel_scope.cancel()
    await offering.stop()
    await kubelet.stop()
