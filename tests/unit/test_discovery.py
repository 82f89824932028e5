"""Discovery on fake GPUs: what a node publishes for each built-in profile, and how odd GPUs are handled."""

from __future__ import annotations

import logging
import re

import pytest

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import MODELS, MigProfile, load_profile
from dra.gpu.discovery import (
    COMMON_DEVICE_NODES,
    cuda_version_string,
    discover,
    mig_device_name,
    mig_profile,
    to_semver,
)
from dra.gpu.library import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_NOT_FOUND,
    ERROR_NOT_SUPPORTED,
    GpuHandle,
    GpuLibraryError,
    MigAttributes,
    MigHandle,
)
from dra.model.devices import Gpu, MigDevice
from tests.unit.helpers import NODE, HostGpuLibrary, inventory, profile

MIB = 1024**2
GIB = 1024**3


def _mig_names(gpu: int, profiles: list[tuple[str, int]]) -> list[str]:
    return [f"gpu-{gpu}-mig-{slug}-{gi}-0" for slug, gi in profiles]


_H100_MIG_LAYOUT = [("3g40gb", 1), ("2g20gb", 2), ("1g10gb", 3), ("1g10gb", 4)]

EXPECTED_NAMES = {
    "h100x8": [f"gpu-{i}" for i in range(8)],
    "h100x8-mig": [f"gpu-{i}" for i in range(4)]
    + [name for gpu in range(4, 8) for name in _mig_names(gpu, _H100_MIG_LAYOUT)],
    "a100x4-mig": _mig_names(0, [("3g20gb", 1), ("2g10gb", 2), ("1g5gb", 3), ("1g5gb", 4)])
    + _mig_names(1, [("1g5gb", gi) for gi in range(1, 8)])
    + _mig_names(2, [("4g20gb", 1), ("3g20gb", 2)])
    + _mig_names(3, [("7g40gb", 1)]),
    "mixed": [f"gpu-{i}" for i in range(4)],
}


@pytest.mark.parametrize(
    ("name", "devices", "gpus"),
    [("h100x8", 8, 8), ("h100x8-mig", 20, 8), ("a100x4-mig", 14, 4), ("mixed", 4, 4)],
)
def test_builtin_profiles_publish_the_expected_devices(name: str, devices: int, gpus: int) -> None:
    inv = inventory(name)
    assert [d.name for d in inv] == EXPECTED_NAMES[name]
    assert len(inv) == devices
    assert len(inv.gpus) == gpus
    assert [g.index for g in inv.gpus] == list(range(gpus))


def test_a_gpu_in_mig_mode_publishes_its_mig_devices_not_itself() -> None:
    inv = inventory("h100x8-mig")
    for gpu in inv.gpus:
        assert gpu.mig_enabled == (gpu.index >= 4)
        assert (inv.get(gpu.name) is None) == gpu.mig_enabled
    for device in inv:
        if isinstance(device, MigDevice):
            assert device.parent is inv.gpus[device.parent.index]
            assert device.parent.mig_enabled
            assert device.name.startswith(f"{device.parent.name}-mig-")


@pytest.mark.parametrize(
    ("name", "index", "product", "architecture", "capability", "memory_mib"),
    [
        ("h100x8", 0, "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", 81559),
        ("h100x8", 7, "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", 81559),
        ("a100x4-mig", 2, "NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", 40960),
        ("mixed", 0, "NVIDIA L40S", "Ada Lovelace", "8.9.0", 46068),
        ("mixed", 3, "Tesla T4", "Turing", "7.5.0", 15360),
    ],
)
def test_gpu_attributes(
    name: str, index: int, product: str, architecture: str, capability: str, memory_mib: int
) -> None:
    gpu = inventory(name).gpus[index]
    assert gpu.name == f"gpu-{index}"
    assert (gpu.index, gpu.minor) == (index, index)
    assert gpu.product_name == product
    assert gpu.brand == "Nvidia"
    assert gpu.architecture == architecture
    assert gpu.cuda_compute_capability == capability
    assert gpu.memory_bytes == memory_mib * MIB
    assert re.fullmatch(r"0{8}:[0-9A-F]{2}:00\.0", gpu.nvml_bus_id)
    assert gpu.pci_bus_id == gpu.nvml_bus_id[4:].lower()
    assert gpu.addressing_mode == "HMM"
    assert gpu.pcie_root is not None
    assert gpu.pcie_root.startswith("pci0000:")


