"""Which gated ResourceSlice fields the API server keeps: the probe, the decision, the start-up log.

The answers below are what real API servers sent to the probe's dry-run creates
(kube-apiserver v1.34.12 with the harness's gates on and with them off, v1.37.2). The list-typed
attribute probe: 1.34.12 drops `ints` (an unknown field there, with a warning) and 1.37.2 with
DRAListTypeAttributes off drops it too, and both then refuse the attribute left without a value
(422); 1.37.2 with the gate on keeps it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from dra.core import versions
from dra.core.versions import ApiFeatures, ServerInfo, assumed_features, features, kept_fields, probe_slices
from dra.kubeletplugin.features import detect_features
from tests.unit.test_kube import Server, _client, _response

V134 = ServerInfo("v1.34.12", 34, ("v1", "v1beta2", "v1beta1", "v1alpha3"))
V137 = ServerInfo("v1.37.2", 37, ("v1",))
TAINT = {
    "key": "gpu.nvidia.com/probe",
    "value": "probe",
    "effect": "NoSchedule",
    "timeAdded": "2026-11-23T13:35:02Z",
}
COUNTERS = [{"name": "probe", "counters": {"memory": {"value": "1Gi"}}}]
DEVICES = [
    {"name": "taint", "taints": [TAINT]},
    {"name": "shared", "allowMultipleAllocations": True},
    {
        "name": "counters",
        "consumesCounters": [{"counterSet": "probe", "counters": {"memory": {"value": "1Gi"}}}],
    },
]


def _created(answer: dict[str, Any]) -> bytes:
    # The scripted server closes each connection: say so, or the client reuses it for the next POST.
    return _response(201, json.dumps(answer).encode()).replace(
        b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1
    )


def _refused() -> bytes:
    body = b'{"kind": "Status", "reason": "Invalid", "code": 422}'
    return _response(422, body).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)


def _answer(**spec: Any) -> dict[str, Any]:
    return {"kind": "ResourceSlice", "spec": {"driver": "gpu.nvidia.com", "nodeName": "n", **spec}}


KEPT_134 = _answer(devices=DEVICES, sharedCounters=COUNTERS)
DROPPED_134 = _answer(devices=[{"name": "taint"}, {"name": "shared"}, {"name": "counters"}])
KEPT_137 = [_answer(sharedCounters=COUNTERS), _answer(devices=DEVICES)]
LIST_KEPT = _answer(devices=[{"name": "list", "attributes": {"probe": {"ints": [0, 1]}}}])


def test_on_134_one_slice_carries_counters_and_devices_together() -> None:
    [[probe]] = probe_slices("gpu.nvidia.com", "n", 34)
    assert probe["metadata"] == {"generateName": "dra-gpu-feature-probe-"}
    assert probe["spec"]["pool"]["name"] == "n", "the only pool the chart's admission policy lets it write"
    assert probe["spec"]["sharedCounters"]
    assert len(probe["spec"]["devices"]) == 3


def test_from_135_the_counters_are_probed_in_a_slice_of_their_own() -> None:
    [[counters], [devices]] = probe_slices("gpu.nvidia.com", "n", 35)
    assert "devices" not in counters["spec"]
    assert counters["spec"]["sharedCounters"]
    assert "sharedCounters" not in devices["spec"]
    assert len(devices["spec"]["devices"]) == 3


def test_a_134_server_with_the_gates_on_keeps_every_feature() -> None:
    assert features(V134, kept_fields([KEPT_134])) == ApiFeatures(34, True, True, True)


def test_a_134_server_with_the_gates_off_drops_them_all() -> None:
    found = features(V134, kept_fields([DROPPED_134]))
    assert found == ApiFeatures(34, False, False, False)
    assert found.counters_in_own_slice is False


def test_a_137_server_keeps_every_feature_across_its_two_slices() -> None:
    found = features(V137, kept_fields(KEPT_137))
    assert found == ApiFeatures(37, True, True, True)
    assert found.counters_in_own_slice


def test_list_typed_attributes_are_probed_in_a_slice_of_their_own() -> None:
    probe = versions.list_probe_slice("gpu.nvidia.com", "n")
    assert probe["spec"]["pool"]["name"] == "n"
    assert probe["spec"]["devices"] == [{"name": "list", "attributes": {"probe": {"ints": [0, 1]}}}]
    assert features(V137, kept_fields([*KEPT_137, LIST_KEPT])).list_attributes
    assert not features(V137, kept_fields(KEPT_137)).list_attributes


def test_counters_need_both_the_sets_and_the_devices_consuming_them() -> None:
    assert not features(V137, kept_fields([KEPT_137[1]])).partitionable_devices


def test_without_an_answer_only_what_no_gate_turns_off_is_assumed() -> None:
    assert assumed_features(V134) == ApiFeatures(34, False, False, False)
    assert assumed_features(V137) == ApiFeatures(37, False, True, False), "DeviceTaints is GA in 1.37"


def test_each_missing_feature_names_its_gate() -> None:
    lines = versions.missing(ApiFeatures(34, True, False, True))
    assert lines == [
        "the API server drops device taints from ResourceSlices (feature gate DRADeviceTaints off): the "
        "driver does without them; turn DRADeviceTaints on (API server, scheduler, controller manager, "
        "kubelet) to use them",
        "the API server drops list-typed attributes from ResourceSlices (feature gate "
        "DRAListTypeAttributes off): the driver does without them; turn DRAListTypeAttributes on "
        "(API server, scheduler) to use them",
    ]


@pytest.mark.anyio
async def test_the_plugin_logs_once_per_missing_feature_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = Server([_created(DROPPED_134)], [_refused()])
    async with _client(tmp_path, server) as client:
        with caplog.at_level(logging.INFO, logger="dra.kubeletplugin.features"):
            found = await detect_features(client, V134, "gpu.nvidia.com", "n")
    assert found == ApiFeatures(34, False, False, False)
    assert all(
        r.startswith(b"POST /apis/resource.k8s.io/v1/resourceslices?dryRun=All ") for r in server.requests
    )
    assert len(server.requests) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(" (feature gate ")[1].split(" ")[0] for w in warnings] == [
        "DRAPartitionableDevices",
        "DRADeviceTaints",
        "DRAConsumableCapacity",
        "DRAListTypeAttributes",
    ]


@pytest.mark.anyio
async def test_a_137_server_is_asked_three_times(tmp_path: Path) -> None:
    server = Server(*([_created(answer)] for answer in KEPT_137), [_refused()])
    async with _client(tmp_path, server) as client:
        assert await detect_features(client, V137, "gpu.nvidia.com", "n") == ApiFeatures(37, True, True, True)
    assert len(server.requests) == 3


@pytest.mark.anyio
async def test_a_137_server_with_list_typed_attributes_on_keeps_them(tmp_path: Path) -> None:
    server = Server(*([_created(answer)] for answer in [*KEPT_137, LIST_KEPT]))
    async with _client(tmp_path, server) as client:
        found = await detect_features(client, V137, "gpu.nvidia.com", "n")
    assert found == ApiFeatures(37, True, True, True, list_attributes=True)


@pytest.mark.anyio
async def test_a_refused_probe_falls_back_to_what_the_version_guarantees(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = Server([_response(403, b'{"message": "resourceslices is forbidden"}')])
    async with _client(tmp_path, server) as client:
        with caplog.at_level(logging.WARNING, logger="dra.kubeletplugin.features"):
            found = await detect_features(client, V137, "gpu.nvidia.com", "n")
    assert found == ApiFeatures(37, False, True, False)
    assert "resourceslices is forbidden" in caplog.text
    assert "assuming device taints" in caplog.text
