"""The node's device inventory: full GPUs and MIG devices, as plain immutable data.

Discovery produces it; slice building, CDI, preparation and the device plugin
read it. A GPU in MIG mode is not allocatable as a whole: its MIG devices are.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

#: The most GPUs a node is taken to hold: far more than any has, so a GPU index is below it.
MAX_GPUS = 1024
#: A GPU's UUID (GPU-<uuid>), as a GPU is named by flags: NVML's 8-4-4-4-12 hexadecimal digits.
GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def gpu_index(text: str) -> int | None:
    """The GPU index `text` spells (ASCII digits, below MAX_GPUS), else None.

    str.isdigit() alone would pass superscripts and other scripts' digits, and numbers longer
    than int() converts.
    """
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(MAX_GPUS))):
        return None
    index = int(text)
    return index if index < MAX_GPUS else None


@dataclass(frozen=True)
class Gpu:
    """A full GPU."""

    name: str
    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str
    memory_bytes: int
    #: The PCI address in extended BDF form, as the kernel writes it: "0000:3b:00.0".
    pci_bus_id: str
    #: NVML's form of the same address ("00000000:3B:00.0"), for the deprecated pcieBusID attribute.
    nvml_bus_id: str
    pcie_root: str | None
    numa_node: int | None
    #: "HMM", "ATS" or "None" (supported, neither active); None where NVML cannot tell.
    addressing_mode: str | None
    mig_enabled: bool
    device_nodes: tuple[str, ...]
    #: The NUMA nodes the GPU is as close to as its own, its own first (KEP-5491's list form of
    #: numaNode, dra.gpu.numa); () where unknown.
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class MigEngines:
    """What a MIG profile gives a MIG device besides memory: multiprocessors and engines, as NVML counts them.

    The same six counts come from nvmlDeviceGetAttributes (a MIG device),
    nvmlDeviceGetGpuInstanceProfileInfo (a profile) and the fake's MIG tables,
    and are published for MIG devices and dynamic-MIG offers alike.
    """

    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True)
class MigDevice:
    """A MIG partition (a GPU instance plus compute instance) of a parent GPU."""

    name: str
    uuid: str
    parent: Gpu
    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    memory_bytes: int
    engines: MigEngines
    device_nodes: tuple[str, ...]
    #: Where its GPU instance sits: the first memory slice and how many (-1: NVML did not say).
    placement_start: int = -1
    placement_size: int = 0

    @property
    def product_name(self) -> str:
        """The parent's product name."""
        return self.parent.product_name


Device = Gpu | MigDevice


@dataclass(frozen=True)
class MigPartition:
    """A MIG device dynamic MIG makes when a claim gets it: one GPU-instance profile at one placement.

    It exists on the GPU only while a claim holds it; until then it is an offer,
    published with the shared counters its placement consumes.
    """

    name: str
    parent: Gpu
    profile: str
    #: The GPU-instance profile ID NVML creates it with.
    profile_id: int
    #: Compute slices (of the GPU's 7).
    slices: int
    #: First memory slice and how many (NVML's placement).
    placement_start: int
    placement_size: int
    memory_bytes: int
    engines: MigEngines

    @property
    def memory_slices(self) -> range:
        """The memory slices it occupies."""
        return range(self.placement_start, self.placement_start + self.placement_size)


@dataclass(frozen=True)
class DriverFile:
    """One of the NVIDIA driver's user-space files a GPU container gets, read-only.

    ``host_path`` is where the container runtime finds it (the host's view);
    ``container_path`` where the container sees it: the same path below the
    driver root, e.g. /run/nvidia/driver/usr/bin/nvidia-smi -> /usr/bin/nvidia-smi.
    """

    host_path: str
    container_path: str
    #: "library", "binary", "firmware" or "ipc" (what NVIDIA's CDI generator calls them).
    kind: str


@dataclass(frozen=True)
class ContainerHook:
    """NVIDIA's nvidia-cdi-hook as the CDI specs run it (docs/configuration.md, "What a container gets").

    ``path`` is where the container runtime executes it on the host; ``driver_version`` the kernel
    driver's version as NVML reports it (580.95.05), which the forward-compatibility hook compares
    with the image's CUDA compat libraries.
    """

    path: str
    driver_version: str


