"""Fake-GPU profiles: a catalog of realistic NVIDIA products and the profile file format.

A profile says which GPUs a node has: a built-in name (`h100x8`, `h100x8-mig`,
`a100x4-mig`, `h100x8-dynamic-mig`, `a100x4-dynamic-mig`, `mixed`), a YAML
file, or a per-node map file that picks one by node name. docs/configuration.md
documents the format; every error names the field to fix. dra.fakegpus.library serves
a profile through the GpuLibrary interface.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from dra import documents
from dra.core.deviceentries import MAX_STRING_ATTRIBUTE
from dra.gpu import migtables
from dra.gpu.discovery import ADDRESSING_MODES, ARCHITECTURES, BRANDS
from dra.gpu.migtables import GpuInstanceProfile
from dra.model.devices import MAX_GPUS, MigEngines
from dra.model.pci import PCIE_ROOT
from dra.model.quoting import quote

_K = TypeVar("_K")


class ProfileError(ValueError):
    """A fake-GPU profile is invalid; the message names the field and what to fix."""


@dataclass(frozen=True)
class MigProfile:
    """Sizes of one MIG profile on one GPU model (as nvmlDeviceGetAttributes reports them)."""

    gpu_instance_slices: int
    memory_mib: int
    engines: MigEngines


#: nvmlDeviceAddressingMode of every catalog model: an x86 host with NVIDIA's open kernel modules
#: (the default install from driver R560 on, and needed for HMM) gives Turing and newer GPUs HMM.
#: A Grace Hopper or Grace Blackwell superchip would report ATS; a profile may say so.
_HMM = 1
#: How a profile says that NVML does not support the addressing-mode query on a GPU.
ADDRESSING_MODE_UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class GpuModel:
    """What NVML reports for one product."""

    product_name: str
    brand: int
    architecture: int
    compute_capability: tuple[int, int]
    memory_mib: int
    #: The model's GPU-instance profiles with their placements (dra.gpu.migtables); empty: no MIG.
    mig_table: tuple[GpuInstanceProfile, ...] = ()
    mig_slices: int = migtables.COMPUTE_SLICES
    #: nvmlDeviceAddressingMode value; None: NVML answers NOT_SUPPORTED.
    addressing_mode: int | None = _HMM
    #: nvmlPciInfo_t.pciDeviceId: the PCI device ID (pci.ids) << 16 | NVIDIA's vendor ID 0x10DE. The
    #: models' values are the ones mig-parted's device filters use (its A100_SXM4_40GB constant and
    #: the GPU Operator's default layouts: 0x20B010DE, 0x20B210DE, 0x233010DE), and pci.ids' for the rest.
    pci_device_id: int = 0x10DE
    #: nvmlMemory_t.used of the idle GPU outside MIG mode: what the driver keeps for itself. Measured on
    #: a real H200 (driver 580.159.04, tests/data/real/h200-580); 0 for the models not measured.
    idle_used_bytes: int = 0

    @property
    def mig_profiles(self) -> dict[str, MigProfile]:
        """Sizes of each MIG profile, by name."""
        return {p.name: MigProfile(p.slices, p.memory_mib, p.engines) for p in self.mig_table}


#: Known products, keyed by a short model name (case-insensitive in profiles).
MODELS: dict[str, GpuModel] = {
    "h100-sxm5-80gb": GpuModel(
        "NVIDIA H100 80GB HBM3", 14, 9, (9, 0), 81559, migtables.H100_80GB, pci_device_id=0x233010DE
    ),
    "h200-sxm5-141gb": GpuModel(
        "NVIDIA H200",
        14,
        9,
        (9, 0),
        143771,
        migtables.H200_141GB,
        pci_device_id=0x233510DE,
        idle_used_bytes=644_939_776,
    ),
    "a100-sxm4-40gb": GpuModel(
        "NVIDIA A100-SXM4-40GB", 14, 7, (8, 0), 40960, migtables.A100_40GB, pci_device_id=0x20B010DE
    ),
    "a100-sxm4-80gb": GpuModel(
        "NVIDIA A100-SXM4-80GB", 14, 7, (8, 0), 81920, migtables.A100_80GB, pci_device_id=0x20B210DE
    ),
    "l40s": GpuModel("NVIDIA L40S", 14, 8, (8, 9), 46068, pci_device_id=0x26B910DE),
    "t4": GpuModel("Tesla T4", 14, 6, (7, 5), 15360, pci_device_id=0x1EB810DE),
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
    # MIG mode on and no instance made: dynamic MIG (--mig-mode=dynamic) partitions them on demand.
    "h100x8-dynamic-mig": {"gpus": [{"model": "h100-sxm5-80gb", "count": 8, "mig": []}]},
    "a100x4-dynamic-mig": {"gpus": [{"model": "a100-sxm4-80gb", "count": 4, "mig": []}]},
    "mixed": {"gpus": [{"model": "l40s", "count": 2}, {"model": "t4", "count": 2}]},
}
#: The built-in profiles made for dynamic MIG: their name selects it when no MIG mode is given.
DYNAMIC_MIG_PROFILES = ("h100x8-dynamic-mig", "a100x4-dynamic-mig")


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
    "addressingMode",
    "migResetBlocked",
}


@dataclass(frozen=True)
class FakeGpu:
    """One GPU of a profile, fully resolved."""

    model: GpuModel
    mig: tuple[str, ...] | None
    numa_node: int | None = None
    pcie_root: str | None = None
    #: Other NUMA nodes of the GPU's socket as close to it as its own (sub-NUMA clustering), ascending:
    #: the rest of the profile's `numaNode` list.
    same_socket_numa_nodes: tuple[int, ...] = ()
    #: NVML cannot reset the GPU (passthrough to a VM, another client holding it): a MIG mode change
    #: on a model that needs a reset for it stays pending (dra.fakegpus.mig).
    mig_reset_blocked: bool = False


@dataclass(frozen=True)
class Profile:
    """A validated fake-GPU profile."""

    name: str
    gpus: tuple[FakeGpu, ...]
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040


def _reverse(table: Mapping[_K, str], value: object, where: str) -> _K:
    for code, label in table.items():
        if str(value).lower() == label.lower():
            return code
    raise ProfileError(f"{where}: unknown value {quote(value)}; one of: {', '.join(sorted(table.values()))}")


#: Linux's highest NUMA node (MAX_NUMNODES is at most 1 << 10), as Kubernetes' deviceattribute bounds it.
MAX_NUMA_NODE = 1023


def _int(value: object, where: str, minimum: int = 0, maximum: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ProfileError(f"{where}: expected an integer >= {minimum}, got {quote(value)}")
    if value > maximum:
        raise ProfileError(f"{where}: at most {maximum}, got {value}")
    return value


def _numa(value: object, where: str) -> tuple[int, tuple[int, ...]]:
    """A node, or a list: the GPU's node, then the other nodes of its socket as close to it."""
    if not isinstance(value, list):
        return _int(value, where, maximum=MAX_NUMA_NODE), ()
    nodes = [_int(v, f"{where}[{i}]", maximum=MAX_NUMA_NODE) for i, v in enumerate(value)]
    if not nodes or len(set(nodes)) != len(nodes):
        raise ProfileError(
            f"{where}: expected a NUMA node or a non-empty list of distinct ones, got {quote(value)}"
        )
    return nodes[0], tuple(sorted(nodes[1:]))


