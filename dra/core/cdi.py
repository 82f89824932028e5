"""CDI specs: pure building, no files.

One spec per claim (kind `k8s.<driver>/claim`, a CDI device `<claim UID>-<device>` each) and one
for the device plugin (kind `k8s.<driver>/device`, devices named by UUID), laid out to compose:
what identifies a device is in its own edits, what belongs to a claim under a per-claim name,
and the spec-wide edits are the same in every spec. Why, and NVIDIA_VISIBLE_DEVICES:
docs/architecture.md ("CDI specs compose") and docs/configuration.md.

`respec` builds a prepared claim's spec (with its device metadata files) from its devices present
on the node, and is the one place a claim's spec is built: a prepare's, one whose spec went
missing, the start-up repair's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dra.core import devicemetadata, sharing
from dra.model.devices import ContainerHook, Device, DriverFile, Inventory
from dra.model.node import Node
from dra.model.prepared import PreparedClaim

#: The CDI specification version the specs declare (supported by containerd >= 1.7 and CRI-O).
CDI_VERSION = "0.5.0"
CDI_CLASS = "claim"
#: The class of the device plugin's per-device spec.
DEVICE_CLASS = "device"
#: The variable NVIDIA's container runtime hook (legacy mode) reads the devices to inject from.
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
#: NVIDIA's runtime hook (legacy mode) reads `none` as "no GPU, but the driver's libraries".
NO_GPUS = "none"
#: ... and `void` as "not a GPU container": no GPU and no driver files (the specs bring their own).
NOT_A_GPU_CONTAINER = "void"
#: Mount options of the driver's files: read-only, no set-uid or device files through them, as
#: NVIDIA's CDI generator sets them; the specs of its gpu-kubelet-plugin bind `rbind,rprivate`,
#: which for a mount of one file changes nothing a container sees, nor runc's time (docs/testing.md).
DRIVER_FILE_OPTIONS = ("ro", "nosuid", "nodev", "bind")
#: Prefix of CDI annotation keys (the device plugin's cdi-annotations strategy).
ANNOTATION_PREFIX = "cdi.k8s.io/"
_ANNOTATION_NAME_MAX = 63
#: Where the kernel puts the VFIO group devices and the legacy IOMMU API device (the VFIO container).
VFIO_DIR = "/dev/vfio"
VFIO_API_DEVICE = VFIO_DIR + "/vfio"

#: NVIDIA's hooks, in the order NVIDIA's CDI generator (nvidia-container-toolkit's nvcdi, nvml
#: mode) puts them in a spec: the links, CUDA forward compatibility, the loader cache, then device
#: nodes left alone. Each runs at createContainer, inside the new container's root.
CREATE_SYMLINKS = "create-symlinks"
ENABLE_CUDA_COMPAT = "enable-cuda-compat"
UPDATE_LDCACHE = "update-ldcache"
DISABLE_DEVICE_NODE_MODIFICATION = "disable-device-node-modification"
#: The hooks' one setting of their own, as NVIDIA's generator sets it.
HOOK_ENV = ("NVIDIA_CTK_DEBUG=false",)
#: The folder of the driver's libcuda below the driver root (where the container has it), a variable
#: NVIDIA's generator sets beside its hooks.
LIBCUDA_DIR = "NVIDIA_CTK_LIBCUDA_DIR"

Obj = dict[str, Any]


def vendor(driver: str) -> str:
    """CDI vendor for a driver name: k8s.gpu.nvidia.com."""
    return f"k8s.{driver}"


def kind(driver: str) -> str:
    """CDI kind (vendor/class) of the claim specs."""
    return f"{vendor(driver)}/{CDI_CLASS}"


def device_name(claim_uid: str, device: str) -> str:
    """The CDI device name of one allocated device within its claim's spec."""
    return f"{claim_uid}-{device}"


def qualified_name(driver: str, claim_uid: str, device: str) -> str:
    """The fully qualified CDI device ID the kubelet passes to the runtime."""
    return f"{kind(driver)}={device_name(claim_uid, device)}"


def metadata_device_id(driver: str, claim_uid: str, request: str) -> str:
    """The fully qualified CDI device ID the kubelet is told for one request's device metadata file."""
    return f"{kind(driver)}={devicemetadata.cdi_device_name(claim_uid, request)}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    """File name of a claim's spec inside the CDI directory."""
    return f"{vendor(driver)}-{CDI_CLASS}_{claim_uid}.json"


def env_key(device: str) -> str:
    """The env var stem naming one device: gpu-4-mig-1g10gb-1-0 -> DRA_GPU_GPU_4_MIG_1G10GB_1_0."""
    return "DRA_GPU_" + _identifier(device)


