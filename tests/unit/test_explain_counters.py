"""explain on dynamic-MIG slices: offers whose GPU's counters other claims used up are not free, and why."""

from __future__ import annotations

from typing import Any

from dra.core.slices import build_slices
from dra.core.versions import ApiFeatures
from dra.explain.report import explain_claim, render, standard_device_classes
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import parse_profile
from dra.gpu.discovery import discover
from dra.model.migmode import parse_mig_modes
from tests.unit.helpers import DRIVER, NODE


def _slices(minor: int) -> list[dict[str, Any]]:
    profile = parse_profile({"gpus": [{"model": "h100-sxm5-80gb", "mig": []}]}, "one-h100")
    inventory = discover(FakeGpuLibrary(profile, NODE), parse_mig_modes("dynamic"))
    return build_slices(
        inventory, DRIVER, NODE, None, 1, ApiFeatures(minor=minor, partitionable_devices=True)
    )


def _holding(*devices: str) -> dict[str, Any]:
    results = [{"request": "r", "driver": DRIVER, "pool": NODE, "device": d} for d in devices]
    return {
        "metadata": {"namespace": "team-a", "name": "other", "uid": "u-1"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def _claim(profile: str) -> dict[str, Any]:
    selector = f'device.attributes["{DRIVER}"].profile == "{profile}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team-b", "name": "wants-3g", "uid": "u-2"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": "mig.nvidia.com",
                            "selectors": [{"cel": {"expression": selector}}],
                        },
                    }
                ]
            }
        },
    }


def test_counter_exhaustion_says_how_much_is_left_and_what_is_needed() -> None:
    for minor in (34, 37):
        report = explain_claim(
            _claim("3g.40gb"),
            standard_device_classes(DRIVER),
            _slices(minor),
            [_holding("gpu-0-mig-4g40gb-at0", "gpu-0-mig-1g10gb-at4")],
        )
        [request] = report.requests
        shortages = {d.device: d.short_of for d in request.devices if d.matched}
        assert shortages == {
            "gpu-0-mig-3g40gb-at0": "gpu-0: 2 of 7 compute slices free; 3g.40gb needs 3",
            "gpu-0-mig-3g40gb-at4": "gpu-0: 2 of 7 compute slices free; 3g.40gb needs 3",
        }
        assert request.available == []
        assert (
            "waits for a free device (gpu-0: 2 of 7 compute slices free; 3g.40gb needs 3)"
            in request.verdict()
        )
        assert "(not free: gpu-0: 2 of 7 compute slices free; 3g.40gb needs 3)" in render(report)


def test_a_taken_memory_slice_is_named() -> None:
    report = explain_claim(
        _claim("1g.10gb"), standard_device_classes(DRIVER), _slices(34), [_holding("gpu-0-mig-3g40gb-at4")]
    )
    [request] = report.requests
    short = {d.device: d.short_of for d in request.devices if d.matched}
    assert short["gpu-0-mig-1g10gb-at5"] == "gpu-0: memory slice 5 is in use; 1g.10gb here needs it"
    assert short["gpu-0-mig-1g10gb-at0"] is None
    assert len(request.available) == 4
