"""Device metadata files (KEP-5304, "DRA device attributes downward API"): pure rendering, no files.

A container that uses a request of a claim finds the attributes of that request's devices at
`/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`
(`resourceclaimtemplates/<pod claim name>/...` for a claim made from a template). The driver
writes one file per request under its plugin directory and bind-mounts it read-only through
the claim's CDI spec, as Kubernetes 1.37's Go kubelet-plugin helper does
(k8s.io/dynamic-resource-allocation/kubeletplugin/metadata.go and api/metadata). The kubelet
takes no part: the runtime mounts what the CDI device names. Layout, format and why:
docs/configuration.md ("Device metadata") and docs/architecture.md (the steps).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dra.core import deviceentries
from dra.model.devices import Device, Inventory
from dra.model.prepared import PreparedClaim

Obj = dict[str, Any]

#: The API group of the files' objects, and the versions written, newest first: a reader takes the
#: first object whose apiVersion it knows (1.37's helper requires v1beta1; v1alpha1 is 1.36's).
GROUP = "metadata.resource.k8s.io"
VERSIONS = ("v1beta1", "v1alpha1")
KIND = "DeviceMetadata"
#: Under the plugin's directory on the host (the helper's metadataSubDir).
HOST_SUBDIR = "dra-device-metadata"
HOST_FILE = "metadata.json"
#: Where containers see the files (api/metadata ContainerDir and its two subdirectories).
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
#: The mount's options, as the helper's CDI spec has them.
MOUNT_OPTIONS = ("ro", "bind")


class MetadataRunner(Protocol):
    """What runs the metadata files' steps (dra.kubeletplugin.devicesteps): one method per kind."""

    def metadata_dirs(self) -> frozenset[str]:
        """The claim directories (dra.core.devicemetadata.claim_dir) under the metadata root."""

    def write_metadata(self, directory: str, files: Mapping[str, bytes], *, point: str = "") -> None:
        """Write a claim's device metadata files, one per request, atomically; other requests' files go."""

    def remove_metadata(self, directory: str, *, point: str = "") -> None:
        """Remove a claim's device metadata directory; none is fine."""


def claim_dir(namespace: str, name: str) -> str:
    """The claim's directory under HOST_SUBDIR: `<namespace>_<name>` (both are DNS names: no `_`)."""
    return f"{namespace}_{name}"


def host_file(root: str, namespace: str, name: str, request: str) -> str:
    """The host path of one request's file; `root` is the plugin directory's HOST_SUBDIR."""
    return f"{root.rstrip('/')}/{claim_dir(namespace, name)}/{request}/{HOST_FILE}"


def container_file(driver: str, claim: PreparedClaim, request: str) -> str:
    """Where a container of the claim's pod reads one request's file."""
    if claim.pod_claim_name:
        return f"{CONTAINER_DIR}/{TEMPLATES_SUBDIR}/{claim.pod_claim_name}/{request}/{driver}-metadata.json"
    return f"{CONTAINER_DIR}/{CLAIMS_SUBDIR}/{claim.name}/{request}/{driver}-metadata.json"


def cdi_device_name(claim_uid: str, request: str) -> str:
    """The CDI device in the claim's spec that mounts one request's file (`_` keeps it apart from devices)."""
    return f"{claim_uid}_{request}"


def requests(claim: PreparedClaim) -> list[str]:
    """The claim's requests this driver serves, in the order of its devices."""
    return list(dict.fromkeys(r for d in claim.devices for r in d.request_names))


def _document(
    driver: str, claim: PreparedClaim, request: str, devices: Mapping[str, Device], inventory: Inventory
) -> Obj:
    # Field order as the helper's Go types serialize: kind, apiVersion, metadata, podClaimName, requests.
    document: Obj = {
        "kind": KIND,
        "apiVersion": "",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid, "generation": 1},
    }
    if claim.pod_claim_name:
        document["podClaimName"] = claim.pod_claim_name
    document["requests"] = [
        {
            "name": request,
            "devices": [
                {
                    "driver": driver,
                    "pool": entry.pool,
                    "name": entry.device,
                    # What the ResourceSlice publishes for the device, as the helper's docs ask.
                    "attributes": deviceentries.device_entry(devices[entry.device], inventory)["attributes"],
                }
                for entry in claim.devices
                if request in entry.request_names and entry.device in devices
            ],
        }
    ]
    return document


def render(
    driver: str, claim: PreparedClaim, request: str, devices: Mapping[str, Device], inventory: Inventory
) -> bytes:
    """One request's file: the same object once per version in VERSIONS, a JSON stream.

    `devices` are the claim's devices as the node knows them, by the name the claim records
    (a device the node no longer has is left out).
    """
    document = _document(driver, claim, request, devices, inventory)
    stream = [{**document, "apiVersion": f"{GROUP}/{version}"} for version in VERSIONS]
    return "".join(json.dumps(d, indent=2, ensure_ascii=False) + "\n" for d in stream).encode()


@dataclass(frozen=True)
class ClaimMetadata:
    """What the metadata of one prepared claim takes: its files and the CDI devices that mount them."""

    #: The claim's directory under the metadata root (claim_dir).
    directory: str
    #: Request name to the bytes of its file.
    files: Mapping[str, bytes]
    #: The CDI devices to add to the claim's spec, one per request.
    cdi_devices: tuple[Obj, ...]


def for_claim(
    driver: str, root: str, claim: PreparedClaim, devices: Sequence[Device], inventory: Inventory
) -> ClaimMetadata:
    """The files and CDI devices of a claim whose devices, present on the node, are `devices`.

    `root` is the host directory the files go under (the plugin directory's HOST_SUBDIR).
    """
    names = requests(claim)
    by_name = {d.name: d for d in devices}
    return ClaimMetadata(
        directory=claim_dir(claim.namespace, claim.name),
        files={r: render(driver, claim, r, by_name, inventory) for r in names},
        cdi_devices=tuple(
            {
                "name": cdi_device_name(claim.uid, r),
                "containerEdits": {
                    "mounts": [
                        {
                            "hostPath": host_file(root, claim.namespace, claim.name, r),
                            "containerPath": container_file(driver, claim, r),
                            "options": list(MOUNT_OPTIONS),
                        }
                    ]
                },
            }
            for r in names
        ),
    )
