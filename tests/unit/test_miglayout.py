"""Static MIG layouts applied to fake GPUs at start: convergence, claims' instances kept, undo, kills."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from dra.adapters.checkpoint import CheckpointStore
from dra.cli import main
from dra.core.migconfig import MigConfigs, parse_mig_configs
from dra.core.miglayout import Applied
from dra.daemon.bootstrap import gpu_library
from dra.fakegpus.library import FakeGpuLibrary
from dra.gpu.discovery import discover
from dra.gpu.library import (
    ERROR_IN_USE,
    ERROR_INSUFFICIENT_RESOURCES,
    ComputeInstanceHandle,
    GpuInstanceHandle,
    GpuLibrary,
    GpuLibraryError,
)
from dra.kubeletplugin.miglayout import (
    MigLayoutError,
    apply_layout,
    held_instances,
    load_configs,
    static_modes,
)
from dra.model.devices import MigDevice
from dra.model.migmode import MigModes, parse_mig_modes
from dra.model.migoffer import parse_mig_offer
from dra.model.prepared import PreparedClaim, PreparedDevice
from tests.unit.helpers import NODE

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs/examples/mig-layouts.yaml"

LAYOUTS = {
    "version": "v1",
    "mig-configs": {
        "mixed": [
            {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
            {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
            {"devices": [2], "mig-enabled": False},
        ],
        "sevens": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
        "off": [{"devices": [0, 1], "mig-enabled": False}],
        "too-big": [
            {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
            {"devices": [1], "mig-enabled": True, "mig-devices": {"7g.80gb": 1, "1g.10gb": 1}},
        ],
    },
}


def _configs() -> MigConfigs:
    return parse_mig_configs(LAYOUTS, "layouts.yaml")


def _lib(root: Path, profile: str = "h100x8") -> FakeGpuLibrary:
    lib = gpu_library(profile, NODE, state_dir=root)
    assert isinstance(lib, FakeGpuLibrary)
    return lib


def _migs(lib: GpuLibrary, modes: MigModes | None = None) -> list[MigDevice]:
    """The MIG devices discovery publishes (static MIG)."""
    return [d for d in discover(lib, modes).devices if isinstance(d, MigDevice)]


def _layout(root: Path, profile: str = "h100x8") -> dict[int, list[tuple[str, int]]]:
    """What the GPUs hold, per GPU: (profile, start) of each complete instance."""
    return {
        gpu: sorted((i.profile, i.start) for i in found if i.compute_instances)
        for gpu, found in _lib(root, profile).instances().items()
        if found
    }


def _apply(root: Path, name: str, held: set[tuple[int, int]] | None = None, modes: str = "static") -> Applied:
    return apply_layout(_lib(root), _configs(), name, held or set(), parse_mig_modes(modes))


def test_a_layout_turns_mig_on_and_makes_the_instances(tmp_path: Path) -> None:
    lib = _lib(tmp_path)
    assert lib.mig_mode(lib.device_by_index(0)) == (0, 0)
    applied = _apply(tmp_path, "mixed")
    assert _layout(tmp_path) == {
        0: [("1g.10gb", 2), ("1g.10gb", 3), ("2g.20gb", 0), ("3g.40gb", 4)],
        1: [("1g.10gb", s) for s in range(7)],
    }
    assert [lib.mig_mode(lib.device_by_index(i)) for i in range(3)] == [(1, 1), (1, 1), (0, 0)]
    assert [p.describe() for p in applied.plans] == [
        "GPU 0 (NVIDIA H100 80GB HBM3): 2g.20gb at 0, 1g.10gb at 2, 1g.10gb at 3, 3g.40gb at 4 "
        "(layouts.yaml: mig-configs.mixed[0])",
        "GPU 1 (NVIDIA H100 80GB HBM3): "
        + ", ".join(f"1g.10gb at {s}" for s in range(7))
        + " (layouts.yaml: mig-configs.mixed[1])",
        "GPU 2 (NVIDIA H100 80GB HBM3): MIG off (layouts.yaml: mig-configs.mixed[2])",
    ]
    # Published as static MIG: the MIG devices, and the GPUs the layout leaves alone whole.
    published = _migs(_lib(tmp_path), static_modes(MigModes(), applied))
    assert sorted(m.profile for m in published if m.parent.index == 0) == [
        "1g.10gb",
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]
    assert len([m for m in published if m.parent.index == 1]) == 7
    assert [g.index for g in discover(_lib(tmp_path)).gpus] == list(range(8))


def test_a_second_start_changes_nothing(tmp_path: Path) -> None:
    _apply(tmp_path, "mixed")
    before = {m.uuid for m in _migs(_lib(tmp_path))}
    again = _apply(tmp_path, "mixed")
    assert all(not p.create and not p.destroy for p in again.plans)
    assert {m.uuid for m in _migs(_lib(tmp_path))} == before


def test_another_layout_keeps_what_matches_and_replaces_the_rest(tmp_path: Path) -> None:
    _apply(tmp_path, "mixed")
    kept = {m.uuid for m in _migs(_lib(tmp_path)) if m.parent.index == 1}
    _apply(tmp_path, "sevens")
    assert _layout(tmp_path) == {g: [("1g.10gb", s) for s in range(7)] for g in (0, 1)}
    assert kept <= {m.uuid for m in _migs(_lib(tmp_path))}
    _apply(tmp_path, "off")
    assert _layout(tmp_path) == {}
    lib = _lib(tmp_path)
    assert lib.mig_mode(lib.device_by_index(0)) == (0, 0)


def test_an_instance_a_prepared_claim_uses_is_never_destroyed(tmp_path: Path) -> None:
    _apply(tmp_path, "mixed")
    lib = _lib(tmp_path)
    three_g = next(m for m in _migs(lib) if m.profile == "3g.40gb")
    claim = PreparedClaim(
        "uid-1", "team-a", "train", (PreparedDevice(("r",), NODE, three_g.name, (), uuid=three_g.uuid),)
    )
    CheckpointStore(tmp_path / "checkpoint.json").save({"uid-1": claim})
    claims, actions = CheckpointStore(tmp_path / "checkpoint.json").load_state()
    held = held_instances(lib, claims.values(), actions)
    assert held == {(0, three_g.gpu_instance_id)}
    applied = _apply(tmp_path, "sevens", held)
    # GPU 0 keeps the claim's 3g.40gb at 4-7 and fills 0-3 with 1g.10gb; the layout waits for the claim.
    assert _layout(tmp_path)[0] == [("1g.10gb", s) for s in range(4)] + [("3g.40gb", 4)]
    assert three_g.uuid in {m.uuid for m in _migs(_lib(tmp_path))}
    assert applied.warnings == [
        "GPU 0 (NVIDIA H100 80GB HBM3): 3g.40gb at 4 (GPU instance "
        f"{three_g.gpu_instance_id}) not in layout layouts.yaml: mig-configs.sevens[0] but used by a "
        "prepared claim: they stay beside the layout's instances; the next start after the claim ends "
        "completes the layout"
    ]
    # MIG off waits for the claim too.
    _apply(tmp_path, "off", held)
    assert _layout(tmp_path) == {0: [("3g.40gb", 4)]}


def test_a_layout_that_does_not_fit_changes_nothing(tmp_path: Path) -> None:
    _apply(tmp_path, "sevens")
    before = _lib(tmp_path).instances()
    with pytest.raises(MigLayoutError) as err:
        _apply(tmp_path, "too-big")
    assert str(err.value) == (
        "cannot apply MIG layout 'too-big': layouts.yaml: mig-configs.too-big[1].mig-devices: GPU 1 "
        "(NVIDIA H100 80GB HBM3) cannot hold 1x 7g.80gb, 1x 1g.10gb: that needs 8 compute slices, it has 7; "
        "nothing of it was applied"
    )
    assert err.value.exit_code == 2
    assert _lib(tmp_path).instances() == before


def test_a_failure_half_way_undoes_the_attempt(tmp_path: Path) -> None:
    _apply(tmp_path, "sevens")
    before = _layout(tmp_path)

    class Failing(FakeGpuLibrary):
        """The fake, with NVML's INSUFFICIENT_RESOURCES for the second compute instance made."""

        made = 0

        def create_compute_instance(self, gi: GpuInstanceHandle, profile: int) -> ComputeInstanceHandle:
            Failing.made += 1
            if Failing.made == 2:
                raise GpuLibraryError(ERROR_INSUFFICIENT_RESOURCES, "no compute slices left")
            return super().create_compute_instance(gi, profile)

    plain = _lib(tmp_path)
    lib = Failing(plain.profile, NODE, mig_state=tmp_path / "fake-gpu-mig.json")
    with pytest.raises(MigLayoutError, match="cannot apply MIG layout 'mixed': no compute slices left"):
        apply_layout(lib, _configs(), "mixed", set(), MigModes())
    # The 1g.10gb that GPU 0 lost are back at their placements; GPU 2's MIG mode was never changed.
    assert _layout(tmp_path) == before
    assert lib.mig_mode(lib.device_by_index(2)) == (0, 0)


