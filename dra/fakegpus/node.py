"""Fake GPUs a real container can see: device nodes and a stand-in driver under one root.

With --fake-gpus and --fake-gpu-root=ROOT the daemon makes, before it discovers the GPUs,
``ROOT/dev`` (inert character device nodes: opening one fails) and ``ROOT/driver-root`` (a
shell-script nvidia-smi that answers ``-L`` as the real one does in a container, and the
libraries), which the CDI specs mount like the real thing. A library is a copy of
``ROOT/libraries/<SONAME>`` where there is one (a fake a loader can load: the local cluster puts
the ones it builds from deploy/local/fakenvml there), else an ELF shared object with the
library's SONAME and no symbols (``elfstub``): the loader cache, the SONAME link and a dlopen take
it as they take the real one. The node numbers and the nvidia-smi it imitates:
docs/configuration.md ("Fake GPUs").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dra.adapters.nodefiles import holds, write_atomic
from dra.adapters.pcisysfs import PciSysfs
from dra.fakegpus.elfstub import UnsupportedMachineError, machine_number, shared_object
from dra.fakegpus.library import FakeGpuLibrary, mig_cap_minor
from dra.fakegpus.profiles import load_profile
from dra.fakegpus.sysfs import FakeFunction, FakeSysfs
from dra.gpu.discovery import mig_enabled, mig_handles
from dra.gpu.library import ERROR_UNKNOWN, GpuHandle, GpuLibraryError
from dra.model.devices import Inventory

#: The fake GPUs' settings (time slices) in the state directory.
FAKE_GPU_STATE = "fake-gpu-state.json"
#: The fake GPUs' MIG instances, in the state directory (on a real GPU, the GPU holds them).
FAKE_MIG_STATE = "fake-gpu-mig.json"
#: The processes running on the fake GPUs (dra.fakegpus.processes' control file), in the state directory.
FAKE_PROCESSES = "fake-gpu-processes.json"
#: NVIDIA's registered character major (/dev/nvidia0, /dev/nvidiactl).
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
#: Stand-ins for the dynamic majors, from the local/experimental range 120-127.
UVM_MAJOR = 120
CAPS_MAJOR = 121
DRIVER_ROOT = "driver-root"
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
STAND_IN_LIBRARIES = ("libcuda", "libnvidia-ml")
#: Under the fake GPU root: libraries to copy into the driver root, by SONAME (libcuda.so.1).
LIBRARIES = "libraries"

_SCRIPT = """#!/bin/sh
# nvidia-smi of dra-gpu's fake GPUs (dra/fakegpus/node.py): only -L, from the device nodes
# this container has. Table: V <CUDA version> / G <minor> <uuid> <memory bytes> <product> /
# M <parent minor> <gi cap> <ci cap> <uuid> <memory bytes> <profile>
case "$1" in
  -L|--list-gpus) ;;
  *) {otherwise} ;;
