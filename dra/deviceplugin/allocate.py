"""What a container gets from an Allocate call, per device-list strategy. Pure.

`cdi-cri`, `cdi-annotations` and/or `envvar` (`--device-list-strategy`). Every container gets an
explicit NVIDIA_VISIBLE_DEVICES: the allocated UUIDs with `envvar`, `none` otherwise, the same
from every resource so that two plugins' values never conflict. The strategies and why `none`:
docs/device-plugin.md ("Allocation and CDI").
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence

from dra.core import cdi
from dra.model.devices import Device
from dra.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb


class Strategy(enum.Enum):
    """How the allocated devices are named to the runtime."""

    CDI_CRI = "cdi-cri"
    CDI_ANNOTATIONS = "cdi-annotations"
    ENVVAR = "envvar"


_CDI = {Strategy.CDI_CRI, Strategy.CDI_ANNOTATIONS}


def parse_strategies(text: str) -> frozenset[Strategy]:
    """`cdi-cri`, `cdi-annotations`, `envvar`, or one CDI strategy plus `envvar` (comma-separated)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    known = {s.value: s for s in Strategy}
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise ValueError(
            f"device list strategy {text!r}: expected cdi-cri, cdi-annotations or envvar "
            "(or one CDI strategy and envvar, comma-separated)"
        )
    chosen = frozenset(known[n] for n in names)
    if chosen >= _CDI:
        raise ValueError("choose one of cdi-cri and cdi-annotations: both would inject every device twice")
    return chosen


def uses_cdi(strategies: frozenset[Strategy]) -> bool:
    """Whether the plugin's CDI spec is needed."""
    return bool(strategies & _CDI)


def allocation_id(device_ids: Sequence[str]) -> str:
    """A short stable ID of one container's allocation (for the annotation key)."""
    return hashlib.sha256(",".join(sorted(device_ids)).encode()).hexdigest()[:16]


def container_response(
    devices: Sequence[Device],
    strategies: frozenset[Strategy],
    driver: str,
    resource: str,
) -> pb.ContainerAllocateResponse:
    """The answer for one container that was allocated `devices` of `resource`."""
    response = pb.ContainerAllocateResponse()
    if Strategy.ENVVAR in strategies:
        response.envs[cdi.VISIBLE_DEVICES] = ",".join(d.uuid for d in devices)
    else:
        response.envs[cdi.VISIBLE_DEVICES] = cdi.NO_GPUS
    names = [cdi.qualified_device_name(driver, d) for d in devices]
    if Strategy.CDI_CRI in strategies:
        response.cdi_devices.extend(pb.CDIDevice(name=name) for name in names)
    if Strategy.CDI_ANNOTATIONS in strategies:
        key = cdi.annotation_key(resource, allocation_id([d.uuid for d in devices]))
        response.annotations[key] = ",".join(names)
    return response