def claim_env_key(claim_uid: str) -> str:
    """The env var a claim's devices set to the claim's UID: DRA_GPU_CLAIM_<UID>, one name per claim."""
    return "DRA_GPU_CLAIM_" + _identifier(claim_uid)


def _identifier(text: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", text.upper())


def _device_nodes(paths: Sequence[str], dev_root: str) -> list[Obj]:
    if dev_root == "/":
        return [{"path": path} for path in paths]
    root = dev_root.rstrip("/")
    return [{"path": path, "hostPath": root + path} for path in paths]


def _driver_mounts(files: Sequence[DriverFile]) -> list[Obj]:
    return [
        {"hostPath": f.host_path, "containerPath": f.container_path, "options": list(DRIVER_FILE_OPTIONS)}
        for f in files
    ]


def _is_link(file: DriverFile) -> bool:
    """A library's SONAME link (libcuda.so.1 of libcuda.so.580.95.05): mounted under another name."""
    return file.kind == "library" and _base(file.container_path) != _base(file.host_path)


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def _hook(hook: ContainerHook, name: str, args: Sequence[str]) -> Obj:
    # As NVIDIA's generator calls it: argv[0] is the program's name; its nvidia-ctk serves the
    # hooks under `nvidia-ctk hook`.
    program = _base(hook.path)
    prefix = [program, "hook"] if program == "nvidia-ctk" else [program]
    return {
        "hookName": "createContainer",
        "path": hook.path,
        "args": [*prefix, name, *args],
        "env": list(HOOK_ENV),
    }


def driver_hooks(files: Sequence[DriverFile], hook: ContainerHook) -> list[Obj]:
    """NVIDIA's createContainer hooks for these driver files, with the arguments NVIDIA's generator gives.

    create-symlinks makes each library's SONAME link that the host has (libcuda.so.1 ->
    libcuda.so.580.95.05) and libcuda.so -> libcuda.so.1 beside libcuda (programs and Triton's
    `-lcuda` link against that name); enable-cuda-compat puts the image's
    /usr/local/cuda/compat first in the loader's path when its libcuda's major version is newer
    than the driver's; update-ldcache adds the libraries' folders to the container's
    /etc/ld.so.conf.d and runs the host's ldconfig in the container's root, so that `ldconfig -p`
    lists the driver and images without a cache (or with one built without the driver) find it;
    disable-device-node-modification keeps libnvidia-ml from making device nodes in the container.
    """
    libraries = [f for f in files if f.kind == "library" and not _is_link(f)]
    links: list[str] = []
    for library in libraries:
        name, folder = _base(library.container_path), _folder(library.container_path)
        if name.startswith("libcuda.so."):
            links.append(f"libcuda.so.1::{folder}/libcuda.so")
        links += [
            f"{name}::{f.container_path}" for f in files if _is_link(f) and f.host_path == library.host_path
        ]
    hooks = []
    if links:
        hooks.append(
            _hook(hook, CREATE_SYMLINKS, [arg for link in dict.fromkeys(links) for arg in ("--link", link)])
        )
    hooks.append(_hook(hook, ENABLE_CUDA_COMPAT, [f"--host-driver-version={hook.driver_version}"]))
    folders = dict.fromkeys(_folder(f.container_path) for f in libraries)
    hooks.append(_hook(hook, UPDATE_LDCACHE, [arg for folder in folders for arg in ("--folder", folder)]))
    hooks.append(_hook(hook, DISABLE_DEVICE_NODE_MODIFICATION, []))
    return hooks


def _libcuda_dir(files: Sequence[DriverFile]) -> list[str]:
    found = [f for f in files if f.kind == "library" and _base(f.host_path).startswith("libcuda.so.")]
    return [f"{LIBCUDA_DIR}={_folder(found[0].container_path)}"] if found else []


def visible_devices_default(inventory: Inventory) -> str:
    """The spec-wide NVIDIA_VISIBLE_DEVICES: `void` when the specs carry the driver's files, else `none`."""
    return NOT_A_GPU_CONTAINER if inventory.driver_files else NO_GPUS


def _device_edits(
    device: Device, dev_root: str, extra_env: Sequence[str] = (), vfio_group: int | None = None
) -> Obj:
    stem = env_key(device.name)
    edits: Obj = {
        "env": [
            f"{stem}_NAME={device.name}",
            f"{stem}_UUID={device.uuid}",
            f"{stem}_PRODUCT={device.product_name}",
            *extra_env,
        ]
    }
    # A GPU bound to vfio-pci has no NVIDIA device node a container could use: its VFIO group instead.
    nodes = device.device_nodes if vfio_group is None else (f"{VFIO_DIR}/{vfio_group}",)
    if nodes:
        edits["deviceNodes"] = _device_nodes(nodes, dev_root)
    return edits


def _common_edits(inventory: Inventory, env: Sequence[str]) -> Obj:
    files, hook = inventory.driver_files, inventory.container_hook
    if hook is not None and files:
        # The hook makes the SONAME links inside the container, as in NVIDIA's specs.
        env = [*env, *_libcuda_dir(files)]
    edits: Obj = {"env": list(env)} if env else {}
    if inventory.common_device_nodes:
        edits["deviceNodes"] = _device_nodes(inventory.common_device_nodes, inventory.dev_root)
    if files:
        edits["mounts"] = _driver_mounts([f for f in files if hook is None or not _is_link(f)])
        if hook is not None:
            edits["hooks"] = driver_hooks(files, hook)
    return edits


def build_spec(
    driver: str,
    claim_uid: str,
    devices: Sequence[Device],
    inventory: Inventory,
    *,
    device_env: Mapping[str, Sequence[str]] | None = None,
    claim_edits: Obj | None = None,
    passthrough: Mapping[str, int] | None = None,
    vfio_api_device: bool = False,
    extra_devices: Sequence[Obj] = (),
) -> Obj:
    """The CDI spec of one claim's devices on this node; it composes with any other claim's spec.

    `device_env` adds KEY=value lines to a device's edits by device name (what
    belongs to this claim's use of it, such as its share of a shared GPU).
    `claim_edits` (env, mounts) go to the spec-wide edits, which the runtime
    applies once for a container that uses any device of the claim, so a
    container referencing two requests of it does not get a mount twice.
    `passthrough` maps the devices bound to vfio-pci to their IOMMU groups: such a device
    brings /dev/vfio/<group> instead of its NVIDIA device nodes, and a claim of nothing
    but those gets none of the driver's files (`void`, as NVIDIA's driver sets it);
    `vfio_api_device` adds /dev/vfio/vfio to the claim's edits.
    `extra_devices` are CDI devices that are no GPU (a request's device metadata file).
    """
    claim_env = f"{claim_env_key(claim_uid)}={claim_uid}"
    extra = device_env or {}
    groups = passthrough or {}
    if devices and all(d.name in groups for d in devices):
        common: Obj = {"env": [f"{VISIBLE_DEVICES}={NOT_A_GPU_CONTAINER}"]}
    else:
        common = _common_edits(inventory, [f"{VISIBLE_DEVICES}={visible_devices_default(inventory)}"])
    if vfio_api_device:
        common = _with_claim_edits(
            common, {"deviceNodes": _device_nodes([VFIO_API_DEVICE], inventory.dev_root)}
        )
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind(driver),
        "devices": [
            {
                "name": device_name(claim_uid, d.name),
                "containerEdits": _device_edits(
                    d, inventory.dev_root, [claim_env, *extra.get(d.name, ())], groups.get(d.name)
                ),
            }
            for d in devices
        ]
        + list(extra_devices),
        "containerEdits": _with_claim_edits(common, claim_edits or {}),
    }


