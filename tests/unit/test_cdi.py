"""CDI specs for prepared claims (pure building) and the spec files in the CDI directory."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dra.adapters import nodefiles
from dra.adapters.nodefiles import CdiStore
from dra.core import cdi
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Device, Inventory
from tests.skips import Lack, reason
from tests.unit.helpers import DRIVER, HostGpuLibrary, inventory

UID = "0b4e2f7a-61c3-4a8e-9d55-2f0c1e9a7b10"
OTHER_UID = "9f1d3c2b-0000-4000-8000-000000000001"

# Name rules of the CDI specification (vendor and class start with a letter; device names may start
# with a digit from spec version 0.5.0 on).
_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS = _VENDOR
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def _devices(inv: Inventory, *names: str) -> list[Device]:
    found = [inv.get(n) for n in names]
    assert all(found)
    return [d for d in found if d is not None]


def _env(edits: dict[str, Any]) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in edits["env"])


# -- building specs --------------------------------------------------------------------------


def test_spec_structure_for_two_gpus() -> None:
    inv = inventory("h100x8")
    devices = _devices(inv, "gpu-2", "gpu-5")
    spec = cdi.build_spec(DRIVER, UID, devices, inv)
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-2", f"{UID}-gpu-5"]
    assert set(spec) == {"cdiVersion", "kind", "devices", "containerEdits"}


def test_names_follow_the_cdi_rules() -> None:
    inv = inventory("h100x8-mig")
    # A claim UID may start with a digit.
    spec = cdi.build_spec(DRIVER, UID, list(inv), inv)
    vendor, _, cdi_class = spec["kind"].partition("/")
    assert _VENDOR.match(vendor)
    assert _CLASS.match(cdi_class)
    for device in spec["devices"]:
        assert _DEVICE.match(device["name"]), device["name"]


def test_qualified_ids_point_at_devices_of_the_spec() -> None:
    inv = inventory("a100x4-mig")
    spec = cdi.build_spec(DRIVER, UID, list(inv), inv)
    for device in inv:
        qualified = cdi.qualified_name(DRIVER, UID, device.name)
        kind, _, name = qualified.partition("=")
        assert kind == spec["kind"]
        assert name in [d["name"] for d in spec["devices"]]
    assert (
        cdi.qualified_name(DRIVER, UID, "gpu-0-mig-7g40gb-1-0")
        == f"k8s.gpu.nvidia.com/claim={UID}-gpu-0-mig-7g40gb-1-0"
    )


def test_spec_wide_edits_carry_no_device_identity() -> None:
    inv = inventory("h100x8-mig")
    specs = [
        cdi.build_spec(DRIVER, UID, _devices(inv, "gpu-1", "gpu-4-mig-3g40gb-1-0"), inv),
        cdi.build_spec(DRIVER, OTHER_UID, _devices(inv, "gpu-6-mig-1g10gb-4-0"), inv),
    ]
    # Identical in every spec, so whichever specs a container draws from, they agree.
    assert (
        specs[0]["containerEdits"] == specs[1]["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=none"]}
    )


def test_each_device_names_itself_and_its_claim_in_env() -> None:
    inv = inventory("h100x8-mig")
    devices = _devices(inv, "gpu-0", "gpu-4-mig-2g20gb-2-0")
    spec = cdi.build_spec(DRIVER, UID, devices, inv)
    gpu_env = _env(spec["devices"][0]["containerEdits"])
    assert gpu_env == {
        "DRA_GPU_GPU_0_NAME": "gpu-0",
        "DRA_GPU_GPU_0_UUID": devices[0].uuid,
        "DRA_GPU_GPU_0_PRODUCT": "NVIDIA H100 80GB HBM3",
        "DRA_GPU_CLAIM_0B4E2F7A_61C3_4A8E_9D55_2F0C1E9A7B10": UID,
    }
    mig_env = _env(spec["devices"][1]["containerEdits"])
    assert mig_env == {
        "DRA_GPU_GPU_4_MIG_2G20GB_2_0_NAME": "gpu-4-mig-2g20gb-2-0",
        "DRA_GPU_GPU_4_MIG_2G20GB_2_0_UUID": devices[1].uuid,
        "DRA_GPU_GPU_4_MIG_2G20GB_2_0_PRODUCT": "NVIDIA H100 80GB HBM3",
        "DRA_GPU_CLAIM_0B4E2F7A_61C3_4A8E_9D55_2F0C1E9A7B10": UID,
    }


@pytest.mark.parametrize(
    ("device", "key"),
    [
        ("gpu-0", "DRA_GPU_GPU_0"),
        ("gpu-4-mig-1g10gb-7-0", "DRA_GPU_GPU_4_MIG_1G10GB_7_0"),
        ("gpu-12", "DRA_GPU_GPU_12"),
    ],
)
def test_env_key(device: str, key: str) -> None:
    assert cdi.env_key(device) == key
    assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", key)


def test_fake_gpus_get_no_device_nodes_at_all() -> None:
    inv = inventory("h100x8-mig")
    spec = cdi.build_spec(DRIVER, UID, list(inv), inv)
    assert "deviceNodes" not in spec["containerEdits"]
    assert all("deviceNodes" not in d["containerEdits"] for d in spec["devices"])


def test_real_device_nodes_are_injected() -> None:
    caps = {"gpu4/gi1/access": 41, "gpu4/gi1/ci0/access": 42}
    inv = discover(HostGpuLibrary(load_profile("h100x8-mig"), caps=caps))
    spec = cdi.build_spec(DRIVER, UID, _devices(inv, "gpu-2", "gpu-4-mig-3g40gb-1-0"), inv)
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidiactl"},
        {"path": "/dev/nvidia-uvm"},
        {"path": "/dev/nvidia-uvm-tools"},
    ]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia2"}]
    assert spec["devices"][1]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia4"},
        {"path": "/dev/nvidia-caps/nvidia-cap41"},
        {"path": "/dev/nvidia-caps/nvidia-cap42"},
    ]


# -- composing specs in one container -------------------------------------------------------------


@dataclasses.dataclass
class Injected:
    """What a container gets from the CDI devices the kubelet passed, merged as the CDI spec says."""

    env: dict[str, str]
    device_nodes: list[str]
    conflicts: dict[str, set[str]]

    @property
    def device_names(self) -> set[str]:
        """The devices whose identity reached the container."""
        return {v for k, v in self.env.items() if k.startswith("DRA_GPU_") and k.endswith("_NAME")}


def _inject(specs: Sequence[dict[str, Any]], ids: Sequence[str]) -> Injected:
    """CDI injection: each device's edits, plus once the spec-wide edits of each spec that
    contributed a device; a later env entry of one name replaces an earlier one, device
    nodes accumulate (one per path)."""
    devices = {f"{spec['kind']}={d['name']}": (spec, d) for spec in specs for d in spec["devices"]}
    edits: list[dict[str, Any]] = []
    contributed: list[dict[str, Any]] = []
    for qualified in ids:
        spec, device = devices[qualified]
        if not any(spec is seen for seen in contributed):
            contributed.append(spec)
            edits.append(spec.get("containerEdits", {}))
        edits.append(device["containerEdits"])
    env: dict[str, str] = {}
    values: dict[str, set[str]] = {}
    nodes: list[str] = []
    for edit in edits:
        for entry in edit.get("env", []):
            key, _, value = entry.partition("=")
            env[key] = value
            values.setdefault(key, set()).add(value)
        nodes += [n["path"] for n in edit.get("deviceNodes", []) if n["path"] not in nodes]
    return Injected(env, nodes, {k: v for k, v in values.items() if len(v) > 1})


def _host_inventory() -> Inventory:
    """h100x8-mig on a host with device nodes and a capability node per MIG instance."""
    caps = {}
    for gpu in (4, 5, 6, 7):
        for gi in (1, 2, 3, 4):
            caps[f"gpu{gpu}/gi{gi}/access"] = 100 + 10 * gpu + 2 * gi
            caps[f"gpu{gpu}/gi{gi}/ci0/access"] = 101 + 10 * gpu + 2 * gi
    return discover(HostGpuLibrary(load_profile("h100x8-mig"), caps=caps))


CLAIM_C = "c0c0c0c0-0000-4000-8000-00000000000c"


@pytest.mark.parametrize(
    ("claims", "container"),
    [
        pytest.param(
            {UID: ["gpu-0"], OTHER_UID: ["gpu-1"]},
            [(UID, "gpu-0"), (OTHER_UID, "gpu-1")],
            id="two-claims",
        ),
        pytest.param(
            {UID: ["gpu-0"], OTHER_UID: ["gpu-1"], CLAIM_C: ["gpu-2"]},
            [(UID, "gpu-0"), (OTHER_UID, "gpu-1"), (CLAIM_C, "gpu-2")],
            id="three-claims",
        ),
        pytest.param(
            {UID: ["gpu-0", "gpu-1"], OTHER_UID: ["gpu-4-mig-3g40gb-1-0"]},
            [(UID, "gpu-0"), (UID, "gpu-1"), (OTHER_UID, "gpu-4-mig-3g40gb-1-0")],
            id="two-devices-beside-mig",
        ),
        pytest.param(
            # One request of a two-request claim: the kubelet passes only that request's device.
            {UID: ["gpu-4-mig-1g10gb-3-0", "gpu-5-mig-1g10gb-3-0"]},
            [(UID, "gpu-5-mig-1g10gb-3-0")],
            id="one-request-of-a-claim",
        ),
        pytest.param(
            # Admin access: a second claim holds a device of the first.
            {UID: ["gpu-0"], OTHER_UID: ["gpu-0", "gpu-1"]},
            [(UID, "gpu-0"), (OTHER_UID, "gpu-0"), (OTHER_UID, "gpu-1")],
            id="admin-access-overlap",
        ),
    ],
)
def test_a_container_sees_exactly_the_union_of_what_it_references(
    claims: dict[str, list[str]], container: list[tuple[str, str]]
) -> None:
    inv = _host_inventory()
    specs = [cdi.build_spec(DRIVER, uid, _devices(inv, *names), inv) for uid, names in claims.items()]
    ids = [cdi.qualified_name(DRIVER, uid, name) for uid, name in container]
    wanted = {name for _, name in container}
    expected_nodes = set(inv.common_device_nodes) | {
        node for name in wanted for node in _devices(inv, name)[0].device_nodes
    }
    results = [_inject(specs, order) for order in itertools.permutations(ids)]
    for result in results:
        assert result.conflicts == {}, "no variable is set to two values, so the merge order cannot matter"
        assert result.device_names == wanted
        assert {result.env[f"{cdi.env_key(n)}_UUID"] for n in wanted} == {
            d.uuid for d in _devices(inv, *wanted)
        }
        assert set(result.device_nodes) == expected_nodes
        assert result.env["NVIDIA_VISIBLE_DEVICES"] == "none"
        assert {k: v for k, v in result.env.items() if k.startswith("DRA_GPU_CLAIM_")} == {
            cdi.claim_env_key(uid): uid for uid, _ in container
        }
    assert all(r.env == results[0].env for r in results)


def test_a_claim_and_the_device_plugin_compose_in_one_container() -> None:
    inv = _host_inventory()
    claim = cdi.build_spec(DRIVER, UID, _devices(inv, "gpu-0"), inv)
    plugin = cdi.build_device_spec(DRIVER, _devices(inv, "gpu-6-mig-1g10gb-4-0", "gpu-3"), inv)
    [gpu3] = _devices(inv, "gpu-3")
    result = _inject(
        [claim, plugin], [cdi.qualified_name(DRIVER, UID, "gpu-0"), cdi.qualified_device_name(DRIVER, gpu3)]
    )
    assert result.conflicts == {}
    assert result.device_names == {"gpu-0", "gpu-3"}
    assert set(result.device_nodes) == {*inv.common_device_nodes, "/dev/nvidia0", "/dev/nvidia3"}


def test_render_is_deterministic_json() -> None:
    def build() -> bytes:
        inv = inventory("h100x8-mig")
        return cdi.render(cdi.build_spec(DRIVER, UID, list(inv), inv))

    first = build()
    assert first == build()
    assert first.endswith(b"}\n")
    inv = inventory("h100x8-mig")
    assert json.loads(first) == cdi.build_spec(DRIVER, UID, list(inv), inv)


def test_spec_file_name() -> None:
    assert cdi.spec_file_name(DRIVER, UID) == f"k8s.gpu.nvidia.com-claim_{UID}.json"


# -- the CDI directory -------------------------------------------------------------------------


def _spec(uid: str = UID, device: str = "gpu-0") -> dict[str, Any]:
    inv = inventory("h100x8")
    return cdi.build_spec(DRIVER, uid, _devices(inv, device), inv)


def test_write_creates_the_directory_and_a_readable_spec(tmp_path: Path) -> None:
    store = CdiStore(tmp_path / "cdi", DRIVER)
    path = store.write(UID, _spec())
    assert path == tmp_path / "cdi" / f"k8s.gpu.nvidia.com-claim_{UID}.json"
    assert path.read_bytes() == cdi.render(_spec())
    assert path.stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path / "cdi") == [path.name]
    assert store.exists(UID)


def test_rewriting_the_same_spec_leaves_the_file_alone(tmp_path: Path) -> None:
    store = CdiStore(tmp_path, DRIVER)
    path = store.write(UID, _spec())
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    inode = path.stat().st_ino
    store.write(UID, _spec())
    assert path.stat().st_mtime_ns == 1_000_000_000
    assert path.stat().st_ino == inode
    # Different content replaces the file (a new inode: written aside, then renamed over it).
    store.write(UID, _spec(device="gpu-1"))
    assert path.read_bytes() == cdi.render(_spec(device="gpu-1"))
    assert path.stat().st_mtime_ns != 1_000_000_000
    assert sorted(os.listdir(tmp_path)) == [path.name]


def test_remove_and_remove_again(tmp_path: Path) -> None:
    store = CdiStore(tmp_path, DRIVER)
    store.write(UID, _spec())
    store.remove(UID)
    assert not store.exists(UID)
    store.remove(UID)
    assert os.listdir(tmp_path) == []


def _foreign_files(root: Path) -> list[str]:
    names = [
        "nvidia.yaml",
        f"k8s.other.example.com-claim_{OTHER_UID}.json",
        f"k8s.gpu.nvidia.com-claim_{OTHER_UID}.yaml",
        f".k8s.gpu.nvidia.com-claim_{OTHER_UID}.json.x1y2.tmp",
        "k8s.gpu.nvidia.com-other_abc.json",
    ]
    for name in names:
        (root / name).write_text("{}")
    return names


def test_claim_uids_are_this_drivers_specs_only(tmp_path: Path) -> None:
    store = CdiStore(tmp_path, DRIVER)
    foreign = _foreign_files(tmp_path)
    store.write(UID, _spec())
    store.write(OTHER_UID, _spec(OTHER_UID))
    assert store.claim_uids() == sorted([UID, OTHER_UID])
    assert CdiStore(tmp_path, "other.example.com").claim_uids() == [OTHER_UID]
    assert sorted(foreign) == sorted(
        set(os.listdir(tmp_path)) - {store.path(UID).name, store.path(OTHER_UID).name}
    )


def test_claim_uids_without_the_directory(tmp_path: Path) -> None:
    assert CdiStore(tmp_path / "missing", DRIVER).claim_uids() == []


def test_remove_leftovers_takes_this_drivers_half_written_specs_only(tmp_path: Path) -> None:
    store = CdiStore(tmp_path, DRIVER)
    foreign = _foreign_files(tmp_path)
    store.write(UID, _spec(UID))
    store.remove_leftovers()
    # This driver's half-written spec, left by a crash, goes; its specs and other files stay.
    kept = [name for name in foreign if not name.endswith(".tmp")]
    assert sorted(os.listdir(tmp_path)) == sorted([*kept, store.path(UID).name])


# -- atomic writes ---------------------------------------------------------------------------------


def test_write_atomic_replaces_content_with_the_mode_asked(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "file.json"
    nodefiles.write_atomic(path, b"one")
    nodefiles.write_atomic(path, b"two", mode=0o600)
    assert path.read_bytes() == b"two"
    assert path.stat().st_mode & 0o777 == 0o600
    assert os.listdir(path.parent) == ["file.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "file.json"
    nodefiles.write_atomic(path, b"old")

    def fail(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk on fire"):
        nodefiles.write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file.json"]


def test_a_temporary_name_taken_already_is_drawn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "file.json"
    draws = iter([b"\x00" * 6, b"\x00" * 6, b"\x01" * 6])
    monkeypatch.setattr(os, "urandom", lambda size: next(draws))
    taken = tmp_path / ".file.json.000000000000.tmp"
    taken.write_bytes(b"another writer's")
    nodefiles.write_atomic(path, b"mine")
    assert path.read_bytes() == b"mine"
    # The other writer's file is neither overwritten nor removed.
    assert taken.read_bytes() == b"another writer's"
    assert sorted(os.listdir(tmp_path)) == [taken.name, "file.json"]


def test_a_write_cut_before_its_rename_leaves_a_temporary_that_leftovers_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CdiStore(tmp_path, DRIVER)

    def killed(name: str) -> None:
        if name == "atomicfile.temp-written":
            raise SystemExit(137)

    # A kill -9 between write and rename runs no clean-up: the failure path's unlink is taken away.
    monkeypatch.setattr(nodefiles, "point", killed)
    monkeypatch.setattr(os, "unlink", lambda path: None)
    with pytest.raises(SystemExit):
        store.write(UID, _spec(UID))
    monkeypatch.undo()
    [leftover] = os.listdir(tmp_path)
    assert leftover.startswith(f".{store.path(UID).name}.")
    assert leftover.endswith(".tmp")
    store.remove_leftovers()
    assert os.listdir(tmp_path) == []


def test_a_large_write_is_whole(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024)
    nodefiles.write_atomic(tmp_path / "big", data, durable=False)
    assert (tmp_path / "big").read_bytes() == data


def test_remove_durably_says_whether_there_was_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    assert nodefiles.remove_durably(path) is True
    assert nodefiles.remove_durably(path) is False


def _tmpfs_mounts() -> set[str]:
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    return {fields[1] for fields in mounts if fields[2] == "tmpfs"}


@pytest.mark.skipif("/dev/shm" not in _tmpfs_mounts(), reason=reason(Lack.TOOL, "no tmpfs at /dev/shm"))
def test_specs_on_tmpfs_are_written_without_fsync_and_elsewhere_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert nodefiles.is_tmpfs(Path("/dev/shm"))
    assert nodefiles.is_tmpfs(tmp_path) == (str(tmp_path) in _tmpfs_mounts())
    synced: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    spec = {"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim", "devices": []}
    volatile = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        CdiStore(volatile / "cdi", "gpu.nvidia.com").write("uid-1", spec)
        assert synced == []
        assert [p.name for p in (volatile / "cdi").iterdir()] == ["k8s.gpu.nvidia.com-claim_uid-1.json"]
    finally:
        shutil.rmtree(volatile)
    if not nodefiles.is_tmpfs(tmp_path):
        CdiStore(tmp_path / "cdi", "gpu.nvidia.com").write("uid-1", spec)
        assert len(synced) == 2  # the file, then its directory
