"""CDI specs for prepared claims: pure building, no files.

One spec per claim, kind `k8s.<driver>/claim`, with one CDI device per
allocated device named `<claim UID>-<device>`. A device carries its own device
nodes (none for fake GPUs, which have no host paths) and env vars naming it;
the spec-wide edits, which the runtime applies once when any device of the
claim is injected, carry the control device nodes and NVIDIA_VISIBLE_DEVICES
with the UUIDs of every device of the claim. A container that asks for no
claim gets nothing from this driver.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from dra.devices import Device, Inventory

#: The CDI specification version the specs declare (supported by containerd >= 1.7 and CRI-O).
CDI_VERSION = "0.5.0"
CDI_CLASS = "claim"

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


def render(spec: Obj) -> bytes:
    """Stable JSON bytes for a spec (same input, same bytes)."""
    return (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()