def _with_claim_edits(common: Obj, claim: Obj) -> Obj:
    merged = dict(common)
    for key, values in claim.items():
        merged[key] = [*merged.get(key, []), *values]
    return merged


@dataclass(frozen=True)
class MissingDevice:
    """A device a prepared claim records that the inventory no longer has (left out of its spec)."""

    claim: PreparedClaim
    device: str

    @property
    def message(self) -> str:
        """The warning for the log."""
        return (
            f"prepared claim {self.claim.namespace}/{self.claim.name} uses {self.device}, "
            "which this node no longer has"
        )


def _devices_of(claim: PreparedClaim, inventory: Inventory) -> tuple[list[Device], list[MissingDevice]]:
    found: list[Device] = []
    missing: list[MissingDevice] = []
    for entry in claim.devices:
        device = inventory.by_uuid(entry.uuid) if entry.uuid else inventory.get(entry.device)
        if device is None:
            missing.append(MissingDevice(claim, entry.device))
        elif device.name != entry.device:
            # A dynamic MIG device, or a GPU through its passthrough twin: the kubelet knows it by the
            # offer's or twin's name, which its CDI ID carries.
            found.append(replace(device, name=entry.device))
        else:
            found.append(device)
    return found, missing


@dataclass(frozen=True)
class Respec:
    """What a prepared claim's devices still present on the node give: its spec and metadata files."""

    #: None when no device of the claim is left.
    spec: Obj | None
    metadata: devicemetadata.ClaimMetadata | None
    missing: tuple[MissingDevice, ...]
    #: Host directories the spec names that the prepare makes itself, so that they may be missing
    #: before: its metadata files (written just before the spec), its MPS daemon's (started after).
    made_here: tuple[str, ...] = ()

    def missing_paths(self, absent: Sequence[str]) -> tuple[str, ...]:
        """Of the spec's host paths not on the node (`absent`), those the prepare does not make."""
        return tuple(path for path in absent if not path.startswith(self.made_here))


