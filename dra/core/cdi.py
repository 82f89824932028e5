"""CDI specs: pure building, no files.

DRA: one spec per claim, kind `k8s.<driver>/claim`, with one CDI device per
allocated device named `<claim UID>-<device>`. A device carries its own device
nodes (none for fake GPUs, which have no host paths) and env vars naming it;
the spec-wide edits, which the runtime applies once when any device of the
claim is injected, carry the control device nodes and NVIDIA_VISIBLE_DEVICES
with the UUIDs of every device of the claim. A container that asks for no
claim gets nothing from this driver.

Device plugin: one spec for every device the plugin advertises, kind
`k8s.<driver>/device`, one CDI device per GPU or MIG device named by its
UUID (stable across restarts and index changes, so an allocation the kubelet
checkpointed still resolves). Each device has the same edits as in a claim
spec; the spec-wide edits carry only the control device nodes, since which
devices a container got is known per allocation, not per spec.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from dra.model.devices import Device, Inventory

#: The CDI specification version the specs declare (supported by containerd >= 1.7 and CRI-O).
CDI_VERSION = "0.5.0"
CDI_CLASS = "claim"
#: The class of the device plugin's per-device spec.
DEVICE_CLASS = "device"
#: Prefix of CDI annotation keys (the device plugin's cdi-annotations strategy).
ANNOTATION_PREFIX = "cdi.k8s.io/"
_ANNOTATION_NAME_MAX = 63

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


def spec_file_name(driver: str, claim_uid: str) -> str:
    """File name of a claim's spec inside the CDI directory."""
    return f"{vendor(driver)}-{CDI_CLASS}_{claim_uid}.json"


def env_key(device: str) -> str:
    """The env var stem naming one device: gpu-4-mig-1g10gb-1-0 -> DRA_GPU_GPU_4_MIG_1G10GB_1_0."""
    return "DRA_GPU_" + re.sub(r"[^A-Z0-9]", "_", device.upper())


def _device_edits(device: Device) -> Obj:
    stem = env_key(device.name)
    edits: Obj = {
        "env": [
            f"{stem}_NAME={device.name}",
            f"{stem}_UUID={device.uuid}",
            f"{stem}_PRODUCT={device.product_name}",
        ]
    }
    if device.device_nodes:
        edits["deviceNodes"] = [{"path": path} for path in device.device_nodes]
    return edits


def build_spec(
    driver: str,
    claim_uid: str,
    devices: Sequence[Device],
    inventory: Inventory,
    extra_env: Sequence[str] = (),
) -> Obj:
    """The CDI spec of one claim's devices on this node."""
    common: Obj = {
        "env": [
            "NVIDIA_VISIBLE_DEVICES=" + ",".join(d.uuid for d in devices),
            f"DRA_GPU_CLAIM_UID={claim_uid}",
            *extra_env,
        ]
    }
    if inventory.common_device_nodes:
        common["deviceNodes"] = [{"path": path} for path in inventory.common_device_nodes]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind(driver),
        "devices": [
            {"name": device_name(claim_uid, d.name), "containerEdits": _device_edits(d)} for d in devices
        ],
        "containerEdits": common,
    }


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
    """The device plugin's spec: one CDI device per device, named by UUID, with the claim specs' edits."""
    spec: Obj = {
        "cdiVersion": CDI_VERSION,
        "kind": device_kind(driver),
        "devices": [{"name": d.uuid, "containerEdits": _device_edits(d)} for d in devices],
    }
    if inventory.common_device_nodes:
        spec["containerEdits"] = {"deviceNodes": [{"path": p} for p in inventory.common_device_nodes]}
    return spec


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
    """Stable JSON bytes for a spec (same input, same bytes)."""
    return (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()
