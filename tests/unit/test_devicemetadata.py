"""Device metadata files (KEP-5304): what a prepare writes and mounts, checked against 1.37's Go helper.

Expected paths, names and format are those of k8s.io/dynamic-resource-allocation v0.37.2
(kubeletplugin/metadata.go, api/metadata/types.go and helpers.go, api/metadata/v1beta1).
"""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.metadatastore import MetadataStore
from dra.adapters.nodefiles import CdiStore
from dra.core import deviceentries, devicemetadata
from dra.core.plan import read_allocation
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import POD_CLAIM_NAME_ANNOTATION, AllocatedDevice, ClaimAllocation
from dra.model.prepared import PreparedClaim, PreparedDevice
from tests.unit.helpers import DRIVER, NODE, inventory

UID = "0b4e2f7a-61c3-4a8e-9d55-2f0c1e9a7b10"
ROOT = "/var/lib/kubelet/plugins/gpu.nvidia.com/dra-device-metadata"
#: CDI device names (specification 0.5.0 and later).
_CDI_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def _state(root: Path, *, device_metadata: bool = True) -> DeviceState:
    return DeviceState(
        DRIVER,
        NODE,
        inventory("h100x8"),
        CdiStore(root / "cdi", DRIVER),
        CheckpointStore(root / "checkpoint.json"),
        metadata=MetadataStore(root / "plugin" / devicemetadata.HOST_SUBDIR),
        device_metadata=device_metadata,
    )


def _allocation(*devices: tuple[str, str], pod_claim_name: str = "") -> ClaimAllocation:
    return ClaimAllocation(
        UID,
        "team-a",
        "train",
        tuple(AllocatedDevice(request, NODE, device) for request, device in devices),
        pod_claim_name=pod_claim_name,
    )


def _stream(data: bytes) -> list[dict[str, Any]]:
    """The objects of a JSON stream, as a Go json.Decoder reads them one after the other."""
    decoder, text, objects, at = json.JSONDecoder(), data.decode(), [], 0
    while text[at:].strip():
        at += len(text[at:]) - len(text[at:].lstrip())
        found, at = decoder.raw_decode(text, at)
        objects.append(found)
    return objects


def test_each_request_gets_a_file_with_its_devices_attributes_in_every_version(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare(_allocation(("gpu", "gpu-0"), ("gpu", "gpu-1"), ("spare", "gpu-2")))
    base = tmp_path / "plugin" / "dra-device-metadata" / "team-a_train"
    assert sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()) == [
        "gpu/metadata.json",
        "spare/metadata.json",
    ]
    objects = _stream((base / "gpu" / "metadata.json").read_bytes())
    assert [o["apiVersion"] for o in objects] == [
        "metadata.resource.k8s.io/v1beta1",
        "metadata.resource.k8s.io/v1alpha1",
    ]
    newest = objects[0]
    assert newest["kind"] == "DeviceMetadata"
    assert newest["metadata"] == {"name": "train", "namespace": "team-a", "uid": UID, "generation": 1}
    assert "podClaimName" not in newest
    [request] = newest["requests"]
    assert request["name"] == "gpu"
    assert [(d["driver"], d["pool"], d["name"]) for d in request["devices"]] == [
        (DRIVER, NODE, "gpu-0"),
        (DRIVER, NODE, "gpu-1"),
    ]
    # The attributes the ResourceSlice publishes for the device, typed the same way.
    gpu0 = inventory("h100x8").get("gpu-0")
    assert gpu0 is not None
    assert (
        request["devices"][0]["attributes"]
        == deviceentries.device_entry(gpu0, inventory("h100x8"))["attributes"]
    )
    assert request["devices"][0]["attributes"]["uuid"] == {"string": gpu0.uuid}
    # The same object in both versions.
    assert {**objects[1], "apiVersion": ""} == {**newest, "apiVersion": ""}


def test_files_and_directories_are_readable_by_any_container_user(tmp_path: Path) -> None:
    _state(tmp_path).prepare(_allocation(("gpu", "gpu-0")))
    path = tmp_path / "plugin" / "dra-device-metadata" / "team-a_train" / "gpu" / "metadata.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o755