def test_an_h100_reports_just_below_80_gib() -> None:
    gpu = inventory("h100x8").gpus[0]
    assert gpu.memory_bytes == 81559 * MIB
    assert 79 * GIB < gpu.memory_bytes < 80 * GIB


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_node_wide_facts_are_semver(name: str) -> None:
    inv = inventory(name)
    assert inv.driver_version == "550.54.15"
    assert inv.cuda_driver_version == "12.4.0"
    # Fake GPUs have no host device nodes at all.
    assert inv.common_device_nodes == ()
    assert all(d.device_nodes == () for d in inv)


def test_gpus_share_pcie_roots_in_pairs_and_split_over_two_numa_nodes() -> None:
    gpus = inventory("h100x8").gpus
    assert [g.pcie_root for g in gpus] == [
        f"pci0000:{r}" for r in ("10", "10", "30", "30", "50", "50", "70", "70")
    ]
    assert [g.numa_node for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({g.pci_bus_id for g in gpus}) == 8


@pytest.mark.parametrize(
    ("name", "device", "expected"),
    [
        # profile, memory MiB, SMs, copy engines, decoders, encoders, JPEG, OFA
        ("h100x8-mig", "gpu-4-mig-3g40gb-1-0", ("3g.40gb", 40192, 60, 3, 3, 0, 3, 0)),
        ("h100x8-mig", "gpu-7-mig-2g20gb-2-0", ("2g.20gb", 19968, 32, 2, 2, 0, 2, 0)),
        ("h100x8-mig", "gpu-5-mig-1g10gb-4-0", ("1g.10gb", 9856, 16, 1, 1, 0, 1, 0)),
        ("a100x4-mig", "gpu-0-mig-3g20gb-1-0", ("3g.20gb", 19968, 42, 3, 2, 0, 0, 0)),
        ("a100x4-mig", "gpu-1-mig-1g5gb-7-0", ("1g.5gb", 4864, 14, 1, 0, 0, 0, 0)),
        ("a100x4-mig", "gpu-2-mig-4g20gb-1-0", ("4g.20gb", 19968, 56, 4, 2, 0, 0, 0)),
        ("a100x4-mig", "gpu-3-mig-7g40gb-1-0", ("7g.40gb", 40192, 98, 7, 5, 0, 1, 1)),
    ],
)
def test_mig_device_capacities(
    name: str, device: str, expected: tuple[str, int, int, int, int, int, int, int]
) -> None:
    mig = inventory(name).get(device)
    assert isinstance(mig, MigDevice)
    assert (
        mig.profile,
        mig.memory_bytes // MIB,
        mig.engines.multiprocessors,
        mig.engines.copy_engines,
        mig.engines.decoders,
        mig.engines.encoders,
        mig.engines.jpeg_engines,
        mig.engines.ofa_engines,
    ) == expected
    assert mig.memory_bytes % MIB == 0
    assert mig.compute_instance_id == 0


def test_mig_devices_link_to_their_parent() -> None:
    inv = inventory("a100x4-mig")
    migs = [d for d in inv if isinstance(d, MigDevice)]
    assert {m.parent.name for m in migs} == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
    for mig in migs:
        assert mig.product_name == mig.parent.product_name == "NVIDIA A100-SXM4-40GB"
        assert mig.uuid.startswith("MIG-")
        assert mig.uuid != mig.parent.uuid
    gpu1 = [m for m in migs if m.parent.name == "gpu-1"]
    assert [m.gpu_instance_id for m in gpu1] == list(range(1, 8))


def test_mig_device_memory_sits_below_the_marketed_size() -> None:
    mig = inventory("h100x8-mig").get("gpu-4-mig-3g40gb-1-0")
    assert mig is not None
    assert mig.memory_bytes == 40192 * MIB < 40 * GIB


_UUID = re.compile(r"^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_uuids_are_stable_per_node_and_differ_between_nodes(name: str) -> None:
    first = [d.uuid for d in inventory(name, "node-a")]
    again = [d.uuid for d in inventory(name, "node-a")]
    other = [d.uuid for d in inventory(name, "node-b")]
    assert first == again
    assert not set(first) & set(other)
    assert len(set(first)) == len(first)
    assert all(_UUID.match(u) for u in first)
    assert [g.uuid for g in inventory(name, "node-a").gpus] == [
        g.uuid for g in inventory(name, "node-a").gpus
    ]


@pytest.mark.parametrize(
    ("raw", "semver"),
    [
        ("550.54.15", "550.54.15"),
        ("535.104.05", "535.104.5"),
        ("470.07.01", "470.7.1"),
        ("9.0", "9.0.0"),
        ("12", "12.0.0"),
        ("00.01.002", "0.1.2"),
        (" 560.28.03\n", "560.28.3"),
        ("", None),
        ("abc", None),
        ("r535", None),
        ("v550.54.15", None),
        ("550.54.15-rc1", None),
        ("550.54.15.1", None),
        ("550..15", None),
        ("550.54.", None),
        ("-1.0", None),
    ],
)
def test_to_semver(raw: str, semver: str | None) -> None:
    assert to_semver(raw) == semver


@pytest.mark.parametrize(
    ("encoded", "version"),
    [(12040, "12.4.0"), (12000, "12.0.0"), (11080, "11.8.0"), (12090, "12.9.0"), (13000, "13.0.0")],
)
def test_cuda_version_string(encoded: int, version: str) -> None:
    assert cuda_version_string(encoded) == version


def test_a_non_numeric_driver_version_is_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dra.gpu.discovery"):
        inv = inventory(profile({"model": "t4"}, driverVersion="open-dev"))
    assert inv.driver_version is None
    assert "'open-dev' is not numeric" in caplog.text
    assert inv.cuda_driver_version == "12.4.0"


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((4, "1g.10gb", 7, 0), "gpu-4-mig-1g10gb-7-0"),
        ((0, "1g.5gb+me", 1, 0), "gpu-0-mig-1g5gbme-1-0"),
        ((12, "1c.3g.20gb", 2, 1), "gpu-12-mig-1c3g20gb-2-1"),
        ((0, "7G.80GB", 0, 0), "gpu-0-mig-7g80gb-0-0"),
    ],
)
def test_mig_device_name_is_a_dns_label(args: tuple[int, str, int, int], name: str) -> None:
    assert mig_device_name(*args) == name
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name)


