"""A node as fake GPUs would show it to a GPU driver, any driver: its driver root, sysfs and procfs.

Both drivers of the local cluster, this project's and NVIDIA's, are started over the same tree
(``--driver-root`` and ``--nvidia-driver-root`` name its driver root):

- ``driver/``: the driver root. ``usr/lib64/libnvidia-ml.so.<version>`` is the fake NVML
  (fakenvml.library, copied so that the path NVIDIA's plugin resolves stays in the driver root),
  with its ``.so.1`` link and ``fakenvml.conf`` beside it, which tells the library which fake
  GPUs to serve; ``libcuda.so.<version>`` the fake CUDA driver (fakenvml.fakecuda);
  ``usr/bin/nvidia-smi`` answers ``-L`` in containers (dra.fakegpus.node' script)
  and the settings the drivers change on the host (fakenvml.smi); ``dev/`` holds the GPUs'
  character devices, so both drivers take the driver root for their device root.
- ``sys/`` and ``proc/driver/``: what the kernel shows of the GPUs (fakenvml.host). ``wrap()``
  starts a driver in a mount namespace of its own where they are the node's /sys and
  /proc/driver, so that PCIe roots, NUMA nodes and MIG capability minors read as the profile says.
- ``state/``: the fake GPUs' state (MIG instances, time slices, processes), which every process
  of the node shares, as a real GPU's state is the GPU's.

Making device nodes needs root (mknod), as on a real node.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import sysconfig
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra.fakegpus import node as fakegpus
from dra.fakegpus.library import FakeGpuLibrary, mig_cap_minor
from dra.gpu.discovery import mig_enabled, mig_handles
from dra.gpu.library import ERROR_UNKNOWN, GpuLibraryError
from fakenvml.fakecuda import ensure_fake_cuda
from fakenvml.host import capability_files, host_tree
from fakenvml.library import SONAME, ensure_library

#: The configuration file the library reads beside itself.
CONF = "fakenvml.conf"
#: Where the library records, beside itself, each function a process called that answers NOT_SUPPORTED.
UNSUPPORTED = "fakenvml.unsupported"
LIBRARY_DIR = "usr/lib64"
_REPO = Path(__file__).resolve().parents[3]


def _numbers(text: str) -> frozenset[int]:
    return frozenset(int(item) for item in text.split(",") if item)


def _names(text: str) -> frozenset[str]:
    return frozenset(item for item in text.split(",") if item)


@dataclass(frozen=True)
class SeenDevice:
    """A device a container has: a GPU (no parent), or a MIG device of a GPU and profile."""

    uuid: str
    parent: str | None
    profile: str | None


@dataclass(frozen=True)
class NodeConfig:
    """What the fake NVML of one node serves: fakenvml.conf, one `key=value` a line."""

    profile: str
    node_name: str
    #: The node's tree: driver/, sys/, proc/ and state/ (see the module's docstring).
    root: Path
    events: Path | None = None
    lacks: frozenset[str] = frozenset()
    reset_required: frozenset[int] = frozenset()
    lost: frozenset[int] = frozenset()

    def write(self, path: Path) -> None:
        """The file, with what the library's loader needs to start Python in a process that has none."""
        libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
        fields = {
            # The loader reads these two itself.
            "libpython": f"{libdir}/{soname}",
            "pythonpath": ":".join(
                [str(_REPO), str(_REPO / "deploy/local"), sysconfig.get_paths()["purelib"]]
            ),
            "profile": self.profile,
            "node": self.node_name,
            "root": str(self.root),
            "events": str(self.events or ""),
            "lacks": ",".join(sorted(self.lacks)),
            "reset_required": ",".join(map(str, sorted(self.reset_required))),
            "lost": ",".join(map(str, sorted(self.lost))),
        }
        fakegpus.write_if_changed(
            path, "".join(f"{key}={value}\n" for key, value in fields.items()).encode(), 0o644
        )

    @classmethod
    def read(cls, path: Path) -> NodeConfig:
        """The configuration in `path`."""
        fields = dict(line.partition("=")[::2] for line in path.read_text().splitlines() if "=" in line)
        return cls(
            profile=fields["profile"],
            node_name=fields["node"],
            root=Path(fields["root"]),
            events=Path(fields["events"]) if fields.get("events") else None,
            lacks=_names(fields.get("lacks", "")),
            reset_required=_numbers(fields.get("reset_required", "")),
            lost=_numbers(fields.get("lost", "")),
        )

    @property
    def driver_root(self) -> Path:
        """The driver root: the fake NVML, nvidia-smi and the device nodes."""
        return self.root / "driver"

    @property
    def state_dir(self) -> Path:
        """Where the fake GPUs keep their state (MIG instances, time slices, processes)."""
        return self.root / "state"

    def fake_gpus(self) -> FakeGpuLibrary:
        """The fake GPUs, their state in the state directory. A MIG instance made or destroyed gets or loses
        its device nodes and capability files, as the driver makes and removes them."""
        lib = fakegpus.fake_gpu_library(self.profile, self.node_name, self.events, self.state_dir)
        lib.root = self.driver_root
        dev = self.driver_root / "dev"

        def made_mig_device() -> None:
            try:
                fakegpus.device_nodes(lib, dev)
                capability_files(lib, self.root / "proc")
            except OSError as err:
                raise GpuLibraryError(ERROR_UNKNOWN, f"cannot make the MIG device's files: {err}") from None

        lib.on_mig_change = made_mig_device
        return lib


