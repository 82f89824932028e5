"""The checkpoint of prepared claims: round trip, and refusing any file it cannot trust."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import pytest

from dra.adapters import nodefiles
from dra.adapters.checkpoint import COMPACT_SLACK, CheckpointError, CheckpointStore, decode_journal, encode
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


def test_every_field_is_written_as_the_generic_dataclass_encoding_wrote_it(path: Path) -> None:
    # The encoder reads fields by name for speed; the bytes (and so every checksum) stay those of
    # dataclasses.asdict, and a field that is not an immutable value would show here.
    device = PreparedDevice(
        ("gpu", "extra"),
        "node-a",
        "gpu-3",
        ("k8s.gpu.nvidia.com/claim=uid-c-gpu-3",),
        True,
        "GPU-3",
        "Long",
        "share-1",
        "20Gi",
        True,
        50,
        "20480M",
        True,
        7,
        True,
    )
    claim = PreparedClaim("uid-c", "team-c", "infer", (device,), pod_claim_name="pod-infer", metadata=True)
    assert [f.name for f in fields(PreparedDevice)][-1] == "vfio_api_device", "a new field: set it above"
    generic = {"uid-c": {k: v for k, v in asdict(claim).items() if k != "uid"}}
    assert json.loads(encode({"uid-c": claim}))["claims"] == json.loads(json.dumps(generic))
    CheckpointStore(path).save({"uid-c": claim})
    assert CheckpointStore(path).load() == {"uid-c": claim}


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
    with pytest.raises(CheckpointError, match=f"^checkpoint: {path} is a directory, not a regular file; "):
        CheckpointStore(path).load()


def test_entries_written_before_admin_access_existed_still_load(path: Path) -> None:
    def drop_admin_access(document: dict[str, Any]) -> None:
        for claim in document["claims"].values():
            for device in claim["devices"]:
                device.pop("admin_access")

    loaded = decode_journal(_edit(drop_admin_access, fix_checksum=True), path).claims
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


def _claim(uid: str) -> PreparedClaim:
    return replace(CLAIMS["uid-a"], uid=uid, name=f"claim-{uid}")


def test_a_save_appends_only_what_changed(path: Path) -> None:
    many = {f"uid-{i}": _claim(f"uid-{i}") for i in range(200)}
    store = CheckpointStore(path)
    store.save(many)
    before = path.stat().st_size
    store.save({**many, "uid-new": _claim("uid-new")})
    grown = path.stat().st_size - before
    # One claim's line, whatever the number of claims already recorded.
    assert 0 < grown < before / 50
    assert CheckpointStore(path).load() == {**many, "uid-new": _claim("uid-new")}
    dropped = dict(many)
    del dropped["uid-7"]
    store.save(dropped)
    assert CheckpointStore(path).load() == dropped


def test_a_save_that_changes_nothing_writes_nothing(path: Path) -> None:
    store = CheckpointStore(path)
    store.save(CLAIMS, [ACTION])
    stat = path.stat()
    store.save(dict(CLAIMS), [ACTION])
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def test_changed_actions_are_appended(path: Path) -> None:
    store = CheckpointStore(path)
    store.save(CLAIMS)
    store.save(CLAIMS, [ACTION])
    assert CheckpointStore(path).load_state() == (CLAIMS, [ACTION])
    store.save(CLAIMS, [])
    assert CheckpointStore(path).load_state() == (CLAIMS, [])


def _appended(store: CheckpointStore, path: Path, *args: Any, **kwargs: Any) -> bytes:
    before = path.read_bytes()
    store.save(*args, **kwargs)
    after = path.read_bytes()
    assert after.startswith(before)
    return after[len(before) :]


def test_the_uids_a_save_names_as_changed_append_what_a_comparison_of_all_would(tmp_path: Path) -> None:
    many = {f"uid-{i}": _claim(f"uid-{i}") for i in range(50)}
    grown = {**many, "uid-new": _claim("uid-new")}
    grown["uid-3"] = replace(grown["uid-3"], name="renamed")
    del grown["uid-7"]
    lines = []
    for name, changed in (("all", None), ("named", frozenset({"uid-new", "uid-3", "uid-7"}))):
        path = tmp_path / name / "checkpoint.json"
        store = CheckpointStore(path)
        store.save(many)
        lines.append(sorted(_appended(store, path, grown, changed=changed).splitlines()))
        assert CheckpointStore(path).load() == grown
    assert lines[0] == lines[1]
    assert len(lines[0]) == 3


def test_changed_uids_that_do_not_account_for_the_size_are_not_trusted(path: Path) -> None:
    store = CheckpointStore(path)
    store.save(CLAIMS)
    added = {**CLAIMS, "uid-new": _claim("uid-new")}
    # Says nothing of the claim added: the save compares every claim instead.
    store.save(added, changed=frozenset({"uid-a"}))
    assert CheckpointStore(path).load() == added


def test_actions_kept_from_the_last_save_are_written_as_a_fresh_encoding_writes_them(path: Path) -> None:
    store = CheckpointStore(path)
    actions = [replace(ACTION, claim_uid=f"uid-{i}", device=f"gpu-{i}-mig-1g10gb-at0") for i in range(20)]
    store.save(CLAIMS, actions[:10])
    kept = [*actions[:10], actions[10]]
    line = _appended(store, path, CLAIMS, kept)
    record = json.loads(line)
    recorded_sum = record.pop("sum")
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"))
    assert line == f'{canonical[:-1]},"sum":"{recorded_sum}"}}\n'.encode()
    assert CheckpointStore(path).load_state() == (CLAIMS, kept)
    # A changed action among kept ones is encoded anew.
    changed = [*kept[:3], replace(kept[3], done=False), *kept[4:]]
    store.save(CLAIMS, changed)
    assert CheckpointStore(path).load_state() == (CLAIMS, changed)


def test_a_line_cut_short_by_a_crash_is_ignored_and_the_next_save_rewrites_the_file(path: Path) -> None:
    store = CheckpointStore(path)
    store.save({"uid-a": CLAIMS["uid-a"]})
    store.save(CLAIMS)
    whole = path.read_bytes()
    # A crash mid-append: part of the line that would have dropped uid-b, no newline.
    path.write_bytes(whole + b'{"gone":true,"uid":"uid-')
    reader = CheckpointStore(path)
    assert reader.load() == CLAIMS
    reader.save({"uid-b": CLAIMS["uid-b"]})
    assert json.loads(path.read_text())["claims"].keys() == {"uid-b"}


def test_an_edited_appended_line_fails_its_checksum(path: Path) -> None:
    store = CheckpointStore(path)
    store.save({})
    store.save({"uid-a": CLAIMS["uid-a"]})
    path.write_text(path.read_text().replace('"gpu-1"', '"gpu-7"'))
    with pytest.raises(CheckpointError, match="appended change 1 fails its checksum") as err:
        CheckpointStore(path).load()
    assert "move it away to start empty" in str(err.value)


def test_text_after_the_document_that_is_no_line_of_its_own_is_refused(path: Path) -> None:
    CheckpointStore(path).save({})
    path.write_text(path.read_text().rstrip("\n") + "garbage\n")
    with pytest.raises(CheckpointError, match="is not valid JSON"):
        CheckpointStore(path).load()


def test_lines_that_outgrow_the_claims_are_compacted_into_a_snapshot(path: Path) -> None:
    store = CheckpointStore(path)
    store.save({})
    for i in range(COMPACT_SLACK + 5):
        store.save({"uid-a": _claim(f"round-{i}")} if i % 2 else {})
    # The last saves started over from a snapshot: the file is one document again, and small.
    lines = path.read_text().splitlines()
    assert [i for i, line in enumerate(lines) if '"kind":' in line] == [0]
    assert len(lines) < 60
    assert CheckpointStore(path).load() == {}


def test_an_older_file_is_appended_to_and_still_read(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(encode(CLAIMS, [ACTION]))
    store = CheckpointStore(path)
    claims, actions = store.load_state()
    claims["uid-c"] = _claim("uid-c")
    store.save(claims, actions)
    assert path.read_bytes().startswith(encode(CLAIMS, [ACTION]))
    assert CheckpointStore(path).load_state() == (claims, [ACTION])


def test_a_failed_append_leaves_the_file_as_before(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(path)
    store.save(CLAIMS)
    before = path.read_bytes()
    real = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        if len(data) > 20:
            return real(fd, data[:20])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left on device"):
        store.save({"uid-a": CLAIMS["uid-a"]})
    assert path.read_bytes() == before
    monkeypatch.undo()
    store.save({"uid-a": CLAIMS["uid-a"]})
    assert CheckpointStore(path).load() == {"uid-a": CLAIMS["uid-a"]}


def test_one_fsync_makes_every_earlier_change_durable(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(path)
    store.save({})
    first = store.save({"uid-a": CLAIMS["uid-a"]}, durable=False)
    second = store.save(CLAIMS, durable=False)
    synced: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    store.sync(second)
    store.sync(first)
    assert len(synced) == 1


def test_a_failed_fsync_fails_every_change_it_covered(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(path)
    store.save({})
    first = store.save({"uid-a": CLAIMS["uid-a"]}, durable=False)
    second = store.save(CLAIMS, durable=False)

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="Input/output error"):
        store.sync(second)
    monkeypatch.undo()
    # The error is reported once by the kernel: the store reports it to the other waiter too.
    with pytest.raises(OSError, match="Input/output error"):
        store.sync(first)
    store.sync(store.save({}, durable=False))


def test_a_snapshot_cut_short_leaves_the_previous_file(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash before the snapshot's rename (atomicfile.temp-written) keeps what was recorded."""
    CheckpointStore(path).save(CLAIMS)

    def crash(name: str) -> None:
        if name == "atomicfile.temp-written":
            raise SystemExit(137)

    monkeypatch.setattr(nodefiles, "point", crash)
    with pytest.raises(SystemExit):
        CheckpointStore(path).save({})
    assert CheckpointStore(path).load() == CLAIMS


