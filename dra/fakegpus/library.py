"""Fake GPUs behind the GpuLibrary interface, from a profile (dra.fakegpus.profiles).

FakeGpuLibrary answers the same NVML calls as the real library, with UUIDs
derived from the node name so that many fake nodes differ. By default it has
no host device nodes (containers get no paths that do not exist); given a
root (--fake-gpu-root, for real containers in the local cluster) it looks
device nodes up under that root, where dra.fakegpus.node makes them, and
lists MIG capability minors as the driver's /proc/driver/nvidia-caps/mig-minors
does. XID errors can be injected
by appending lines to an events file, which the health monitor reads like
NVML events:

    <uuid> <xid> [<gpu instance ID> [<compute instance ID>]]

The instance IDs are those NVML gives for an error on one MIG instance of a
GPU in MIG mode (a MIG device's are in its name, gpu-4-mig-1g10gb-<gi>-<ci>);
without them, or with 4294967295 (NVML's "none"), the error concerns the
whole GPU.

MIG mode and MIG instances are dra.fakegpus.mig's (FakeMigPartitions, which
FakeGpuLibrary extends).

The addressing mode is the model's (HMM for every catalog model: Turing and
newer GPUs on an x86 host with NVIDIA's open kernel modules; see
dra.fakegpus.profiles), or the profile's `addressingMode` where it sets one, with
`unsupported` answered as NVML's NOT_SUPPORTED.

Settings the driver changes on a GPU (the compute time slice) are kept in a
JSON state file when one is given, `{"<uuid>": {"timeSlice": <level>}}`, the way a real
GPU keeps them across a restart of the driver; `dra-gpu time-slices` shows them.

Processes with device memory and duty cycles run on the GPUs as a control file declares
them (dra.fakegpus.processes, `processes`); memory used, utilisation, the per-process calls and
GPM answer from them as NVML does: device utilisation NOT_SUPPORTED and per-process
utilisation NOT_SUPPORTED in MIG mode, NOT_FOUND from per-process utilisation when every
process is idle, GPM on Hopper and newer only.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from dra import documents
from dra.fakegpus.mig import FakeMigDevice, FakeMigPartitions
from dra.fakegpus.processes import FakeProcess, FakeProcesses
from dra.fakegpus.profiles import Profile
from dra.gpu.discovery import mig_handles
from dra.gpu.library import (
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    ERROR_UNKNOWN,
    NO_INSTANCE,
    GpmSample,
    GpuHandle,
    GpuLibraryError,
    MigHandle,
    ProcessMemory,
    ProcessUtilization,
    XidEvent,
)

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
#: nvmlDeviceArchitecture_t of Hopper, the first with GPM counters (nvml.h: "For Hopper or newer").
_GPM_ARCHITECTURE = 9


@dataclass(frozen=True)
class FakeGpmSample:
    """A GPM sample: whose counters (GPU index, GPU instance or None for the GPU) and their busy time."""

    gpu: int
    gpu_instance_id: int | None
    time: float
    busy: float


class FakeGpuLibrary(FakeMigPartitions):
    """GpuLibrary over a profile; UUIDs depend on the node name."""

    def __init__(
        self,
        profile: Profile,
        node_name: str,
        events_file: Path | None = None,
        state_file: Path | None = None,
        root: Path | None = None,
        mig_state: Path | None = None,
        processes: Path | None = None,
    ) -> None:
        super().__init__(profile, mig_state)
        #: The processes running on the GPUs, from the control file `processes` when given.
        self.processes = FakeProcesses(processes)
        self.node_name = node_name
        self._state_file = state_file
        self._state: dict[str, dict[str, int]] = {}
        #: Where the fake device nodes live (root/dev/nvidia0 ...); None: nowhere.
        self.root = root
        self._events_file = events_file
        self._events_offset = 0
        self._watched: set[int] = set()
        #: numa_sockets' answer, worked out once: it walks every GPU, and discovery asks it per GPU.
        self._sockets: dict[int, frozenset[int]] | None = None

    def _uuid(self, prefix: str, key: str) -> str:
        return f"{prefix}-{uuid.uuid5(_UUID_NAMESPACE, f'{self.node_name}/{key}')}"

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
        """GPU handles are their indexes; INVALID_ARGUMENT past the count, as nvml.h documents."""
        if not 0 <= index < len(self.profile.gpus):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"no GPU {index}")
        return GpuHandle(index)

    def name(self, gpu: GpuHandle | MigHandle) -> str:
        """Product name, with " MIG <profile>" for MIG devices as NVML does."""
        if isinstance(gpu, FakeMigDevice):
            return f"{self._gpu(gpu).model.product_name} MIG {gpu.profile}"
        return self._gpu(gpu).model.product_name

    def uuid(self, gpu: GpuHandle | MigHandle) -> str:
        """Stable per node and device."""
        if isinstance(gpu, FakeMigDevice):
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
        return self._numa_node(gpu)

    def _numa_node(self, index: int) -> int:
        explicit = self.profile.gpus[index].numa_node
        if explicit is not None:
            return explicit
        return index * 2 // max(len(self.profile.gpus), 2)

    def numa_nodes(self, gpu: GpuHandle) -> tuple[int, ...]:
        """The GPU's node, then the other nodes of its socket (numa_sockets), as dra.gpu.numa reads sysfs."""
        assert isinstance(gpu, int)
        node = self._numa_node(gpu)
        return (node, *sorted(self.numa_sockets()[node] - {node}))

    def numa_sockets(self) -> dict[int, frozenset[int]]:
        """Each NUMA node of the GPUs with the nodes of its socket, all as close to each other.

        A profile's `numaNode` list names nodes of one socket; nodes listed by no GPU together
        are sockets of their own (the fake node's SLIT table says so: fakenvml.host).
        """
        if self._sockets is None:
            sockets: list[set[int]] = []
            for index, gpu in enumerate(self.profile.gpus):
                nodes = {self._numa_node(index), *gpu.same_socket_numa_nodes}
                joined = [s for s in sockets if s & nodes]
                sockets = [s for s in sockets if not s & nodes] + [nodes.union(*joined)]
            self._sockets = {node: frozenset(s) for s in sockets for node in s}
        return dict(self._sockets)

    def pci_device_id(self, gpu: GpuHandle) -> int:
        """The model's PCI device ID, with NVIDIA's vendor ID in the low 16 bits."""
        return self._gpu(gpu).model.pci_device_id

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
        source = "fake GPU state"
        move = "move it away (the settings start anew)"
        try:
            raw = documents.read_file(self._state_file, source)
            loaded = documents.load_json(raw, f"{source} {self._state_file}")
        except documents.MissingFileError:
            return {}
        except documents.DocumentError as err:
            raise GpuLibraryError(ERROR_UNKNOWN, f"{err}; {move}") from None
        # A mapping of UUIDs to each GPU's settings, a level of 0 to 3 each: as set_time_slice writes it.
        if not isinstance(loaded, dict) or not all(
            isinstance(gpu, dict) and gpu.get("timeSlice", 0) in range(4) and gpu.get("timeSlice") is not True
            for gpu in loaded.values()
        ):
            raise GpuLibraryError(ERROR_UNKNOWN, f"{source} {self._state_file} is not one; {move}")
        return loaded

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
            # dra.gpu sits below dra.adapters (nodefiles); a rename is atomic enough for a fake.
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

    def _on(self, device: GpuHandle | MigHandle) -> list[FakeProcess]:
        """The processes on a MIG device, or on a GPU and all its MIG devices."""
        uuids = {self.uuid(device), *(self.uuid(MigHandle(mig)) for mig in self._migs(device))}
        return [p for p in self.processes.current() if p.device in uuids]

    def memory_used(self, device: GpuHandle | MigHandle) -> int:
        """The memory of the device's processes, and on a whole GPU outside MIG mode the driver's own."""
        reserved = 0
        if isinstance(device, int) and not self._mig_on(GpuHandle(device)):
            reserved = self._gpu(GpuHandle(device)).model.idle_used_bytes
        return reserved + sum(p.memory for p in self._on(device))

    def utilization(self, gpu: GpuHandle) -> int:
        """The duties of the GPU's processes added up, in percent (at most 100); NOT_SUPPORTED in MIG mode."""
        if self._mig_on(gpu):
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "utilization of a GPU in MIG mode")
        return min(round(sum(p.duty for p in self._on(gpu)) * 100), 100)

    def running_processes(self, device: GpuHandle | MigHandle) -> list[ProcessMemory]:
        """Each process with its memory, and on a MIG device its instance IDs."""
        migs = {self.uuid(MigHandle(m)): m for m in self._migs(device)}
        if isinstance(device, FakeMigDevice):
            migs[self.uuid(device)] = device
        found = []
        for process in self._on(device):
            mig = migs.get(process.device)
            found.append(
                ProcessMemory(
                    process.pid,
                    process.memory,
                    None if mig is None else mig.gpu_instance_id,
                    None if mig is None else mig.compute_instance_id,
                )
            )
        return found

    def _migs(self, device: GpuHandle | MigHandle) -> list[FakeMigDevice]:
        """The MIG devices of a GPU in MIG mode; none for a MIG device or a GPU off MIG mode."""
        if isinstance(device, FakeMigDevice) or not self._mig_on(GpuHandle(device)):
            return []
        return [m for m in mig_handles(self, GpuHandle(device)) if isinstance(m, FakeMigDevice)]

    def process_utilization(self, gpu: GpuHandle, since_us: int) -> list[ProcessUtilization]:
        """A sample now of each process with a duty; NOT_FOUND without one, NOT_SUPPORTED in MIG mode."""
        if self._mig_on(gpu):
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "process utilization of a GPU in MIG mode")
        now = int(self.processes.clock() * 1_000_000)
        samples = [ProcessUtilization(p.pid, now, round(p.duty * 100)) for p in self._on(gpu) if p.duty > 0]
        if not samples or now <= since_us:
            raise GpuLibraryError(ERROR_NOT_FOUND, "no process utilization samples")
        return samples

    def gpm_supported(self, gpu: GpuHandle) -> bool:
        """Hopper and newer."""
        return self._gpu(gpu).model.architecture >= _GPM_ARCHITECTURE

    def gpm_sample(self, gpu: GpuHandle, gpu_instance_id: int | None) -> GpmSample:
        """The busy time so far of the GPU, or of the MIG devices of one GPU instance.

        NOT_SUPPORTED before Hopper; NOT_FOUND for a GPU instance the GPU does not have.
        """
        if not self.gpm_supported(gpu):
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "GPM needs Hopper or newer")
        if gpu_instance_id is None:
            devices = [self.uuid(gpu), *(self.uuid(MigHandle(m)) for m in self._migs(gpu))]
        else:
            devices = [
                self.uuid(MigHandle(m)) for m in self._migs(gpu) if m.gpu_instance_id == gpu_instance_id
            ]
            if not devices:
                raise GpuLibraryError(ERROR_NOT_FOUND, f"no GPU instance {gpu_instance_id}")
        now, busy = self.processes.busy_seconds(devices)
        return GpmSample(FakeGpmSample(int(str(gpu)), gpu_instance_id, now, busy))

    def gpm_graphics_utilization(self, first: GpmSample, second: GpmSample) -> float:
        """Busy time between the samples over the time between them, in percent (at most 100)."""
        if not isinstance(first, FakeGpmSample) or not isinstance(second, FakeGpmSample):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "not a GPM sample")
        if (first.gpu, first.gpu_instance_id) != (second.gpu, second.gpu_instance_id):
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "GPM samples of different devices")
        elapsed = second.time - first.time
        if elapsed <= 0:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, "the second GPM sample is not newer")
        return min((second.busy - first.busy) / elapsed * 100, 100.0)

    def gpm_free(self, sample: GpmSample) -> None:
        """Nothing to free."""

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
            # Only a regular file: opening a FIFO would block the XID watch until a writer came.
            if not self._events_file.is_file():
                return None
            with self._events_file.open() as f:
                f.seek(self._events_offset)
                line = f.readline()
                if not line.endswith("\n"):
                    return None
                self._events_offset = f.tell()
        except FileNotFoundError:
            return None
        return parse_event_line(line)


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