# -- GPUs that misbehave ----------------------------------------------------


class BrokenGpus(FakeGpuLibrary):
    """Fake GPUs where some NVML queries fail."""

    def __init__(
        self,
        name: str,
        lost: frozenset[int] = frozenset(),
        no_numa: bool = False,
        lost_mig: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__(load_profile(name), NODE)
        self.lost = lost
        self.no_numa = no_numa
        self.lost_mig = lost_mig

    def memory_total(self, gpu: GpuHandle) -> int:
        if int(str(gpu)) in self.lost:
            raise GpuLibraryError(ERROR_GPU_IS_LOST, "GPU is lost")
        return super().memory_total(gpu)

    def numa_node(self, gpu: GpuHandle) -> int:
        if self.no_numa:
            raise GpuLibraryError(ERROR_NOT_SUPPORTED, "not supported")
        return super().numa_node(gpu)

    def numa_nodes(self, gpu: GpuHandle) -> tuple[int, ...]:
        return () if self.no_numa else super().numa_nodes(gpu)

    def mig_attributes(self, mig: MigHandle) -> MigAttributes:
        if getattr(mig, "gpu_index", None) in self.lost_mig:
            raise GpuLibraryError(ERROR_GPU_IS_LOST, "GPU is lost")
        return super().mig_attributes(mig)


def test_a_gpu_whose_queries_fail_is_skipped_and_the_others_remain(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dra.gpu.discovery"):
        inv = discover(BrokenGpus("h100x8", lost=frozenset({2, 5})))
    assert [d.name for d in inv] == ["gpu-0", "gpu-1", "gpu-3", "gpu-4", "gpu-6", "gpu-7"]
    assert [g.index for g in inv.gpus] == [0, 1, 3, 4, 6, 7]
    healthy = inventory("h100x8")
    assert inv.get("gpu-3") == healthy.get("gpu-3")
    assert "skipping GPU 2: NVML error 15" in caplog.text
    assert "skipping GPU 5" in caplog.text


def test_a_mig_gpu_whose_mig_queries_fail_is_skipped_whole() -> None:
    inv = discover(BrokenGpus("h100x8-mig", lost_mig=frozenset({5})))
    assert not [d for d in inv if d.name.startswith("gpu-5")]
    assert len([d for d in inv if d.name.startswith("gpu-6-mig")]) == 4
    assert [g.index for g in inv.gpus] == [0, 1, 2, 3, 4, 6, 7]


def test_a_gpu_without_numa_node_is_still_published() -> None:
    inv = discover(BrokenGpus("h100x8", no_numa=True))
    assert len(inv) == 8
    assert all(g.numa_node is None and g.numa_nodes == () for g in inv.gpus)


class FailingCall(FakeGpuLibrary):
    """Fake GPUs where one NVML query fails, with one return code, for one GPU and its MIG devices."""

    def __init__(self, name: str, method: str, gpu: int, code: int) -> None:
        super().__init__(load_profile(name), NODE)
        self.method, self.gpu, self.code = method, gpu, code

    def _check(self, method: str, handle: object) -> None:
        if method == self.method and getattr(handle, "gpu_index", handle) == self.gpu:
            raise GpuLibraryError(self.code, f"{method} failed")

    def uuid(self, gpu: GpuHandle | MigHandle) -> str:
        self._check("uuid", gpu)
        return super().uuid(gpu)

    def numa_node(self, gpu: GpuHandle) -> int:
        self._check("numa_node", gpu)
        return super().numa_node(gpu)

    def addressing_mode(self, gpu: GpuHandle) -> int:
        self._check("addressing_mode", gpu)
        return super().addressing_mode(gpu)

    def mig_mode(self, gpu: GpuHandle) -> tuple[int, int]:
        self._check("mig_mode", gpu)
        return super().mig_mode(gpu)

    def mig_device_by_index(self, gpu: GpuHandle, index: int) -> MigHandle:
        self._check("mig_device_by_index", gpu)
        return super().mig_device_by_index(gpu, index)

    def gpu_instance_id(self, mig: MigHandle) -> int:
        self._check("gpu_instance_id", mig)
        return super().gpu_instance_id(mig)


_GPU5_MIGS = _mig_names(5, _H100_MIG_LAYOUT)


@pytest.mark.parametrize(
    ("method", "code", "published"),
    [
        ("numa_node", ERROR_NOT_SUPPORTED, _GPU5_MIGS),
        ("numa_node", ERROR_NOT_FOUND, _GPU5_MIGS),
        ("numa_node", ERROR_GPU_IS_LOST, []),
        # Too old a driver or pynvml for the call, or a platform without it: no addressingMode, that is all.
        ("addressing_mode", ERROR_NOT_SUPPORTED, _GPU5_MIGS),
        ("addressing_mode", ERROR_FUNCTION_NOT_FOUND, _GPU5_MIGS),
        ("addressing_mode", ERROR_ARGUMENT_VERSION_MISMATCH, _GPU5_MIGS),
        ("addressing_mode", ERROR_GPU_IS_LOST, []),
        # A GPU that cannot say its MIG mode is a plain GPU; any other failure hides it.
        ("mig_mode", ERROR_NOT_SUPPORTED, ["gpu-5"]),
        ("mig_mode", ERROR_GPU_IS_LOST, []),
        ("mig_device_by_index", ERROR_GPU_IS_LOST, []),
        ("gpu_instance_id", ERROR_GPU_IS_LOST, []),
        ("uuid", ERROR_GPU_IS_LOST, []),
    ],
)
def test_which_nvml_failures_hide_a_gpu(method: str, code: int, published: list[str]) -> None:
    inv = discover(FailingCall("h100x8-mig", method, 5, code))
    assert [d.name for d in inv if d.name == "gpu-5" or d.name.startswith("gpu-5-")] == published
    assert (5 in [g.index for g in inv.gpus]) == bool(published)
    # The other GPUs are untouched.
    assert len([d for d in inv if not d.name.startswith("gpu-5")]) == 16


def test_devices_can_be_found_by_uuid() -> None:
    inv = inventory("h100x8-mig")
    for device in inv:
        assert inv.by_uuid(device.uuid) is device
    # A GPU in MIG mode is not a device of the inventory.
    assert inv.by_uuid(inv.gpus[4].uuid) is None
    assert inv.by_uuid("GPU-unknown") is None


def test_a_gpu_without_mig_support_is_a_plain_gpu() -> None:
    # L40S and T4 answer NOT_SUPPORTED to the MIG mode query.
    inv = inventory("mixed")
    assert all(isinstance(d, Gpu) and not d.mig_enabled for d in inv)


# -- device nodes on a real host -----------------------------------------------


def test_device_nodes_are_listed_when_the_host_has_them() -> None:
    inv = discover(HostGpuLibrary(load_profile("h100x8")))
    assert [d.device_nodes for d in inv] == [(f"/dev/nvidia{i}",) for i in range(8)]
    assert (
        inv.common_device_nodes
        == COMMON_DEVICE_NODES
        == (
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
        )
    )


def test_only_existing_device_nodes_are_listed() -> None:
    lib = HostGpuLibrary(
        load_profile("h100x8"), existing=["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia1"]
    )
    inv = discover(lib)
    assert inv.common_device_nodes == ("/dev/nvidiactl", "/dev/nvidia-uvm")
    assert [d.name for d in inv if d.device_nodes] == ["gpu-1"]
    assert inv.gpus[1].device_nodes == ("/dev/nvidia1",)


def _caps_for(gpu_minor: int, instances: int, first: int) -> dict[str, int]:
    caps = {}
    for gi in range(1, instances + 1):
        caps[f"gpu{gpu_minor}/gi{gi}/access"] = first + 2 * gi
        caps[f"gpu{gpu_minor}/gi{gi}/ci0/access"] = first + 2 * gi + 1
    return caps


def test_mig_devices_get_their_parent_node_and_capability_nodes() -> None:
    caps = {"config": 1, "monitor": 2, **_caps_for(4, 4, 400), **_caps_for(5, 4, 500)}
    inv = discover(HostGpuLibrary(load_profile("h100x8-mig"), caps=caps))
    mig = inv.get("gpu-4-mig-2g20gb-2-0")
    assert mig is not None
    assert mig.device_nodes == (
        "/dev/nvidia4",
        "/dev/nvidia-caps/nvidia-cap404",
        "/dev/nvidia-caps/nvidia-cap405",
    )
    other = inv.get("gpu-5-mig-3g40gb-1-0")
    assert other is not None
    assert other.device_nodes == (
        "/dev/nvidia5",
        "/dev/nvidia-caps/nvidia-cap502",
        "/dev/nvidia-caps/nvidia-cap503",
    )
    # No capability minors known for GPU 6: only its own device node.
    unknown = inv.get("gpu-6-mig-1g10gb-3-0")
    assert unknown is not None
    assert unknown.device_nodes == ("/dev/nvidia6",)


def test_mig_capability_nodes_missing_on_the_host_are_left_out() -> None:
    caps = _caps_for(4, 4, 400)
    present = ["/dev/nvidia4", "/dev/nvidia-caps/nvidia-cap402"]
    inv = discover(HostGpuLibrary(load_profile("h100x8-mig"), existing=present, caps=caps))
    mig = inv.get("gpu-4-mig-3g40gb-1-0")
    assert mig is not None
    assert mig.device_nodes == ("/dev/nvidia4", "/dev/nvidia-caps/nvidia-cap402")
    assert inv.common_device_nodes == ()


# -- MIG profile names --------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "profile_name"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me", "1g.5gb+me"),
        ("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", "1c.3g.20gb"),
        ("NVIDIA H200 MIG  7g.141gb", "7g.141gb"),
    ],
)
def test_mig_profile_comes_from_the_name_when_nvml_gives_it(name: str, profile_name: str) -> None:
    # The sizes are deliberately wrong: the name wins.
    assert mig_profile(name, 1, 1, 1, 1) == profile_name