def test_an_undo_step_that_fails_is_logged_and_the_rest_still_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Stuck(FakeGpuLibrary):
        """The fake, failing the second compute instance and every GPU instance destroyed."""

        made = 0

        def create_compute_instance(self, gi: GpuInstanceHandle, profile: int) -> ComputeInstanceHandle:
            Stuck.made += 1
            if Stuck.made == 2:
                raise GpuLibraryError(ERROR_INSUFFICIENT_RESOURCES, "no compute slices left")
            return super().create_compute_instance(gi, profile)

        def destroy_gpu_instance(self, gi: GpuInstanceHandle) -> None:
            raise GpuLibraryError(ERROR_IN_USE, "in use")

    lib = Stuck(_lib(tmp_path).profile, NODE, mig_state=tmp_path / "fake-gpu-mig.json")
    with pytest.raises(MigLayoutError) as err, caplog.at_level(logging.ERROR, "dra.kubeletplugin.miglayout"):
        apply_layout(lib, _configs(), "mixed", set(), MigModes())
    assert str(err.value) == (
        "cannot apply MIG layout 'mixed': no compute slices left; undoing it failed in part (see the log)"
    )
    # Each failed step is said in the log, and the rest still ran: GPU 1 has MIG off again.
    assert [r.getMessage() for r in caplog.records] == [
        "undoing the MIG layout: cannot destroy GPU instance 2 made on GPU 0: in use",
        "undoing the MIG layout: cannot destroy GPU instance 1 made on GPU 0: in use",
        "undoing the MIG layout: cannot set MIG mode 0 on GPU 0 again: GPU 0 has MIG instances: "
        "destroy them first",
    ]
    assert [lib.mig_mode(lib.device_by_index(i)) for i in (1, 2)] == [(0, 0), (0, 0)]


