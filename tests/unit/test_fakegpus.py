"""Fake GPUs made visible to real containers: device nodes, a stand-in driver, a fake nvidia-smi."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.core import cdi
from dra.daemon.bootstrap import DaemonSettings, gpu_library, node_inventory
from dra.fakegpus import node as fakegpus
from dra.fakegpus.profiles import load_profile
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation, ClaimError
from dra.model.devices import Inventory, MigDevice
from dra.model.migmode import parse_mig_modes
from tests.skips import Lack, reason
from tests.unit.helpers import DRIVER, NODE

UID = "0b4e2f7a-61c3-4a8e-9d55-2f0c1e9a7b10"


def _settings(root: Path, profile: str = "h100x8-mig", **extra: object) -> DaemonSettings:
    return DaemonSettings(
        driver_name=DRIVER,
        node_name=NODE,
        kubelet_root=root / "kubelet",
        cdi_root=root / "cdi",
        state_dir=None,
        fake_gpus=profile,
        fake_gpu_root=root / "fake",
        **extra,  # type: ignore[arg-type]
    )


def _inventory(root: Path, profile: str = "h100x8-mig", **extra: object) -> Inventory:
    settings = _settings(root, profile, **extra)
    lib = gpu_library(settings.fake_gpus, NODE, fake_gpu_root=settings.fake_gpu_root)
    return node_inventory(lib, settings)


def _char(path: Path) -> tuple[int, int]:
    st = path.lstat()
    assert stat.S_ISCHR(st.st_mode), path
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def test_every_gpu_and_mig_device_gets_its_nodes_with_nvidias_numbers(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    dev = tmp_path / "fake/dev"
    assert _char(dev / "nvidia0") == (195, 0)
    assert _char(dev / "nvidiactl") == (195, 255)
    assert inv.dev_root == str(tmp_path / "fake")
    assert inv.common_device_nodes == ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    mig = inv.get("gpu-4-mig-3g40gb-1-0")
    assert isinstance(mig, MigDevice)
    # GPU 4, GPU instance 1: the minors the driver's mig-minors file gives (3 + 4*135 + 9, + 1).
    assert mig.device_nodes == (
        "/dev/nvidia4",
        "/dev/nvidia-caps/nvidia-cap552",
        "/dev/nvidia-caps/nvidia-cap553",
    )
    assert _char(dev / "nvidia-caps/nvidia-cap552") == (fakegpus.CAPS_MAJOR, 552)


def test_specs_point_at_the_private_nodes_and_mount_the_stand_in_driver(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    gpu = inv.get("gpu-0")
    assert gpu is not None
    spec = cdi.build_spec(DRIVER, UID, [gpu], inv)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": str(tmp_path / "fake/dev/nvidia0")}
    ]
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    root = tmp_path / "fake/driver-root"
    version = load_profile("h100x8-mig").driver_version
    assert mounts == {
        "/usr/bin/nvidia-smi": str(root / "usr/bin/nvidia-smi"),
        f"/usr/lib/x86_64-linux-gnu/libcuda.so.{version}": str(
            root / f"usr/lib/x86_64-linux-gnu/libcuda.so.{version}"
        ),
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1": str(
            root / f"usr/lib/x86_64-linux-gnu/libcuda.so.{version}"
        ),
        f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}": str(
            root / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}"
        ),
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1": str(
            root / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}"
        ),
    }
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"]


def test_cdi_driver_files_false_keeps_the_hooks_job(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, cdi_driver_files=False)
    assert inv.driver_files == ()
    spec = cdi.build_spec(DRIVER, UID, [inv.devices[0]], inv)
    assert "mounts" not in spec["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=none" in spec["containerEdits"]["env"]


def test_making_the_root_again_changes_nothing(tmp_path: Path) -> None:
    _inventory(tmp_path)
    smi = tmp_path / "fake/driver-root/usr/bin/nvidia-smi"
    before = smi.stat().st_ino, (tmp_path / "fake/dev/nvidia0").stat().st_ino
    _inventory(tmp_path)
    assert (smi.stat().st_ino, (tmp_path / "fake/dev/nvidia0").stat().st_ino) == before


def _nvidia_smi(tmp_path: Path, root: Path, dev_paths: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the fake nvidia-smi -L with only these of the fake nodes as /dev, as in a container."""
    if os.geteuid() != 0:
        pytest.skip(reason(Lack.ROOT, "a private /dev is a mount namespace"))
    if shutil.which("unshare") is None:
        pytest.skip(reason(Lack.TOOL, "needs unshare(1) for a private /dev"))
    dev = tmp_path / "container-dev"
    dev.mkdir()
    for path in dev_paths:
        target = dev / path.removeprefix("/dev/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("")  # the script looks at presence, as the real one looks at what it can open
    script = root / "driver-root/usr/bin/nvidia-smi"
    return subprocess.run(
        ["unshare", "--mount", "--fork", "sh", "-c", f'mount --bind "{dev}" /dev && exec sh "{script}" -L'],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_nvidia_smi_lists_exactly_the_gpus_and_mig_devices_the_container_has(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    gpu1, mig = inv.get("gpu-1"), inv.get("gpu-4-mig-1g10gb-3-0")
    assert gpu1 is not None
    assert isinstance(mig, MigDevice)
    result = _nvidia_smi(
        tmp_path, tmp_path / "fake", ["/dev/nvidiactl", *gpu1.device_nodes, *mig.device_nodes]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {gpu1.uuid})",
        f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {mig.parent.uuid})",
        f"  MIG 1g.10gb     Device  0: (UUID: {mig.uuid})",
    ]


def test_nvidia_smi_without_the_driver_nodes_fails_like_the_real_one(tmp_path: Path) -> None:
    _inventory(tmp_path)
    result = _nvidia_smi(tmp_path, tmp_path / "fake", [])
    assert result.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in result.stderr


def test_prepare_refuses_a_spec_naming_a_node_that_is_gone(tmp_path: Path) -> None:
    inv = _inventory(tmp_path)
    state = DeviceState(
        DRIVER, NODE, inv, CdiStore(tmp_path / "cdi", DRIVER), CheckpointStore(tmp_path / "cp.json")
    )
    (tmp_path / "fake/dev/nvidia2").unlink()  # lost after discovery
    allocation = ClaimAllocation(
        uid=UID, namespace="team-a", name="train", devices=(AllocatedDevice("gpu", NODE, "gpu-2"),)
    )
    with pytest.raises(ClaimError) as err:
        state.prepare(allocation)
    assert str(err.value) == (
        f"cannot prepare ResourceClaim team-a/train: its CDI spec would name {tmp_path}/fake/dev/nvidia2, "
        "not on this node (a GPU or the driver changed since discovery)"
    )
    assert not (tmp_path / "cdi").exists() or not list((tmp_path / "cdi").iterdir())
    # The other GPUs still prepare.
    other = replace(
        allocation, uid=UID.replace("0b4e", "1b4e"), devices=(AllocatedDevice("gpu", NODE, "gpu-1"),)
    )
    assert [d.device for d in state.prepare(other).devices] == ["gpu-1"]


def test_a_dynamic_mig_device_made_after_start_gets_its_nodes_and_prepares(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "h100x8-dynamic-mig", mig_modes=parse_mig_modes("dynamic"))
    lib = gpu_library(
        settings.fake_gpus, NODE, state_dir=tmp_path / "state", fake_gpu_root=settings.fake_gpu_root
    )
    inv = node_inventory(lib, settings)
    state = DeviceState(
        DRIVER, NODE, inv, CdiStore(tmp_path / "cdi", DRIVER), CheckpointStore(tmp_path / "cp.json"), lib
    )
    allocation = ClaimAllocation(
        uid=UID,
        namespace="team-a",
        name="train",
        devices=(AllocatedDevice("mig", NODE, "gpu-0-mig-3g40gb-at4"),),
    )
    # Before, the new instance's capability nodes appeared only when the driver restarted.
    [device] = state.prepare(allocation).devices
    [made] = state.inventory.instances
    assert made.uuid == device.uuid
    assert len(made.device_nodes) == 3
    for node in made.device_nodes:
        assert _char(tmp_path / "fake" / node.lstrip("/"))[0] in (195, fakegpus.CAPS_MAJOR)
