"""Fake GPUs: profiles of realistic NVIDIA hardware behind the GpuLibrary interface.

A profile says which GPUs a node has (`h100x8`, `a100x4-mig`, ... or a YAML
file, see docs/configuration.md). FakeGpuLibrary answers the same NVML calls
as the real library, with UUIDs derived from the node name so that many fake
nodes differ, and no host device nodes (containers get no paths that do not
exist). XID errors can be injected by appending "<uuid> <xid>" lines to an
events file, which the health monitor reads like NVML events.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dra.discovery import ARCHITECTURES, BRANDS
from dra.nvml import (
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    GpuHandle,
    GpuLibraryError,
    MigAttributes,
    MigHandle,
    XidEvent,
)

# An even number, so that the pairs of GPUs that share a root never straddle two domains.
_BUSES_PER_DOMAIN = 14
_UUID_NAMESPACE = uuid.UUID("0b9c4a52-8b0e-4c36-9a55-6c0f3f1d2a71")


class ProfileError(ValueError):
    """A fake-GPU profile is invalid; the message names the field and what to fix."""


@dataclass(frozen=True)
class MigProfile:
    """Sizes of one MIG profile on one GPU model (as nvmlDeviceGetAttributes reports them)."""

    gpu_instance_slices: int
    multiprocessors: int
    memory_mib: int
    copy_engines: int
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0


@dataclass(frozen=True)
class GpuModel:
    """What NVML reports for one product."""

    product_name: str
    brand: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_mib: int
    mig_profiles: dict[str, MigProfile] = field(default_factory=dict)
    mig_slices: int = 7


_H100_MIG = {
    "1g.10gb": MigProfile(1, 16, 9856, 1, decoders=1, jpeg_engines=1),
    "1g.20gb": MigProfile(1, 16, 19968, 1, decoders=1, jpeg_engines=1),
    "2g.20gb": MigProfile(2, 32, 19968, 2, decoders=2, jpeg_engines=2),
    "3g.40gb": MigProfile(3, 60, 40192, 3, decoders=3, jpeg_engines=3),
    "4g.40gb": MigProfile(4, 64, 40192, 4, decoders=4, jpeg_engines=4),
    "7g.80gb": MigProfile(7, 132, 80384, 8, decoders=7, jpeg_engines=7, ofa_engines=1),
}

#: Known products, keyed by a short model name (case-insensitive in profiles).
MODELS: dict[str, GpuModel] = {
    "h100-sxm5-80gb": GpuModel("NVIDIA H100 80GB HBM3", 14, 9, (9, 0), 81559, _H100_MIG),
    "h200-sxm5-141gb": GpuModel("NVIDIA H200", 14, 9, (9, 0), 143771),
    "a100-sxm4-40gb": GpuModel(
        "NVIDIA A100-SXM4-40GB",
        14,
        7,
        (8, 0),
        40960,
        {
            "1g.5gb": MigProfile(1, 14, 4864, 1),
            "1g.5gb+me": MigProfile(1, 14, 4864, 1, decoders=1, jpeg_engines=1, ofa_engines=1),
            "2g.10gb": MigProfile(2, 28, 9984, 2, decoders=1),
            "3g.20gb": MigProfile(3, 42, 19968, 3, decoders=2),
            "4g.20gb": MigProfile(4, 56, 19968, 4, decoders=2),
            "7g.40gb": MigProfile(7, 98, 40192, 7, decoders=5, jpeg_engines=1, ofa_engines=1),
        },
    ),
    "l40s": GpuModel("NVIDIA L40S", 14, 8, (8, 9), 46068),
    "t4": GpuModel("Tesla T4", 14, 6, (7, 5), 15360),
}

#: Built-in profiles, in the profile file format.
BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "h100x8": {"gpus": [{"model": "h100-sxm5-80gb", "count": 8}]},
    "h100x8-mig": {
        "gpus": [
            {"model": "h100-sxm5-80gb", "count": 4},
            {"model": "h100-sxm5-80gb", "count": 4, "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]},
        ]
    },
    "a100x4-mig": {
        "gpus": [
            {"model": "a100-sxm4-40gb", "mig": ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]},
            {"model": "a100-sxm4-40gb", "mig": ["1g.5gb"] * 7},
            {"model": "a100-sxm4-40gb", "mig": ["4g.20gb", "3g.20gb"]},
            {"model": "a100-sxm4-40gb", "mig": ["7g.40gb"]},
        ]
    },
    "mixed": {"gpus": [{"model": "l40s", "count": 2}, {"model": "t4", "count": 2}]},
}

_PROFILE_KEYS = {"driverVersion", "cudaDriverVersion", "gpus"}
_GPU_KEYS = {
    "model",
    "count",
    "mig",
    "productName",
    "brand",
    "architecture",
    "computeCapability",
    "memoryMiB",
    "numaNode",
    "pcieRoot",
}


@dataclass(frozen=True)
class FakeGpu:
    """One GPU of a profile, fully resolved."""

    model: GpuModel
    mig: tuple[str, ...] | None
    numa_node: int | None = None
    pcie_root: str | None = None


@dataclass(frozen=True)
class Profile:
    """A validated fake-GPU profile."""

    name: str
    gpus: tuple[FakeGpu, ...]
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040


def _reverse(table: dict[int, str], value: object, where: str) -> int:
    for code, label in table.items():
        if str(value).lower() == label.lower():
            return code
    raise ProfileError(f"{where}: unknown value {value!r}; one of: {', '.join(sorted(table.values()))}")


def _int(value: object, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProfileError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _model(entry: dict[str, Any], where: str) -> GpuModel:
    key = entry.get("model")
    if key is not None:
        model = MODELS.get(str(key).lower())
        if model is None:
            raise ProfileError(f"{where}.model: unknown model {key!r}; known: {', '.join(sorted(MODELS))}")
    elif "productName" in entry and "memoryMiB" in entry:
        model = GpuModel(str(entry["productName"]), 14, 9, (9, 0), 0)
    else:
        raise ProfileError(f"{where}: give a catalog `model` or at least `productName` and `memoryMiB`")
    overrides: dict[str, Any] = {}
    if "productName" in entry:
        overrides["product_name"] = str(entry["productName"])
    if "brand" in entry:
        overrides["brand"] = _reverse(BRANDS, entry["brand"], f"{where}.brand")
    if "architecture" in entry:
        overrides["architecture"] = _reverse(ARCHITECTURES, entry["architecture"], f"{where}.architecture")
    if "computeCapability" in entry:
        major, _, minor = str(entry["computeCapability"]).partition(".")
        if not (major.isdigit() and minor.isdigit()):
            raise ProfileError(f"{where}.computeCapability: expected MAJOR.MINOR such as 9.0")
        overrides["compute_capability"] = (int(major), int(minor))
    if "memoryMiB" in entry:
        overrides["memory_mib"] = _int(entry["memoryMiB"], f"{where}.memoryMiB", 1)
    return replace(model, **overrides)


def _mig(entry: dict[str, Any], model: GpuModel, where: str) -> tuple[str, ...] | None:
    if "mig" not in entry:
        return None
    profiles = entry["mig"]
    if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
        raise ProfileError(f"{where}.mig: expected a list of MIG profile names such as [3g.40gb, 1g.10gb]")
    if not model.mig_profiles:
        raise ProfileError(f"{where}.mig: {model.product_name} does not support MIG")
    for i, name in enumerate(profiles):
        if name not in model.mig_profiles:
            known = ", ".join(model.mig_profiles)
            raise ProfileError(
                f"{where}.mig[{i}]: {name!r} is not a MIG profile of {model.product_name}; known: {known}"
            )
    slices = sum(model.mig_profiles[p].gpu_instance_slices for p in profiles)
    if slices > model.mig_slices:
        raise ProfileError(
            f"{where}.mig: the profiles need {slices} GPU-instance slices, "
            f"{model.product_name} has {model.mig_slices}"
        )
    return tuple(profiles)


def parse_profile(data: object, name: str) -> Profile:
    """Validate a profile document (already loaded from YAML)."""
    if not isinstance(data, dict):
        raise ProfileError(f"profile {name}: expected a mapping with a `gpus` list")
    unknown = set(data) - _PROFILE_KEYS
    if unknown:
        raise ProfileError(
            f"profile {name}: unknown keys {sorted(unknown)}; allowed: {sorted(_PROFILE_KEYS)}"
        )
    entries = data.get("gpus")
    if not isinstance(entries, list) or not entries:
        raise ProfileError(f"profile {name}: `gpus` must be a non-empty list")
    gpus: list[FakeGpu] = []
    for i, entry in enumerate(entries):
        where = f"gpus[{i}]"
        if not isinstance(entry, dict):
            raise ProfileError(f"{where}: expected a mapping")
        unknown = set(entry) - _GPU_KEYS
        if unknown:
            raise ProfileError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_GPU_KEYS)}")
        model = _model(entry, where)
        mig = _mig(entry, model, where)
        numa = _int(entry["numaNode"], f"{where}.numaNode") if "numaNode" in entry else None
        root = str(entry["pcieRoot"]) if "pcieRoot" in entry else None
        count = _int(entry.get("count", 1), f"{where}.count", 1)
        gpus.extend(FakeGpu(model, mig, numa, root) for _ in range(count))
    cuda = str(data.get("cudaDriverVersion", "12.4"))
    major, _, minor = cuda.partition(".")
    if not (major.isdigit() and (minor.isdigit() or minor == "")):
        raise ProfileError(f"profile {name}: cudaDriverVersion must look like 12.4, got {cuda!r}")
    return Profile(
        name=name,
        gpus=tuple(gpus),
        driver_version=str(data.get("driverVersion", "550.54.15")),
        cuda_driver_version=int(major) * 1000 + int(minor or 0) * 10,
    )


def _select_for_node(data: dict[str, Any], path: Path, node_name: str | None) -> Profile:
    nodes = data.get("nodes")
    unknown = set(data) - {"nodes", "default"}
    if not isinstance(nodes, dict) or unknown:
        raise ProfileError(
            f"{path}: a per-node profile map has only `nodes` (node name -> profile) and `default`"
        )
    choice = nodes.get(node_name) if node_name else None
    where = f"{path}: nodes[{node_name}]"
    if choice is None:
        choice = data.get("default")
        where = f"{path}: default"
    if choice is None:
        listed = ", ".join(sorted(nodes)) or "none"
        raise ProfileError(f"{path}: no profile for node {node_name!r} (listed: {listed}) and no `default`")
    if isinstance(choice, str) and choice in BUILTIN_PROFILES:
        return parse_profile(BUILTIN_PROFILES[choice], choice)
    return parse_profile(choice, where)


def load_profile(spec: str, node_name: str | None = None) -> Profile:
    """A built-in profile by name, a profile file, or a per-node map file picked by node name.

    A per-node map is YAML with `nodes` (node name -> built-in name or inline profile)
    and an optional `default`, so one DaemonSet can give each node its own fake GPUs.
    """
    if spec in BUILTIN_PROFILES:
        return parse_profile(BUILTIN_PROFILES[spec], spec)
    path = Path(spec)
    if not path.is_file():
        raise ProfileError(
            f"fake GPU profile {spec!r} is neither a built-in ({', '.join(BUILTIN_PROFILES)}) nor a file"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ProfileError(f"{path}: cannot read the profile: {err}") from err
    except yaml.YAMLError as err:
        # PyYAML's own message spans several lines (with a source excerpt); keep one.
        detail = " ".join(str(err).split())
        if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
            mark = err.problem_mark
            detail = f"line {mark.line + 1}, column {mark.column + 1}: {err.problem}"
        raise ProfileError(f"{path}: not valid YAML: {detail}") from err
    if isinstance(data, dict) and "nodes" in data:
        return _select_for_node(data, path, node_name)
    return parse_profile(data, str(path))


@dataclass(frozen=True)
class _FakeMig:
    gpu_index: int
    slot: int
    profile: str
    gpu_instance_id: int


class FakeGpuLibrary:
    """GpuLibrary over a profile; UUIDs depend on the node name."""

    def __init__(self, profile: Profile, node_name: str, events_file: Path | None = None) -> None:
        self.profile = profile
        self.node_name = node_name
        self._events_file = events_file
        self._events_offset = 0
        self._watched: set[int] = set()

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
            return self._uuid("MIG", f"gpu/{gpu.gpu_index}/mig/{gpu.gpu_instance_id}/0")
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
        """MIG on where the profile lists MIG devices; NOT_SUPPORTED on models without MIG."""
        fake = self._gpu(gpu)
        if not fake.model.mig_profiles:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "MIG not supported")
        mode = 1 if fake.mig is not None else 0
        return mode, mode

    def max_mig_device_count(self, gpu: GpuHandle) -> int:
        """Seven slots on MIG-capable GPUs."""
        return self._gpu(gpu).model.mig_slices if self._gpu(gpu).model.mig_profiles else 0

    def mig_device_by_index(self, gpu: GpuHandle, index: int) -> MigHandle:
        """The index-th MIG device of the profile, in order."""
        assert isinstance(gpu, int)
        profiles = self._gpu(gpu).mig or ()
        if index >= len(profiles):
            raise GpuLibraryError(ERROR_NOT_FOUND, "no MIG device in this slot")
        return MigHandle(_FakeMig(gpu, index, profiles[index], gpu_instance_id=index + 1))

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
        """One compute instance per GPU instance."""
        return 0

    def pcie_root(self, pci_bus_id: str) -> str | None:
        """The profile's root, else GPUs in pairs behind one root complex."""
        domain_text, bus_text, _ = pci_bus_id.split(":")
        domain = int(domain_text, 16)
        index = domain * _BUSES_PER_DOMAIN + (int(bus_text, 16) - 0x10) // 0x10
        explicit = self.profile.gpus[index].pcie_root
        first_of_pair = (index % _BUSES_PER_DOMAIN) // 2 * 2
        return explicit or f"pci{domain:04x}:{0x10 + 0x10 * first_of_pair:02x}"

    def mig_capability_minors(self) -> dict[str, int]:
        """Fake GPUs have no capability devices."""
        return {}

    def path_exists(self, path: str) -> bool:
        """Fake GPUs have no device nodes on the host."""
        return False

    def watch_xid_events(self, gpus: list[GpuHandle]) -> None:
        """Remember which GPUs are watched."""
        self._watched.update(int(str(g)) for g in gpus)

    def wait_xid_event(self, timeout_ms: int) -> XidEvent | None:
        """The next "<uuid> <xid>" line appended to the events file, or None after the timeout."""
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
        uuid_text, _, xid = line.strip().partition(" ")
        return XidEvent(uuid=uuid_text, xid=int(xid) if xid.isdigit() else 0)