def test_the_claims_spec_mounts_each_file_read_only_through_a_device_of_its_own(tmp_path: Path) -> None:
    state = _state(tmp_path)
    claim = state.prepare(_allocation(("gpu", "gpu-0"), ("gpu", "gpu-1"), ("spare", "gpu-2")))
    spec = json.loads(CdiStore(tmp_path / "cdi", DRIVER).path(UID).read_text())
    mounts = {d["name"]: d["containerEdits"].get("mounts") for d in spec["devices"]}
    host = tmp_path / "plugin" / "dra-device-metadata" / "team-a_train"
    for request in ("gpu", "spare"):
        name = f"{UID}_{request}"
        assert _CDI_DEVICE.match(name)
        assert mounts[name] == [
            {
                "hostPath": f"{host}/{request}/metadata.json",
                "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/"
                f"{request}/gpu.nvidia.com-metadata.json",
                "options": ["ro", "bind"],
            }
        ]
    # The kubelet is told each request's metadata device once, with the request's first device.
    ids = {d.device: d.cdi_device_ids for d in claim.devices}
    assert ids["gpu-0"][1:] == (f"k8s.gpu.nvidia.com/claim={UID}_gpu",)
    assert ids["gpu-1"] == (f"k8s.gpu.nvidia.com/claim={UID}-gpu-1",)
    assert ids["gpu-2"][1:] == (f"k8s.gpu.nvidia.com/claim={UID}_spare",)


def test_a_claim_from_a_template_is_found_under_the_pods_name_for_it() -> None:
    claim = _state_free_claim(pod_claim_name="gpus")
    meta = devicemetadata.for_claim(DRIVER, ROOT, claim, [], inventory("h100x8"))
    assert meta.cdi_devices[0]["containerEdits"]["mounts"][0]["containerPath"] == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpus/gpu/gpu.nvidia.com-metadata.json"
    )
    assert _stream(meta.files["gpu"])[0]["podClaimName"] == "gpus"


def test_the_pod_claim_name_is_read_from_the_claims_annotation() -> None:
    claim = {
        "metadata": {
            "namespace": "team-a",
            "name": "pod-gpus-x7k2q",
            "uid": UID,
            "annotations": {POD_CLAIM_NAME_ANNOTATION: "gpus"},
        },
        "status": {"allocation": {"devices": {"results": [_result("gpu-0")]}}},
    }
    assert read_allocation(claim, UID, DRIVER).pod_claim_name == "gpus"


def _result(device: str) -> dict[str, str]:
    return {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}


def _state_free_claim(pod_claim_name: str = "") -> PreparedClaim:
    return PreparedClaim(
        UID,
        "team-a",
        "pod-gpus-x7k2q",
        (PreparedDevice(("gpu",), NODE, "gpu-0", ()),),
        pod_claim_name=pod_claim_name,
        metadata=True,
    )


def test_off_no_files_and_no_mounts(tmp_path: Path) -> None:
    claim = _state(tmp_path, device_metadata=False).prepare(_allocation(("gpu", "gpu-0")))
    assert not claim.metadata
    assert not (tmp_path / "plugin" / "dra-device-metadata").exists()
    spec = json.loads(CdiStore(tmp_path / "cdi", DRIVER).path(UID).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-0"]


def test_unprepare_removes_the_claims_files(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare(_allocation(("gpu", "gpu-0")))
    state.unprepare(UID)
    assert list((tmp_path / "plugin" / "dra-device-metadata").iterdir()) == []


def test_start_up_removes_strays_and_writes_prepared_claims_files_again(tmp_path: Path) -> None:
    _state(tmp_path).prepare(_allocation(("gpu", "gpu-0")))
    root = tmp_path / "plugin" / "dra-device-metadata"
    mine = root / "team-a_train" / "gpu" / "metadata.json"
    written = mine.read_bytes()
    mine.unlink()
    stray = root / "team-b_gone" / "gpu"
    stray.mkdir(parents=True)
    (stray / "metadata.json").write_text("{}")
    (stray / ".metadata.json.x1.tmp").write_text("half")
    # Turned off since: claims that have files keep them.
    _state(tmp_path, device_metadata=False).recover()
    assert sorted(p.name for p in root.iterdir()) == ["team-a_train"]
    assert mine.read_bytes() == written


def test_a_new_allocation_of_the_claim_drops_files_of_requests_it_no_longer_has(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path)
    store.write("team-a_train", {"gpu": b"1", "spare": b"2"})
    store.write("team-a_train", {"gpu": b"3"})
    assert sorted(p.name for p in (tmp_path / "team-a_train").iterdir()) == ["gpu"]
    with pytest.raises(ValueError, match="not a claim's metadata directory"):
        store.remove("../x")
