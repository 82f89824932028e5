"""Static MIG layouts in mig-parted's format: every error names its path; selection and placement."""

from __future__ import annotations

from typing import Any

import pytest

from dra.core.migconfig import MigConfigError, Slot, parse_mig_configs, place, select_gpus
from dra.gpu import migtables

H100 = 0x233010DE
A100_40 = 0x20B010DE
SRC = "layouts.yaml"


def _file(*entries: object, name: str = "mine") -> dict[str, Any]:
    return {"version": "v1", "mig-configs": {name: list(entries)}}


def _entry(**fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}
    entry.update({k.replace("_", "-"): v for k, v in fields.items()})
    return {k: v for k, v in entry.items() if v is not None}


def test_the_readme_style_file_parses() -> None:
    configs = parse_mig_configs(
        {
            "version": "v1",
            "mig-configs": {
                "all-disabled": [{"devices": "all", "mig-enabled": False}],
                "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
                "custom": [
                    {"devices": [0, 1], "mig-enabled": False},
                    {
                        "devices": [2],
                        "device-filter": ["0x233010DE", "0x233510de"],
                        "mig-enabled": True,
                        "mig-devices": {"3g.40gb": 2, "1g.10gb+me": 0},
                    },
                ],
            },
        },
        SRC,
    )
    custom = configs.layout("custom")
    assert custom[0].devices == (0, 1)
    assert not custom[0].mig_enabled
    assert custom[1].device_filter == (H100, 0x233510DE)
    # A count of 0 asks for nothing.
    assert custom[1].mig_devices == (("3g.40gb", 2),)
    assert custom[1].where == "layouts.yaml: mig-configs.custom[1]"
    assert configs.layout("all-enabled")[0].mig_devices == ()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "layouts.yaml: expected a mapping with `version: v1` and `mig-configs`"),
        ({"version": "v1", "mig-configs": {}, "extra": 1}, "layouts.yaml: unknown key extra; allowed"),
        ({"mig-configs": {"a": []}}, "layouts.yaml: version: expected 'v1', got None"),
        ({"version": "v2", "mig-configs": {}}, "version: expected 'v1', got 'v2'"),
        ({"version": "v1"}, "mig-configs: expected a mapping of at least one layout"),
        (
            {"version": "v1", "mig-configs": {"a": []}},
            r"mig-configs.a: expected a list of 1 to 1024 entries",
        ),
        (_file("all"), r"mig-configs.mine\[0\]: expected a mapping with devices"),
        (
            _file(_entry(gpus=[0])),
            r"mig-configs.mine\[0\]: unknown key gpus; allowed: devices, device-filter",
        ),
        (_file(_entry(devices=None)), r"mig-configs.mine\[0\]: missing required key devices"),
        (_file(_entry(mig_enabled=None)), r"mig-configs.mine\[0\]: missing required key mig-enabled"),
        (_file(_entry(mig_enabled="yes")), r"mine\[0\].mig-enabled: expected true or false, got 'yes'"),
        (_file(_entry(mig_devices=None)), r"mine\[0\]: mig-devices is required when mig-enabled is true"),
        (_file(_entry(mig_enabled=False)), r"mine\[0\].mig-devices: must be empty when mig-enabled is false"),
        (_file(_entry(devices="some")), r"mine\[0\].devices: expected `all` or a non-empty list of GPU"),
        (_file(_entry(devices=[])), r"mine\[0\].devices: expected `all`"),
        (_file(_entry(devices=[-1])), r"mine\[0\].devices: expected `all`"),
        (_file(_entry(devices=[True])), r"mine\[0\].devices: expected `all`"),
        (_file(_entry(devices=[1, 1])), r"mine\[0\].devices: GPU indexes listed twice in \[1, 1\]"),
        (_file(_entry(device_filter=[])), r"mine\[0\].device-filter: expected a PCI device ID such as"),
        (_file(_entry(device_filter=0x2330)), r"mine\[0\].device-filter: expected a PCI device ID"),
        (_file(_entry(device_filter="H100")), r"mine\[0\].device-filter: 'H100' is not a PCI device ID"),
        (_file(_entry(device_filter=["0x233010DE", 5])), r"device-filter: 5 is not a PCI device ID"),
        (_file(_entry(mig_devices=["1g.10gb"])), r"mine\[0\].mig-devices: expected a mapping of MIG profile"),
        (_file(_entry(mig_devices={"1g10gb": 7})), r"mig-devices: '1g10gb' is not a MIG profile name"),
        (_file(_entry(mig_devices={"1c.3g.40gb": 1})), r"mig-devices: '1c.3g.40gb' is a compute-instance"),
        (_file(_entry(mig_devices={"1g.10gb": -1})), r"mig-devices.1g.10gb: expected a count >= 0, got -1"),
        (_file(_entry(mig_devices={"1g.10gb": "7"})), r"mig-devices.1g.10gb: expected a count >= 0, got '7'"),
        (_file(_entry(mig_devices={"1g.10gb": True})), r"mig-devices.1g.10gb: expected a count >= 0"),
        (
            _file(_entry(), _entry(devices=[1])),
            r"mine\[1\]: selects GPUs that layouts.yaml: mig-configs.mine\[0\] selects too",
        ),
        (_file(_entry(devices=[0, 1]), _entry(devices=[1, 2])), r"mine\[1\]: selects GPUs that"),
        (
            _file(_entry(device_filter="0x233010DE"), _entry(devices=[3], device_filter=["0x233010de"])),
            r"mine\[1\]: selects GPUs that",
        ),
    ],
)
def test_every_fault_is_an_error_naming_its_path(data: object, message: str) -> None:
    with pytest.raises(MigConfigError, match=message):
        parse_mig_configs(data, SRC)


