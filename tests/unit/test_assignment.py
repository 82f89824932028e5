"""The split of a node's GPUs between DRA and the device plugin (dra.core.assignment), on fake inventories."""

from __future__ import annotations

import pytest

from dra.core.assignment import (
    ALL,
    NONE,
    AssignmentError,
    GpuPath,
    RecordedGpu,
    SelectorError,
    assign,
    conflict,
    gpus_behind,
    held_gpus,
    held_refusal,
    parse_recorded,
    parse_selector,
    recorded,
    restrict,
    select,
    stranded_claims,
)
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.model.devices import Device, Gpu, Inventory, MigDevice
from dra.model.prepared import PreparedClaim, PreparedDevice

NODE = "node-a"


def inventory(profile: str) -> Inventory:
    return discover(FakeGpuLibrary(load_profile(profile), NODE))


@pytest.fixture
def mixed() -> Inventory:
    """gpu-0, gpu-1: L40S; gpu-2, gpu-3: T4."""
    return inventory("mixed")


@pytest.fixture
def h100_mig() -> Inventory:
    """gpu-0..3 full H100s; gpu-4..7 in MIG mode with four MIG devices each."""
    return inventory("h100x8-mig")


def indexes(gpus: tuple[Gpu, ...] | list[Gpu]) -> list[int]:
    return [g.index for g in gpus]


# -- selectors -----------------------------------------------------------------


@pytest.mark.parametrize("text", ["all", "ALL", " all "])
def test_all(text: str) -> None:
    assert parse_selector(text).everything


@pytest.mark.parametrize("text", ["none", "None"])
def test_none_selects_nothing(text: str, mixed: Inventory) -> None:
    assert select(parse_selector(text), mixed) == ([], [])


def test_items_of_every_kind() -> None:
    text = "0, 3,GPU-0123ABCD-0000-1111,mig-89abcdef-2222,MIG-GPU-01234567-aaaa/1/0,model=NVIDIA L40S"
    selector = parse_selector(text)
    assert selector.indexes == {0, 3}
    assert selector.uuids == {"gpu-0123abcd-0000-1111", "mig-89abcdef-2222", "mig-gpu-01234567-aaaa/1/0"}
    assert selector.models == {"nvidia l40s"}
    assert str(selector) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty GPU selector"),
        ("0,,1", "'' in '0,,1' is not a GPU index"),
        ("gpu-0", "'gpu-0' in 'gpu-0' is not a GPU index.*device names are not selectors"),
        ("GPU-xyz", "is not a GPU index"),
        ("-1", "is not a GPU index"),
        ("model=", "is not a GPU index"),
        ("0,all", "'all' cannot be combined"),
        ("GPU-", "is not a GPU index"),
    ],
)
def test_bad_selectors_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message.replace("(", r"\(")):
        parse_selector(text)


def test_select_by_index_uuid_and_model(mixed: Inventory) -> None:
    gpus = list(mixed.gpus)
    chosen, unmatched = select(parse_selector(f"3,{gpus[1].uuid.upper()}"), mixed)
    assert indexes(chosen) == [1, 3]
    assert unmatched == []
    chosen, _ = select(parse_selector("model=tesla t4"), mixed)
    assert indexes(chosen) == [2, 3]


def test_select_reports_items_that_match_nothing(mixed: Inventory) -> None:
    chosen, unmatched = select(parse_selector("1,7,GPU-00000000-0000,model=H100"), mixed)
    assert indexes(chosen) == [1]
    assert unmatched == ["7", "gpu-00000000-0000", "model=h100"]


def test_a_mig_uuid_selects_its_parent_gpu(h100_mig: Inventory) -> None:
    mig = next(d for d in h100_mig if isinstance(d, MigDevice) and d.parent.index == 6)
    chosen, unmatched = select(parse_selector(mig.uuid), h100_mig)
    assert indexes(chosen) == [6]
    assert unmatched == []


# -- the split -----------------------------------------------------------------


def test_no_selector_gives_everything_to_the_running_path(mixed: Inventory) -> None:
    dra = assign(mixed, None, None, GpuPath.DRA)
    assert indexes(dra.dra) == [0, 1, 2, 3]
    assert dra.device_plugin == ()
    plugin = assign(mixed, None, None, GpuPath.DEVICE_PLUGIN)
    assert plugin.dra == ()
    assert indexes(plugin.device_plugin) == [0, 1, 2, 3]


