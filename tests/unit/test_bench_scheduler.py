"""The scheduler benchmark's pure parts: NVIDIA's captured slices written for each node, and the report."""

from __future__ import annotations

from typing import Any

import pytest

from dra.core.versions import ApiFeatures
from tests.bench import scheduler_profile
from tests.bench.bench_scheduler import (
    EXPERIMENTS,
    LAYOUTS,
    Result,
    beside_nvidia,
    node_slices,
    pool_complete,
    replicated,
    with_nvidia,
)


def _spec(index: int, of: int, generation: int = 3) -> dict[str, object]:
    return {
        "driver": "gpu.nvidia.com",
        "nodeName": "gpu-node-1",
        "pool": {"name": "gpu-node-1", "generation": generation, "resourceSliceCount": of},
        "devices": [{"name": f"gpu-{index}"}],
    }


def test_a_captured_pool_is_whole_when_every_slice_of_one_generation_is_there() -> None:
    assert pool_complete([_spec(0, 2), _spec(1, 2)])
    assert not pool_complete([_spec(0, 2)])
    assert not pool_complete([_spec(0, 2), _spec(1, 2, generation=4)])


def test_captured_slices_are_written_as_another_node_would_publish_them() -> None:
    captured = [_spec(0, 2), _spec(1, 2)]
    slices = replicated(captured, "gpu-node-0007", "uid-7")
    names = [s["metadata"]["name"] for s in slices]
    assert names == ["gpu-node-0007-gpu.nvidia.com-0", "gpu-node-0007-gpu.nvidia.com-1"]
    first = slices[0]
    assert first["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-0007", "uid": "uid-7", "controller": True}
    ]
    assert first["spec"]["nodeName"] == "gpu-node-0007"
    assert first["spec"]["pool"] == {"name": "gpu-node-0007", "generation": 1, "resourceSliceCount": 2}
    assert first["spec"]["devices"] == [{"name": "gpu-0"}]
    # The capture itself is left as it was, for the next node.
    assert captured[0]["nodeName"] == "gpu-node-1"


def test_nvidias_layout_is_the_same_node_and_workload_as_ours() -> None:
    ours, nvidia = LAYOUTS["dynamic-mig"], LAYOUTS["nvidia-dynamic-mig"]
    assert (nvidia.profile, nvidia.mix, nvidia.publisher) == (ours.profile, ours.mix, "nvidia")


def test_our_dynamic_mig_is_reported_beside_nvidias() -> None:
    ours = Result("dynamic-mig", 100, 11200, 400, 100, 100, 10.0, 2.0)
    nvidia = Result("nvidia-dynamic-mig", 100, 5600, 100, 100, 100, 5.0, 1.5)
    assert beside_nvidia(ours, nvidia) == (
        "100 nodes, dynamic MIG: dra-gpu 11200 devices in 400 slices, 10.0 pods/s; NVIDIA 5600 devices in "
        "100 slices, 20.0 pods/s; ratio dra-gpu / NVIDIA 0.50x, scheduler CPU per pod 1.33x"
    )


def test_our_dynamic_mig_always_runs_beside_nvidias() -> None:
    assert with_nvidia(["whole", "dynamic-mig"]) == ["whole", "dynamic-mig", "nvidia-dynamic-mig"]
    assert with_nvidia(["nvidia-dynamic-mig", "dynamic-mig"]) == ["nvidia-dynamic-mig", "dynamic-mig"]
    assert with_nvidia(["whole"]) == ["whole"]


def _entries(slices: list[dict[str, Any]], field: str) -> int:
    return sum(len(d.get(field) or []) for s in slices for d in s["spec"].get("devices") or [])


@pytest.mark.parametrize("minor", [34, 37])
@pytest.mark.parametrize("variant", list(scheduler_profile.VARIANTS))
def test_each_experiment_changes_one_thing_and_keeps_the_pool_whole(variant: str, minor: int) -> None:
    features = ApiFeatures(minor=minor, partitionable_devices=True)
    published = node_slices(LAYOUTS["dynamic-mig"], "gpu-node-0", "uid", features)
    changed = scheduler_profile.apply(variant, published)
    assert pool_complete([s["spec"] for s in changed])
    assert len({s["metadata"]["name"] for s in changed}) == len(changed)
    names = sorted(d["name"] for s in changed for d in s["spec"].get("devices") or [])
    assert names == sorted(d["name"] for s in published for d in s["spec"].get("devices") or [])
    same = {
        field: _entries(changed, field) == _entries(published, field)
        for field in ("attributes", "capacity", "consumesCounters")
    }
    assert same["capacity"] == (variant != "no-offer-capacity")
    assert same["consumesCounters"] == (variant != "no-counters")
    assert f"dynamic-mig~{variant}" in EXPERIMENTS
    assert f"nvidia-dynamic-mig~{variant}" in EXPERIMENTS


def test_the_scheduler_serves_its_profile_to_anonymous_requests_on_loopback_only() -> None:
    flags = scheduler_profile.pprof_flags(10259)
    assert "--secure-port=10259" in flags
    assert "--bind-address=127.0.0.1" in flags
    assert "--authorization-always-allow-paths=/healthz,/readyz,/livez,/debug/pprof/*" in flags
