"""The driver's user-space files: found under a driver root, mounted read-only by every CDI spec."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dra.core import cdi
from dra.gpu import driverfiles
from dra.gpu.driverfiles import find_driver_files
from dra.model.devices import DriverFile
from tests.unit.helpers import DRIVER, inventory

VERSION = "580.82.07"
UID = "0b4e2f7a-61c3-4a8e-9d55-2f0c1e9a7b10"


def _driver_install(root: Path) -> None:
    """Files as NVIDIA's .run installer lays them out on a Debian-style host."""
    libs = root / "usr/lib/x86_64-linux-gnu"
    libs.mkdir(parents=True)
    for stem in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        (libs / f"{stem}.so.{VERSION}").write_text("elf")
        (libs / f"{stem}.so.1").symlink_to(f"{stem}.so.{VERSION}")
    (libs / "libcuda.so").symlink_to("libcuda.so.1")  # the development link: not a SONAME
    (libs / "libnvidia-ml.so.470.1").write_text("an older driver's leftover")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("elf")
    (root / "usr/bin/nvidia-persistenced").write_text("elf")
    (root / f"lib/firmware/nvidia/{VERSION}").mkdir(parents=True)
    (root / "var/run/nvidia-persistenced").mkdir(parents=True)
    (root / "var/run/nvidia-persistenced/socket").write_text("")


def test_finds_libraries_binaries_firmware_and_sockets_of_the_running_version(tmp_path: Path) -> None:
    _driver_install(tmp_path)
    files = find_driver_files(VERSION, tmp_path)
    by_path = {f.container_path: f for f in files}
    assert sorted(by_path) == sorted(
        [
            f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}",
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            f"/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.{VERSION}",
            "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so.1",
            "/usr/bin/nvidia-smi",
            "/usr/bin/nvidia-persistenced",
            f"/lib/firmware/nvidia/{VERSION}",
            "/var/run/nvidia-persistenced/socket",
        ]
    )
    # The SONAME path gets the versioned file itself: no hook is there to make the link.
    assert by_path["/usr/lib/x86_64-linux-gnu/libcuda.so.1"].host_path == str(
        tmp_path / f"usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    )
    assert {f.kind for f in files} == {"library", "binary", "firmware", "ipc"}


def test_host_paths_are_the_runtimes_view_below_host_root(tmp_path: Path) -> None:
    # The daemon sees the host's / at host_root; the runtime on the host sees /run/nvidia/driver.
    _driver_install(tmp_path / "host/run/nvidia/driver")
    files = find_driver_files(VERSION, Path("/run/nvidia/driver"), host_root=tmp_path / "host")
    smi = next(f for f in files if f.container_path == "/usr/bin/nvidia-smi")
    assert smi == DriverFile("/run/nvidia/driver/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", "binary")


def test_a_node_without_the_driver_has_no_files(tmp_path: Path) -> None:
    assert find_driver_files(VERSION, tmp_path) == ()


def test_specs_mount_the_files_read_only_and_turn_the_hook_off(tmp_path: Path) -> None:
    _driver_install(tmp_path)
    inv = dataclasses.replace(inventory("h100x8"), driver_files=find_driver_files(VERSION, tmp_path))
    spec = cdi.build_spec(DRIVER, UID, [inv.devices[0]], inv)
    edits = spec["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    smi = next(m for m in edits["mounts"] if m["containerPath"] == "/usr/bin/nvidia-smi")
    assert smi == {
        "hostPath": str(tmp_path / "usr/bin/nvidia-smi"),
        "containerPath": "/usr/bin/nvidia-smi",
        "options": ["ro", "nosuid", "nodev", "bind"],
    }
    # The device plugin's spec carries the same files.
    assert cdi.build_device_spec(DRIVER, list(inv), inv)["containerEdits"]["mounts"] == edits["mounts"]


def test_without_driver_files_the_hook_still_brings_the_libraries() -> None:
    spec = cdi.build_spec(DRIVER, UID, [inventory("h100x8").devices[0]], inventory("h100x8"))
    assert spec["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=none"]}


def test_device_nodes_under_a_private_root_name_their_host_path() -> None:
    inv = dataclasses.replace(
        inventory("h100x8"), dev_root="/tmp/cluster/fakegpus/", common_device_nodes=("/dev/nvidiactl",)
    )
    gpu = dataclasses.replace(inv.devices[0], device_nodes=("/dev/nvidia0",))
    spec = cdi.build_spec(DRIVER, UID, [gpu], inv)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/tmp/cluster/fakegpus/dev/nvidia0"}
    ]
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl", "hostPath": "/tmp/cluster/fakegpus/dev/nvidiactl"}
    ]