class FakeNode:
    """The tree of one fake node under `root` (see the module's docstring); build() makes it."""

    def __init__(
        self,
        root: Path,
        profile: str,
        node_name: str,
        events: Path | None = None,
        lacks: Collection[str] = (),
        reset_required: Collection[int] = (),
        lost: Collection[int] = (),
    ) -> None:
        self.root = root
        self.config = NodeConfig(
            profile=profile,
            node_name=node_name,
            root=root,
            events=events,
            lacks=frozenset(lacks),
            reset_required=frozenset(reset_required),
            lost=frozenset(lost),
        )

    @property
    def driver_root(self) -> Path:
        """The driver root both drivers are given."""
        return self.config.driver_root

    @property
    def library(self) -> Path:
        """The fake NVML as the drivers find it: <driver root>/usr/lib64/libnvidia-ml.so.1."""
        return self.driver_root / LIBRARY_DIR / SONAME

    def unsupported_calls(self, program: str) -> set[str]:
        """The NVML functions `program` (its short name, as /proc/<pid>/comm) called on this node that the
        stand-in answers NOT_SUPPORTED (loader.c records them)."""
        try:
            lines = (self.driver_root / LIBRARY_DIR / UNSUPPORTED).read_text().splitlines()
        except FileNotFoundError:
            return set()
        return {name for caller, _, name in (line.partition(" ") for line in lines) if caller == program}

    def build(self) -> FakeNode:
        """Make (or refresh) the tree; the fake GPUs' state is kept."""
        fake = self.config.fake_gpus()
        version = fake.driver_version()
        libs = self.driver_root / LIBRARY_DIR
        libs.mkdir(parents=True, exist_ok=True)
        self.config.write(libs / CONF)
        versioned = libs / f"libnvidia-ml.so.{version}"
        built = ensure_library()
        if not versioned.is_file() or versioned.read_bytes() != built.read_bytes():
            shutil.copyfile(built, versioned.with_name(f".{versioned.name}.tmp"))
            versioned.with_name(f".{versioned.name}.tmp").replace(versioned)
        if not self.library.is_symlink():
            self.library.symlink_to(versioned.name)
        fakegpus.stand_in_libraries(libs, version, ("libcuda",), sources=ensure_fake_cuda().parent)
        table = fakegpus.device_nodes(fake, self.driver_root / "dev")
        smi = self.root / "nvidia-smi-host"
        fakegpus.write_if_changed(smi, self._host_smi().encode(), 0o755)
        fakegpus.write_if_changed(
            self.driver_root / "usr/bin/nvidia-smi",
            fakegpus.nvidia_smi_script(
                table, otherwise=f'[ -x {smi} ] && exec {smi} "$@"; {fakegpus.ONLY_LIST}'
            ),
            0o755,
        )
        host_tree(fake, self.root)
        return self

    def _host_smi(self) -> str:
        path = ":".join([str(_REPO), str(_REPO / "deploy/local")])
        return (
            "#!/bin/sh\n"
            "# nvidia-smi on the fake node's host: the settings drivers change (fakenvml.smi).\n"
            f"PYTHONPATH={shlex.quote(path)} exec {shlex.quote(sys.executable)} -m fakenvml.smi "
            f'{shlex.quote(str(self.library.parent / CONF))} "$@"\n'
        )

    def devices_seen(self, device_paths: Iterable[str]) -> list[SeenDevice]:
        """The GPUs and MIG devices whose device nodes a container has (paths as it sees them).

        A MIG device is seen through its GPU instance's and compute instance's capability nodes; its
        GPU's own node, which comes with them, does not make the whole GPU seen.
        """
        paths = set(device_paths)
        fake = self.config.fake_gpus()
        seen: list[SeenDevice] = []
        for index in range(fake.device_count()):
            gpu = fake.device_by_index(index)
            minor = fake.minor_number(gpu)
            if f"/dev/nvidia{minor}" not in paths:
                continue
            migs = [
                SeenDevice(fake.uuid(mig), fake.uuid(gpu), fake.name(mig).rsplit(" MIG ", 1)[-1])
                for mig in (mig_handles(fake, gpu) if mig_enabled(fake, gpu) else [])
                if {
                    f"/dev/nvidia-caps/nvidia-cap{mig_cap_minor(minor, fake.gpu_instance_id(mig))}",
                    "/dev/nvidia-caps/nvidia-cap"
                    f"{mig_cap_minor(minor, fake.gpu_instance_id(mig), fake.compute_instance_id(mig))}",
                }
                <= paths
            ]
            seen.extend(migs or [SeenDevice(fake.uuid(gpu), None, None)])
        return seen

    def wrap(self, command: Sequence[str]) -> list[str]:
        """`command` in a mount namespace that shows this node's sys/, proc/driver/ and proc/devices."""
        setup = " && ".join(
            [
                f"mount --bind {shlex.quote(str(self.root / 'sys'))} /sys",
                f"mount --bind {shlex.quote(str(self.root / 'proc/driver'))} /proc/driver",
                f"mount --bind {shlex.quote(str(self.root / 'proc/devices'))} /proc/devices",
                'exec "$@"',
            ]
        )
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", setup, "fakenode", *command]