@pytest.mark.parametrize("running", list(GpuPath))
def test_one_selector_leaves_the_rest_to_the_other_path(mixed: Inventory, running: GpuPath) -> None:
    by_plugin = assign(mixed, None, parse_selector("2,3"), running)
    assert (indexes(by_plugin.dra), indexes(by_plugin.device_plugin)) == ([0, 1], [2, 3])
    by_dra = assign(mixed, parse_selector("model=NVIDIA L40S"), None, running)
    assert (indexes(by_dra.dra), indexes(by_dra.device_plugin)) == ([0, 1], [2, 3])
    assert by_plugin.warnings == by_dra.warnings == ()


def test_all_and_none(mixed: Inventory) -> None:
    result = assign(mixed, NONE, None, GpuPath.DRA)
    assert (indexes(result.dra), indexes(result.device_plugin)) == ([], [0, 1, 2, 3])
    result = assign(mixed, ALL, NONE, GpuPath.DEVICE_PLUGIN)
    assert (indexes(result.dra), indexes(result.device_plugin)) == ([0, 1, 2, 3], [])


def test_overlap_is_refused_naming_the_first_gpu_and_both_flags(mixed: Inventory) -> None:
    gpu = mixed.gpus[1]
    with pytest.raises(AssignmentError) as raised:
        assign(mixed, parse_selector("1,2"), parse_selector("model=NVIDIA L40S,3"), GpuPath.DRA)
    message = str(raised.value)
    assert message.startswith(f"GPU 1 ({gpu.uuid}, NVIDIA L40S) is selected by both --dra-gpus=1,2 and ")
    assert "--device-plugin-gpus=model=NVIDIA L40S,3" in message
    assert "one path only" in message


def test_overlap_of_several_gpus_counts_the_others(mixed: Inventory) -> None:
    with pytest.raises(AssignmentError, match=r"GPU 0 .*\(3 more GPU\(s\) overlap\)"):
        assign(mixed, ALL, ALL, GpuPath.DEVICE_PLUGIN)


def test_gpus_selected_by_neither_are_advertised_by_neither_with_a_warning(mixed: Inventory) -> None:
    result = assign(mixed, parse_selector("0"), parse_selector("3,9"), GpuPath.DRA)
    assert (indexes(result.dra), indexes(result.device_plugin), indexes(result.unassigned)) == (
        [0],
        [3],
        [1, 2],
    )
    neither = "is selected by neither --dra-gpus nor --device-plugin-gpus"
    assert result.warnings == (
        "--device-plugin-gpus=3,9: no GPU of this node matches 9",
        f"GPU 1 ({mixed.gpus[1].uuid}, NVIDIA L40S) {neither}",
        f"GPU 2 ({mixed.gpus[2].uuid}, Tesla T4) {neither}",
    )


def test_mig_devices_follow_their_parent(h100_mig: Inventory) -> None:
    result = assign(h100_mig, None, parse_selector("0,5"), GpuPath.DRA)
    plugin = restrict(h100_mig, result.device_plugin)
    dra = restrict(h100_mig, result.dra)
    assert [g.index for g in plugin.gpus] == [0, 5]
    assert [d.name for d in plugin] == ["gpu-0"] + [d.name for d in h100_mig if d.name.startswith("gpu-5-")]
    assert len([d for d in plugin if isinstance(d, MigDevice)]) == 4
    assert {d.name for d in plugin}.isdisjoint(d.name for d in dra)
    assert len(plugin) + len(dra) == len(h100_mig)
    assert plugin.cuda_driver_version == h100_mig.cuda_driver_version
    assert plugin.get("gpu-1") is None
    assert dra.get("gpu-1") is not None


# -- what the record holds -------------------------------------------------------


def test_record_entries_round_trip(mixed: Inventory) -> None:
    assert parse_recorded(recorded(mixed.gpus[:2])) == [
        RecordedGpu(g.uuid, g.index, g.product_name) for g in mixed.gpus[:2]
    ]


