"""The MIG profile tables: the placements NVIDIA's MIG user guide gives, within the GPU's slices."""

from __future__ import annotations

import pytest

from dra.gpu import migtables
from dra.gpu.migtables import GpuInstanceProfile

TABLES = {
    "A100 40GB": migtables.A100_40GB,
    "A100 80GB": migtables.A100_80GB,
    "H100 80GB": migtables.H100_80GB,
    "H200 141GB": migtables.H200_141GB,
}


def _placements(table: tuple[GpuInstanceProfile, ...]) -> dict[str, list[tuple[int, int]]]:
    return {p.name: [(start, p.memory_slices) for start in p.starts] for p in table}


def test_h100_placements_are_the_guides() -> None:
    assert _placements(migtables.H100_80GB) == {
        "1g.10gb": [(i, 1) for i in range(7)],
        "1g.10gb+me": [(i, 1) for i in range(7)],
        "1g.20gb": [(0, 2), (2, 2), (4, 2), (6, 2)],
        "2g.20gb": [(0, 2), (2, 2), (4, 2)],
        "3g.40gb": [(0, 4), (4, 4)],
        "4g.40gb": [(0, 4)],
        "7g.80gb": [(0, 8)],
    }


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES.keys())
def test_every_placement_fits_the_gpu(table: tuple[GpuInstanceProfile, ...]) -> None:
    for p in table:
        assert p.slices <= migtables.COMPUTE_SLICES
        assert all(start % p.memory_slices == 0 or p.memory_slices == 1 for start in p.starts), p.name
        assert all(start + p.memory_slices <= migtables.MEMORY_SLICES for start in p.starts), p.name
        assert migtables.by_nvml_profile(table, p.nvml_profile) == p
        assert migtables.by_id(table, p.id) == p


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES.keys())
def test_seven_one_slice_instances_fill_a_gpu_and_the_whole_one_takes_all(
    table: tuple[GpuInstanceProfile, ...],
) -> None:
    smallest = migtables.by_nvml_profile(table, migtables.PROFILE_1_SLICE)
    whole = migtables.by_nvml_profile(table, migtables.PROFILE_7_SLICE)
    assert smallest is not None
    assert whole is not None
    assert smallest.instance_count == migtables.COMPUTE_SLICES
    assert (whole.slices, whole.memory_slices, whole.starts) == (7, 8, (0,))
    # Eight one-slice memory shares never exceed the whole GPU's memory.
    assert smallest.memory_mib * migtables.MEMORY_SLICES <= whole.memory_mib + smallest.memory_mib
