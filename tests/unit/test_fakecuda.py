"""The fake CUDA driver (deploy/local/fakenvml/fakecuda.c) as a program loads it: by SONAME, then
the driver API's enumeration, in a private /dev holding only the nodes a container would have."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fakenvml.fakecuda import SONAME, ensure_fake_cuda, install_driver_libraries
from localcluster.cudaimages import PROBE_SOURCE

from dra.fakegpus import node as fakegpus
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Inventory, MigDevice
from tests.unit.helpers import NODE

PROFILE = "h100x8-mig"
PRODUCT = "NVIDIA H100 80GB HBM3"


def _root(tmp_path: Path) -> tuple[Path, Inventory]:
    """A fake GPU root with the ELF libraries, made as the daemon makes it; its GPUs."""
    root = tmp_path / "fake"
    install_driver_libraries(root / fakegpus.LIBRARIES)
    fakegpus.fake_gpu_library(PROFILE, NODE, fake_gpu_root=root)
    return root, discover(FakeGpuLibrary(load_profile(PROFILE), NODE, root=root))


def _probe(tmp_path: Path, root: Path, dev_paths: list[str]) -> subprocess.CompletedProcess[str]:
    """cudaprobe with only these of the fake nodes as /dev and the driver root's nvidia-smi in /usr/bin."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("gcc") is None:
        pytest.skip("needs root, unshare(1) for a private /dev and gcc")
    probe = tmp_path / "cudaprobe"
    subprocess.run(["gcc", "-O2", "-o", str(probe), str(PROBE_SOURCE), "-ldl"], check=True)
    dev, usr_bin = tmp_path / "container-dev", tmp_path / "container-bin"
    for path in dev_paths:
        target = dev / path.removeprefix("/dev/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("")
    usr_bin.mkdir()
    shutil.copy2(root / fakegpus.DRIVER_ROOT / "usr/bin/nvidia-smi", usr_bin / "nvidia-smi")
    libs = root / fakegpus.DRIVER_ROOT / fakegpus.LIBRARY_DIR
    setup = f'mount --bind "{dev}" /dev && mount --bind "{usr_bin}" /usr/bin && exec "{probe}"'
    return subprocess.run(
        ["unshare", "--mount", "--fork", "sh", "-c", setup],
        env={"LD_LIBRARY_PATH": str(libs)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_driver_libraries_are_elf_objects_with_their_sonames(tmp_path: Path) -> None:
    root, _ = _root(tmp_path)
    libs = root / fakegpus.DRIVER_ROOT / fakegpus.LIBRARY_DIR
    version = load_profile(PROFILE).driver_version
    for stem in fakegpus.STAND_IN_LIBRARIES:
        library = libs / f"{stem}.so.{version}"
        assert library.read_bytes()[:4] == b"\x7fELF"
        dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True)
        assert f"Library soname: [{stem}.so.1]" in dynamic.stdout
    assert ensure_fake_cuda().name == SONAME


def test_cuda_lists_exactly_the_gpus_and_mig_devices_whose_nodes_the_process_has(tmp_path: Path) -> None:
    root, inventory = _root(tmp_path)
    gpu1, mig = inventory.get("gpu-1"), inventory.get("gpu-4-mig-1g10gb-3-0")
    assert gpu1 is not None
    assert isinstance(mig, MigDevice)
    result = _probe(tmp_path, root, ["/dev/nvidiactl", *gpu1.device_nodes, *mig.device_nodes])
    assert result.returncode == 0, result.stderr + result.stdout
    lines = result.stdout.splitlines()
    assert "cuDriverGetVersion: 12040" in lines
    assert "cuDeviceGetCount: 2" in lines
    assert lines[-2:] == [
        f"device 0: {gpu1.uuid} {gpu1.memory_bytes} {PRODUCT}",
        f"device 1: {mig.uuid} {mig.memory_bytes} {PRODUCT} MIG 1g.10gb",
    ]


def test_a_mig_gpu_without_its_instances_nodes_is_no_cuda_device(tmp_path: Path) -> None:
    root, inventory = _root(tmp_path)
    mig = inventory.get("gpu-4-mig-1g10gb-3-0")
    assert isinstance(mig, MigDevice)
    result = _probe(tmp_path, root, ["/dev/nvidiactl", mig.device_nodes[0]])
    assert result.returncode == 1
    assert "cuInit: 100" in result.stdout.splitlines()


def test_without_the_control_node_there_is_no_device(tmp_path: Path) -> None:
    root, inventory = _root(tmp_path)
    gpu = inventory.get("gpu-0")
    assert gpu is not None
    result = _probe(tmp_path, root, list(gpu.device_nodes))
    assert "cuInit: 100" in result.stdout.splitlines()
