"""Following device changes after start-up: only the GPUs this path was given."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from dra.core.assignment import restrict
from dra.daemon.health import HealthTracker
from dra.daemon.rediscovery import Rediscovery
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import parse_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.daemon import PluginSettings
from dra.model.devices import Inventory

SETTINGS = PluginSettings(
    driver_name="gpu.nvidia.com",
    node_name="node-a",
    kubeconfig=None,
    kubelet_root=Path("/var/lib/kubelet"),
    cdi_root=Path("/var/run/cdi"),
    state_dir=None,
    fake_gpus=None,
    fake_gpu_events=None,
    http_address=None,
)


def _inventory(*gpus: Mapping[str, object]) -> Inventory:
    return discover(FakeGpuLibrary(parse_profile({"gpus": list(gpus)}, "test"), "node-a"))


SMALL = {"model": "a100-sxm4-40gb", "mig": ["1g.5gb"] * 7}
LARGE = {"model": "a100-sxm4-40gb", "mig": ["7g.40gb"]}
T4 = {"model": "t4"}


def test_nothing_changed_is_none() -> None:
    follow = Rediscovery(SETTINGS, _inventory(SMALL, T4))
    assert follow.follow(_inventory(SMALL, T4)) is None


def test_a_new_mig_layout_replaces_the_devices() -> None:
    follow = Rediscovery(SETTINGS, _inventory(SMALL, T4))
    changed = follow.follow(_inventory(LARGE, T4))
    assert changed is not None
    assert [d.name for d in changed] == ["gpu-0-mig-7g40gb-1-0", "gpu-1"]
    assert follow.follow(_inventory(LARGE, T4)) is None


def test_withheld_gpus_come_back_with_the_next_discovery() -> None:
    """A MIG layout changed a GPU and it could not be read again: none of its old devices is offered."""
    follow = Rediscovery(SETTINGS, _inventory(SMALL, T4))
    small = follow.current.gpus[0]
    assert [d.name for d in follow.withhold([small.uuid])] == ["gpu-1"]
    changed = follow.follow(_inventory(LARGE, T4))
    assert changed is not None
    assert [d.name for d in changed] == ["gpu-0-mig-7g40gb-1-0", "gpu-1"]


def test_a_gpu_not_given_at_start_is_reported_once_and_not_taken(caplog: pytest.LogCaptureFixture) -> None:
    follow = Rediscovery(SETTINGS, _inventory(T4))
    caplog.set_level(logging.WARNING)
    assert follow.follow(_inventory(T4, T4)) is None
    assert follow.follow(_inventory(T4, T4)) is None
    assert [r.getMessage() for r in caplog.records if "appeared after start-up" in r.getMessage()] == [
        f"GPU 1 ({_inventory(T4, T4).gpus[1].uuid}) appeared after start-up: restart the driver to assign it"
    ]


def test_gpus_given_to_the_other_path_at_start_are_not_reported_as_new(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """--dra-gpus 0 --device-plugin-gpus 1: GPU 1 was there at start, on the other path."""
    node = _inventory(T4, T4)
    follow = Rediscovery(SETTINGS, restrict(node, node.gpus[:1]), everything=node)
    caplog.set_level(logging.WARNING)
    assert follow.follow(_inventory(T4, T4)) is None
    later = _inventory(T4, T4, T4)
    assert follow.follow(later) is None
    assert [r.getMessage() for r in caplog.records if "appeared after start-up" in r.getMessage()] == [
        f"GPU 2 ({later.gpus[2].uuid}) appeared after start-up: restart the driver to assign it"
    ]


def test_health_follows_the_inventory() -> None:
    tracker = HealthTracker(_inventory(SMALL, T4))
    tracker.mark_unhealthy(["gpu-1"], "XID 79")
    tracker.set_inventory(_inventory(LARGE, T4))
    health = tracker.snapshot()
    assert sorted(health) == ["gpu-0-mig-7g40gb-1-0", "gpu-1"]
    assert not health["gpu-1"].healthy
    assert health["gpu-0-mig-7g40gb-1-0"].healthy


def test_renumbered_gpus_are_not_followed(caplog: pytest.LogCaptureFixture) -> None:
    """A GPU leaving the bus shifts the indexes of those after it: names would point at other GPUs."""
    three = _inventory(T4, T4, T4)
    follow = Rediscovery(SETTINGS, three)
    shifted = Inventory(
        devices=tuple(replace(g, name=f"gpu-{i}", index=i) for i, g in enumerate(three.gpus[1:])),
        driver_version=three.driver_version,
        cuda_driver_version=three.cuda_driver_version,
        gpus=tuple(replace(g, name=f"gpu-{i}", index=i) for i, g in enumerate(three.gpus[1:])),
    )
    caplog.set_level(logging.ERROR)
    assert follow.follow(shifted) is None
    assert "GPU indexes changed" in caplog.text
    assert follow.current == three


def test_a_held_gpu_joins_when_released_and_leaves_when_held_again() -> None:
    start = _inventory(SMALL, T4)
    t4 = start.gpus[1].uuid
    follow = Rediscovery(SETTINGS, start, held={t4})
    assert [g.uuid for g in follow.current.gpus] == [start.gpus[0].uuid]
    assert follow.follow(_inventory(SMALL, T4), held={t4}) is None
    joined = follow.follow(_inventory(SMALL, T4))
    assert joined is not None
    assert "gpu-1" in {d.name for d in joined}
    left = follow.follow(_inventory(SMALL, T4), held={t4})
    assert left is not None
    assert "gpu-1" not in {d.name for d in left}


def test_a_gpu_passed_through_stays_while_nvml_cannot_see_it() -> None:
    """Bound to vfio-pci, the last GPU leaves NVML's view; the claim holding it keeps it published."""
    follow = Rediscovery(SETTINGS, _inventory(T4, T4))
    passed = follow.current.gpus[1].uuid
    without = _inventory(T4)
    assert without.gpus[0].uuid == follow.current.gpus[0].uuid
    assert follow.follow(without, kept={passed}) is None
    changed = follow.follow(without)
    assert changed is not None
    assert [d.name for d in changed] == ["gpu-0"]


def test_nvml_losing_a_gpu_passed_through_is_not_a_health_problem() -> None:
    inv = _inventory(T4, T4)
    tracker = HealthTracker(inv)
    tracker.passed_through = lambda: {inv.gpus[1].uuid}
    assert tracker.mark_gpus_unhealthy([g.uuid for g in inv.gpus], "GPU is lost") == ["gpu-0"]
