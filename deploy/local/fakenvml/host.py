"""The host facts NVML does not give, as the kernel shows them, for fake GPUs: a sysfs and a procfs tree.

The real adapter (dra.gpu.nvml) reads a GPU's PCIe root complex and NUMA node
from sysfs and the MIG capability minors from procfs; NVIDIA's plugin reads the
same sysfs, each MIG instance's capability file under
/proc/driver/nvidia/capabilities and the character majors in /proc/devices. Over
the fake NVML those must say what the fake says, so they are written here under a
host root.
"""

from __future__ import annotations

import os
from pathlib import Path

from dra.fakegpus import node as fakegpus
from dra.fakegpus.library import FakeGpuLibrary, mig_cap_minor
from dra.gpu.discovery import mig_enabled, mig_handles
from dra.gpu.library import sysfs_bus_id


def host_tree(fake: FakeGpuLibrary, root: Path) -> tuple[Path, Path]:
    """The host facts NVML does not give, as the kernel shows them, for the fake's GPUs: (sysfs, procfs).

    Under root/sys each GPU's PCI device sits below its PCIe root complex
    (devices/<root>/<bus id>, linked from bus/pci/devices) with its numa_node, the
    NUMA nodes have their SLIT distances and one CPU each on their socket (numa_sockets),
    and under root/proc
    the driver's MIG capability minors (driver/nvidia-caps/mig-minors), so that
    dra.gpu.nvml reads the same PCIe roots and minors the fake answers.
    """
    sysfs, procfs = root / "sys", root / "proc"
    links = sysfs / "bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    for index in range(fake.device_count()):
        bus_id = fake.pci_bus_id(fake.device_by_index(index))
        complex_ = fake.pcie_root(bus_id)
        if complex_ is None:
            continue
        device = sysfs / "devices" / complex_ / sysfs_bus_id(bus_id)
        device.mkdir(parents=True, exist_ok=True)
        (device / "numa_node").write_text(f"{fake.numa_node(fake.device_by_index(index))}\n")
        link = links / device.name
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(device, links))
    _numa_tree(fake, sysfs)
    caps = procfs / "driver/nvidia-caps"
    caps.mkdir(parents=True, exist_ok=True)
    minors = fake.mig_capability_minors()
    (caps / "mig-minors").write_text("".join(f"{name} {minor}\n" for name, minor in minors.items()))
    capability_files(fake, procfs)
    devices(procfs)
    return sysfs, procfs


def capability_files(fake: FakeGpuLibrary, procfs: Path) -> None:
    """driver/nvidia/capabilities/gpu<minor>/mig/gi<N>[/ci<M>]/access of each MIG instance that exists.

    The driver makes one per GPU and compute instance (NVIDIA's MIG user guide, "Device Nodes
    and Capabilities"): the minor of the instance's nvidia-caps node, its mode (decimal, as the
    kernel prints it: 438 is the 0666 the fake nodes are made with) and whether it may be
    changed. Instances gone since the last call lose theirs.
    """
    root = procfs / "driver/nvidia/capabilities"
    wanted: dict[Path, int] = {}
    for index in range(fake.device_count()):
        gpu = fake.device_by_index(index)
        minor = fake.minor_number(gpu)
        for mig in mig_handles(fake, gpu) if mig_enabled(fake, gpu) else []:
            gi, ci = fake.gpu_instance_id(mig), fake.compute_instance_id(mig)
            instance = root / f"gpu{minor}/mig/gi{gi}"
            wanted[instance / "access"] = mig_cap_minor(minor, gi)
            wanted[instance / f"ci{ci}/access"] = mig_cap_minor(minor, gi, ci)
    for path in sorted(root.glob("gpu*/mig/gi*/**/access"), reverse=True) if root.is_dir() else []:
        if path not in wanted:
            path.unlink()
    for path, cap in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"DeviceFileMinor: {cap}\nDeviceFileMode: 438\nDeviceFileModify: 1\n")


def devices(procfs: Path) -> Path:
    """/proc/devices as the host has it, with the NVIDIA drivers' character majors the fake nodes use."""
    own = Path("/proc/devices").read_text().splitlines()
    taken = {line.split()[0] for line in own if line.strip()[:1].isdigit()}
    nvidia = [
        f"{major:>3} {name}"
        for major, name in (
            (fakegpus.NVIDIA_MAJOR, "nvidia-frontend"),
            (fakegpus.UVM_MAJOR, "nvidia-uvm"),
            (fakegpus.CAPS_MAJOR, "nvidia-caps"),
        )
        if str(major) not in taken
    ]
    at = own.index("Character devices:") + 1 if "Character devices:" in own else 0
    path = procfs / "devices"
    path.write_text("\n".join([*own[:at], *nvidia, *own[at:]]) + "\n")
    return path


#: SLIT distances (ACPI): a node to itself, to another node of its socket, to another socket's.
_LOCAL, _SAME_SOCKET, _REMOTE = 10, 11, 21


def _numa_tree(fake: FakeGpuLibrary, sysfs: Path) -> None:
    """devices/system/node/node<N>/{distance,cpulist} and CPU N's package: what dra.gpu.numa reads."""
    sockets = fake.numa_sockets()
    if not sockets:
        return
    count = max(sockets) + 1
    package = {node: min(sockets.get(node, {node})) for node in range(count)}
    for node in range(count):
        row = [
            _LOCAL if other == node else _SAME_SOCKET if package[other] == package[node] else _REMOTE
            for other in range(count)
        ]
        directory = sysfs / f"devices/system/node/node{node}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "distance").write_text(" ".join(map(str, row)) + "\n")
        (directory / "cpulist").write_text(f"{node}\n")
        topology = sysfs / f"devices/system/cpu/cpu{node}/topology"
        topology.mkdir(parents=True, exist_ok=True)
        (topology / "physical_package_id").write_text(f"{package[node]}\n")