_FALLBACK_CASES = [
    (model.product_name, model.memory_mib, name, p)
    for model in MODELS.values()
    for name, p in model.mig_profiles.items()
    if "+" not in name  # "+me" cannot be told from the sizes
]


@pytest.mark.parametrize(
    ("product", "parent_mib", "expected", "sizes"),
    _FALLBACK_CASES,
    ids=[f"{c[0]}-{c[2]}" for c in _FALLBACK_CASES],
)
def test_mig_profile_falls_back_to_the_sizes_when_the_name_has_no_mig_suffix(
    product: str, parent_mib: int, expected: str, sizes: MigProfile
) -> None:
    slices = sizes.gpu_instance_slices
    assert mig_profile(product, sizes.memory_mib, slices, slices, parent_mib) == expected


def test_mig_profile_fallback_names_a_smaller_compute_instance() -> None:
    assert mig_profile("NVIDIA A100-SXM4-40GB", 19968, 3, 1, 40960) == "1c.3g.20gb"


def test_mig_profile_fallback_without_the_parents_memory_rounds_up_to_whole_gb() -> None:
    assert mig_profile("NVIDIA A100-SXM4-40GB", 4864, 1, 1, 0) == "1g.5gb"


class UnnamedMigs(FakeGpuLibrary):
    """An older driver: MIG devices report the parent's product name without " MIG <profile>"."""

    def name(self, gpu: GpuHandle | MigHandle) -> str:
        return super().name(gpu).split(" MIG ")[0]


