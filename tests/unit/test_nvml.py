"""NvmlLibrary: host helpers on a fake sysfs/procfs/dev tree, NVML error mapping, real NVML if present."""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dra.core.slices import build_slices
from dra.gpu.discovery import ADDRESSING_MODES, discover
from dra.gpu.library import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_NOT_SUPPORTED,
    ERROR_TIMEOUT,
    EVENT_XID_CRITICAL,
    NO_INSTANCE,
    GpuHandle,
    GpuLibraryError,
    XidEvent,
    sysfs_bus_id,
)
from dra.gpu.nvml import NvmlLibrary
from tests.skips import Lack, reason
from tests.unit.helpers import DRIVER, real_or_standin_nvml

# -- a fake /sys ------------------------------------------------------------------


def _sysfs_devices(sysfs: Path, root: str, *chain: str) -> None:
    """Create /sys/devices/<root>/<chain...> plus a /sys/bus/pci/devices link per device, like the kernel."""
    links = sysfs / "bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    for depth in range(1, len(chain) + 1):
        target = sysfs.joinpath("devices", root, *chain[:depth])
        target.mkdir(parents=True, exist_ok=True)
        if not chain[depth - 1].startswith("pci"):  # a bus below a bridge (VMD) is no device
            (links / chain[depth - 1]).symlink_to(os.path.relpath(target, links))


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    # A GPU behind a PCIe switch under root complex pci0000:17, and one directly under pci0000:a0.
    _sysfs_devices(root, "pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:19:00.0")
    _sysfs_devices(root, "pci0000:a0", "0000:a0:01.0", "0000:af:00.0")
    return root


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000000:AF:00.0", "0000:af:00.0"),
        ("0000:3B:00.0", "0000:3b:00.0"),
        ("00000001:02:00.0", "0001:02:00.0"),
        ("0000DEAD:02:00.0", "dead:02:00.0"),
        # Domains above ffff (Intel VMD) keep every digit: sysfs prints them with %04x.
        ("00010000:E1:00.0", "10000:e1:00.0"),
    ],
)
def test_nvml_bus_ids_translate_to_sysfs_names(nvml: str, sysfs: str) -> None:
    assert sysfs_bus_id(nvml) == sysfs


@pytest.mark.parametrize(
    ("bus_id", "root"),
    [
        ("00000000:19:00.0", "pci0000:17"),
        ("00000000:AF:00.0", "pci0000:a0"),
        # A bridge on the way is a device too.
        ("00000000:18:00.0", "pci0000:17"),
    ],
)
def test_pcie_root_is_the_root_complex_above_the_device(sysfs: Path, bus_id: str, root: str) -> None:
    assert NvmlLibrary(sysfs=sysfs).pcie_root(bus_id) == root


def test_pcie_root_behind_a_vmd_domain(sysfs: Path) -> None:
    _sysfs_devices(sysfs, "pci0000:64", "0000:64:00.5", "pci10000:e0", "10000:e0:01.0", "10000:e1:00.0")
    # A device at the same bus number in domain 0 must not be taken for it.
    _sysfs_devices(sysfs, "pci0000:e0", "0000:e0:01.0", "0000:e1:00.0")
    assert NvmlLibrary(sysfs=sysfs).pcie_root("00010000:E1:00.0") == "pci0000:64"


def test_pcie_root_is_found_below_the_sysfs_root_only(tmp_path: Path) -> None:
    # Where sysfs is mounted (here under a directory named pci-lab) is not part of the device's path.
    root = tmp_path / "pci-lab" / "sys"
    _sysfs_devices(root, "pci0000:3a", "0000:3a:00.0", "0000:3b:00.0")
    assert NvmlLibrary(sysfs=root).pcie_root("00000000:3B:00.0") == "pci0000:3a"


def test_pcie_root_of_an_unknown_device_is_none(sysfs: Path) -> None:
    assert NvmlLibrary(sysfs=sysfs).pcie_root("00000000:42:00.0") is None


def test_pcie_root_of_a_dangling_link_is_none(sysfs: Path) -> None:
    (sysfs / "bus/pci/devices/0000:42:00.0").symlink_to("../../../devices/pci0000:40/0000:42:00.0")
    assert NvmlLibrary(sysfs=sysfs).pcie_root("00000000:42:00.0") is None


def test_pcie_root_without_sysfs_is_none(tmp_path: Path) -> None:
    assert NvmlLibrary(sysfs=tmp_path / "nothing").pcie_root("00000000:18:00.0") is None


# -- /proc/driver/nvidia-caps/mig-minors ----------------------------------------------


def test_mig_capability_minors_are_parsed(tmp_path: Path) -> None:
    caps = tmp_path / "proc/driver/nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text(
        "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu7/gi14/ci7/access 4095\n"
        "\nnot a minor\nbroken\n"
    )
    minors = NvmlLibrary(procfs=tmp_path / "proc").mig_capability_minors()
    assert minors == {
        "config": 1,
        "monitor": 2,
        "gpu0/gi1/access": 12,
        "gpu0/gi1/ci0/access": 13,
        "gpu7/gi14/ci7/access": 4095,
    }


