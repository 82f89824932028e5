"""MIG GPU-instance profiles and their placements per GPU model, as NVML reports them. Pure data.

Source: NVIDIA Multi-Instance GPU User Guide, section "Supported MIG Profiles"
(the tables "A100 MIG Profiles", "H100 MIG Profiles", "H200 MIG Profiles":
fraction of memory and of SMs, NVDEC/JPEG/OFA units, copy engines, instances
available) and its figures of possible placements; and nvml.h for the profile
enumeration (NVML_GPU_INSTANCE_PROFILE_*) and the profile IDs that
`nvidia-smi mig -lgip` prints (nvmlGpuInstanceProfileInfo_t.id).

A GPU of these models has 7 compute slices and 8 memory slices. A placement is
(start, size) in memory slices, as nvmlDeviceGetGpuInstancePossiblePlacements
gives it: 1g profiles with one memory slice sit at 0..6 (slice 7 is only
reachable by larger profiles), 1g profiles with two memory slices and 2g
profiles at even starts, 3g at 0 and 4, 4g at 0, 7g at 0 over all 8.

The MiB sizes are what nvidia-smi reports on these models (an H100 80GB's
3g.40gb is 40192 MiB, less than 40 GiB). The H100 figures are checked against
real devices; the A100 80GB and H200 MiB sizes follow from the guide's memory
fractions and the H100's reserve and are marked as not checked on a device in
docs/mig.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra.model.devices import MigEngines

# nvmlGpuInstanceProfile enumeration (nvml.h, NVML_GPU_INSTANCE_PROFILE_*).
PROFILE_1_SLICE = 0
PROFILE_2_SLICE = 1
PROFILE_3_SLICE = 2
PROFILE_4_SLICE = 3
PROFILE_7_SLICE = 4
PROFILE_8_SLICE = 5
PROFILE_6_SLICE = 6
PROFILE_1_SLICE_REV1 = 7  # 1g with media extensions (+me)
PROFILE_2_SLICE_REV1 = 8  # 2g with media extensions
PROFILE_1_SLICE_REV2 = 9  # 1g with twice the memory (1g.20gb on an H100)
#: How many profile enumerators the fake knows: below it a profile a GPU lacks is NOT_SUPPORTED, from it
#: on INVALID_ARGUMENT, as a real H200 on driver 580.159.04 answered (up to 2_SLICE_ALL_ME, 0x10;
#: nvidia-ml-py 13.615 already names 0x11, 3_SLICE_GFX, which that driver refused as invalid).
PROFILE_COUNT = 0x11

#: nvmlComputeInstanceProfile enumeration: the compute-instance profile spanning N slices.
COMPUTE_PROFILE_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
#: The slices each compute-instance profile spans: COMPUTE_PROFILE_BY_SLICES the other way round.
SLICES_BY_COMPUTE_PROFILE = {p: n for n, p in COMPUTE_PROFILE_BY_SLICES.items()}

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True)
class GpuInstanceProfile:
    """One row of `nvidia-smi mig -lgip` with its possible placements."""

    name: str
    #: The NVML_GPU_INSTANCE_PROFILE_* enumerator it answers to.
    nvml_profile: int
    #: nvmlGpuInstanceProfileInfo_t.id, the ID nvidia-smi shows and creation takes.
    id: int
    #: Compute slices (sliceCount).
    slices: int
    #: Memory slices: the size of each of its placements.
    memory_slices: int
    memory_mib: int
    #: Multiprocessors and engines; these models' MIG profiles have no NVENC.
    engines: MigEngines
    #: Start memory slice of each possible placement.
    starts: tuple[int, ...]

    @property
    def media_extensions(self) -> bool:
        """A +me profile: it takes the GPU's single OFA, so one instance of it at a time."""
        return self.name.endswith("+me")

    @property
    def instance_count(self) -> int:
        """How many instances of this profile fit on one GPU at most (instanceCount)."""
        return 1 if self.media_extensions else len(self.starts)


def _p(
    name: str,
    nvml_profile: int,
    profile_id: int,
    slices: int,
    memory_slices: int,
    memory_mib: int,
    sms: int,
    ce: int,
    engines: tuple[int, int, int],
    starts: tuple[int, ...],
) -> GpuInstanceProfile:
    decoders, jpeg, ofa = engines
    return GpuInstanceProfile(
        name,
        nvml_profile,
        profile_id,
        slices,
        memory_slices,
        memory_mib,
        MigEngines(sms, ce, decoders, 0, jpeg, ofa),
        starts,
    )


_ONE = (0, 1, 2, 3, 4, 5, 6)
_EVEN = (0, 2, 4, 6)
_TWO = (0, 2, 4)
_THREE = (0, 4)
_WHOLE = (0,)

#: NVIDIA A100-SXM4-40GB: 98 SMs in MIG mode (14 per slice), 5 NVDEC, 1 JPEG, 1 OFA.
A100_40GB = (
    _p("1g.5gb", PROFILE_1_SLICE, 19, 1, 1, 4864, 14, 1, (0, 0, 0), _ONE),
    _p("1g.5gb+me", PROFILE_1_SLICE_REV1, 20, 1, 1, 4864, 14, 1, (1, 1, 1), _ONE),
    _p("1g.10gb", PROFILE_1_SLICE_REV2, 15, 1, 2, 9984, 14, 1, (1, 0, 0), _EVEN),
    _p("2g.10gb", PROFILE_2_SLICE, 14, 2, 2, 9984, 28, 2, (1, 0, 0), _TWO),
    _p("3g.20gb", PROFILE_3_SLICE, 9, 3, 4, 19968, 42, 3, (2, 0, 0), _THREE),
    _p("4g.20gb", PROFILE_4_SLICE, 5, 4, 4, 19968, 56, 4, (2, 0, 0), _WHOLE),
    _p("7g.40gb", PROFILE_7_SLICE, 0, 7, 8, 40192, 98, 7, (5, 1, 1), _WHOLE),
)

