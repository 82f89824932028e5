"""The NVIDIA driver's user-space files a GPU container needs, found under a driver root.

NVIDIA's CDI generator (nvidia-ctk cdi generate) mounts, besides the device
nodes, what a CUDA program and nvidia-smi load from the driver: the
libraries of the driver's version (libcuda, libnvidia-ml, the PTX JIT and
NVVM compilers, ...), a few binaries (nvidia-smi, nvidia-debugdump,
nvidia-persistenced, the MPS control daemon and server), the GSP firmware of
that version and the IPC sockets of the persistence daemon, the fabric
manager and MPS. This module looks for the same names; what the node lacks is
left out, so a spec never names a file that is not there.

Libraries are looked up as ``<name>.so.<driver version>`` in the usual library
directories rather than through the ld cache (reading /etc/ld.so.cache is
NVIDIA's way; the driver installers put the files in one of these
directories). Each is mounted at its own path and, where the host has one, at
its SONAME link (libcuda.so.1): NVIDIA's generator creates that link with a
hook, as the specs do where NVIDIA's nvidia-cdi-hook is there (dra.core.cdi.driver_hooks), and
without a hook the mount is what lets a program find it.

``driver_root`` is the root as the container runtime sees it (``/``, or e.g.
/run/nvidia/driver for a containerised driver); ``host_root`` is where this
process sees the host's / (the daemon's --host-root).
"""

from __future__ import annotations

import os
from pathlib import Path

from dra.model.devices import DriverFile

#: Library stems NVIDIA's generator mounts for compute and utility (graphics stacks left out).
LIBRARIES = (
    "libcuda",
    "libcudadebugger",
    "libnvidia-cfg",
    "libnvidia-gpucomp",
    "libnvidia-ml",
    "libnvidia-nvvm",
    "libnvidia-opencl",
    "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3",
    "libnvidia-ptxjitcompiler",
    "libnvidia-allocator",
)
#: Where distributions and NVIDIA's installer put the driver's libraries (x86-64 and arm64); last,
#: lib64 of a driver root laid out as bin and lib64 alone (GKE's installer, seen at /usr/local/nvidia
#: on a real H200 machine: tests/data/real/README.md), where none of the others exists.
LIBRARY_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib64",
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
BINARY_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
#: Where the GSP firmware of each driver version is (a directory named after the version).
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia", "firmware/nvidia")
#: The directories of the daemons' sockets and the MPS pipe directory.
IPC_DIRS = ("var/run/nvidia-persistenced", "var/run/nvidia-fabricmanager", "tmp/nvidia-mps")
#: The daemons' sockets and the MPS pipe directory, as NVIDIA's generator lists them.
IPC_PATHS = (f"{IPC_DIRS[0]}/socket", f"{IPC_DIRS[1]}/socket", IPC_DIRS[2])
#: The directories the chart mounts of a host install's root (the host's /, which mounted whole would
#: show the plugin the kubelet's credentials and every pod's volumes): libraries, binaries and firmware
#: live under these four on every distribution (merged /usr or not); IPC_DIRS are mounted one by one.
#: Any other driver root is the driver's own and mounted whole, which lib64 and firmware/nvidia need.
FILE_DIRS = ("usr", "lib", "bin", "sbin")
#: The lookups only a driver root of the driver's own has (not mounted from the host's /), and where a
#: container gets what they hold: a Debian or Ubuntu image's loader never
#: searches /lib64, while CUDA images search /usr/local/nvidia/lib64 (GKE's place for the driver's
#: libraries, on LD_LIBRARY_PATH and in ld.so.conf.d of nvidia/cuda images); firmware where
#: NVIDIA's generator puts it.
CONTAINER_DIRS = {"lib64": "usr/local/nvidia/lib64", "firmware/nvidia": "lib/firmware/nvidia"}


def device_root(driver_root: Path, host_root: Path = Path("/")) -> str:
    """Where the GPUs' device nodes are on the host: the driver root when it has a dev/ of its own (a
    containerised driver's), else /, as NVIDIA's plugin decides (host_root: where this process sees /)."""
    if str(driver_root) != "/" and (host_root / str(driver_root).lstrip("/") / "dev").is_dir():
        return str(driver_root)
    return "/"


def nvml_library(root: Path) -> Path | None:
    """The driver's libnvidia-ml.so.1 under root (the driver root as this process sees it), if it has one.

    NVIDIA's plugin loads NVML from its driver root the same way, so that a node needs no container
    toolkit to hand the plugin the library; None leaves the choice to the dynamic loader.
    """
    for directory in LIBRARY_DIRS:
        candidate = root / directory / "libnvidia-ml.so.1"
        if candidate.exists():
            return candidate
    return None


def find_driver_files(
    driver_version: str, driver_root: Path = Path("/"), host_root: Path = Path("/")
) -> tuple[DriverFile, ...]:
    """The driver files of this version present under driver_root (looked up below host_root)."""
    seen = _Finder(driver_root, host_root)
    for stem in LIBRARIES:
        seen.library(stem, driver_version)
    for name in BINARIES:
        seen.first(name, BINARY_DIRS, "binary")
    seen.first(driver_version, FIRMWARE_DIRS, "firmware")
    for ipc in IPC_PATHS:
        seen.add(ipc, "ipc")
    return tuple(seen.files)


class _Finder:
    def __init__(self, driver_root: Path, host_root: Path) -> None:
        self.driver_root = driver_root
        self.host_root = host_root
        self.files: list[DriverFile] = []
        self._containers: set[str] = set()

    def _local(self, relative: str) -> Path:
        # Where this process sees <driver root>/<relative> of the host.
        return self.host_root / str(self.driver_root).lstrip("/") / relative

    def add(self, relative: str, kind: str, host_relative: str | None = None) -> bool:
        """Record <driver root>/<host_relative> mounted at /<relative>, if it exists."""
        source = host_relative or relative
        container = "/" + relative
        if container in self._containers or not os.path.lexists(self._local(source)):
            return False
        self._containers.add(container)
        host = str(self.driver_root / source)
        self.files.append(DriverFile(host_path=host, container_path=container, kind=kind))
        return True

    def first(self, name: str, directories: tuple[str, ...], kind: str) -> None:
        for directory in directories:
            inside = CONTAINER_DIRS.get(directory, directory)
            if self.add(f"{inside}/{name}", kind, f"{directory}/{name}"):
                return

    def library(self, stem: str, version: str) -> None:
        for directory in LIBRARY_DIRS:
            inside = CONTAINER_DIRS.get(directory, directory)
            versioned = f"{directory}/{stem}.so.{version}"
            if not self.add(f"{inside}/{stem}.so.{version}", "library", versioned):
                continue
            # The SONAME link (libcuda.so.1 -> libcuda.so.<version>) gets the file itself.
            for link in sorted(self._local(directory).glob(f"{stem}.so.*")):
                # Read the link rather than resolve it: an absolute target would resolve outside host_root.
                if link.is_symlink() and Path(os.readlink(link)).name == f"{stem}.so.{version}":
                    self.add(f"{inside}/{link.name}", "library", versioned)
            return
