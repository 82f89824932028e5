"""The DRAResourceHealth gRPC services (v1 and v1alpha1) over one health tracker, without a socket."""

from __future__ import annotations

from typing import Any

from dra.daemon.health import HealthTracker
from dra.kubeletplugin.service import HealthService
from dra.pb.drahealth.v1 import health_pb2 as health_v1
from dra.pb.drahealth.v1alpha1 import health_pb2
from tests.unit.helpers import NODE, inventory


class _Kubelet:
    """The gRPC context of a stream the kubelet keeps open."""

    def is_active(self) -> bool:
        return True


NO_CONTEXT: Any = _Kubelet()


def test_v1_says_why_a_device_is_unhealthy() -> None:
    tracker = HealthTracker(inventory("h100x8"))
    tracker.mark_unhealthy(["gpu-3"], "XID 79: GPU has fallen off the bus")
    stream = HealthService(NODE, tracker).NodeWatchResources(
        health_v1.NodeWatchResourcesRequest(), NO_CONTEXT
    )
    first = next(stream)
    by_name = {d.device.device_name: d for d in first.devices}
    assert by_name["gpu-3"].health == health_v1.UNHEALTHY
    assert by_name["gpu-3"].message == "XID 79: GPU has fallen off the bus"
    assert by_name["gpu-0"].health == health_v1.HEALTHY
    assert by_name["gpu-0"].message == ""
    assert {d.device.pool_name for d in first.devices} == {NODE}
    stream.close()


def test_v1alpha1_streams_the_same_devices_without_the_v1_fields() -> None:
    tracker = HealthTracker(inventory("h100x8"))
    tracker.mark_unhealthy(["gpu-3"], "XID 79")
    service = HealthService(NODE, tracker)
    v1 = next(service.NodeWatchResources(health_v1.NodeWatchResourcesRequest(), NO_CONTEXT))
    alpha_stream = service.alpha.NodeWatchResources(health_pb2.NodeWatchResourcesRequest(), NO_CONTEXT)
    alpha = next(alpha_stream)
    assert isinstance(alpha, health_pb2.NodeWatchResourcesResponse)
    assert [(d.device.device_name, int(d.health), d.last_updated_time) for d in alpha.devices] == [
        (d.device.device_name, int(d.health), d.last_updated_time) for d in v1.devices
    ]
    # v1alpha1 has no message field: nothing of it may travel as an unknown field either.
    for d in alpha.devices:
        bare = health_pb2.DeviceHealth(
            device=d.device, health=d.health, last_updated_time=d.last_updated_time
        )
        assert d.SerializeToString() == bare.SerializeToString()
    alpha_stream.close()


def test_both_versions_follow_a_change() -> None:
    tracker = HealthTracker(inventory("h100x8"))
    service = HealthService(NODE, tracker)
    v1 = service.NodeWatchResources(health_v1.NodeWatchResourcesRequest(), NO_CONTEXT)
    alpha = service.alpha.NodeWatchResources(health_pb2.NodeWatchResourcesRequest(), NO_CONTEXT)
    assert all(d.health == health_v1.HEALTHY for d in (next(v1)).devices)
    assert all(d.health == health_pb2.HEALTHY for d in (next(alpha)).devices)
    tracker.mark_unhealthy(["gpu-1"], "XID 48")
    assert [d.device.device_name for d in (next(v1)).devices if d.health == health_v1.UNHEALTHY] == ["gpu-1"]
    assert [d.device.device_name for d in (next(alpha)).devices if d.health == health_pb2.UNHEALTHY] == [
        "gpu-1"
    ]
    v1.close()
    alpha.close()
