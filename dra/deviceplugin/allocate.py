"""What a container gets from an Allocate call, per device-list strategy. Pure.

Strategies (`--device-list-strategy`, one CDI strategy and/or `envvar`):

- `cdi-cri` (default): the CDI device names in the response's `cdi_devices`;
  the kubelet passes them to the runtime in the CRI request (containerd >= 1.7
  with CDI enabled, CRI-O), which applies the edits of the plugin's spec.
- `cdi-annotations`: the same names in a `cdi.k8s.io/<plugin>_<id>` container
  annotation, for runtimes that read CDI requests from annotations.
- `envvar`: NVIDIA_VISIBLE_DEVICES with the allocated UUIDs, for the NVIDIA
  container runtime in legacy mode, which injects devices and driver
  libraries from that variable.

Every container the plugin answers for gets an explicit NVIDIA_VISIBLE_DEVICES,
overriding the `all` that CUDA images bake in: the allocated UUIDs with
`envvar`, `none` otherwise. With CDI strategies the devices reach the
container through CDI, and `none` tells an NVIDIA runtime (legacy mode, the
default runtime on many GPU nodes) to add no GPU of its own, only the driver's
libraries, which the plugin's CDI spec does not carry. It is also the
same value from every resource: when two device plugins set one variable for
a container, the kubelet keeps one of the values (whichever resource it merges
first) and logs a conflict, so a list could not describe a container that asks
for a GPU and a MIG device.
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