@pytest.mark.parametrize("entries", [None, {"uuid": "x"}, [{"index": 0}], ["GPU-x"]])
def test_bad_record_entries_are_refused(entries: object) -> None:
    with pytest.raises(ValueError, match=r"expected a list|bad GPU entry"):
        parse_recorded(entries)


def test_conflict_names_the_gpu_and_the_other_path(mixed: Inventory) -> None:
    theirs = parse_recorded(recorded(mixed.gpus[1:3]))
    message = conflict(GpuPath.DEVICE_PLUGIN, list(mixed.gpus), theirs, where=" (record /x)")
    assert message is not None
    assert message.startswith(
        f"GPU 1 ({mixed.gpus[1].uuid}, NVIDIA L40S) is already advertised by the DRA kubelet-plugin "
        "on this node (1 more GPU(s) overlap) (record /x): give both commands the same"
    )
    assert conflict(GpuPath.DRA, list(mixed.gpus[:1]), theirs) is None
    other = conflict(GpuPath.DRA, list(mixed.gpus[2:]), theirs)
    assert other is not None
    assert "already advertised by the device plugin" in other


# -- GPUs that claims prepared for DRA still use -------------------------------------


def _claim(uid: str, *devices: PreparedDevice, name: str = "") -> PreparedClaim:
    return PreparedClaim(uid=uid, namespace="team-a", name=name or f"claim-{uid}", devices=devices)


def _device(device: Device, *, recorded_uuid: bool = True, admin: bool = False) -> PreparedDevice:
    return PreparedDevice(
        request_names=("gpu",),
        pool=NODE,
        device=device.name,
        cdi_device_ids=(f"k8s.gpu.nvidia.com/claim=x-{device.name}",),
        admin_access=admin,
        uuid=device.uuid if recorded_uuid else "",
    )


def test_held_gpus_are_found_by_uuid_and_a_mig_device_holds_its_parent(h100_mig: Inventory) -> None:
    mig = h100_mig.get("gpu-5-mig-1g10gb-3-0")
    assert isinstance(mig, MigDevice)
    a = _claim("a", _device(h100_mig.gpus[2]))
    b = _claim("b", _device(mig), _device(h100_mig.gpus[1]))
    held = held_gpus([a, b], h100_mig)
    assert [(h.gpu.index, h.device, h.claim.uid) for h in held] == [
        (1, "gpu-1", "b"),
        (2, "gpu-2", "a"),
        (5, "gpu-5-mig-1g10gb-3-0", "b"),
    ]


def test_a_recorded_uuid_wins_over_the_name(mixed: Inventory) -> None:
    # Recorded as gpu-2 when that was its index; the GPU is now gpu-3 (one left the bus).
    moved = PreparedDevice(("gpu",), NODE, "gpu-2", ("x",), uuid=mixed.gpus[3].uuid)
    [held] = held_gpus([_claim("a", moved)], mixed)
    assert held.gpu == mixed.gpus[3]
    # A UUID this node does not have is no GPU of this node, whatever the name says.
    gone = PreparedDevice(("gpu",), NODE, "gpu-2", ("x",), uuid="GPU-00000000-0000-0000-0000-000000000000")
    assert held_gpus([_claim("b", gone)], mixed) == []


def test_entries_without_a_uuid_are_found_by_name(h100_mig: Inventory) -> None:
    old = [
        _claim("a", _device(h100_mig.gpus[0], recorded_uuid=False)),
        _claim("b", PreparedDevice(("gpu",), NODE, "gpu-6-mig-2g20gb-2-0", ("x",))),
        # Prepared whole before the GPU went into MIG mode: the GPU is no device now, but still a GPU.
        _claim("c", PreparedDevice(("gpu",), NODE, "gpu-7", ("x",))),
        _claim("d", PreparedDevice(("gpu",), NODE, "gpu-9", ("x",))),
    ]
    assert [(h.gpu.index, h.claim.uid) for h in held_gpus(old, h100_mig)] == [(0, "a"), (6, "b"), (7, "c")]


def test_only_gpus_of_the_given_inventory_are_held(mixed: Inventory) -> None:
    claims = [_claim("a", _device(mixed.gpus[0])), _claim("b", _device(mixed.gpus[3]))]
    device_plugin = restrict(mixed, mixed.gpus[2:])
    assert [(h.gpu.index, h.claim.uid) for h in held_gpus(claims, device_plugin)] == [(3, "b")]