@dataclass(frozen=True)
class Inventory:
    """Every allocatable device of the node, plus node-wide facts."""

    devices: tuple[Device, ...]
    #: Semver form of the kernel driver version; None where it has no numeric form.
    driver_version: str | None
    cuda_driver_version: str
    #: Control device nodes every GPU container needs (/dev/nvidiactl, /dev/nvidia-uvm...).
    common_device_nodes: tuple[str, ...] = ()
    #: Every full GPU, including those in MIG mode (which are not allocatable themselves).
    gpus: tuple[Gpu, ...] = ()
    #: What dynamic MIG offers: every profile at every placement of the GPUs it manages.
    partitions: tuple[MigPartition, ...] = ()
    #: MIG devices that exist on dynamic-MIG GPUs (made for claims; not offered themselves).
    instances: tuple[MigDevice, ...] = ()
    #: The driver's user-space files the CDI specs mount (empty: the node's runtime hook brings them).
    driver_files: tuple[DriverFile, ...] = ()
    #: The hook that makes the driver's files usable the way NVIDIA's toolkit does (links, the loader
    #: cache, CUDA forward compatibility); None: the specs mount the files and run no hook.
    container_hook: ContainerHook | None = None
    #: Where, on the runtime's host, the device nodes named in ``device_nodes`` live: "/" on a real
    #: node; a private directory for fake GPUs made visible to real containers.
    dev_root: str = "/"
    _by_name: Mapping[str, Device] = field(init=False, repr=False, compare=False)
    #: Each prepare looks its devices up by name: offers and twins too, so no lookup is a scan.
    _partitions: Mapping[str, MigPartition] = field(init=False, repr=False, compare=False)
    _twins: Mapping[str, Gpu] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {d.name: d for d in self.devices}
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_partitions", {p.name: p for p in reversed(self.partitions)})
        whole = (g for g in self.gpus if isinstance(by_name.get(g.name), Gpu))
        object.__setattr__(self, "_twins", {vfio_twin_name(g): g for g in whole})

    @property
    def dynamic_gpus(self) -> tuple[Gpu, ...]:
        """The GPUs dynamic MIG partitions on demand."""
        # The offers share their parent objects: told apart by identity first, only those few are
        # hashed (every field of a Gpu), not one per offer (1 ms a MIG unprepare at 16 GPUs, bench_scale).
        return tuple(dict.fromkeys({id(p.parent): p.parent for p in self.partitions}.values()))

    def partition(self, name: str) -> MigPartition | None:
        """The dynamic-MIG offer of this name, or None."""
        return self._partitions.get(name)

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def get(self, name: str) -> Device | None:
        """The device of this name, or None."""
        return self._by_name.get(name)

    def vfio_twin(self, name: str) -> Gpu | None:
        """The GPU a passthrough twin of this name stands for, under the twin's name; None if no such twin.

        Every GPU offered whole has one (`vfio_twins`); whether it is published is the kubelet plugin's
        --vfio. It keeps the GPU's UUID, so that a claim holding either one holds the GPU.
        """
        gpu = self._twins.get(name)
        return replace(gpu, name=name) if gpu is not None else None

    def device_or_twin(self, name: str) -> Device | None:
        """The device of this name, a passthrough twin (its GPU under the twin's name) included."""
        return self.get(name) or self.vfio_twin(name)

    @property
    def vfio_twins(self) -> tuple[Gpu, ...]:
        """The GPUs that get a passthrough twin: those offered whole (not in static MIG mode)."""
        return tuple(self._twins.values())

    def by_uuid(self, uuid: str) -> Device | None:
        """The device with this UUID (a MIG device made for a claim too), or None."""
        return next((d for d in (*self.devices, *self.instances) if d.uuid == uuid), None)


def vfio_twin_name(gpu: Gpu) -> str:
    """The name of a GPU's passthrough twin (type vfio): gpu-vfio-<index>, as NVIDIA's driver names it.

    NVIDIA's counts GPUs in PCI bus order, the order NVML indexes them in.
    """
    return f"gpu-vfio-{gpu.index}"


def is_vfio_twin(device: Device) -> bool:
    """Whether this is a GPU under its passthrough twin's name (Inventory.vfio_twin)."""
    return isinstance(device, Gpu) and device.name == vfio_twin_name(device)


def gpu_of(device: Device) -> Gpu:
    """The full GPU a device is, or is part of."""
    return device.parent if isinstance(device, MigDevice) else device


def device_uuids(device: Device) -> tuple[str, ...]:
    """UUIDs a health event about this device may name (a MIG device also answers to its parent's)."""
    return tuple(dict.fromkeys((device.uuid, gpu_of(device).uuid)))