esac
TABLE='{table}'
if [ ! -e /dev/nvidiactl ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
  exit 9
fi
i=0
echo "$TABLE" | while read -r kind minor uuid _memory product; do
  [ "$kind" = G ] && [ -e "/dev/nvidia$minor" ] || continue
  echo "GPU $i: $product (UUID: $uuid)"
  i=$((i + 1))
  j=0
  echo "$TABLE" | while read -r mkind parent gicap cicap muuid _mmemory profile; do
    [ "$mkind" = M ] && [ "$parent" = "$minor" ] || continue
    [ -e "/dev/nvidia-caps/nvidia-cap$gicap" ] && [ -e "/dev/nvidia-caps/nvidia-cap$cicap" ] || continue
    printf '  MIG %-11s Device %2d: (UUID: %s)\\n' "$profile" "$j" "$muuid"
    j=$((j + 1))
  done
done
"""


class FakeRootError(RuntimeError):
    """The fake device nodes or driver root could not be made (the message says where and why)."""


#: What the fake nvidia-smi answers to anything but -L.
ONLY_LIST = 'echo "fake nvidia-smi: only -L (--list-gpus) is implemented" >&2; exit 2'


def fake_gpu_library(
    fake_gpus: str,
    node_name: str,
    events: Path | None = None,
    state_dir: Path | None = None,
    fake_gpu_root: Path | None = None,
) -> FakeGpuLibrary:
    """The fake GPUs of a profile (a built-in name or a file), keeping their state in state_dir.

    ProfileError when the profile cannot be read. With fake_gpu_root their device nodes and
    stand-in driver are made there first, and again whenever a MIG device is made.
    """

    def kept(name: str) -> Path | None:
        return state_dir / name if state_dir is not None else None

    lib = FakeGpuLibrary(
        load_profile(fake_gpus, node_name),
        node_name,
        events,
        kept(FAKE_GPU_STATE),
        fake_gpu_root,
        kept(FAKE_MIG_STATE),
        kept(FAKE_PROCESSES),
    )
    if fake_gpu_root is not None:
        root = fake_gpu_root
        materialise(lib, root)

        def made_mig_device() -> None:
            # A MIG device made after start (a layout, dynamic MIG) needs its capability nodes now.
            try:
                materialise(lib, root)
            except FakeRootError as err:
                raise GpuLibraryError(ERROR_UNKNOWN, str(err)) from None

        lib.on_mig_change = made_mig_device
    return lib


def materialise(lib: FakeGpuLibrary, root: Path) -> None:
    """Make (or refresh) the device nodes and the driver root of lib's fake GPUs under root."""
    try:
        table = device_nodes(lib, root / "dev")
        _driver_root(root / DRIVER_ROOT, lib.driver_version(), nvidia_smi_script(table), root / LIBRARIES)
    except OSError as err:
        raise FakeRootError(f"--fake-gpu-root={root}: cannot make the fake GPUs' files: {err}") from None


def device_nodes(lib: FakeGpuLibrary, dev: Path) -> str:
    """Make (or refresh) the character devices of lib's GPUs and MIG devices under dev; nvidia-smi's table.

    OSError when a node cannot be made.
    """
    table = [f"V {lib.cuda_driver_version()}"]
    _node(dev / "nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR)
    _node(dev / "nvidia-uvm", UVM_MAJOR, 0)
    _node(dev / "nvidia-uvm-tools", UVM_MAJOR, 1)
    for index in range(lib.device_count()):
        handle = lib.device_by_index(index)
        minor = lib.minor_number(handle)
        _node(dev / f"nvidia{minor}", NVIDIA_MAJOR, minor)
        table.append(f"G {minor} {lib.uuid(handle)} {lib.memory_total(handle)} {lib.name(handle)}")
        table.extend(_mig_lines(lib, handle, minor, dev))
    return "\n".join(table)


def nvidia_smi_script(table: str, otherwise: str = ONLY_LIST) -> bytes:
    """The fake nvidia-smi: -L lists the GPUs of `table` whose device nodes the caller sees;
    `otherwise` is the shell that answers any other command."""
    return _SCRIPT.format(table=table, otherwise=otherwise).encode()


def pci_tree(inventory: Inventory, root: Path) -> PciSysfs:
    """The fake GPUs' PCI functions in a fake sysfs under root (each GPU an IOMMU group of its own, numbered
    by its index, bound to nvidia), kept as they are when there already; /dev/vfio beside the GPUs' nodes.
    """
    fake = FakeSysfs(root)
    fake.build([FakeFunction(gpu.pci_bus_id, group=gpu.index) for gpu in inventory.gpus])
    return PciSysfs(root, write=fake.write)


def _mig_lines(lib: FakeGpuLibrary, handle: GpuHandle, minor: int, dev: Path) -> list[str]:
    if not mig_enabled(lib, handle):
        return []
    lines = []
    for mig in mig_handles(lib, handle):
        gi, ci = lib.gpu_instance_id(mig), lib.compute_instance_id(mig)
        caps = mig_cap_minor(minor, gi), mig_cap_minor(minor, gi, ci)
        for cap in caps:
            _node(dev / "nvidia-caps" / f"nvidia-cap{cap}", CAPS_MAJOR, cap)
        profile = lib.name(mig).rsplit(" MIG ", 1)[-1]
        memory = lib.mig_attributes(mig).memory_mib * 2**20
        lines.append(f"M {minor} {caps[0]} {caps[1]} {lib.uuid(mig)} {memory} {profile}")
    return lines


def _node(path: Path, major: int, minor: int) -> None:
    wanted = os.makedev(major, minor)
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == wanted:
            return
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, wanted)
    except FileExistsError:
        # The kubelet plugin and the device plugin of one node make the same nodes.
        if path.lstat().st_rdev == wanted:
            return
        raise
    # mknod honours the umask; containers run as any user, as with the real nodes.
    path.chmod(0o666)


def _driver_root(driver_root: Path, version: str, script: bytes, sources: Path) -> None:
    write_if_changed(driver_root / "usr/bin/nvidia-smi", script, 0o755)
    stand_in_libraries(driver_root / LIBRARY_DIR, version, sources=sources)


def stand_in_libraries(
    libs: Path, version: str, stems: tuple[str, ...] = STAND_IN_LIBRARIES, sources: Path | None = None
) -> None:
    """The driver's libraries of `version` in libs, each with its .so.1 link: copies of
    `sources`/<stem>.so.1 where there is one, else ELF shared objects with that SONAME and no
    symbols (text files saying why on a machine with no ELF machine number known here)."""
    for stem in stems:
        name = f"{stem}.so.{version}"
        soname = f"{stem}.so.1"
        source = sources / soname if sources is not None else None
        if source is not None and source.is_file():
            write_if_changed(libs / name, source.read_bytes(), 0o755)
        else:
            write_if_changed(libs / name, *_stand_in(name, soname))
        link = libs / soname
        if not link.is_symlink() or os.readlink(link) != name:
            link.unlink(missing_ok=True)
            link.symlink_to(name)


def _stand_in(name: str, soname: str) -> tuple[bytes, int]:
    """The stand-in for library `name` and its mode."""
    what = f"dra-gpu fake GPUs: stand-in for {name}"
    try:
        machine = machine_number()
    except UnsupportedMachineError as err:
        # The fake GPUs still work there; only a program loading the library would not.
        return f"{what} (not an ELF object: {err})\n".encode(), 0o644
    # Executable, as a copied library is.
    return shared_object(soname, machine, f"{what}, no symbols"), 0o755


def write_if_changed(path: Path, data: bytes, mode: int) -> None:
    """Write path atomically with data and mode, unless it already holds exactly that."""
    # Rediscovery calls this every minute: leave a file that is already right alone.
    if holds(path, data) and stat.S_IMODE(path.stat().st_mode) == mode:
        return
    write_atomic(path, data, mode)