def test_the_charts_mount_set_finds_every_file_and_shows_nothing_else(tmp_path: Path) -> None:
    # The host, with the driver installed and the kubelet's secrets beside it; the container's
    # view holds only what the chart mounts of it (FILE_DIRS and IPC_DIRS, bound at /host).
    host = tmp_path / "host"
    _driver_install(host)
    secrets = [host / "var/lib/kubelet/pki/kubelet-client-current.pem", host / "etc/shadow"]
    secrets.append(host / "var/lib/kubelet/pods/uid/volumes/kubernetes.io~secret/token/token")
    for secret in secrets:
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.write_text("secret")
    view = tmp_path / "container/host"
    for directory in (*driverfiles.FILE_DIRS, *driverfiles.IPC_DIRS):
        if (host / directory).exists():
            (view / directory).parent.mkdir(parents=True, exist_ok=True)
            (view / directory).symlink_to(host / directory)

    def seen(root: Path) -> list[tuple[str, str]]:
        return [(f.container_path, f.kind) for f in find_driver_files(VERSION, Path("/"), root)]

    assert seen(view) == seen(host)
    for secret in secrets:
        assert not (view / secret.relative_to(host)).exists()


def test_a_driver_root_of_bin_and_lib64_alone_is_found(tmp_path: Path) -> None:
    # GKE's installer layout, as a real H200 machine had it at /usr/local/nvidia (tests/data/real):
    # bin/, lib64/ with the SONAME links, firmware/nvidia/<version>, no usr/ at all.
    root = tmp_path / "usr/local/nvidia"
    (root / "lib64").mkdir(parents=True)
    for stem in ("libcuda", "libnvidia-ml"):
        (root / f"lib64/{stem}.so.{VERSION}").write_text("elf")
        (root / f"lib64/{stem}.so.1").symlink_to(f"{stem}.so.{VERSION}")
    (root / "bin").mkdir()
    (root / "bin/nvidia-smi").write_text("elf")
    (root / f"firmware/nvidia/{VERSION}").mkdir(parents=True)
    files = find_driver_files(VERSION, Path("/usr/local/nvidia"), tmp_path)
    # The libraries where CUDA images look for them (/lib64 is not on a Debian image's loader path).
    lib = "/usr/local/nvidia/lib64"
    assert {(f.container_path, f.host_path) for f in files} == {
        (f"{lib}/libcuda.so.{VERSION}", f"{lib}/libcuda.so.{VERSION}"),
        (f"{lib}/libcuda.so.1", f"{lib}/libcuda.so.{VERSION}"),
        (f"{lib}/libnvidia-ml.so.{VERSION}", f"{lib}/libnvidia-ml.so.{VERSION}"),
        (f"{lib}/libnvidia-ml.so.1", f"{lib}/libnvidia-ml.so.{VERSION}"),
        ("/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi"),
        (f"/lib/firmware/nvidia/{VERSION}", f"/usr/local/nvidia/firmware/nvidia/{VERSION}"),
    }


def test_nvml_is_the_driver_roots_own_library_where_it_has_one(tmp_path: Path) -> None:
    assert driverfiles.nvml_library(tmp_path) is None
    for directory in ("usr/lib", "usr/lib64"):
        (tmp_path / directory).mkdir(parents=True)
        (tmp_path / directory / "libnvidia-ml.so.550.54.15").touch()
        (tmp_path / directory / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.54.15")
    # The first of the directories a CDI spec's libraries come from, as NVIDIA's plugin searches its root.
    assert driverfiles.nvml_library(tmp_path) == tmp_path / "usr/lib64/libnvidia-ml.so.1"


def test_device_nodes_are_the_driver_roots_where_it_has_a_dev_of_its_own(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "run/nvidia/driver").mkdir(parents=True)
    assert driverfiles.device_root(Path("/run/nvidia/driver"), host) == "/"
    (host / "run/nvidia/driver/dev").mkdir()
    assert driverfiles.device_root(Path("/run/nvidia/driver"), host) == "/run/nvidia/driver"
    # The host's own / never counts as a driver root of its own, whatever it holds.
    assert driverfiles.device_root(Path("/"), host) == "/"
