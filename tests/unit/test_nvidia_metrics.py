"""NVIDIA's DRA driver's metrics (nvidia_dra_*), beside ours: its names, labels, buckets and meaning.

The expected set is that of pkg/metrics/dra_requests.go in kubernetes-sigs/dra-driver-nvidia-gpu
at 95932046683719c43b6a0dd9613c2e5aad5d6703 (its main on 2026-08-07).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.kube import NotFoundError
from dra.adapters.nodefiles import CdiStore
from dra.daemon import metrics
from dra.kubeletplugin.service import DraService, prepared_counts
from dra.kubeletplugin.state import DeviceState
from dra.model.prepared import PreparedClaim, PreparedDevice
from dra.pb.dra.v1 import dra_pb2
from tests.unit.helpers import DRIVER, NODE, inventory

NVIDIA = {
    "nvidia_dra_requests": ("counter", ["driver", "operation"]),
    "nvidia_dra_request_duration_seconds": ("histogram", ["driver", "operation"]),
    "nvidia_dra_requests_inflight": ("gauge", ["driver", "operation"]),
    "nvidia_dra_prepared_devices": ("gauge", ["node", "driver", "device_type"]),
    "nvidia_dra_node_prepare_errors": ("counter", ["driver", "error_type"]),
    "nvidia_dra_node_unprepare_errors": ("counter", ["driver", "error_type"]),
}
UID = "aaaaaaaa-0000-4000-8000-00000000000a"


def test_the_set_is_nvidias() -> None:
    # A family is listed once it has a series: make one of each (NVIDIA's error series, too, start
    # at their first error).
    metrics.start_request_series("example.com")
    metrics.PREPARED.follow(NODE, "example.com", lambda: (0, {}))
    metrics.NVIDIA_PREPARE_ERRORS.labels("example.com", "prepare_devices")
    metrics.NVIDIA_UNPREPARE_ERRORS.labels("example.com", "unprepare_devices")
    found = {
        family.name: (family.type, sorted({k for s in family.samples for k in s.labels} - {"le"}))
        for family in metrics.REGISTRY.collect()
        if family.name.startswith("nvidia_dra_")
    }
    assert found == {name: (kind, sorted(labels)) for name, (kind, labels) in NVIDIA.items()}
    assert metrics.NVIDIA_REQUEST_SECONDS._upper_bounds[:-1] == pytest.approx(
        [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8]
    )


class Claims:
    """The API server's claims: one allocated GPU for claim-a; claim-gone is not there."""

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        if name == "claim-gone":
            raise NotFoundError("not found", 404)
        result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
        return {
            "metadata": {"namespace": namespace, "name": name, "uid": UID},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }

    def write_event(self, involved: dict[str, Any], reason: str, message: str, *, host: str = "") -> None:
        """No events are asked for here."""


def _recovered_state(tmp_path: Path) -> DeviceState:
    state = DeviceState(
        DRIVER,
        NODE,
        inventory("h100x8"),
        CdiStore(tmp_path / "cdi", DRIVER),
        CheckpointStore(tmp_path / "checkpoint.json"),
    )
    state.recover()
    return state


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_prepare_and_unprepare_count_as_nvidias_driver_counts_them(tmp_path: Path) -> None:
    state = _recovered_state(tmp_path)
    told: list[str] = []
    dra = DraService(DRIVER, NODE, state, Claims(), on_prepared=lambda claim: told.append(claim.name))
    ops = {"driver": DRIVER, "operation": "prepare"}
    before = _value("nvidia_dra_requests_total", **ops)
    errors = _value("nvidia_dra_node_prepare_errors_total", driver=DRIVER, error_type="get_claim")

    ok = dra_pb2.Claim(namespace="team-a", name="claim-a", uid=UID)
    gone = dra_pb2.Claim(namespace="team-a", name="claim-gone", uid=UID)
    dra.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[ok, gone]), None)  # type: ignore[arg-type]

    assert _value("nvidia_dra_requests_total", **ops) == before + 1
    assert told == ["claim-a"], "only a claim prepared is told"
    assert _value("nvidia_dra_node_prepare_errors_total", driver=DRIVER, error_type="get_claim") == errors + 1
    assert _value("nvidia_dra_requests_inflight", **ops) == 0
    assert _value("nvidia_dra_request_duration_seconds_count", **ops) >= 1
    devices = {"node": NODE, "driver": DRIVER}
    assert _value("nvidia_dra_prepared_devices", **devices, device_type="gpu") == 1
    assert _value("nvidia_dra_prepared_devices", **devices, device_type="mig") == 0

    request = dra_pb2.NodeUnprepareResourcesRequest(claims=[ok])
    dra.NodeUnprepareResources(request, None)  # type: ignore[arg-type]
    assert _value("nvidia_dra_requests_total", driver=DRIVER, operation="unprepare") >= 1
    assert _value("nvidia_dra_prepared_devices", **devices, device_type="gpu") == 0


def test_the_in_flight_gauge_counts_the_claims_of_the_requests_being_answered(tmp_path: Path) -> None:
    state = _recovered_state(tmp_path)
    ops = {"driver": DRIVER, "operation": "prepare"}
    seen: list[float] = []
    dra = DraService(
        DRIVER, NODE, state, Claims(), on_prepared=lambda _: seen.append(_value(INFLIGHT, **ops))
    )
    ok = dra_pb2.Claim(namespace="team-a", name="claim-a", uid=UID)
    gone = dra_pb2.Claim(namespace="team-a", name="claim-gone", uid=UID)
    dra.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[ok, gone]), None)  # type: ignore[arg-type]
    # Read while the request's two claims were being answered, and once it was.
    assert seen == [2]
    assert _value(INFLIGHT, **ops) == 0
    assert dra.wait_idle(0)


INFLIGHT = "nvidia_dra_requests_inflight"


def test_prepare_and_unprepare_histograms_start_at_zero_for_each_result() -> None:
    # Born at zero, a first prepare (or failure) counts in rate(); born with it, it would not.
    metrics.start_request_series("example.com")
    counts = {
        (family.name, sample.labels["result"]): sample.value
        for family in metrics.REGISTRY.collect()
        if family.name in ("dra_gpu_node_prepare_seconds", "dra_gpu_node_unprepare_seconds")
        for sample in family.samples
        if sample.name.endswith("_count")
    }
    assert set(counts) == {
        (name, result)
        for name in ("dra_gpu_node_prepare_seconds", "dra_gpu_node_unprepare_seconds")
        for result in metrics.RESULTS
    }


def test_a_gpu_passed_through_counts_as_vfio() -> None:
    passed = PreparedDevice(("gpu",), NODE, "gpu-0", (), uuid="GPU-0", vfio_group=12)
    whole = PreparedDevice(("gpu",), NODE, "gpu-1", (), uuid="GPU-1")
    prepared = {UID: PreparedClaim(UID, "vms", "vm", (passed, whole))}
    metrics.PREPARED.follow(NODE, "vfio.example.com", lambda: prepared_counts(prepared))
    devices = {"node": NODE, "driver": "vfio.example.com"}
    assert _value("nvidia_dra_prepared_devices", **devices, device_type="vfio") == 1
    assert _value("nvidia_dra_prepared_devices", **devices, device_type="gpu") == 1