#: NVIDIA A100-SXM4-80GB: the A100 40GB's profiles with twice the memory.
A100_80GB = (
    _p("1g.10gb", PROFILE_1_SLICE, 19, 1, 1, 9856, 14, 1, (0, 0, 0), _ONE),
    _p("1g.10gb+me", PROFILE_1_SLICE_REV1, 20, 1, 1, 9856, 14, 1, (1, 1, 1), _ONE),
    _p("1g.20gb", PROFILE_1_SLICE_REV2, 15, 1, 2, 19968, 14, 1, (1, 0, 0), _EVEN),
    _p("2g.20gb", PROFILE_2_SLICE, 14, 2, 2, 19968, 28, 2, (1, 0, 0), _TWO),
    _p("3g.40gb", PROFILE_3_SLICE, 9, 3, 4, 40192, 42, 3, (2, 0, 0), _THREE),
    _p("4g.40gb", PROFILE_4_SLICE, 5, 4, 4, 40192, 56, 4, (2, 0, 0), _WHOLE),
    _p("7g.80gb", PROFILE_7_SLICE, 0, 7, 8, 80384, 98, 7, (5, 1, 1), _WHOLE),
)

#: NVIDIA H100 80GB HBM3 (SXM5): 132 SMs, 7 NVDEC, 7 JPEG, 1 OFA.
H100_80GB = (
    _p("1g.10gb", PROFILE_1_SLICE, 19, 1, 1, 9856, 16, 1, (1, 1, 0), _ONE),
    _p("1g.10gb+me", PROFILE_1_SLICE_REV1, 20, 1, 1, 9856, 16, 1, (1, 1, 1), _ONE),
    _p("1g.20gb", PROFILE_1_SLICE_REV2, 15, 1, 2, 19968, 16, 1, (1, 1, 0), _EVEN),
    _p("2g.20gb", PROFILE_2_SLICE, 14, 2, 2, 19968, 32, 2, (2, 2, 0), _TWO),
    _p("3g.40gb", PROFILE_3_SLICE, 9, 3, 4, 40192, 60, 3, (3, 3, 0), _THREE),
    _p("4g.40gb", PROFILE_4_SLICE, 5, 4, 4, 40192, 64, 4, (4, 4, 0), _WHOLE),
    _p("7g.80gb", PROFILE_7_SLICE, 0, 7, 8, 80384, 132, 8, (7, 7, 1), _WHOLE),
)

#: NVIDIA H200 (SXM, 141 GB): the H100's compute layout with more memory per slice. Every value as
#: NVML reported it on a real H200 (driver 580.159.04, MIG mode off: tests/data/real/h200-580/); the
#: 1g.35gb profile has 26 multiprocessors where the H100's 1g.20gb has 16.
H200_141GB = (
    _p("1g.18gb", PROFILE_1_SLICE, 19, 1, 1, 16384, 16, 1, (1, 1, 0), _ONE),
    _p("1g.18gb+me", PROFILE_1_SLICE_REV1, 20, 1, 1, 16384, 16, 1, (1, 1, 1), _ONE),
    _p("1g.35gb", PROFILE_1_SLICE_REV2, 15, 1, 2, 33280, 26, 1, (1, 1, 0), _EVEN),
    _p("2g.35gb", PROFILE_2_SLICE, 14, 2, 2, 33280, 32, 2, (2, 2, 0), _TWO),
    _p("3g.71gb", PROFILE_3_SLICE, 9, 3, 4, 71424, 60, 3, (3, 3, 0), _THREE),
    _p("4g.71gb", PROFILE_4_SLICE, 5, 4, 4, 71424, 64, 4, (4, 4, 0), _WHOLE),
    _p("7g.141gb", PROFILE_7_SLICE, 0, 7, 8, 143360, 132, 8, (7, 7, 1), _WHOLE),
)


#: The tables by product name, as nvmlDeviceGetName gives it: what a GPU in MIG mode would offer, for a
#: GPU whose MIG mode is off on a driver that answers no profile query then (recent drivers do answer:
#: discovery asks NVML first).
BY_PRODUCT = {
    "NVIDIA A100-SXM4-40GB": A100_40GB,
    "NVIDIA A100-SXM4-80GB": A100_80GB,
    "NVIDIA H100 80GB HBM3": H100_80GB,
    "NVIDIA H200": H200_141GB,
}


def by_nvml_profile(table: tuple[GpuInstanceProfile, ...], nvml_profile: int) -> GpuInstanceProfile | None:
    """The row answering to an NVML_GPU_INSTANCE_PROFILE_* enumerator, or None (NOT_SUPPORTED in NVML)."""
    return next((p for p in table if p.nvml_profile == nvml_profile), None)


def by_id(table: tuple[GpuInstanceProfile, ...], profile_id: int) -> GpuInstanceProfile | None:
    """The row with this profile ID, or None."""
    return next((p for p in table if p.id == profile_id), None)