def test_mig_mode_turned_on_is_turned_off_again_when_the_layout_fails(tmp_path: Path) -> None:
    with pytest.raises(MigLayoutError, match=r"too-big\[1\].mig-devices: GPU 1 .* cannot hold 1x 7g.80gb"):
        _apply(tmp_path, "too-big")
    lib = _lib(tmp_path)
    assert [lib.mig_mode(lib.device_by_index(i)) for i in (0, 1)] == [(0, 0), (0, 0)]


def test_a_dynamic_gpu_cannot_have_a_layout(tmp_path: Path) -> None:
    with pytest.raises(
        MigLayoutError, match=r"GPU 1 \(GPU-\S+\) is dynamic in --mig-mode and layouts.yaml: "
    ):
        _apply(tmp_path, "mixed", modes="static,1=dynamic")
    assert _layout(tmp_path) == {}


def test_a_gpu_without_mig_cannot_have_mig_enabled(tmp_path: Path) -> None:
    lib = _lib(tmp_path, "mixed")
    with pytest.raises(MigLayoutError, match=r"mixed\[0\]: GPU 0 \(NVIDIA L40S\) does not support MIG"):
        apply_layout(lib, _configs(), "mixed", set(), MigModes())


_APPLY = """
import sys
from pathlib import Path
from tests.unit.test_miglayout import _apply
_apply(Path(sys.argv[1]), sys.argv[2])
"""


