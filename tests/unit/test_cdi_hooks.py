"""NVIDIA's container hooks in the CDI specs, and where the hook program comes from at start."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra.core import cdi
from dra.daemon import cdihook
from dra.model.devices import ContainerHook, DriverFile, Inventory
from tests.unit.helpers import DRIVER, inventory

VERSION = "580.95.05"
LIB = "/usr/lib/x86_64-linux-gnu"
ROOT = "/run/nvidia/driver"
HOOK = ContainerHook("/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook", VERSION)


def _library(stem: str, link: bool = True) -> list[DriverFile]:
    versioned = f"{ROOT}{LIB}/{stem}.so.{VERSION}"
    files = [DriverFile(versioned, f"{LIB}/{stem}.so.{VERSION}", "library")]
    if link:
        files.append(DriverFile(versioned, f"{LIB}/{stem}.so.1", "library"))
    return files


FILES = (
    *_library("libcuda"),
    *_library("libnvidia-ml"),
    *_library("libnvidia-nvvm", link=False),
    DriverFile(f"{ROOT}/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", "binary"),
    DriverFile(f"{ROOT}/lib/firmware/nvidia/{VERSION}", f"/lib/firmware/nvidia/{VERSION}", "firmware"),
)


def _node(hook: ContainerHook | None = HOOK) -> Inventory:
    return dataclasses.replace(inventory("h100x8"), driver_files=FILES, container_hook=hook)


def test_the_hooks_are_nvidias_in_its_order_with_its_arguments() -> None:
    edits = cdi.build_spec(DRIVER, "uid", [], _node())["containerEdits"]
    hooks = edits["hooks"]
    assert [h["args"][:2] for h in hooks] == [
        ["nvidia-cdi-hook", "create-symlinks"],
        ["nvidia-cdi-hook", "enable-cuda-compat"],
        ["nvidia-cdi-hook", "update-ldcache"],
        ["nvidia-cdi-hook", "disable-device-node-modification"],
    ]
    assert all(h["hookName"] == "createContainer" and h["path"] == HOOK.path for h in hooks)
    assert all(h["env"] == ["NVIDIA_CTK_DEBUG=false"] for h in hooks)
    assert hooks[0]["args"][2:] == [
        "--link",
        f"libcuda.so.1::{LIB}/libcuda.so",
        "--link",
        f"libcuda.so.{VERSION}::{LIB}/libcuda.so.1",
        "--link",
        f"libnvidia-ml.so.{VERSION}::{LIB}/libnvidia-ml.so.1",
    ]
    assert hooks[1]["args"][2:] == [f"--host-driver-version={VERSION}"]
    # One folder per folder of libraries, as first mounted.
    assert hooks[2]["args"][2:] == ["--folder", LIB]
    assert hooks[3]["args"][2:] == []


def test_with_the_hook_the_links_are_made_not_mounted() -> None:
    edits = cdi.build_spec(DRIVER, "uid", [], _node())["containerEdits"]
    mounted = [m["containerPath"] for m in edits["mounts"]]
    assert f"{LIB}/libcuda.so.{VERSION}" in mounted
    assert not [path for path in mounted if path.endswith(".so.1")]
    assert f"NVIDIA_CTK_LIBCUDA_DIR={LIB}" in edits["env"]


def test_without_a_hook_the_specs_mount_the_links_and_run_nothing() -> None:
    edits = cdi.build_spec(DRIVER, "uid", [], _node(None))["containerEdits"]
    assert "hooks" not in edits
    assert f"{LIB}/libcuda.so.1" in [m["containerPath"] for m in edits["mounts"]]
    assert not [e for e in edits["env"] if e.startswith("NVIDIA_CTK_")]


def test_the_device_plugins_spec_runs_the_same_hooks() -> None:
    node = _node()
    claim = cdi.build_spec(DRIVER, "uid", [], node)["containerEdits"]
    device = cdi.build_device_spec(DRIVER, list(node), node)["containerEdits"]
    assert device["hooks"] == claim["hooks"]


def test_the_toolkits_nvidia_ctk_serves_the_hooks_under_its_hook_command() -> None:
    hooks = cdi.driver_hooks(FILES, ContainerHook("/usr/bin/nvidia-ctk", VERSION))
    assert [h["args"][:3] for h in hooks][1] == ["nvidia-ctk", "hook", "enable-cuda-compat"]


def test_no_driver_files_no_hooks() -> None:
    node = dataclasses.replace(inventory("h100x8"), container_hook=HOOK)
    assert "hooks" not in cdi.build_spec(DRIVER, "uid", [], node)["containerEdits"]


# -- the program on the host ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    cdihook.install.cache_clear()
    yield
    cdihook.install.cache_clear()


def _program(directory: Path, body: bytes = b"#!/bin/sh\n") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / cdihook.PROGRAM
    program.write_bytes(body)
    program.chmod(0o755)
    return program


def test_the_images_hook_is_copied_into_the_plugin_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _program(tmp_path / "bin", b"#!/bin/sh\nexit 0\n")
    monkeypatch.setenv("PATH", str(source.parent))
    plugin = tmp_path / "plugins" / DRIVER
    assert cdihook.install(plugin) == str(plugin / cdihook.PROGRAM)
    copied = plugin / cdihook.PROGRAM
    assert copied.read_bytes() == source.read_bytes()
    assert os.access(copied, os.X_OK)


def test_the_nodes_own_hook_is_used_where_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    host = tmp_path / "host"
    _program(host / "usr/bin")
    assert (
        cdihook.install(tmp_path / "plugin", Path("/usr/bin/nvidia-cdi-hook"), host)
        == "/usr/bin/nvidia-cdi-hook"
    )
    assert not (tmp_path / "plugin").exists()


def test_without_a_hook_one_warning_says_what_will_not_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    caplog.set_level(logging.WARNING)
    assert cdihook.install(tmp_path / "plugin") is None
    assert cdihook.install(tmp_path / "plugin") is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "ldconfig -p" in warnings[0]
    assert "forward compatibility" in warnings[0]


def test_a_missing_node_hook_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert cdihook.install(tmp_path / "plugin", Path("/nowhere/nvidia-cdi-hook"), tmp_path) is None
    assert "--nvidia-cdi-hook-path=/nowhere/nvidia-cdi-hook: no executable file there" in caplog.text