def test_entries_for_different_models_may_both_say_all() -> None:
    configs = parse_mig_configs(
        _file(
            _entry(device_filter="0x233010DE"),
            _entry(device_filter="0x20B010DE", mig_devices={"1g.5gb": 7}),
        ),
        SRC,
    )
    chosen = select_gpus(configs.layout("mine"), [(0, H100), (1, A100_40), (2, 0x26B910DE)])
    assert {i: e.mig_devices for i, e in chosen.items()} == {0: (("1g.10gb", 7),), 1: (("1g.5gb", 7),)}


def test_an_unknown_layout_lists_the_file_s_layouts() -> None:
    configs = parse_mig_configs(_file(_entry()), SRC)
    with pytest.raises(
        MigConfigError, match=r"layouts\.yaml: no MIG layout named 'other' under mig-configs; it has mine"
    ):
        configs.layout("other")


def test_an_entry_naming_a_gpu_the_node_lacks_is_an_error() -> None:
    entries = parse_mig_configs(_file(_entry(devices=[0, 9])), SRC).layout("mine")
    with pytest.raises(MigConfigError, match=r"mine\[0\].devices: no GPU 9 on this node \(it has 2 GPUs\)"):
        select_gpus(entries, [(0, H100), (1, H100)])


GPU = "GPU 2 (NVIDIA H100 80GB HBM3)"


def test_placement_is_largest_first_at_the_lowest_start_that_leaves_room() -> None:
    wanted = (("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1))
    # 3g at 0 would leave 2g at 4 and one 1g at 6 with no room for the second: 3g goes to 4.
    assert place(migtables.H100_80GB, wanted, [], GPU, "w") == [
        Slot("3g.40gb", 4),
        Slot("2g.20gb", 0),
        Slot("1g.10gb", 2),
        Slot("1g.10gb", 3),
    ]
    assert place(migtables.H100_80GB, (("4g.40gb", 1), ("3g.40gb", 1)), [], GPU, "w") == [
        Slot("4g.40gb", 0),
        Slot("3g.40gb", 4),
    ]
    assert place(migtables.H100_80GB, (("1g.10gb", 7),), [], GPU, "w") == [
        Slot("1g.10gb", s) for s in range(7)
    ]


def test_placement_goes_around_kept_instances() -> None:
    kept = [Slot("1g.10gb", 0), Slot("3g.40gb", 4)]
    wanted = (("1g.10gb", 3), ("3g.40gb", 1))
    assert place(migtables.H100_80GB, wanted, kept, GPU, "w") == [Slot("1g.10gb", 1), Slot("1g.10gb", 2)]


@pytest.mark.parametrize(
    ("wanted", "kept", "message"),
    [
        (
            (("1g.5gb", 7),),
            [],
            r"w.mig-devices: GPU 2 \(NVIDIA H100 80GB HBM3\) has no MIG profile 1g.5gb; its ",
        ),
        ((("3g.40gb", 3),), [], r"GPU 2 .* cannot hold 3 3g.40gb: at most 2"),
        ((("1g.10gb+me", 2),), [], r"cannot hold 2 1g.10gb\+me: at most 1"),
        (
            (("3g.40gb", 2), ("1g.10gb", 1)),
            [],
            r"no memory placements for 2x 3g.40gb, 1x 1g.10gb: no placement left for 3g.40gb and the rest",
        ),
        ((("4g.40gb", 1), ("3g.40gb", 1), ("1g.10gb", 1)), [], r"that needs 8 compute slices, it has 7"),
        (
            (("3g.40gb", 2),),
            [Slot("1g.10gb", 3)],
            r"no memory placements for 2x 3g.40gb around the instances kept \(1g.10gb at 3\)",
        ),
        (
            (("3g.40gb", 2),),
            [Slot("1g.10gb", 3), Slot("1g.10gb", 2)],
            r"beside the instances kept \(1g.10gb at 2, 1g.10gb at 3\): that needs 8 compute slices",
        ),
        (
            (("4g.40gb", 1), ("2g.20gb", 1)),
            [Slot("1g.10gb", 5)],
            r"no memory placements for 1x 4g.40gb, 1x 2g.20gb around the instances kept \(1g.10gb at 5\)",
        ),
    ],
)
def test_a_layout_that_does_not_fit_names_gpu_profile_and_reason(
    wanted: tuple[tuple[str, int], ...], kept: list[Slot], message: str
) -> None:
    with pytest.raises(MigConfigError, match=message):
        place(migtables.H100_80GB, wanted, kept, GPU, "w")