@pytest.mark.parametrize("name", ["h100x8-mig", "a100x4-mig"])
def test_discovery_names_mig_devices_the_same_without_the_name_suffix(name: str) -> None:
    expected = [(d.name, getattr(d, "profile", None)) for d in inventory(name)]
    found = [(d.name, getattr(d, "profile", None)) for d in discover(UnnamedMigs(load_profile(name), NODE))]
    assert found == expected


def test_a_full_size_h100_mig_device_is_named_7g_80gb_without_the_name_suffix() -> None:
    full = profile({"model": "h100-sxm5-80gb", "mig": ["7g.80gb"]})
    inv = discover(UnnamedMigs(full, NODE))
    assert [d.name for d in inv] == ["gpu-0-mig-7g80gb-1-0"]


@pytest.mark.parametrize("code", [ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND])
def test_a_gpu_that_cannot_tell_its_addressing_mode_has_none(code: int) -> None:
    inv = discover(FailingCall("h100x8", "addressing_mode", 2, code))
    assert [g.addressing_mode for g in inv.gpus] == ["HMM", "HMM", None, "HMM", "HMM", "HMM", "HMM", "HMM"]


class AddressingModes(FakeGpuLibrary):
    """Fake GPUs reporting the raw nvmlDeviceAddressingMode value given per GPU index."""

    def __init__(self, modes: list[int]) -> None:
        super().__init__(profile({"model": "t4", "count": len(modes)}), NODE)
        self.modes = modes

    def addressing_mode(self, gpu: GpuHandle) -> int:
        assert isinstance(gpu, int)
        return self.modes[gpu]


def test_addressing_modes_are_named_as_nvidia_smi_names_them(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dra.gpu.discovery"):
        inv = discover(AddressingModes([0, 1, 2, 7]))
    # A value newer than this driver is left out rather than guessed.
    assert [g.addressing_mode for g in inv.gpus] == ["None", "HMM", "ATS", None]
    assert "GPU 3 reports addressing mode 7, unknown to this driver" in caplog.text