def respec(claim: PreparedClaim, inventory: Inventory, node: Node) -> Respec:
    """The CDI spec (and device metadata files) of a claim, from its devices present on the node.

    The one place a claim's spec is built: for a new claim once its MIG devices are made and its GPUs
    bound, for one prepared before whose spec is gone, and at start-up (dra.core.recovery).
    """
    devices, missing = _devices_of(claim, inventory)
    if not devices:
        return Respec(None, None, tuple(missing))
    # A share's environment and the MPS daemon's edits only where the claim has them (dra.core.sharing).
    share_env = {d.device: sharing.share_env(d) for d in claim.devices if d.share_id}
    unique = list({d.name: d for d in devices}.values())
    mps = sharing.mps_edits(claim, node.mps_root) if claim.uses_mps else None
    metadata = (
        devicemetadata.for_claim(node.driver, node.metadata_root, claim, unique, inventory)
        if claim.metadata
        else None
    )
    passthrough = {d.device: d.vfio_group for d in claim.devices if d.vfio_group >= 0}
    made_here = [f"{node.metadata_root.rstrip('/')}/{metadata.directory}/"] if metadata else []
    if mps is not None:
        made_here.append(sharing.mps_dirs(node.mps_root, sharing.claim_mps_key(claim)).root + "/")
    spec = build_spec(
        node.driver,
        claim.uid,
        unique,
        inventory,
        device_env=share_env,
        claim_edits=mps,
        passthrough=passthrough,
        vfio_api_device=any(d.vfio_api_device for d in claim.devices),
        extra_devices=metadata.cdi_devices if metadata else (),
    )
    return Respec(spec, metadata, tuple(missing), tuple(made_here))


def device_kind(driver: str) -> str:
    """CDI kind of the device plugin's spec: k8s.gpu.nvidia.com/device."""
    return f"{vendor(driver)}/{DEVICE_CLASS}"


def device_spec_file_name(driver: str) -> str:
    """File name of the device plugin's spec inside the CDI directory."""
    return f"{vendor(driver)}-{DEVICE_CLASS}.json"


def qualified_device_name(driver: str, device: Device) -> str:
    """The fully qualified CDI name of one device in the device plugin's spec."""
    return f"{device_kind(driver)}={device.uuid}"


def build_device_spec(driver: str, devices: Sequence[Device], inventory: Inventory) -> Obj:
    """The device plugin's spec: one CDI device per device, named by UUID, with claim specs' device edits."""
    spec: Obj = {
        "cdiVersion": CDI_VERSION,
        "kind": device_kind(driver),
        "devices": [
            {"name": d.uuid, "containerEdits": _device_edits(d, inventory.dev_root)} for d in devices
        ],
    }
    common = _common_edits(inventory, ())
    if common:
        spec["containerEdits"] = common
    return spec


def host_paths(spec: Obj) -> list[str]:
    """Every host path a spec names (device nodes, mounts), in order: what the runtime will open."""
    paths: list[str] = []
    for edits in [spec.get("containerEdits") or {}, *(d["containerEdits"] for d in spec.get("devices", []))]:
        paths += [node.get("hostPath") or node["path"] for node in edits.get("deviceNodes", [])]
        paths += [mount["hostPath"] for mount in edits.get("mounts", [])]
    return list(dict.fromkeys(paths))


def annotation_key(plugin: str, allocation_id: str) -> str:
    """A CDI annotation key, `cdi.k8s.io/<plugin>_<id>`, as the CDI producer rules want it.

    The part after the prefix is at most 63 characters of letters, digits, `_`, `-`
    and `.`, starting and ending with a letter or digit; `plugin` is shortened to fit.
    """
    clean = re.sub(r"[^A-Za-z0-9_.-]", ".", plugin).strip("._-") or "plugin"
    ident = re.sub(r"[^A-Za-z0-9_.-]", "_", allocation_id).strip("._-") or "0"
    room = _ANNOTATION_NAME_MAX - len(ident) - 1
    if room < 1:
        raise ValueError(f"CDI annotation id {allocation_id!r} is too long")
    return f"{ANNOTATION_PREFIX}{clean[:room].rstrip('._-')}_{ident}"


def render(spec: Obj) -> bytes:
    """Stable JSON bytes for a spec (same input, same bytes).

    One line, not indented: json's C encoder does not indent, and its pure-Python one took half
    of a spec write's CPU in a prepare (docs/architecture.md). `jq . <file>` shows it indented.
    """
    return (json.dumps(spec, sort_keys=True, separators=(",", ":")) + "\n").encode()