@pytest.mark.parametrize(
    ("arm", "layout"),
    [
        ("miglayout.mode-set", "mixed"),
        ("miglayout.mode-set:2", "mixed"),
        ("miglayout.gpu-instance-created:3", "mixed"),
        ("miglayout.compute-instance-created:5", "mixed"),
        ("miglayout.destroyed:2", "sevens"),
        ("miglayout.mode-set", "off"),
    ],
)
def test_a_kill_at_any_step_converges_at_the_next_start(tmp_path: Path, arm: str, layout: str) -> None:
    if layout != "mixed":
        _apply(tmp_path, "mixed")
    done = subprocess.run(
        [sys.executable, "-c", _APPLY, str(tmp_path), layout],
        env={**os.environ, "DRA_GPU_FAULT_POINT": arm},
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 137, done.stderr
    _apply(tmp_path, layout)
    fresh = tmp_path / "fresh"
    _apply(fresh, layout)
    assert _layout(tmp_path) == _layout(fresh)
    # No half-made instance is left: every GPU instance has its compute instance.
    assert all(i.compute_instances for found in _lib(tmp_path).instances().values() for i in found)


def test_mig_devices_made_after_start_get_their_device_nodes(tmp_path: Path) -> None:
    root = tmp_path / "fake"
    lib = gpu_library("h100x8", NODE, state_dir=tmp_path, fake_gpu_root=root)
    apply_layout(lib, _configs(), "sevens", set(), MigModes())
    for device in _migs(lib):
        for node in device.device_nodes:
            assert (root / node.lstrip("/")).exists(), node
    # The fake nvidia-smi -L lists them too.
    table = (root / "driver-root/usr/bin/nvidia-smi").read_text()
    assert len(re.findall(r"^M 0 \d+ \d+ MIG-\S+ \d+ 1g.10gb$", table, re.MULTILINE)) == 7


def _discover(tmp_path: Path, *flags: str) -> int:
    layouts = tmp_path / "layouts.yaml"
    layouts.write_text(yaml.safe_dump(LAYOUTS))
    return main(
        ["discover", "--fake-gpus", "h100x8", "--node-name", NODE, "--mig-config-file", str(layouts), *flags]
    )


def test_discover_shows_a_layout_without_applying_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _discover(tmp_path, "--mig-config", "mixed")
    out, err = capsys.readouterr()
    assert status == 0
    assert f"MIG layout 'mixed' of {tmp_path / 'layouts.yaml'}:" in err
    assert "GPU 1 (NVIDIA H100 80GB HBM3): 1g.10gb at 0, 1g.10gb at 1" in err
    devices = [d["name"] for s in yaml.safe_load(out)["items"] for d in s["spec"]["devices"]]
    assert sum(d.startswith("gpu-1-mig-1g10gb-") for d in devices) == 7
    assert "gpu-0-mig-3g40gb-1-0" in devices
    assert "gpu-2" in devices


def test_a_layout_that_cannot_be_applied_exits_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _discover(tmp_path, "--mig-config", "too-big")
    assert status == 2
    assert "GPU 1 (NVIDIA H100 80GB HBM3) cannot hold" in capsys.readouterr().err
    status = _discover(tmp_path, "--mig-config", "nope")
    assert status == 2
    assert (
        "no MIG layout named 'nope' under mig-configs; it has mixed, off, sevens, too-big"
        in capsys.readouterr().err
    )


def test_a_file_that_is_not_yaml_is_refused_with_its_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: v1\nmig-configs: [\n")
    with pytest.raises(MigLayoutError, match=f"--mig-config-file {bad}: not valid YAML or JSON: line 3"):
        load_configs(bad)


def test_every_layout_of_the_documented_example_applies_to_its_gpus(tmp_path: Path) -> None:
    configs = load_configs(EXAMPLE)
    for name, profile in [
        *((name, "h100x8") for name in configs.layouts),
        ("balanced", "a100x4-dynamic-mig"),
        ("all-1g", "a100x4-dynamic-mig"),
    ]:
        root = tmp_path / name / profile
        applied = apply_layout(_lib(root, profile), configs, name, set(), MigModes())
        assert not applied.warnings, (name, profile)
        assert all(not p.skipped for p in applied.plans), (name, profile)
    assert _layout(tmp_path / "balanced/a100x4-dynamic-mig", "a100x4-dynamic-mig")[3] == [
        ("1g.10gb", 2),
        ("1g.10gb", 3),
        ("2g.20gb", 0),
        ("3g.40gb", 4),
    ]


def test_the_static_modes_keep_the_flags_other_settings(tmp_path: Path) -> None:
    """--mig-profiles and the per-node defaults stay as they were for the GPUs a layout leaves alone."""
    modes = parse_mig_modes("whole,@gpu-node-9=dynamic,3=dynamic")
    modes = replace(modes, offer=parse_mig_offer("common"))
    applied = _apply(tmp_path, "sevens")
    static = static_modes(modes, applied)
    assert static.offer == modes.offer
    assert static.nodes == modes.nodes
    assert static.default == "whole"
    lib = _lib(tmp_path)
    assert static.of(0, lib.uuid(lib.device_by_index(0))) == "static"
    assert static.of(3, lib.uuid(lib.device_by_index(3))) == "dynamic"