def _keys(unknown: set[Any]) -> str:
    """Unknown keys for a message: YAML keys need not be strings (`null:`, `1:`), nor short."""
    return "[" + ", ".join(sorted(quote(str(k)) for k in unknown)) + "]"


def _string(value: object, where: str) -> str:
    """A string field: a list or a number would be published as its Python spelling ("[1, 2]")."""
    if not isinstance(value, str):
        raise ProfileError(f"{where}: expected a string, got {quote(value)}")
    return value


def _product_name(value: object, where: str) -> str:
    """A product name the productName attribute holds whole: NVML's are, and a longer one would be cut."""
    name = _string(value, where)
    if len(name) > MAX_STRING_ATTRIBUTE:
        raise ProfileError(
            f"{where}: at most {MAX_STRING_ATTRIBUTE} characters (a device attribute's string), "
            f"has {len(name)}: {quote(name)}"
        )
    return name


def _pcie_root(value: object, where: str) -> str:
    root = _string(value, where)
    if not PCIE_ROOT.fullmatch(root):
        raise ProfileError(
            f"{where}: expected a root complex as sysfs names it, pci<domain>:<bus> in lower-case "
            f"hexadecimal such as pci0000:80, got {quote(value)}"
        )
    return root


def _digits(text: str) -> bool:
    """Decimal digits that int() takes: str.isdigit() also passes superscripts and other scripts' digits."""
    return text.isascii() and text.isdigit() and len(text) <= 9