def test_a_save_by_another_process_is_seen_under_the_lock(path: Path) -> None:
    mine, theirs = CheckpointStore(path), CheckpointStore(path)
    mine.save({"uid-a": CLAIMS["uid-a"]})
    assert theirs.load() == {"uid-a": CLAIMS["uid-a"]}
    theirs.save(CLAIMS)
    with mine.exclusive() as saved_elsewhere:
        assert saved_elsewhere is not None
        assert saved_elsewhere[0] == CLAIMS
    with mine.exclusive() as unchanged:
        assert unchanged is None


def test_the_lock_file_is_opened_once_and_excludes_another_store(path: Path) -> None:
    mine, theirs = CheckpointStore(path), CheckpointStore(path)
    opened = []
    real_open = nodefiles.open_lock

    def counting(lock: Path) -> Any:
        opened.append(lock)
        return real_open(lock)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nodefiles, "open_lock", counting)
        for _ in range(3):
            # Another open of the file (another instance) waits while this one holds it.
            with (
                mine.exclusive(),
                pytest.raises(CheckpointError, match="cannot lock checkpoint"),
                theirs.exclusive(0.05),
            ):
                pass
    # Once per store, not once per hold.
    assert opened == [mine.lock_path, theirs.lock_path]


def test_a_lock_whose_reread_fails_is_let_go(path: Path) -> None:
    mine, theirs = CheckpointStore(path), CheckpointStore(path)
    mine.save(CLAIMS)
    # Another instance's save that cannot be trusted: the hold fails, and the flock goes with it.
    path.write_text("not a checkpoint\n")
    with pytest.raises(CheckpointError):
        mine.lock()
    theirs.save(CLAIMS)
    with theirs.exclusive(0.05):
        pass
    mine.unlock()  # nothing to let go of: harmless, as the state's clean-up after a failed hold


