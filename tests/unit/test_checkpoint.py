"""The checkpoint of prepared claims: round trip, and refusing any file it cannot trust."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra.adapters.checkpoint import CheckpointError, CheckpointStore, decode, encode
from dra.model.prepared import MIG_CREATE, DeviceAction, PreparedClaim, PreparedDevice

CLAIMS = {
    "uid-a": PreparedClaim(
        uid="uid-a",
        namespace="team-a",
        name="train",
        devices=(
            PreparedDevice(("gpu",), "node-a", "gpu-0", ("k8s.gpu.nvidia.com/claim=uid-a-gpu-0",)),
            PreparedDevice(("gpu", "extra"), "node-a", "gpu-1", ("k8s.gpu.nvidia.com/claim=uid-a-gpu-1",)),
        ),
    ),
    "uid-b": PreparedClaim(
        uid="uid-b",
        namespace="monitoring",
        name="dcgm",
        devices=(
            PreparedDevice(
                ("all",), "node-a", "gpu-0", ("k8s.gpu.nvidia.com/claim=uid-b-gpu-0",), admin_access=True
            ),
        ),
    ),
}


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "checkpoint.json"


def test_round_trip(path: Path) -> None:
    CheckpointStore(path).save(CLAIMS)
    assert CheckpointStore(path).load() == CLAIMS


def test_an_empty_checkpoint_round_trips(path: Path) -> None:
    CheckpointStore(path).save({})
    assert CheckpointStore(path).load() == {}


def test_no_file_means_no_prepared_claims(path: Path) -> None:
    assert CheckpointStore(path).load() == {}


def test_the_file_is_private_and_written_without_leftovers(path: Path) -> None:
    store = CheckpointStore(path)
    store.save(CLAIMS)
    store.save({"uid-a": CLAIMS["uid-a"]})
    assert path.stat().st_mode & 0o777 == 0o600
    assert os.listdir(path.parent) == ["checkpoint.json"]


def test_encoding_is_deterministic() -> None:
    reversed_order = dict(reversed(list(CLAIMS.items())))
    assert encode(CLAIMS) == encode(reversed_order)
    document = json.loads(encode(CLAIMS))
    assert document["kind"] == "DraGpuCheckpoint"
    assert document["version"] == 1
    assert list(document["claims"]) == ["uid-a", "uid-b"]


def test_exclusive_holding_leaves_out_admin_access() -> None:
    assert CLAIMS["uid-a"].holds("gpu-0", "GPU-unrecorded")
    assert CLAIMS["uid-a"].holds("gpu-1", "GPU-unrecorded")
    assert not CLAIMS["uid-b"].holds("gpu-0", "GPU-unrecorded")


def test_a_recorded_uuid_identifies_the_device_whatever_its_name() -> None:
    entry = PreparedDevice(("gpu",), "node-a", "gpu-4", ("k8s.gpu.nvidia.com/claim=u-gpu-4",), uuid="GPU-x")
    assert entry.is_device("gpu-3", "GPU-x")
    assert not entry.is_device("gpu-4", "GPU-y")


def _document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(encode(CLAIMS))
    return loaded


def _with_valid_checksum(document: dict[str, Any]) -> dict[str, Any]:
    # The checksum covers the claims, serialised compactly with sorted keys.
    canonical = json.dumps(document["claims"], sort_keys=True, separators=(",", ":")).encode()
    document["checksum"] = "sha256:" + hashlib.sha256(canonical).hexdigest()
    return document


def test_the_checksum_is_a_sha256_of_the_claims() -> None:
    document = _document()
    assert document["checksum"] == _with_valid_checksum(dict(document))["checksum"]


def _edit(change: Callable[[dict[str, Any]], object], fix_checksum: bool = False) -> bytes:
    document = _document()
    change(document)
    if fix_checksum:
        _with_valid_checksum(document)
    return json.dumps(document).encode()


BAD_FILES: list[tuple[str, bytes, str]] = [
    ("not JSON", b'{"kind": "DraGpuCheckpoint", ', "is not valid JSON"),
    ("empty", b"", "is not valid JSON"),
    ("not UTF-8", b"\xff\xfe\x00", "is not valid JSON"),
    ("a list", b"[]", "is not a DraGpuCheckpoint file"),
    ("wrong kind", _edit(lambda d: d.update(kind="SomethingElse")), "is not a DraGpuCheckpoint file"),
    ("no kind", _edit(lambda d: d.pop("kind")), "is not a DraGpuCheckpoint file"),
    (
        "newer version",
        _edit(lambda d: d.update(version=3)),
        "has format version 3, this driver reads 1 and 2",
    ),
    ("no version", _edit(lambda d: d.pop("version")), "has format version None"),
    (
        "edited by hand",
        _edit(lambda d: d["claims"]["uid-a"].update(namespace="team-b")),
        "fails its checksum (corrupted or edited)",
    ),
    (
        "device handed to another claim by hand",
        _edit(lambda d: d["claims"]["uid-a"]["devices"][1].update(device="gpu-7")),
        "fails its checksum",
    ),
    ("no checksum", _edit(lambda d: d.pop("checksum")), "fails its checksum"),
    ("claims not a mapping", _edit(lambda d: d.update(claims=[]), fix_checksum=True), "fails its checksum"),
    (
        "claim without devices",
        _edit(lambda d: d["claims"]["uid-a"].pop("devices"), fix_checksum=True),
        "has a malformed claim entry",
    ),
    (
        "device without its name",
        _edit(lambda d: d["claims"]["uid-b"]["devices"][0].pop("device"), fix_checksum=True),
        "has a malformed claim entry",
    ),
    (
        "claim that is a string",
        _edit(lambda d: d["claims"].update({"uid-c": "gpu-3"}), fix_checksum=True),
        "has a malformed claim entry",
    ),
    (
        "devices not a list",
        _edit(lambda d: d["claims"]["uid-a"].update(devices=None), fix_checksum=True),
        "has a malformed claim entry",
    ),
]


@pytest.mark.parametrize(("data", "problem"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_an_untrustworthy_checkpoint_is_an_error_naming_the_file(
    path: Path, data: bytes, problem: str
) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as err:
        CheckpointStore(path).load()
    message = str(err.value)
    assert f"checkpoint {path} " in message
    assert problem in message
    # And what to do about it.
    assert "move it away to start empty" in message


def test_a_checkpoint_that_cannot_be_read_names_the_file(path: Path) -> None:
    path.mkdir(parents=True)
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint {path}"):
        CheckpointStore(path).load()


def test_entries_written_before_admin_access_existed_still_load(path: Path) -> None:
    def drop_admin_access(document: dict[str, Any]) -> None:
        for claim in document["claims"].values():
            for device in claim["devices"]:
                device.pop("admin_access")

    loaded = decode(_edit(drop_admin_access, fix_checksum=True), path)
    assert loaded["uid-a"] == CLAIMS["uid-a"]
    assert loaded["uid-b"].devices[0].admin_access is False


ACTION = DeviceAction(
    "uid-a",
    "gpu-0-mig-3g40gb-at4",
    MIG_CREATE,
    {"gpu": "GPU-1", "profile": "3g.40gb", "profileId": 9, "start": 4, "size": 4},
    done=True,
    result={"gpuInstance": 2, "computeInstance": 0, "uuid": "MIG-1"},
)


def test_device_actions_round_trip_in_format_version_2(path: Path) -> None:
    CheckpointStore(path).save(CLAIMS, [ACTION])
    assert json.loads(path.read_text())["version"] == 2
    assert CheckpointStore(path).load_state() == (CLAIMS, [ACTION])
    # Without actions the file stays version 1, which older drivers read.
    CheckpointStore(path).save(CLAIMS)
    assert json.loads(path.read_text())["version"] == 1


def test_an_edited_action_fails_the_checksum(path: Path) -> None:
    CheckpointStore(path).save(CLAIMS, [ACTION])
    document = json.loads(path.read_text())
    document["actions"][0]["result"]["gpuInstance"] = 3
    path.write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        CheckpointStore(path).load_state()