def test_admin_access_does_not_hold_a_gpu(mixed: Inventory) -> None:
    claims = [_claim("monitor", _device(mixed.gpus[2], admin=True)), _claim("a", _device(mixed.gpus[1]))]
    assert [h.gpu.index for h in held_gpus(claims, mixed)] == [1]
    assert [h.claim.uid for h in held_gpus(claims, mixed, admin_access=True)] == ["monitor"]


def test_held_refusal_names_the_gpu_and_the_claim(mixed: Inventory) -> None:
    assert held_refusal([]) is None
    held = held_gpus([_claim("uid-1", _device(mixed.gpus[2]), name="trainer")], mixed)
    assert held_refusal(held, " (checkpoint /s/checkpoint.json)") == (
        f"GPU 2 ({mixed.gpus[2].uuid}, Tesla T4) is still used by ResourceClaim team-a/trainer (UID uid-1), "
        "prepared for DRA on this node (checkpoint /s/checkpoint.json): wait until the pods using it end, "
        "or drain the node; the device plugin starts once the kubelet has unprepared the claim"
    )


def test_held_refusal_names_the_mig_device_and_counts_the_other_gpus(h100_mig: Inventory) -> None:
    mig = h100_mig.get("gpu-4-mig-3g40gb-1-0")
    assert mig is not None
    claims = [
        _claim("a", _device(mig), _device(h100_mig.gpus[0])),
        _claim("b", _device(h100_mig.gpus[1]), _device(h100_mig.gpus[2])),
    ]
    message = held_refusal(held_gpus(claims, restrict(h100_mig, h100_mig.gpus[4:])))
    assert message is not None
    assert message.startswith(
        f"GPU 4 ({h100_mig.gpus[4].uuid}, NVIDIA H100 80GB HBM3) is still used by ResourceClaim "
        "team-a/claim-a (UID a) through gpu-4-mig-3g40gb-1-0, prepared for DRA on this node:"
    )
    everything = held_refusal(held_gpus(claims, h100_mig))
    assert everything is not None
    assert everything.startswith(f"GPU 0 ({h100_mig.gpus[0].uuid}, NVIDIA H100 80GB HBM3) is still used by")
    assert "on this node (3 more GPU(s) in use by prepared claims):" in everything


def test_stranded_claims_get_one_warning_each(mixed: Inventory) -> None:
    claims = [
        _claim("a", _device(mixed.gpus[2]), _device(mixed.gpus[3]), name="trainer"),
        _claim("b", _device(mixed.gpus[0])),
        _claim("c", _device(mixed.gpus[3])),
    ]
    not_dra = restrict(mixed, mixed.gpus[2:])
    gpu2, gpu3 = f"GPU 2 ({mixed.gpus[2].uuid}, Tesla T4)", f"GPU 3 ({mixed.gpus[3].uuid}, Tesla T4)"
    assert stranded_claims(held_gpus(claims, not_dra)) == [
        f"prepared ResourceClaim team-a/trainer (UID a) uses gpu-2 on {gpu2}, gpu-3 on {gpu3}, no longer "
        "assigned to DRA: the claim stays prepared until its pods end, and the device plugin refuses to "
        "start with the GPU until then",
        f"prepared ResourceClaim team-a/claim-c (UID c) uses gpu-3 on {gpu3}, no longer assigned to DRA: "
        "the claim stays prepared until its pods end, and the device plugin refuses to start with the GPU "
        "until then",
    ]


def test_device_plugin_ids_name_their_gpus_mig_parents_included() -> None:
    node = inventory("h100x8-mig")
    gpu0, gpu5 = node.gpus[0], node.gpus[5]
    mig = next(d for d in node if isinstance(d, MigDevice) and d.parent == gpu5)
    named = gpus_behind(
        [
            ("nvidia.com/gpu", f"{gpu0.uuid}::3"),
            ("nvidia.com/mig-1g.10gb", mig.uuid),
            ("nvidia.com/gpu", "2"),
            ("example.com/nic", "1"),
            ("nvidia.com/gpu", "GPU-not-on-this-node"),
        ],
        node,
    )
    assert [g.index for g in named] == [0, 2, 5]