def test_a_lock_file_removed_while_kept_is_opened_again(path: Path) -> None:
    mine, theirs = CheckpointStore(path), CheckpointStore(path)
    with mine.exclusive():
        pass
    mine.lock_path.unlink()
    # The lock is on the file now at the path: the other store's open finds it held.
    with (
        mine.exclusive(),
        pytest.raises(CheckpointError, match="cannot lock checkpoint"),
        theirs.exclusive(0.05),
    ):
        pass


# NVIDIA's DRA driver keeps its checkpoint at the same path (same driver name, same file name): an empty one
# as its v0.4.1 wrote it on the local cluster, and one with a claim prepared, v2 as its checkpointv.go has it.
NVIDIA_EMPTY = {"checksum": 1083090442, "v1": {}, "v2": {"checksum": 3599265083, "nodeBootID": "89393dcf"}}
NVIDIA_PREPARED = {
    "checksum": 1,
    "v1": {"preparedClaims": {"u-1": {"status": {}}}},
    "v2": {
        "checksum": 2,
        "preparedClaims": {
            "u-1": {"checkpointState": "PrepareCompleted", "name": "c", "namespace": "team-a"},
            # A prepare that failed: nothing reached a container.
            "u-2": {"checkpointState": "PrepareStarted", "name": "d", "namespace": "team-a"},
        },
    },
}


def test_nvidia_s_empty_checkpoint_is_kept_aside_and_the_driver_starts_empty(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(NVIDIA_EMPTY))
    store = CheckpointStore(path)
    assert store.load_state() == ({}, [])
    assert not path.exists()
    assert json.loads(path.with_name("checkpoint.json.nvidia-dra-driver").read_text()) == NVIDIA_EMPTY
    assert "was NVIDIA's DRA driver's, with no claim prepared" in caplog.text
    store.save(CLAIMS)
    assert CheckpointStore(path).load() == CLAIMS


def test_nvidia_s_checkpoint_with_prepared_claims_is_refused_naming_them(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(NVIDIA_PREPARED))
    with pytest.raises(CheckpointError) as err:
        CheckpointStore(path).load()
    assert str(err.value).startswith(
        f"checkpoint {path} is NVIDIA's DRA driver's and records claims it prepared: team-a/c (u-1); "
    )
    assert "run NVIDIA's driver again until the pods of those claims are gone" in str(err.value)
    assert json.loads(path.read_text()) == NVIDIA_PREPARED  # left as it was


def test_nvidia_s_empty_checkpoint_that_cannot_be_moved_aside_is_refused(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(NVIDIA_EMPTY))
    # Where it would be kept, a directory with something in it: the rename fails (as root too).
    (path.with_name("checkpoint.json.nvidia-dra-driver") / "kept").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=f"cannot move NVIDIA's DRA driver checkpoint {path} aside: "):
        CheckpointStore(path).load()
    assert json.loads(path.read_text()) == NVIDIA_EMPTY