def test_mig_capability_minors_without_the_file_are_empty(tmp_path: Path) -> None:
    assert NvmlLibrary(procfs=tmp_path).mig_capability_minors() == {}


# -- /dev ---------------------------------------------------------------------------


def test_path_exists_looks_under_the_host_root(tmp_path: Path) -> None:
    (tmp_path / "dev/nvidia-caps").mkdir(parents=True)
    (tmp_path / "dev/nvidia0").touch()
    (tmp_path / "dev/nvidia-caps/nvidia-cap12").touch()
    lib = NvmlLibrary(dev=tmp_path)
    assert lib.path_exists("/dev/nvidia0")
    assert lib.path_exists("/dev/nvidia-caps/nvidia-cap12")
    assert not lib.path_exists("/dev/nvidia1")
    assert not lib.path_exists("/dev/nvidiactl")


# -- calls through a stand-in for pynvml -------------------------------------------------


class StubNvmlError(Exception):
    """pynvml's NVMLError: the return code in `value`."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class StubNvml:
    """The few pynvml functions these tests call."""

    NVMLError = StubNvmlError

    def __init__(
        self, bus_id: bytes | str = b"00000000:AF:00.0", numa: int | None = None, addressing: int | None = 1
    ) -> None:
        self.bus_id = bus_id
        self.numa = numa
        self.addressing = addressing
        self.wait: Any = StubNvmlError(ERROR_TIMEOUT)
        self.unsupported: set[object] = set()
        self.calls: list[tuple[object, ...]] = []

    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int:  # noqa: N802 (pynvml's name)
        if self.numa is None:
            raise StubNvmlError(ERROR_NOT_SUPPORTED)
        return self.numa

    def nvmlDeviceGetAddressingMode(self, handle: object) -> int:  # noqa: N802
        if self.addressing is None:
            raise StubNvmlError(ERROR_NOT_SUPPORTED)
        return self.addressing

    def nvmlDeviceGetPciInfo(self, handle: object) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self.bus_id)

    def nvmlDeviceGetUUID(self, handle: object) -> str:  # noqa: N802
        return f"GPU-{handle}"

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
        if isinstance(self.wait, Exception):
            raise self.wait
        device, xid, *instances = self.wait
        gpu_instance, compute_instance = instances or (NO_INSTANCE, NO_INSTANCE)
        return SimpleNamespace(
            device=device, eventData=xid, gpuInstanceId=gpu_instance, computeInstanceId=compute_instance
        )

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        self.calls.append(("create",))
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: object, mask: int, event_set: object) -> None:  # noqa: N802
        if handle in self.unsupported:
            raise StubNvmlError(ERROR_NOT_SUPPORTED)
        self.calls.append(("register", handle, mask, event_set))

    def nvmlEventSetFree(self, event_set: object) -> None:  # noqa: N802
        self.calls.append(("free", event_set))

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append(("shutdown",))


def _with_stub(stub: StubNvml, **roots: Path) -> NvmlLibrary:
    lib = NvmlLibrary(**roots)
    lib._nvml = stub
    return lib


def test_numa_node_comes_from_nvml_when_it_knows() -> None:
    assert _with_stub(StubNvml(numa=1)).numa_node(GpuHandle(0)) == 1


def test_numa_node_falls_back_to_sysfs(sysfs: Path) -> None:
    (sysfs / "devices/pci0000:a0/0000:a0:01.0/0000:af:00.0/numa_node").write_text("1\n")
    assert _with_stub(StubNvml(bus_id=b"00000000:AF:00.0"), sysfs=sysfs).numa_node(GpuHandle(0)) == 1


@pytest.mark.parametrize("content", ["-1\n", "garbage\n", None])
def test_no_numa_node_is_not_supported(sysfs: Path, content: str | None) -> None:
    if content is not None:
        (sysfs / "devices/pci0000:a0/0000:a0:01.0/0000:af:00.0/numa_node").write_text(content)
    with pytest.raises(GpuLibraryError) as err:
        _with_stub(StubNvml(bus_id="00000000:AF:00.0"), sysfs=sysfs).numa_node(GpuHandle(0))
    assert err.value.code == ERROR_NOT_SUPPORTED


def test_addressing_mode_is_nvmls_value() -> None:
    assert _with_stub(StubNvml(addressing=2)).addressing_mode(GpuHandle(0)) == 2
    with pytest.raises(GpuLibraryError) as err:
        _with_stub(StubNvml(addressing=None)).addressing_mode(GpuHandle(0))
    assert err.value.code == ERROR_NOT_SUPPORTED


def test_a_call_missing_from_pynvml_is_function_not_found() -> None:
    lib = NvmlLibrary()
    lib._nvml = SimpleNamespace(NVMLError=StubNvmlError)  # bindings that predate the call
    with pytest.raises(GpuLibraryError) as err:
        lib.addressing_mode(GpuHandle(0))
    assert err.value.code == ERROR_FUNCTION_NOT_FOUND
    assert str(err.value) == "nvmlDeviceGetAddressingMode: not in this pynvml (nvidia-ml-py)"


def test_addressing_mode_names_match_the_installed_pynvml() -> None:
    import pynvml  # a dependency of the package: missing, the test fails

    if not hasattr(pynvml, "NVML_DEVICE_ADDRESSING_MODE_HMM"):
        pytest.skip(reason(Lack.TOOL, "this nvidia-ml-py predates nvmlDeviceGetAddressingMode"))
    assert {
        getattr(pynvml, f"NVML_DEVICE_ADDRESSING_MODE_{name.upper()}"): name
        for name in ADDRESSING_MODES.values()
    } == ADDRESSING_MODES
    assert pynvml.NVML_ERROR_FUNCTION_NOT_FOUND == ERROR_FUNCTION_NOT_FOUND
    assert pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH == ERROR_ARGUMENT_VERSION_MISMATCH


def test_wait_xid_event_timeout_is_none() -> None:
    assert _with_stub(StubNvml()).wait_xid_event(10) is None


def test_wait_xid_event_names_the_gpu_and_the_xid() -> None:
    stub = StubNvml()
    stub.wait = ("handle-3", 79)
    assert _with_stub(stub).wait_xid_event(10) == XidEvent(uuid="GPU-handle-3", xid=79)


def test_wait_xid_event_names_the_mig_instance_when_nvml_does() -> None:
    stub = StubNvml()
    stub.wait = ("handle-4", 94, 2, 0)
    assert _with_stub(stub).wait_xid_event(10) == XidEvent(
        uuid="GPU-handle-4", xid=94, gpu_instance_id=2, compute_instance_id=0
    )
    stub.wait = ("handle-4", 94, 3, NO_INSTANCE)
    assert _with_stub(stub).wait_xid_event(10) == XidEvent(uuid="GPU-handle-4", xid=94, gpu_instance_id=3)


def test_each_gpu_is_registered_on_its_own_in_one_event_set() -> None:
    stub = StubNvml()
    stub.unsupported = {"old-gpu"}
    lib = _with_stub(stub)
    lib.watch_xid_events(GpuHandle("gpu-0"))
    with pytest.raises(GpuLibraryError) as err:
        lib.watch_xid_events(GpuHandle("old-gpu"))
    assert err.value.code == ERROR_NOT_SUPPORTED
    lib.watch_xid_events(GpuHandle("gpu-2"))
    assert stub.calls == [
        ("create",),
        ("register", "gpu-0", EVENT_XID_CRITICAL, "event-set"),
        ("register", "gpu-2", EVENT_XID_CRITICAL, "event-set"),
    ]


def test_the_event_set_is_freed_once_and_before_nvml_shuts_down() -> None:
    stub = StubNvml()
    lib = _with_stub(stub)
    lib.watch_xid_events(GpuHandle("gpu-0"))
    lib.unwatch_xid_events()
    lib.unwatch_xid_events()
    lib.shutdown()
    assert [c[0] for c in stub.calls] == ["create", "register", "free", "shutdown"]
    # Without an unwatch first, shutdown frees it itself, first.
    stub.calls.clear()
    lib.watch_xid_events(GpuHandle("gpu-0"))
    lib.shutdown()
    assert [c[0] for c in stub.calls] == ["create", "register", "free", "shutdown"]


def test_nvml_errors_become_gpu_library_errors_naming_the_call() -> None:
    stub = StubNvml()
    stub.wait = StubNvmlError(ERROR_GPU_IS_LOST)
    with pytest.raises(GpuLibraryError) as err:
        _with_stub(stub).wait_xid_event(10)
    assert err.value.code == ERROR_GPU_IS_LOST
    assert str(err.value) == "nvmlEventSetWait_v2: NVML error 15"


# -- real NVML, or the adapter over the NVML stand-in ------------------------------------


@pytest.mark.gpu
def test_real_nvml_discovery_publishes_valid_slices(tmp_path: Path) -> None:
    with real_or_standin_nvml(tmp_path, "h100x8-mig") as lib:
        inv = discover(lib)
    assert inv.gpus, "NVML initialised but discovery found no GPU"
    assert inv.cuda_driver_version.count(".") == 2
    for gpu in inv.gpus:
        assert gpu.uuid.startswith("GPU-")
        assert gpu.memory_bytes > 0
        assert gpu.device_nodes == (f"/dev/nvidia{gpu.minor}",)
        assert re.fullmatch(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", gpu.pci_bus_id)
        assert gpu.addressing_mode in (*ADDRESSING_MODES.values(), None)
    assert "/dev/nvidiactl" in inv.common_device_nodes
    published = build_slices(inv, DRIVER, "gpu-node", None, generation=1)
    # Every device, once (in the packing order, not discovery's: DeviceOrder).
    assert sorted(d["name"] for s in published for d in s["spec"]["devices"]) == sorted(d.name for d in inv)