def _model(entry: dict[str, Any], where: str) -> GpuModel:
    key = entry.get("model")
    if key is not None:
        model = MODELS.get(str(key).lower())
        if model is None:
            raise ProfileError(
                f"{where}.model: unknown model {quote(key)}; known: {', '.join(sorted(MODELS))}"
            )
    elif "productName" in entry and "memoryMiB" in entry:
        model = GpuModel(_product_name(entry["productName"], f"{where}.productName"), 14, 9, (9, 0), 0)
    else:
        raise ProfileError(f"{where}: give a catalog `model` or at least `productName` and `memoryMiB`")
    overrides: dict[str, Any] = {}
    if "productName" in entry:
        overrides["product_name"] = _product_name(entry["productName"], f"{where}.productName")
    if "brand" in entry:
        overrides["brand"] = _reverse(BRANDS, entry["brand"], f"{where}.brand")
    if "architecture" in entry:
        overrides["architecture"] = _reverse(ARCHITECTURES, entry["architecture"], f"{where}.architecture")
    if "computeCapability" in entry:
        major, _, minor = str(entry["computeCapability"]).partition(".")
        if not (_digits(major) and _digits(minor)):
            raise ProfileError(f"{where}.computeCapability: expected MAJOR.MINOR such as 9.0")
        overrides["compute_capability"] = (int(major), int(minor))
    if "memoryMiB" in entry:
        overrides["memory_mib"] = _int(entry["memoryMiB"], f"{where}.memoryMiB", 1)
    if "addressingMode" in entry:
        overrides["addressing_mode"] = _addressing_mode(entry["addressingMode"], f"{where}.addressingMode")
    return replace(model, **overrides)


def _addressing_mode(value: object, where: str) -> int | None:
    choices: dict[int | None, str] = dict(ADDRESSING_MODES.items())
    choices[None] = ADDRESSING_MODE_UNSUPPORTED
    if not isinstance(value, str):
        # YAML reads a bare `null` as None, which must not pass for the mode "None".
        known = ", ".join(sorted(choices.values()))
        raise ProfileError(f"{where}: expected one of {known} as a string, got {quote(value)}")
    return _reverse(choices, value, where)


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
                f"{where}.mig[{i}]: {quote(name)} is not a MIG profile of {model.product_name}; "
                f"known: {known}"
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
        raise ProfileError(f"profile {name}: unknown keys {_keys(unknown)}; allowed: {sorted(_PROFILE_KEYS)}")
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
            raise ProfileError(f"{where}: unknown keys {_keys(unknown)}; allowed: {sorted(_GPU_KEYS)}")
        model = _model(entry, where)
        mig = _mig(entry, model, where)
        numa, siblings = _numa(entry["numaNode"], f"{where}.numaNode") if "numaNode" in entry else (None, ())
        root = _pcie_root(entry["pcieRoot"], f"{where}.pcieRoot") if "pcieRoot" in entry else None
        # The bound is what the profile has room left for, so that the total stays within MAX_GPUS.
        count = _int(entry.get("count", 1), f"{where}.count", 1, MAX_GPUS - len(gpus))
        blocked = entry.get("migResetBlocked", False)
        if not isinstance(blocked, bool):
            raise ProfileError(f"{where}.migResetBlocked: expected true or false, got {quote(blocked)}")
        gpus.extend(FakeGpu(model, mig, numa, root, siblings, blocked) for _ in range(count))
    cuda = str(data.get("cudaDriverVersion", "12.4"))
    major, _, minor = cuda.partition(".")
    if not (_digits(major) and (_digits(minor) or minor == "")):
        raise ProfileError(f"profile {name}: cudaDriverVersion must look like 12.4, got {quote(cuda)}")
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
        listed = ", ".join(sorted(map(str, nodes))) or "none"
        raise ProfileError(
            f"{path}: no profile for node {quote(node_name)} (listed: {listed}) and no `default`"
        )
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
            f"fake GPU profile {quote(spec)} is neither a built-in ({', '.join(BUILTIN_PROFILES)}) nor a file"
        )
    try:
        data = documents.load_yaml(documents.read_file(path, "fake GPU profile"), str(path))
    except documents.DocumentError as err:
        raise ProfileError(str(err)) from None
    if isinstance(data, dict) and "nodes" in data:
        return _select_for_node(data, path, node_name)
    return parse_profile(data, str(path))
