"""Fake-GPU profiles (built-in and from YAML files) and the fake library's NVML-like answers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra.fakegpus.library import FakeGpuLibrary, parse_event_line
from dra.fakegpus.profiles import BUILTIN_PROFILES, MODELS, ProfileError, load_profile, parse_profile
from dra.gpu.discovery import discover
from dra.gpu.library import (
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    GpuHandle,
    GpuLibraryError,
    XidEvent,
)
from dra.model.devices import MigDevice
from tests.unit.helpers import NODE, inventory

CUSTOM = """\
# a test node
driverVersion: "535.104.05"
cudaDriverVersion: "12.2"
gpus:
  - model: H100-SXM5-80GB     # model names are case-insensitive
    count: 2
    numaNode: 1
    pcieRoot: pci0000:aa
  - productName: NVIDIA Prototype X
    memoryMiB: 1000
    brand: tesla
    architecture: blackwell
    computeCapability: "10.0"
  - model: a100-sxm4-40gb
    mig: [7g.40gb]
"""


def _write(tmp_path: Path, text: str, name: str = "node.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_builtin_profile_loads_by_name() -> None:
    assert sorted(BUILTIN_PROFILES) == [
        "a100x4-dynamic-mig",
        "a100x4-mig",
        "h100x8",
        "h100x8-dynamic-mig",
        "h100x8-mig",
        "mixed",
    ]
    for name in BUILTIN_PROFILES:
        loaded = load_profile(name)
        assert loaded.name == name
        assert loaded.driver_version == "550.54.15"
        assert loaded.cuda_driver_version == 12040


def test_a_custom_profile_file(tmp_path: Path) -> None:
    path = _write(tmp_path, CUSTOM)
    loaded = load_profile(str(path))
    assert loaded.name == str(path)
    assert loaded.cuda_driver_version == 12020
    inv = discover(FakeGpuLibrary(loaded, NODE))
    assert inv.driver_version == "535.104.5"
    assert inv.cuda_driver_version == "12.2.0"
    assert [d.name for d in inv] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3-mig-7g40gb-1-0"]
    h100 = inv.gpus[0]
    assert (h100.product_name, h100.numa_node, h100.pcie_root) == ("NVIDIA H100 80GB HBM3", 1, "pci0000:aa")
    assert inv.gpus[1].pcie_root == "pci0000:aa"
    custom = inv.gpus[2]
    assert custom.product_name == "NVIDIA Prototype X"
    assert custom.brand == "Tesla"
    assert custom.architecture == "Blackwell"
    assert custom.cuda_compute_capability == "10.0.0"
    assert custom.memory_bytes == 1000 * 1024 * 1024
    assert not custom.mig_enabled
    mig = inv.get("gpu-3-mig-7g40gb-1-0")
    assert isinstance(mig, MigDevice)
    assert mig.parent.name == "gpu-3"


def test_overrides_apply_on_top_of_a_catalog_model() -> None:
    loaded = parse_profile(
        {
            "gpus": [
                {"model": "t4", "productName": "Tesla T4 (lab)", "memoryMiB": 16384, "computeCapability": 7.5}
            ]
        },
        "p",
    )
    gpu = inventory(loaded).gpus[0]
    assert (gpu.product_name, gpu.memory_bytes, gpu.architecture) == (
        "Tesla T4 (lab)",
        16 * 1024**3,
        "Turing",
    )
    assert gpu.cuda_compute_capability == "7.5.0"


def test_every_catalog_model_reports_hmm_unless_the_profile_says_otherwise() -> None:
    entries = [{"model": model} for model in sorted(MODELS)]
    loaded = parse_profile(
        {
            "gpus": [
                *entries,
                {"model": "h100-sxm5-80gb", "addressingMode": "ATS"},
                {"model": "t4", "addressingMode": "unsupported"},
            ]
        },
        "p",
    )
    lib = FakeGpuLibrary(loaded, NODE)
    assert [lib.addressing_mode(GpuHandle(i)) for i in range(len(MODELS) + 1)] == [1] * len(MODELS) + [2]
    with pytest.raises(GpuLibraryError) as err:
        lib.addressing_mode(GpuHandle(len(MODELS) + 1))
    assert err.value.code == ERROR_NOT_SUPPORTED


def test_a_builtin_name_wins_over_a_file_of_the_same_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "gpus: [{model: t4}]\n", name="h100x8")
    assert len(load_profile("h100x8").gpus) == 8
    assert len(load_profile("./h100x8").gpus) == 1


def test_unknown_profile_names_the_builtins() -> None:
    with pytest.raises(ProfileError) as err:
        load_profile("h100x16")
    message = str(err.value)
    assert (
        "'h100x16' is neither a built-in (h100x8, h100x8-mig, a100x4-mig, "
        "h100x8-dynamic-mig, a100x4-dynamic-mig, mixed) nor a file" in message
    )


def test_a_directory_is_not_a_profile(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="nor a file"):
        load_profile(str(tmp_path))


def test_an_empty_file_is_not_a_profile(tmp_path: Path) -> None:
    path = _write(tmp_path, "")
    with pytest.raises(ProfileError, match=r"expected a mapping with a `gpus` list"):
        load_profile(str(path))


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ("gpus: [model: t4\n", "line 2, column 1: did not find expected ',' or ']'"),
        (
            "gpus:\n  - model: t4\n\tcount: 2\n",
            "line 3, column 1: found a tab character that violates indentation",
        ),
    ],
)
def test_invalid_yaml_is_one_line_naming_the_file_and_the_place(
    tmp_path: Path, text: str, detail: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert str(err.value).startswith(f"{path}: not valid YAML or JSON: {detail}")
    assert "\n" not in str(err.value)


def test_a_binary_file_is_a_profile_error(tmp_path: Path) -> None:
    path = tmp_path / "profile.bin"
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe")
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert str(err.value) == f"{path}: not UTF-8 text (byte 8)"


_T4 = {"model": "t4"}
_A100 = "a100-sxm4-40gb"

PROFILE_ERRORS: list[tuple[str, Any, str]] = [
    ("not a mapping", ["t4"], "profile test: expected a mapping with a `gpus` list"),
    ("unknown top-level key", {"gpus": [_T4], "gpu": 2}, "profile test: unknown keys ['gpu']; allowed:"),
    ("no gpus", {"driverVersion": "550.54.15"}, "profile test: `gpus` must be a non-empty list"),
    ("empty gpus", {"gpus": []}, "`gpus` must be a non-empty list"),
    ("gpus not a list", {"gpus": {"model": "t4"}}, "`gpus` must be a non-empty list"),
    ("entry not a mapping", {"gpus": ["t4"]}, "gpus[0]: expected a mapping"),
    ("unknown gpu key", {"gpus": [_T4, {"model": "t4", "cores": 3}]}, "gpus[1]: unknown keys ['cores']"),
    (
        "unknown model",
        {"gpus": [{"model": "v100"}]},
        "gpus[0].model: unknown model 'v100'; known: a100-sxm4-40gb",
    ),
    ("neither model nor product", {"gpus": [{"count": 2}]}, "gpus[0]: give a catalog `model` or at least"),
    ("product without memory", {"gpus": [{"productName": "X"}]}, "gpus[0]: give a catalog `model`"),
    (
        "MIG without MIG support",
        {"gpus": [{"model": "l40s", "mig": ["1g.5gb"]}]},
        "gpus[0].mig: NVIDIA L40S does not support MIG",
    ),
    (
        "MIG on a custom model",
        {"gpus": [{"productName": "X", "memoryMiB": 1, "mig": ["1g.5gb"]}]},
        "gpus[0].mig: X does not support MIG",
    ),
    (
        "MIG not a list",
        {"gpus": [{"model": _A100, "mig": "1g.5gb"}]},
        "gpus[0].mig: expected a list of MIG profile names",
    ),
    (
        "unknown MIG profile",
        {"gpus": [{"model": _A100, "mig": ["1g.5gb", "1g.12gb"]}]},
        "gpus[0].mig[1]: '1g.12gb' is not a MIG profile of NVIDIA A100-SXM4-40GB; known: 1g.5gb,",
    ),
    (
        "too many slices",
        {"gpus": [{"model": _A100, "mig": ["4g.20gb", "4g.20gb"]}]},
        "gpus[0].mig: the profiles need 8 GPU-instance slices, NVIDIA A100-SXM4-40GB has 7",
    ),
    (
        "too many small slices",
        {"gpus": [{"model": "h100-sxm5-80gb", "mig": ["1g.10gb"] * 8}]},
        "the profiles need 8 GPU-instance slices",
    ),
    (
        "bad computeCapability",
        {"gpus": [{"model": "t4", "computeCapability": "nine"}]},
        "gpus[0].computeCapability: expected MAJOR.MINOR",
    ),
    (
        "computeCapability without minor",
        {"gpus": [{"model": "t4", "computeCapability": 9}]},
        "gpus[0].computeCapability",
    ),
    ("count zero", {"gpus": [{"model": "t4", "count": 0}]}, "gpus[0].count: expected an integer >= 1, got 0"),
    (
        "count negative",
        {"gpus": [{"model": "t4", "count": -2}]},
        "gpus[0].count: expected an integer >= 1, got -2",
    ),
    (
        "count a string",
        {"gpus": [{"model": "t4", "count": "2"}]},
        "gpus[0].count: expected an integer >= 1, got '2'",
    ),
    (
        "count a bool",
        {"gpus": [{"model": "t4", "count": True}]},
        "gpus[0].count: expected an integer >= 1, got True",
    ),
    ("count a float", {"gpus": [{"model": "t4", "count": 1.5}]}, "gpus[0].count"),
    (
        "memory zero",
        {"gpus": [{"model": "t4", "memoryMiB": 0}]},
        "gpus[0].memoryMiB: expected an integer >= 1",
    ),
    (
        "negative NUMA node",
        {"gpus": [{"model": "t4", "numaNode": -1}]},
        "gpus[0].numaNode: expected an integer >= 0",
    ),
    (
        "unknown brand",
        {"gpus": [{"model": "t4", "brand": "Acme"}]},
        "gpus[0].brand: unknown value 'Acme'; one of:",
    ),
    (
        "unknown architecture",
        {"gpus": [{"model": "t4", "architecture": "Fermi"}]},
        "gpus[0].architecture: unknown value 'Fermi'",
    ),
    (
        "unknown addressing mode",
        {"gpus": [{"model": "t4", "addressingMode": "UVM"}]},
        "gpus[0].addressingMode: unknown value 'UVM'; one of: ATS, HMM, None, unsupported",
    ),
    (
        "addressing mode null",
        {"gpus": [{"model": "t4", "addressingMode": None}]},
        "gpus[0].addressingMode: expected one of ATS, HMM, None, unsupported as a string, got None",
    ),
    (
        "bad cudaDriverVersion",
        {"gpus": [_T4], "cudaDriverVersion": "twelve"},
        "cudaDriverVersion must look like 12.4, got 'twelve'",
    ),
    (
        "three-part cudaDriverVersion",
        {"gpus": [_T4], "cudaDriverVersion": "12.4.1"},
        "cudaDriverVersion must look like 12.4",
    ),
]


@pytest.mark.parametrize(
    ("data", "message"), [c[1:] for c in PROFILE_ERRORS], ids=[c[0] for c in PROFILE_ERRORS]
)
def test_profile_errors_name_the_field(data: Any, message: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "test")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("data", "message"), [c[1:] for c in PROFILE_ERRORS[:8]], ids=[c[0] for c in PROFILE_ERRORS[:8]]
)
def test_profile_file_errors_name_the_field(tmp_path: Path, data: Any, message: str) -> None:
    path = _write(tmp_path, yaml.safe_dump(data))
    with pytest.raises(ProfileError) as err:
        load_profile(str(path))
    assert message.replace("profile test", f"profile {path}") in str(err.value)


@pytest.mark.parametrize(
    ("cuda", "encoded"), [("12.4", 12040), ("12", 12000), (12.2, 12020), ("11.8", 11080)]
)
def test_cuda_driver_version(cuda: object, encoded: int) -> None:
    assert parse_profile({"gpus": [_T4], "cudaDriverVersion": cuda}, "p").cuda_driver_version == encoded


def test_every_catalog_mig_layout_fits_its_gpu() -> None:
    for model in MODELS.values():
        for name, sizes in model.mig_profiles.items():
            assert name.startswith(f"{sizes.gpu_instance_slices}g.")
            assert sizes.memory_mib < model.memory_mib


def test_a_full_mig_layout_is_accepted() -> None:
    loaded = parse_profile({"gpus": [{"model": _A100, "mig": ["1g.5gb"] * 7}]}, "p")
    assert loaded.gpus[0].mig == ("1g.5gb",) * 7


def test_an_empty_mig_list_enables_mig_with_no_devices() -> None:
    inv = inventory(parse_profile({"gpus": [{"model": _A100, "mig": []}, _T4]}, "p"))
    assert [d.name for d in inv] == ["gpu-1"]
    assert inv.gpus[0].mig_enabled


# -- the fake library itself ----------------------------------------------------


def test_handles_beyond_the_profile_are_invalid_arguments() -> None:
    lib = FakeGpuLibrary(load_profile("mixed"), NODE)
    assert lib.device_count() == 4
    with pytest.raises(GpuLibraryError) as err:
        lib.device_by_index(4)
    assert err.value.code == ERROR_INVALID_ARGUMENT


def test_mig_mode_is_not_supported_on_gpus_without_mig() -> None:
    lib = FakeGpuLibrary(load_profile("mixed"), NODE)
    with pytest.raises(GpuLibraryError) as err:
        lib.mig_mode(lib.device_by_index(0))
    assert err.value.code == ERROR_NOT_SUPPORTED
    assert lib.max_mig_device_count(lib.device_by_index(0)) == 0


def test_mig_slots_past_the_profile_are_empty() -> None:
    lib = FakeGpuLibrary(load_profile("h100x8-mig"), NODE)
    gpu = lib.device_by_index(4)
    assert lib.mig_mode(gpu) == (1, 1)
    assert lib.mig_mode(lib.device_by_index(0)) == (0, 0)
    assert lib.max_mig_device_count(gpu) == 7
    with pytest.raises(GpuLibraryError) as err:
        lib.mig_device_by_index(gpu, 4)
    assert err.value.code == ERROR_NOT_FOUND


def test_fake_gpus_have_no_host_paths() -> None:
    lib = FakeGpuLibrary(load_profile("h100x8"), NODE)
    assert not lib.path_exists("/dev/nvidia0")
    assert not lib.path_exists("/dev/nvidiactl")
    assert lib.mig_capability_minors() == {}


def test_xid_events_are_read_from_the_events_file_line_by_line(tmp_path: Path) -> None:
    events = tmp_path / "xid"
    lib = FakeGpuLibrary(load_profile("h100x8"), NODE, events)
    lib.watch_xid_events(GpuHandle(0))
    assert lib.wait_xid_event(0) is None  # no file yet
    events.write_text("GPU-a 79\nGPU-b 48\nGPU-c")
    assert lib.wait_xid_event(0) == XidEvent("GPU-a", 79)
    assert lib.wait_xid_event(0) == XidEvent("GPU-b", 48)
    # A line still being written is not an event yet.
    assert lib.wait_xid_event(0) is None
    with events.open("a") as f:
        f.write(" 31\nGPU-d junk\n")
    assert lib.wait_xid_event(0) == XidEvent("GPU-c", 31)
    assert lib.wait_xid_event(0) == XidEvent("GPU-d", 0)
    assert lib.wait_xid_event(0) is None


def test_without_an_events_file_there_are_no_events() -> None:
    assert FakeGpuLibrary(load_profile("h100x8"), NODE).wait_xid_event(0) is None


@pytest.mark.parametrize(
    ("line", "event"),
    [
        ("GPU-a 79\n", XidEvent("GPU-a", 79)),
        ("GPU-a 79 2\n", XidEvent("GPU-a", 79, gpu_instance_id=2)),
        ("GPU-a 79 2 0\n", XidEvent("GPU-a", 79, gpu_instance_id=2, compute_instance_id=0)),
        ("  GPU-a\t94   13  1 \n", XidEvent("GPU-a", 94, gpu_instance_id=13, compute_instance_id=1)),
        # NVML's "no instance" is no instance; a compute instance alone names nothing.
        ("GPU-a 79 4294967295 4294967295\n", XidEvent("GPU-a", 79)),
        ("GPU-a 79 4294967295 3\n", XidEvent("GPU-a", 79)),
        ("GPU-a 79 1 4294967295\n", XidEvent("GPU-a", 79, gpu_instance_id=1)),
        ("GPU-a 79 x 0\n", XidEvent("GPU-a", 79)),
        ("GPU-a junk 1 0\n", XidEvent("GPU-a", 0, gpu_instance_id=1, compute_instance_id=0)),
    ],
)
def test_event_lines_may_name_a_mig_instance(line: str, event: XidEvent) -> None:
    assert parse_event_line(line) == event


def test_events_with_instances_come_from_the_file(tmp_path: Path) -> None:
    events = tmp_path / "xid"
    events.write_text("GPU-a 79 2 0\nGPU-b 48\n")
    lib = FakeGpuLibrary(load_profile("h100x8-mig"), NODE, events)
    assert lib.wait_xid_event(0) == XidEvent("GPU-a", 79, gpu_instance_id=2, compute_instance_id=0)
    assert lib.wait_xid_event(0) == XidEvent("GPU-b", 48)


def test_per_node_map_picks_the_node_profile_then_the_default(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        yaml.safe_dump({"nodes": {"node-a": "mixed", "node-b": {"gpus": [_T4]}}, "default": "h100x8"}),
    )
    assert load_profile(str(path), "node-a").name == "mixed"
    assert [g.model.product_name for g in load_profile(str(path), "node-b").gpus] == ["Tesla T4"]
    assert load_profile(str(path), "node-c").name == "h100x8"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nodes": {"node-a": "mixed"}}, "no profile for node 'node-c' (listed: node-a) and no `default`"),
        ({"nodes": {}, "extra": 1}, "a per-node profile map has only `nodes`"),
        ({"nodes": {"node-c": {"gpus": []}}}, "nodes[node-c]: `gpus` must be a non-empty list"),
    ],
)
def test_per_node_map_errors(tmp_path: Path, data: Any, message: str) -> None:
    path = _write(tmp_path, yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=re.escape(message)):
        load_profile(str(path), "node-c")
