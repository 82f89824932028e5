"""Fake GPUs behind the GpuLibrary interface, from a profile (dra.gpu.profiles).

FakeGpuLibrary answers the same NVML calls as the real library, with UUIDs
derived from the node name so that many fake nodes differ. By default it has
no host device nodes (containers get no paths that do not exist); given a
root (--fake-gpu-root, for real containers in the local cluster) it looks
device nodes up under that root, where dra.daemon.fakegpus makes them, and
lists MIG capability minors as the driver's /proc/driver/nvidia-caps/mig-minors
does. XID errors can be injected
by appending lines to an events file, which the health monitor reads like
NVML events:

    <uuid> <xid> [<gpu instance ID> [<compute instance ID>]]

The instance IDs are those NVML gives for an error on one MIG instance of a
GPU in MIG mode (a MIG device's are in its name, gpu-4-mig-1g10gb-<gi>-<ci>);
without them, or with 4294967295 (NVML's "none"), the error concerns the
whole GPU.

MIG instances are made and destroyed through the same calls as on NVML, with
the placements of dra.gpu.migtables, and fail the way NVML fails (nvml.h):
MIG mode off or a profile the model lacks -> NOT_SUPPORTED; a placement the
profile cannot take -> INVALID_ARGUMENT; a placement overlapping an instance
that exists, or one instance too many -> INSUFFICIENT_RESOURCES; destroying a
GPU instance that still has compute instances -> IN_USE; an unknown ID ->
NOT_FOUND. The instances live in a small JSON file when one is given (as they
live on the GPU, so that a restarted driver finds them), else in memory; the
instances a profile lists under `mig` are there from the start, at the first
placements where they all fit. A file written for another profile (another
MIG layout) counts as absent, as a re-partitioned GPU would. set_mig_mode
turns MIG on or off at once (recorded in the same file), refused with IN_USE
while the GPU has instances; a GPU the profile gives no `mig` starts with MIG
off. With on_mig_change set, each new MIG device is announced (with a root,
dra.daemon.fakegpus then makes its device nodes).

The addressing mode is the model's (HMM for every catalog model: Turing and
newer GPUs on an x86 host with NVIDIA's open kernel modules; see
dra.gpu.profiles), or the profile's `addressingMode` where it sets one, with
`unsupported` answered as NVML's NOT_SUPPORTED.

Settings the driver changes on a GPU (the compute time slice) are kept in a
JSON state file when one is given, `{"<uuid>": {"timeSlice": <level>}}`, the way a real
GPU keeps them across a restart of the driver; `dra-gpu time-slices` shows them.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dra.gpu import migtables
from dra.gpu.migtables import GpuInstanceProfile
from dra.gpu.nvml import (
    ERROR_IN_USE,
    ERROR_INSUFFICIENT_RESOURCES,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_UNKNOWN,
    NO_INSTANCE,
    ComputeInstanceHandle,
    GpuHandle,
    GpuInstanceHandle,
    GpuInstanceInfo,
    GpuInstanceProfileInfo,
    GpuLibraryError,
    MigAttributes,
    MigHandle,
    Placement,
    XidEvent,
)
from dra.gpu.profiles import FakeGpu, Profile

#: GPU and compute instance IDs a GPU can have, as the driver's mig-minors file lists them.
MIG_GPU_INSTANCES = 15
MIG_COMPUTE_INSTANCES = 8


def mig_cap_minor(gpu_minor: int, gpu_instance: int, compute_instance: int | None = None) -> int:
    """The nvidia-caps minor of a GPU instance's (or compute instance's) access file.

    The driver's numbering in /proc/driver/nvidia-caps/mig-minors: 1 and 2 are
    the config and monitor capabilities, then per GPU and GPU instance one minor
    for the instance followed by one per compute instance.
    """
    per_gi = 1 + MIG_COMPUTE_INSTANCES
    base = 3 + gpu_minor * MIG_GPU_INSTANCES * per_gi + gpu_instance * per_gi
    return base if compute_instance is None else base + 1 + compute_instance


# An even number, so that the pairs of GPUs that share a root never straddle two domains.
_BUSES_PER_DOMAIN = 14
_UUID_NAMESPACE = uuid.UUID("0b9c4a52-8b0e-4c36-9a55-6c0f3f1d2a71")


@dataclass(frozen=True)
class _FakeMig:
    gpu_index: int
    slot: int
    profile: str
    gpu_instance_id: int
    compute_instance_id: int = 0
    #: 0 for the instances of the profile; a creation counter for those made later.
    serial: int = 0


@dataclass(frozen=True)
class _FakeGi:
    gpu_index: int
    gpu_instance_id: int


@dataclass(frozen=True)
class _FakeCi:
    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass
class FakeInstance:
    """A GPU instance on a fake GPU, as the state file records it."""

    gpu_instance_id: int
    profile: str
    start: int
    size: int
    compute_instances: list[int] = field(default_factory=list)
    serial: int = 0


class FakeGpuLibrary:
    """GpuLibrary over a profile; UUIDs depend on the node name."""

    def __init__(
        self,
        profile: Profile,
        node_name: str,
        events_file: Path | None = None,
        state_file: Path | None = None,
        root: Path | None = None,
        mig_state: Path | None = None,
    ) -> None:
        self.profile = profile
        self.node_name = node_name
        self._state_file = state_file
        self._state: dict[str, dict[str, int]] = {}
        #: Where the fake device nodes live (root/dev/nvidia0 ...); None: nowhere.
        self.root = root
        self._events_file = events_file
        self._events_offset = 0
        self._watched: set[int] = set()
        self._mig_state = mig_state
        self._memory: dict[int, list[FakeInstance]] | None = None
        #: MIG modes set through set_mig_mode, by GPU index; the others are the profile's.
        self._modes: dict[int, int] = {}
        #: Called after MIG devices appear or go (outside the lock): with a root, their device nodes follow.
        self.on_mig_change: Callable[[], None] | None = None
        self._lock = threading.Lock()

    def _uuid(self, prefix: str, key: str) -> str:
        return f"{prefix}-{uuid.uuid5(_UUID_NAMESPACE, f'{self.node_name}/{key}')}"

    def _gpu(self, handle: GpuHandle | MigHandle) -> FakeGpu:
        index = handle.gpu_index if isinstance(handle, _FakeMig) else handle
        assert isinstance(index, int)
        return self.profile.gpus[index]

    def init(self) -> None:
        """Nothing to load."""

    def shutdown(self) -> None:
        """Nothing to release."""

    def driver_version(self) -> str:
        """The profile's driver version."""
        return self.profile.driver_version

    def cuda_driver_version(self) -> int:
        """The profile's CUDA version, NVML-encoded."""
        return self.profile.cuda_driver_version

    def device_count(self) -> int:
        """Number of GPUs in the profile."""
        return len(self.profile.gpus)

    def device_by_index(self, index: int) -> GpuHandle:
        """GPU handles are their indexes."""
        if not 0 <= index < len(self.profile.gpus):
            raise GpuLibraryError(ERROR_NOT_FOUND, f"no GPU {index}")
        return GpuHandle(index)

    def name(self, gpu: GpuHandle | MigHandle) -> str:
        """Product name, with " MIG <profile>" for MIG devices as NVML does."""
        if isinstance(gpu, _FakeMig):
            return f"{self._gpu(gpu).model.product_name} MIG {gpu.profile}"
        return self._gpu(gpu).model.product_name

    def uuid(self, gpu: GpuHandle | MigHandle) -> str:
        """Stable per node and device."""
        if isinstance(gpu, _FakeMig):
            # A re-created MIG device is a new device with a new UUID, as on real GPUs.
            key = f"gpu/{gpu.gpu_index}/mig/{gpu.gpu_instance_id}/{gpu.compute_instance_id}/{gpu.profile}"
            return self._uuid("MIG", f"{key}/{gpu.serial}" if gpu.serial else key)
        return self._uuid("GPU", f"gpu/{gpu}")

    def brand(self, gpu: GpuHandle) -> int:
        """nvmlBrandType_t of the model."""
        return self._gpu(gpu).model.brand

    def architecture(self, gpu: GpuHandle) -> int:
        """nvmlDeviceArchitecture_t of the model."""
        return self._gpu(gpu).model.architecture

    def cuda_compute_capability(self, gpu: GpuHandle) -> tuple[int, int]:
        """(major, minor) of the model."""
        return self._gpu(gpu).model.compute_capability

    def memory_total(self, gpu: GpuHandle) -> int:
        """Bytes of the model."""
        return self._gpu(gpu).model.memory_mib * 1024 * 1024

    def pci_bus_id(self, gpu: GpuHandle) -> str:
        """One bus per GPU, 14 buses per PCI domain, as on a real board."""
        assert isinstance(gpu, int)
        domain, slot = divmod(gpu, _BUSES_PER_DOMAIN)
        return f"{domain:08X}:{0x10 + 0x10 * slot:02X}:00.0"

    def addressing_mode(self, gpu: GpuHandle) -> int:
        """The model's addressing mode; NOT_SUPPORTED where the profile says `unsupported`."""
        mode = self._gpu(gpu).model.addressing_mode
        if mode is None:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "addressing mode not supported")
        return mode

    def minor_number(self, gpu: GpuHandle) -> int:
        """Minors follow indexes."""
        assert isinstance(gpu, int)
        return gpu

    def numa_node(self, gpu: GpuHandle) -> int:
        """The profile's NUMA node, else the first half of the GPUs on node 0 and the rest on 1."""
        assert isinstance(gpu, int)
        explicit = self._gpu(gpu).numa_node
        if explicit is not None:
            return explicit
        return gpu * 2 // max(len(self.profile.gpus), 2)

    def mig_mode(self, gpu: GpuHandle) -> tuple[int, int]:
        """MIG on where set_mig_mode turned it on or the profile lists MIG devices; NOT_SUPPORTED without MIG.

        A change applies at once (current and pending agree), as on a GPU that needs no reset for it.
        """
        fake = self._gpu(gpu)
        if not fake.model.mig_profiles:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "MIG not supported")
        mode = 1 if self._mig_on(gpu) else 0
        return mode, mode

    def _mig_on(self, gpu: GpuHandle) -> bool:
        assert isinstance(gpu, int)
        with self._lock:
            self._load()
            mode = self._modes.get(gpu)
        return self.profile.gpus[gpu].mig is not None if mode is None else mode == 1

    def set_mig_mode(self, gpu: GpuHandle, mode: int) -> None:
        """Turn MIG on or off at once; IN_USE while the GPU has GPU instances, as NVML refuses then."""
        assert isinstance(gpu, int)
        fake = self._gpu(gpu)
        if not fake.model.mig_profiles:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"{fake.model.product_name} does not support MIG")
        if mode not in (0, 1):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no MIG mode {mode}")
        with self._lock:
            state = self._load()
            if state.get(gpu):
                raise GpuLibraryError(ERROR_IN_USE, f"GPU {gpu} has MIG instances: destroy them first")
            self._modes[gpu] = mode
            self._save(state)

    def pci_device_id(self, gpu: GpuHandle) -> int:
        """The model's PCI device ID, with NVIDIA's vendor ID in the low 16 bits."""
        return self._gpu(gpu).model.pci_device_id

    def max_mig_device_count(self, gpu: GpuHandle) -> int:
        """Seven slots on MIG-capable GPUs."""
        return self._gpu(gpu).model.mig_slices if self._gpu(gpu).model.mig_profiles else 0

    def mig_device_by_index(self, gpu: GpuHandle, index: int) -> MigHandle:
        """The index-th compute instance of the GPU, by GPU instance ID then compute instance ID."""
        assert isinstance(gpu, int)
        devices = [
            (gi, ci)
            for gi in sorted(self._instances(gpu), key=lambda i: i.gpu_instance_id)
            for ci in sorted(gi.compute_instances)
        ]
        if index >= len(devices):
            raise GpuLibraryError(ERROR_NOT_FOUND, "no MIG device in this slot")
        gi, ci = devices[index]
        return MigHandle(_FakeMig(gpu, index, gi.profile, gi.gpu_instance_id, ci, gi.serial))

    # -- MIG management ----------------------------------------------------

    def _table(self, gpu: GpuHandle) -> tuple[GpuInstanceProfile, ...]:
        fake = self._gpu(gpu)
        if not fake.model.mig_table:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"{fake.model.product_name} does not support MIG")
        if not self._mig_on(gpu):
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"MIG mode is disabled on GPU {gpu}")
        return fake.model.mig_table

    def _premade(self, index: int) -> list[FakeInstance]:
        """The profile's MIG devices, at the first placements where all of them fit."""
        fake = self.profile.gpus[index]
        table = {p.name: p for p in fake.model.mig_table}
        names = list(fake.mig or ())

        def place(made: list[FakeInstance]) -> list[FakeInstance] | None:
            if len(made) == len(names):
                return made
            p = table[names[len(made)]]
            for start in p.starts:
                if not _overlaps(made, start, p.memory_slices):
                    found = place([*made, FakeInstance(len(made) + 1, p.name, start, p.memory_slices, [0])])
                    if found is not None:
                        return found
            return None

        # The profile's own check counts compute slices only; memory placements may still clash.
        placed = place([])
        if placed is None:
            raise GpuLibraryError(
                ERROR_INSUFFICIENT_RESOURCES, f"GPU {index}: the profile's MIG devices do not fit"
            )
        return placed

    def _layout(self) -> list[list[object]]:
        """What the profile says of each GPU's MIG: a state file written for another profile is void."""
        return [[g.model.product_name, None if g.mig is None else list(g.mig)] for g in self.profile.gpus]

    def _load(self) -> dict[int, list[FakeInstance]]:
        if self._mig_state is not None and self._mig_state.exists():
            data = json.loads(self._mig_state.read_text())
            if data.get("profile") == self._layout():
                self._modes = {int(k): int(v) for k, v in data.get("migMode", {}).items()}
                return {int(k): [FakeInstance(**i) for i in v] for k, v in data["gpus"].items()}
        if self._memory is None:
            self._memory = {i: self._premade(i) for i in range(len(self.profile.gpus))}
        return self._memory

    def _save(self, state: dict[int, list[FakeInstance]]) -> None:
        self._memory = state
        if self._mig_state is None:
            return
        gpus = {str(k): [asdict(i) for i in v] for k, v in sorted(state.items())}
        modes = {str(k): v for k, v in sorted(self._modes.items())}
        text = json.dumps({"profile": self._layout(), "gpus": gpus, "migMode": modes})
        # Atomically, as the real GPU changes: a reader never sees half a state.
        tmp = self._mig_state.with_name(f".{self._mig_state.name}.tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._mig_state)

    def _instances(self, gpu: GpuHandle) -> list[FakeInstance]:
        assert isinstance(gpu, int)
        with self._lock:
            return self._load().get(gpu, [])

    def instances(self) -> dict[int, list[FakeInstance]]:
        """Every GPU instance on every GPU (for tests and the admin's eyes)."""
        with self._lock:
            return self._load()

    def gpu_instance_profile_info(self, gpu: GpuHandle, profile: int) -> GpuInstanceProfileInfo:
        """The migtables row of this profile enumerator."""
        if not 0 <= profile < migtables.PROFILE_COUNT:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no GPU instance profile {profile}")
        p = migtables.by_nvml_profile(self._table(gpu), profile)
        if p is None:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, f"GPU {gpu} has no GPU instance profile {profile}")
        return GpuInstanceProfileInfo(
            id=p.id,
            slice_count=p.slices,
            instance_count=p.instance_count,
            multiprocessors=p.multiprocessors,
            copy_engines=p.copy_engines,
            decoders=p.decoders,
            encoders=p.encoders,
            jpeg_engines=p.jpeg_engines,
            ofa_engines=p.ofa_engines,
            memory_mib=p.memory_mib,
            name=f"MIG {p.name}",
        )

    def _profile(self, gpu: GpuHandle, profile_id: int) -> GpuInstanceProfile:
        p = migtables.by_id(self._table(gpu), profile_id)
        if p is None:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no GPU instance profile ID {profile_id}")
        return p

    def gpu_instance_possible_placements(self, gpu: GpuHandle, profile_id: int) -> list[Placement]:
        """The table's placements of the profile."""
        p = self._profile(gpu, profile_id)
        return [Placement(start, p.memory_slices) for start in p.starts]

    def create_gpu_instance_with_placement(
        self, gpu: GpuHandle, profile_id: int, placement: Placement
    ) -> GpuInstanceHandle:
        """A new GPU instance at the placement, with the lowest free ID."""
        assert isinstance(gpu, int)
        p = self._profile(gpu, profile_id)
        if placement.start not in p.starts or placement.size != p.memory_slices:
            raise GpuLibraryError(
                ERROR_INVALID_ARGUMENT, f"{p.name} cannot be placed at {placement.start}:{placement.size}"
            )
        with self._lock:
            state = self._load()
            existing = state.setdefault(gpu, [])
            same = sum(1 for i in existing if i.profile == p.name)
            used = sum(self._slices(gpu, i.profile) for i in existing)
            if (
                _overlaps(existing, placement.start, placement.size)
                or same >= p.instance_count
                or used + p.slices > migtables.COMPUTE_SLICES
            ):
                raise GpuLibraryError(
                    ERROR_INSUFFICIENT_RESOURCES,
                    f"GPU {gpu}: no room for {p.name} at {placement.start}:{placement.size}",
                )
            ids = {i.gpu_instance_id for i in existing}
            gi = next(n for n in range(1, 64) if n not in ids)
            # Never reused, even after every instance is gone: a re-made MIG device has a new UUID.
            serial = time.time_ns()
            existing.append(FakeInstance(gi, p.name, placement.start, placement.size, [], serial))
            self._save(state)
        return GpuInstanceHandle(_FakeGi(gpu, gi))

    def _slices(self, gpu: GpuHandle, name: str) -> int:
        return next(p.slices for p in self._gpu(gpu).model.mig_table if p.name == name)

    def gpu_instances(self, gpu: GpuHandle, profile_id: int) -> list[GpuInstanceHandle]:
        """The GPU instances of the profile."""
        assert isinstance(gpu, int)
        name = self._profile(gpu, profile_id).name
        return [
            GpuInstanceHandle(_FakeGi(gpu, i.gpu_instance_id))
            for i in self._instances(gpu)
            if i.profile == name
        ]

    def gpu_instance_by_id(self, gpu: GpuHandle, gpu_instance_id: int) -> GpuInstanceHandle:
        """The GPU instance of this ID; NOT_FOUND when there is none."""
        assert isinstance(gpu, int)
        self._table(gpu)
        if not any(i.gpu_instance_id == gpu_instance_id for i in self._instances(gpu)):
            raise GpuLibraryError(ERROR_NOT_FOUND, f"GPU {gpu} has no GPU instance {gpu_instance_id}")
        return GpuInstanceHandle(_FakeGi(gpu, gpu_instance_id))

    def _gi(self, state: dict[int, list[FakeInstance]], gi: GpuInstanceHandle) -> FakeInstance:
        assert isinstance(gi, _FakeGi)
        found = next(
            (i for i in state.get(gi.gpu_index, []) if i.gpu_instance_id == gi.gpu_instance_id), None
        )
        if found is None:
            raise GpuLibraryError(ERROR_NOT_FOUND, f"GPU instance {gi.gpu_instance_id} does not exist")
        return found

    def gpu_instance_info(self, gi: GpuInstanceHandle) -> GpuInstanceInfo:
        """ID, profile ID and placement."""
        assert isinstance(gi, _FakeGi)
        with self._lock:
            instance = self._gi(self._load(), gi)
        profile = next(
            p for p in self._gpu(GpuHandle(gi.gpu_index)).model.mig_table if p.name == instance.profile
        )
        return GpuInstanceInfo(instance.gpu_instance_id, profile.id, Placement(instance.start, instance.size))

    def create_compute_instance(self, gi: GpuInstanceHandle, profile: int) -> ComputeInstanceHandle:
        """A compute instance with the lowest free ID, if the GPU instance has the slices left."""
        assert isinstance(gi, _FakeGi)
        slices = next((n for n, p in migtables.COMPUTE_PROFILE_BY_SLICES.items() if p == profile), None)
        if slices is None:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no compute instance profile {profile}")
        with self._lock:
            state = self._load()
            instance = self._gi(state, gi)
            own = self._slices(GpuHandle(gi.gpu_index), instance.profile)
            if slices > own or (instance.compute_instances and slices == own):
                raise GpuLibraryError(
                    ERROR_INSUFFICIENT_RESOURCES,
                    f"GPU instance {gi.gpu_instance_id} has no {slices} slices free",
                )
            ci = next(n for n in range(64) if n not in instance.compute_instances)
            instance.compute_instances.append(ci)
            self._save(state)
        if self.on_mig_change is not None:
            self.on_mig_change()
        return ComputeInstanceHandle(_FakeCi(gi.gpu_index, gi.gpu_instance_id, ci))

    def compute_instances(self, gi: GpuInstanceHandle) -> list[ComputeInstanceHandle]:
        """The compute instances of the GPU instance."""
        assert isinstance(gi, _FakeGi)
        with self._lock:
            instance = self._gi(self._load(), gi)
        return [
            ComputeInstanceHandle(_FakeCi(gi.gpu_index, gi.gpu_instance_id, ci))
            for ci in sorted(instance.compute_instances)
        ]

    def compute_instance_info_id(self, ci: ComputeInstanceHandle) -> int:
        """Its ID."""
        assert isinstance(ci, _FakeCi)
        return ci.compute_instance_id

    def destroy_compute_instance(self, ci: ComputeInstanceHandle) -> None:
        """Remove it from its GPU instance."""
        assert isinstance(ci, _FakeCi)
        with self._lock:
            state = self._load()
            instance = self._gi(state, GpuInstanceHandle(_FakeGi(ci.gpu_index, ci.gpu_instance_id)))
            if ci.compute_instance_id not in instance.compute_instances:
                raise GpuLibraryError(
                    ERROR_NOT_FOUND, f"compute instance {ci.compute_instance_id} does not exist"
                )
            instance.compute_instances.remove(ci.compute_instance_id)
            self._save(state)

    def destroy_gpu_instance(self, gi: GpuInstanceHandle) -> None:
        """Remove it; IN_USE while it has compute instances."""
        assert isinstance(gi, _FakeGi)
        with self._lock:
            state = self._load()
            instance = self._gi(state, gi)
            if instance.compute_instances:
                raise GpuLibraryError(
                    ERROR_IN_USE, f"GPU instance {gi.gpu_instance_id} still has compute instances"
                )
            state[gi.gpu_index].remove(instance)
            self._save(state)

    def _mig(self, mig: MigHandle) -> _FakeMig:
        assert isinstance(mig, _FakeMig)
        return mig

    def mig_attributes(self, mig: MigHandle) -> MigAttributes:
        """Sizes from the model's MIG profile table."""
        fake = self._mig(mig)
        p = self._gpu(mig).model.mig_profiles[fake.profile]
        return MigAttributes(
            multiprocessors=p.multiprocessors,
            copy_engines=p.copy_engines,
            decoders=p.decoders,
            encoders=p.encoders,
            jpeg_engines=p.jpeg_engines,
            ofa_engines=p.ofa_engines,
            gpu_instance_slices=p.gpu_instance_slices,
            compute_instance_slices=p.gpu_instance_slices,
            memory_mib=p.memory_mib,
        )

    def gpu_instance_id(self, mig: MigHandle) -> int:
        """Assigned in profile order, from 1."""
        return self._mig(mig).gpu_instance_id

    def compute_instance_id(self, mig: MigHandle) -> int:
        """The compute instance the MIG device is."""
        return self._mig(mig).compute_instance_id

    def pcie_root(self, pci_bus_id: str) -> str | None:
        """The profile's root, else GPUs in pairs behind one root complex."""
        domain_text, bus_text, _ = pci_bus_id.split(":")
        domain = int(domain_text, 16)
        index = domain * _BUSES_PER_DOMAIN + (int(bus_text, 16) - 0x10) // 0x10
        explicit = self.profile.gpus[index].pcie_root
        first_of_pair = (index % _BUSES_PER_DOMAIN) // 2 * 2
        return explicit or f"pci{domain:04x}:{0x10 + 0x10 * first_of_pair:02x}"

    def mig_capability_minors(self) -> dict[str, int]:
        """With a root, every GPU's capability minors as the driver numbers them; else none."""
        if self.root is None:
            return {}
        minors: dict[str, int] = {}
        for gpu in range(len(self.profile.gpus)):
            for gi in range(MIG_GPU_INSTANCES):
                minors[f"gpu{gpu}/gi{gi}/access"] = mig_cap_minor(gpu, gi)
                for ci in range(MIG_COMPUTE_INSTANCES):
                    minors[f"gpu{gpu}/gi{gi}/ci{ci}/access"] = mig_cap_minor(gpu, gi, ci)
        return minors

    def path_exists(self, path: str) -> bool:
        """Whether the node exists under the root; without one fake GPUs have no device nodes."""
        return self.root is not None and (self.root / path.lstrip("/")).exists()

    def watch_xid_events(self, gpu: GpuHandle) -> None:
        """Remember which GPUs are watched."""
        self._watched.add(int(str(gpu)))

    def _load_state(self) -> dict[str, dict[str, int]]:
        if self._state_file is None:
            return self._state
        try:
            loaded = json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise GpuLibraryError(ERROR_UNKNOWN, f"fake GPU state {self._state_file}: {err}") from None
        return loaded if isinstance(loaded, dict) else {}

    def set_time_slice(self, gpu: GpuHandle, level: int) -> None:
        """Record the level, as `nvidia-smi compute-policy --set-timeslice` would set it.

        nvidia-smi accepts 0 to 3 only; anything else fails as it would.
        """
        if level not in range(4):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"invalid time slice {level}; valid: 0-3")
        state = self._load_state()
        state.setdefault(self.uuid(gpu), {})["timeSlice"] = level
        self._state = state
        if self._state_file is not None:
            # dra.gpu sits below dra.adapters (atomicfile); a rename is atomic enough for a fake.
            self._state_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._state_file.with_name(f".{self._state_file.name}.tmp")
            tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, self._state_file)

    def time_slice(self, gpu: GpuHandle) -> int:
        """The recorded level; 0 (Default) for a GPU never set."""
        return int(self._load_state().get(self.uuid(gpu), {}).get("timeSlice", 0))

    def unwatch_xid_events(self) -> None:
        """Forget the watched GPUs."""
        self._watched.clear()

    def wait_xid_event(self, timeout_ms: int) -> XidEvent | None:
        """The next line appended to the events file, or None after the timeout."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            event = self._next_event()
            if event is not None or time.monotonic() >= deadline:
                return event
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))

    def _next_event(self) -> XidEvent | None:
        if self._events_file is None:
            return None
        try:
            with self._events_file.open() as f:
                f.seek(self._events_offset)
                line = f.readline()
                if not line.endswith("\n"):
                    return None
                self._events_offset = f.tell()
        except FileNotFoundError:
            return None
        return parse_event_line(line)


def _overlaps(instances: list[FakeInstance], start: int, size: int) -> bool:
    return any(i.start < start + size and start < i.start + i.size for i in instances)


def _number(fields: list[str], index: int) -> int | None:
    text = fields[index] if index < len(fields) else ""
    return int(text) if text.isdigit() else None


def parse_event_line(line: str) -> XidEvent:
    """One events file line, `<uuid> <xid> [<gpu instance> [<compute instance>]]`.

    A field that is not a number counts as absent (an XID as 0), as does NVML's 4294967295.
    """
    fields = line.split()
    gpu_instance, compute_instance = _number(fields, 2), _number(fields, 3)
    return XidEvent(
        uuid=fields[0] if fields else "",
        xid=_number(fields, 1) or 0,
        gpu_instance_id=None if gpu_instance == NO_INSTANCE else gpu_instance,
        # A compute instance lives in a GPU instance: alone it names nothing.
        compute_instance_id=None
        if gpu_instance in (None, NO_INSTANCE) or compute_instance == NO_INSTANCE
        else compute_instance,
    )
