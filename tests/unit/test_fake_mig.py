"""MIG management on fake GPUs: the NVML calls, their failures, and instances that outlive the process."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.gpu.library import (
    ERROR_IN_USE,
    ERROR_INSUFFICIENT_RESOURCES,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_SUPPORTED,
    GpuLibraryError,
    Placement,
)
from dra.model.devices import MigDevice
from dra.model.migmode import parse_mig_modes

NODE = "node-a"
ID_3G = 9
ID_1G = 19


def _lib(profile: str = "h100x8-dynamic-mig", state: Path | None = None) -> FakeGpuLibrary:
    return FakeGpuLibrary(load_profile(profile), NODE, mig_state=state)


def test_placements_and_profile_info_are_the_tables() -> None:
    lib = _lib()
    gpu = lib.device_by_index(0)
    info = lib.gpu_instance_profile_info(gpu, 2)
    assert (info.id, info.slice_count, info.memory_mib, info.name) == (ID_3G, 3, 40192, "MIG 3g.40gb")
    assert lib.gpu_instance_possible_placements(gpu, ID_3G) == [Placement(0, 4), Placement(4, 4)]


def test_an_overlapping_placement_fails_as_nvml_does() -> None:
    lib = _lib()
    gpu = lib.device_by_index(0)
    lib.create_gpu_instance_with_placement(gpu, ID_3G, Placement(4, 4))
    with pytest.raises(GpuLibraryError) as err:
        lib.create_gpu_instance_with_placement(gpu, ID_1G, Placement(5, 1))
    assert err.value.code == ERROR_INSUFFICIENT_RESOURCES
    with pytest.raises(GpuLibraryError) as err:
        lib.create_gpu_instance_with_placement(gpu, ID_1G, Placement(7, 1))
    assert err.value.code == ERROR_INVALID_ARGUMENT
    lib.create_gpu_instance_with_placement(gpu, ID_1G, Placement(3, 1))


def test_mig_mode_off_answers_profile_queries_and_makes_nothing() -> None:
    """As a real H200 on driver 580 answered with MIG mode off (tests/data/real/h200-580)."""
    lib = _lib("h100x8")
    gpu = lib.device_by_index(0)
    assert lib.gpu_instance_profile_info(gpu, 0).name == "MIG 1g.10gb"
    assert len(lib.gpu_instance_possible_placements(gpu, ID_1G)) == 7
    assert lib.gpu_instances(gpu, ID_1G) == []
    assert lib.max_mig_device_count(gpu) == 0
    with pytest.raises(GpuLibraryError) as err:
        lib.create_gpu_instance_with_placement(lib.device_by_index(0), ID_1G, Placement(0, 1))
    assert err.value.code == ERROR_NOT_SUPPORTED


def test_a_gpu_instance_with_a_compute_instance_is_in_use() -> None:
    lib = _lib()
    gi = lib.create_gpu_instance_with_placement(lib.device_by_index(1), ID_3G, Placement(0, 4))
    ci = lib.create_compute_instance(gi, 2)
    with pytest.raises(GpuLibraryError) as err:
        lib.destroy_gpu_instance(gi)
    assert err.value.code == ERROR_IN_USE
    lib.destroy_compute_instance(ci)
    lib.destroy_gpu_instance(gi)
    assert lib.instances()[1] == []


def test_instances_outlive_the_library_and_show_as_mig_devices(tmp_path: Path) -> None:
    state = tmp_path / "mig.json"
    first = _lib(state=state)
    gi = first.create_gpu_instance_with_placement(first.device_by_index(2), ID_3G, Placement(4, 4))
    first.create_compute_instance(gi, 2)
    again = _lib(state=state)
    inventory = discover(again, parse_mig_modes("dynamic"))
    made = [(m.parent.index, m.profile, m.gpu_instance_id) for m in inventory.instances]
    assert made == [(2, "3g.40gb", 1)]
    assert inventory.by_uuid(inventory.instances[0].uuid) == inventory.instances[0]
    # A new instance at the same place is a new device.
    again.destroy_compute_instance(
        again.compute_instances(again.gpu_instance_by_id(again.device_by_index(2), 1))[0]
    )
    again.destroy_gpu_instance(again.gpu_instance_by_id(again.device_by_index(2), 1))
    gi = again.create_gpu_instance_with_placement(again.device_by_index(2), ID_3G, Placement(4, 4))
    again.create_compute_instance(gi, 2)
    assert discover(again, parse_mig_modes("dynamic")).instances[0].uuid != inventory.instances[0].uuid


def test_two_libraries_on_one_state_file_see_each_others_changes(tmp_path: Path) -> None:
    """As two processes see one GPU: the file is re-read when another writer changed it, only then."""
    state = tmp_path / "mig.json"
    ours, theirs = _lib(state=state), _lib(state=state)
    gi = ours.create_gpu_instance_with_placement(ours.device_by_index(0), ID_3G, Placement(0, 4))
    assert [i.profile for i in theirs.instances()[0]] == ["3g.40gb"]
    theirs.create_gpu_instance_with_placement(theirs.device_by_index(0), ID_1G, Placement(4, 1))
    assert [i.profile for i in ours.instances()[0]] == ["3g.40gb", "1g.10gb"]
    with pytest.raises(GpuLibraryError) as err:
        ours.create_gpu_instance_with_placement(ours.device_by_index(0), ID_1G, Placement(4, 1))
    assert err.value.code == ERROR_INSUFFICIENT_RESOURCES
    ours.destroy_gpu_instance(gi)
    assert [i.profile for i in theirs.instances()[0]] == ["1g.10gb"]


def test_instances_are_a_copy_that_later_changes_leave_alone(tmp_path: Path) -> None:
    lib = _lib(state=tmp_path / "mig.json")
    gi = lib.create_gpu_instance_with_placement(lib.device_by_index(0), ID_3G, Placement(0, 4))
    before = lib.instances()
    lib.create_compute_instance(gi, 2)
    assert before[0][0].compute_instances == []
    assert lib.instances()[0][0].compute_instances == [0]


def test_static_profiles_keep_their_mig_devices() -> None:
    inventory = discover(_lib("h100x8-mig"))
    assert sorted(
        {m.profile for m in inventory.devices if isinstance(m, MigDevice) and m.parent.index == 4}
    ) == [
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]


def test_mig_modes_per_gpu() -> None:
    modes = parse_mig_modes("dynamic,1=whole,2=static")
    inventory = discover(_lib(), modes)
    assert {p.parent.index for p in inventory.partitions} == {0, 3, 4, 5, 6, 7}
    # GPU 2 is static with MIG on and no MIG device made: it offers nothing.
    assert [d.name for d in inventory.devices][:3] == ["gpu-0", "gpu-1", "gpu-3"]
    on_nodes = parse_mig_modes("static,@node-a=dynamic,3=whole")
    assert on_nodes.for_node("node-a").of(0, "GPU-x") == "dynamic"
    assert on_nodes.for_node("node-a").of(3, "GPU-x") == "whole"
    assert on_nodes.for_node("node-b").of(0, "GPU-x") == "static"
    with pytest.raises(ValueError, match="one of static, dynamic, whole"):
        parse_mig_modes("dynamic,1=partitioned")
    with pytest.raises(ValueError, match="by index"):
        parse_mig_modes("dynamic,first=whole")


def test_a_state_file_of_another_profile_counts_as_absent(tmp_path: Path) -> None:
    state = tmp_path / "mig.json"
    dynamic_lib = _lib(state=state)
    dynamic_lib.create_gpu_instance_with_placement(dynamic_lib.device_by_index(4), ID_1G, Placement(0, 1))
    static_lib = _lib("h100x8-mig", state=state)
    assert [i.profile for i in static_lib.instances()[4]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
