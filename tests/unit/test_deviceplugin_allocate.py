"""What Allocate answers per strategy (dra.deviceplugin.allocate), and the plugin's CDI spec."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from dra.adapters.nodefiles import CdiStore
from dra.core import cdi
from dra.core.assignment import restrict
from dra.deviceplugin.allocate import Strategy, allocation_id, container_response, parse_strategies, uses_cdi
from dra.deviceplugin.daemon import DevicePluginSettings, keep_cdi_spec
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Inventory

DRIVER = "gpu.nvidia.com"
KIND = "k8s.gpu.nvidia.com/device"


@pytest.fixture
def inventory() -> Inventory:
    return discover(FakeGpuLibrary(load_profile("h100x8-mig"), "node-a"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cdi-cri", {Strategy.CDI_CRI}),
        ("cdi-annotations", {Strategy.CDI_ANNOTATIONS}),
        ("envvar", {Strategy.ENVVAR}),
        ("cdi-cri, envvar", {Strategy.CDI_CRI, Strategy.ENVVAR}),
    ],
)
def test_strategies(text: str, expected: set[Strategy]) -> None:
    assert parse_strategies(text) == expected
    assert uses_cdi(parse_strategies(text)) == (expected != {Strategy.ENVVAR})


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "expected cdi-cri"), ("volume-mounts", "expected cdi-cri"), ("cdi-cri,cdi-annotations", "one of")],
)
def test_bad_strategies(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_strategies(text)


def test_cdi_cri_names_devices_and_tells_the_hook_no_gpus(inventory: Inventory) -> None:
    devices = list(inventory.devices[:2])
    response = container_response(devices, frozenset({Strategy.CDI_CRI}), DRIVER, "nvidia.com/gpu")
    assert [c.name for c in response.cdi_devices] == [f"{KIND}={d.uuid}" for d in devices]
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "none"}
    assert dict(response.annotations) == {}
    assert list(response.devices) == []
    assert list(response.mounts) == []


def test_envvar_lists_exactly_the_allocated_uuids(inventory: Inventory) -> None:
    devices = [inventory.devices[3], inventory.devices[1]]
    response = container_response(devices, frozenset({Strategy.ENVVAR}), DRIVER, "nvidia.com/gpu")
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{devices[0].uuid},{devices[1].uuid}"}
    assert list(response.cdi_devices) == []


def test_cdi_and_envvar_together(inventory: Inventory) -> None:
    [device] = inventory.devices[:1]
    strategies = frozenset({Strategy.CDI_CRI, Strategy.ENVVAR})
    response = container_response([device], strategies, DRIVER, "nvidia.com/gpu")
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": device.uuid}
    assert [c.name for c in response.cdi_devices] == [f"{KIND}={device.uuid}"]


def test_cdi_annotations(inventory: Inventory) -> None:
    devices = [d for d in inventory if d.name.startswith("gpu-7-")][:2]
    strategies = frozenset({Strategy.CDI_ANNOTATIONS})
    response = container_response(devices, strategies, DRIVER, "nvidia.com/mig-1c.3g.20gb")
    [(key, value)] = response.annotations.items()
    assert key == "cdi.k8s.io/nvidia.com.mig-1c.3g.20gb_" + allocation_id([d.uuid for d in devices])
    assert value == ",".join(f"{KIND}={d.uuid}" for d in devices)
    assert list(response.cdi_devices) == []
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": "none"}


@pytest.mark.parametrize(
    ("plugin", "ident"),
    [
        ("nvidia.com/gpu", "0123456789abcdef"),
        ("x" * 80, "0123456789abcdef"),
        ("nvidia.com/gpu", "GPU-" + "a" * 36),
    ],
)
def test_annotation_keys_follow_the_cdi_rules(plugin: str, ident: str) -> None:
    key = cdi.annotation_key(plugin, ident)
    name = key.removeprefix("cdi.k8s.io/")
    assert key.startswith("cdi.k8s.io/")
    assert len(name) <= 63
    assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?", name)
    assert name.endswith("_" + ident)


def test_allocation_ids_ignore_order() -> None:
    assert allocation_id(["b", "a"]) == allocation_id(["a", "b"]) != allocation_id(["a"])


def test_device_spec_has_the_claim_specs_device_edits(inventory: Inventory) -> None:
    devices = list(inventory.devices[:3])
    spec = cdi.build_device_spec(DRIVER, devices, inventory)
    assert spec["kind"] == KIND
    assert [d["name"] for d in spec["devices"]] == [d.uuid for d in devices]
    claim = cdi.build_spec(DRIVER, "uid", devices, inventory)
    claim_var = f"{cdi.claim_env_key('uid')}=uid"
    # The same identity as in a claim spec, so a container reads its devices one way; no claim var.
    assert [d["containerEdits"] for d in spec["devices"]] == [
        {**d["containerEdits"], "env": [e for e in d["containerEdits"]["env"] if e != claim_var]}
        for d in claim["devices"]
    ]
    assert "containerEdits" not in spec, "fake GPUs have no control device nodes"
    assert cdi.qualified_device_name(DRIVER, devices[0]) == f"{KIND}={devices[0].uuid}"


def test_device_spec_carries_the_control_nodes(inventory: Inventory) -> None:
    with_nodes = replace(inventory, common_device_nodes=("/dev/nvidiactl", "/dev/nvidia-uvm"))
    spec = cdi.build_device_spec(DRIVER, list(with_nodes.devices[:1]), with_nodes)
    assert spec["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}]
    }


def test_device_spec_file_is_written_atomically_next_to_claim_specs(
    tmp_path: Path, inventory: Inventory
) -> None:
    store = CdiStore(tmp_path, DRIVER)
    path = store.write_device_spec(cdi.build_device_spec(DRIVER, list(inventory), inventory))
    assert path == tmp_path / "k8s.gpu.nvidia.com-device.json"
    assert json.loads(path.read_text())["kind"] == KIND
    mtime = path.stat().st_mtime_ns
    store.write_device_spec(cdi.build_device_spec(DRIVER, list(inventory), inventory))
    assert path.stat().st_mtime_ns == mtime, "unchanged content is not rewritten"
    assert store.claim_uids() == [], "the device spec is not mistaken for a claim spec"
    store.remove_leftovers()
    assert path.exists()
    assert [p.name for p in tmp_path.iterdir()] == [path.name], "no temporary file is left"


def _settings(cdi_root: Path, *strategies: Strategy) -> DevicePluginSettings:
    return DevicePluginSettings(
        node_name="node-a",
        driver_name=DRIVER,
        kubelet_root=cdi_root / "kubelet",
        device_plugin_dir=None,
        cdi_root=cdi_root,
        state_dir=None,
        strategies=frozenset(strategies or {Strategy.CDI_CRI}),
    )


def test_a_plugin_without_devices_removes_the_spec_an_earlier_configuration_left(
    tmp_path: Path, inventory: Inventory
) -> None:
    store = CdiStore(tmp_path, DRIVER)
    keep_cdi_spec(_settings(tmp_path), inventory)
    spec = tmp_path / "k8s.gpu.nvidia.com-device.json"
    assert {d["name"] for d in json.loads(spec.read_text())["devices"]} == {d.uuid for d in inventory}
    claim_spec = store.write("uid-1", cdi.build_spec(DRIVER, "uid-1", list(inventory)[:1], inventory))

    # Restarted with every GPU given to DRA: no device to describe, and the old spec names DRA's GPUs.
    keep_cdi_spec(_settings(tmp_path), restrict(inventory, []))
    assert not spec.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [claim_spec.name], "claim specs stay"
    keep_cdi_spec(_settings(tmp_path), restrict(inventory, []))  # nothing to remove is fine
    keep_cdi_spec(_settings(tmp_path, Strategy.ENVVAR), restrict(inventory, []))
    assert not spec.exists()


def test_the_envvar_strategy_writes_no_spec(tmp_path: Path, inventory: Inventory) -> None:
    keep_cdi_spec(_settings(tmp_path, Strategy.ENVVAR), inventory)
    assert list(tmp_path.iterdir()) == []
