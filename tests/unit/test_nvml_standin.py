"""The NVML stand-in itself: nvml.h's layouts and codes where the fake has no notion of them.

The differential test (test_nvml_differential.py) shows the adapter over the
stand-in answers as the fake does; these show what only NVML does: structure
layouts as the header gives them (checked against pynvml's), versioned
structures, UNINITIALIZED, INSUFFICIENT_SIZE, handles a destroyed instance
invalidates, functions an older driver lacks, a MIG mode change pending until
a GPU reset, events only for registered GPUs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pynvml  # a dependency of the package: missing, the test fails
import pytest
from fakenvml import abi as nvmlabi
from fakenvml.abi import struct_version
from fakenvml.adapter import over
from fakenvml.standin import NvmlStandIn

from dra.core.migconfig import parse_mig_configs
from dra.daemon.health import HealthMonitor, HealthTracker
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu import dynamic
from dra.gpu.discovery import discover
from dra.gpu.library import (
    ERROR_ARGUMENT_VERSION_MISMATCH,
    ERROR_FUNCTION_NOT_FOUND,
    ERROR_GPU_IS_LOST,
    ERROR_IN_USE,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_SUPPORTED,
    ERROR_UNKNOWN,
    GpuInstanceHandle,
    GpuInstanceInfo,
    GpuLibraryError,
    MigHandle,
    Placement,
    XidEvent,
)
from dra.gpu.nvml import NvmlLibrary
from dra.kubeletplugin.miglayout import apply_layout
from dra.model.devices import Gpu, MigDevice
from dra.model.migmode import MigModes, parse_mig_modes
from tests.unit.helpers import NODE

LAYOUTS = [
    (nvmlabi.PciInfo, "nvmlPciInfo_t"),
    (nvmlabi.Memory, "c_nvmlMemory_t"),
    (nvmlabi.DeviceAttributes, "c_nvmlDeviceAttributes"),
    (nvmlabi.AddressingMode, "c_nvmlDeviceAddressingMode_t"),
    (nvmlabi.GpuInstancePlacement, "c_nvmlGpuInstancePlacement_t"),
    (nvmlabi.GpuInstanceProfileInfoV2, "c_nvmlGpuInstanceProfileInfo_v2_t"),
    (nvmlabi.GpuInstanceInfo, "c_nvmlGpuInstanceInfo_t"),
    (nvmlabi.ComputeInstanceProfileInfoV2, "c_nvmlComputeInstanceProfileInfo_v2_t"),
    (nvmlabi.ComputeInstanceInfo, "c_nvmlComputeInstanceInfo_t"),
    (nvmlabi.EventData, "c_nvmlEventData_t"),
    (nvmlabi.Utilization, "c_nvmlUtilization_t"),
    (nvmlabi.ProcessInfo, "c_nvmlProcessInfo_v3_t"),
    (nvmlabi.ProcessUtilizationSample, "c_nvmlProcessUtilizationSample_t"),
    (nvmlabi.GpmSupport, "c_nvmlGpmSupport_t"),
    (nvmlabi.GpmMetric, "c_nvmlGpmMetric_t"),
]


def test_pynvml_lays_out_the_head_of_nvml_gpm_metrics_get_t_as_nvml_h_does() -> None:
    # Only the metrics array's length differs between headers (NVML_GPM_METRIC_MAX grows).
    theirs = pynvml.c_nvmlGpmMetricsGet_t
    assert _layout(nvmlabi.GpmMetricsGetHead) == _layout(theirs)[:4]
    request = theirs()
    metrics = nvmlabi.gpm_metrics(ctypes.addressof(request), 2)
    assert ctypes.addressof(metrics) == ctypes.addressof(request) + theirs.metrics.offset


def _layout(structure: type[ctypes.Structure]) -> list[tuple[str, int, int]]:
    return [
        (name, getattr(structure, name).offset, getattr(structure, name).size)
        for name, *_ in structure._fields_
    ]


@pytest.mark.parametrize(("ours", "theirs"), LAYOUTS, ids=[name for _, name in LAYOUTS])
def test_pynvml_lays_out_each_structure_as_nvml_h_does(ours: type[ctypes.Structure], theirs: str) -> None:
    structure = getattr(pynvml, theirs)
    assert ctypes.sizeof(structure) == ctypes.sizeof(ours)
    assert _layout(structure) == _layout(ours)


def test_struct_versions_are_nvml_h_s() -> None:
    assert struct_version(nvmlabi.GpuInstanceProfileInfoV2, 2) == pynvml.nvmlGpuInstanceProfileInfo_v2
    assert struct_version(nvmlabi.ComputeInstanceProfileInfoV2, 2) == pynvml.nvmlComputeInstanceProfileInfo_v2
    assert struct_version(nvmlabi.AddressingMode, 1) == pynvml.nvmlDeviceAddressingMode_v1


def _standin(profile: str = "h100x8", **options: object) -> NvmlStandIn:
    return NvmlStandIn(FakeGpuLibrary(load_profile(profile), NODE), **options)  # type: ignore[arg-type]


#: The stand-in each NvmlLibrary of these tests is over.
_BEHIND: dict[int, NvmlStandIn] = {}


def _over(standin: NvmlStandIn) -> NvmlLibrary:
    lib = over(standin)
    _BEHIND[id(lib)] = standin
    return lib


@pytest.fixture
def adapter() -> Iterator[Callable[..., NvmlLibrary]]:
    """NvmlLibrary over a stand-in made with these options, initialised; shut down after the test."""
    made: list[NvmlLibrary] = []

    def make(profile: str = "h100x8", **options: object) -> NvmlLibrary:
        lib = _over(_standin(profile, **options))
        lib.init()
        made.append(lib)
        return lib

    yield make
    for lib in made:
        lib.shutdown()
        assert _standin_of(lib).faults == []


def _standin_of(lib: NvmlLibrary) -> NvmlStandIn:
    return _BEHIND[id(lib)]


def _gpu0(standin: NvmlStandIn) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    assert standin.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == nvmlabi.SUCCESS
    return handle


def test_every_call_before_init_and_after_shutdown_is_uninitialized() -> None:
    standin = _standin()
    count = ctypes.c_uint()
    assert standin.nvmlDeviceGetCount_v2(ctypes.byref(count)) == nvmlabi.ERROR_UNINITIALIZED
    assert standin.nvmlInitWithFlags(0) == nvmlabi.SUCCESS
    assert standin.nvmlDeviceGetCount_v2(ctypes.byref(count)) == nvmlabi.SUCCESS
    assert count.value == 8
    assert standin.nvmlShutdown() == nvmlabi.SUCCESS
    assert standin.nvmlDeviceGetCount_v2(ctypes.byref(count)) == nvmlabi.ERROR_UNINITIALIZED


def test_null_pointers_and_unknown_handles_are_invalid_arguments() -> None:
    standin = _standin()
    standin.nvmlInitWithFlags(0)
    assert standin.nvmlDeviceGetCount_v2(None) == ERROR_INVALID_ARGUMENT
    brand = ctypes.c_uint()
    assert standin.nvmlDeviceGetBrand(ctypes.c_void_p(0xDEAD0), ctypes.byref(brand)) == ERROR_INVALID_ARGUMENT
    event_set = ctypes.c_void_p()
    assert standin.nvmlEventSetCreate(ctypes.byref(event_set)) == nvmlabi.SUCCESS
    # A handle of another kind is no GPU.
    assert standin.nvmlDeviceGetBrand(event_set, ctypes.byref(brand)) == ERROR_INVALID_ARGUMENT


def test_a_versioned_structure_without_its_version_is_refused() -> None:
    standin = _standin("h100x8-dynamic-mig")
    standin.nvmlInitWithFlags(0)
    info = nvmlabi.GpuInstanceProfileInfoV2()
    gpu = _gpu0(standin)
    assert (
        standin.nvmlDeviceGetGpuInstanceProfileInfoV(gpu, 0, ctypes.byref(info))
        == ERROR_ARGUMENT_VERSION_MISMATCH
    )
    info.version = struct_version(nvmlabi.GpuInstanceProfileInfoV2, 2)
    assert standin.nvmlDeviceGetGpuInstanceProfileInfoV(gpu, 0, ctypes.byref(info)) == nvmlabi.SUCCESS
    assert (info.id, info.sliceCount, info.name) == (19, 1, b"MIG 1g.10gb")


def test_a_string_longer_than_the_buffer_is_insufficient_size() -> None:
    standin = _standin()
    standin.nvmlInitWithFlags(0)
    small = ctypes.create_string_buffer(10)
    assert standin.nvmlDeviceGetName(_gpu0(standin), small, 10) == nvmlabi.ERROR_INSUFFICIENT_SIZE
    assert standin.nvmlSystemGetDriverVersion(small, 9) == nvmlabi.ERROR_INSUFFICIENT_SIZE
    assert standin.nvmlSystemGetDriverVersion(small, 10) == nvmlabi.SUCCESS
    assert small.value == b"550.54.15"


def test_a_function_the_driver_lacks_is_function_not_found(adapter: Callable[..., NvmlLibrary]) -> None:
    lib = adapter(lacks={"nvmlDeviceGetAddressingMode"})
    with pytest.raises(GpuLibraryError) as err:
        lib.addressing_mode(lib.device_by_index(0))
    assert err.value.code == ERROR_FUNCTION_NOT_FOUND
    # Discovery publishes no addressing mode rather than failing the GPU.
    assert [g.addressing_mode for g in discover(lib).gpus] == [None] * 8


def test_errors_name_the_call_and_nvmls_string(adapter: Callable[..., NvmlLibrary]) -> None:
    lib = adapter()
    with pytest.raises(GpuLibraryError) as err:
        lib.mig_attributes(MigHandle(lib.device_by_index(0)))  # a GPU, not a MIG device
    assert (err.value.code, str(err.value)) == (
        ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetAttributes: Not Supported",
    )


def test_a_stand_in_bug_is_an_unknown_error_never_a_success(adapter: Callable[..., NvmlLibrary]) -> None:
    lib = adapter()
    standin = _standin_of(lib)

    def broken(gpu: object) -> int:
        raise RuntimeError("a bug")

    standin.fake.brand = broken  # type: ignore[method-assign]
    with pytest.raises(GpuLibraryError) as err:
        lib.brand(lib.device_by_index(0))
    assert err.value.code == ERROR_UNKNOWN
    assert standin.faults == ["nvmlDeviceGetBrand: RuntimeError('a bug')"]
    standin.faults.clear()  # seen: the fixture checks that no other call failed so


def test_a_mig_mode_change_waits_for_a_gpu_reset_where_the_gpu_needs_one(
    adapter: Callable[..., NvmlLibrary],
) -> None:
    lib = adapter(reset_required={0})
    standin = _standin_of(lib)
    gpu = lib.device_by_index(0)
    lib.set_mig_mode(gpu, 1)
    assert lib.mig_mode(gpu) == (0, 1)
    lib.set_mig_mode(gpu, 0)  # asked back before the reset: nothing pending any more
    assert lib.mig_mode(gpu) == (0, 0)
    configs = parse_mig_configs(
        {
            "version": "v1",
            "mig-configs": {"on": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {}}]},
        },
        "layouts.yaml",
    )
    applied = apply_layout(lib, configs, "on", set(), MigModes())
    assert applied.warnings == [
        "GPU 0 (NVIDIA H100 80GB HBM3): MIG mode on is pending until the GPU is reset "
        "(nvidia-smi -i 0 -r, with no process on it, or a reboot); the layout is applied at the next start "
        "after that, and the GPU is published as it is until then"
    ]
    assert lib.mig_mode(lib.device_by_index(1)) == (1, 1)  # no reset needed there
    standin.reset_gpu(0)
    assert lib.mig_mode(gpu) == (1, 1)
    with pytest.raises(GpuLibraryError) as err:
        lib.set_mig_mode(gpu, 2)
    assert err.value.code == ERROR_INVALID_ARGUMENT


def test_a_mig_device_handle_dies_with_its_instance(adapter: Callable[..., NvmlLibrary]) -> None:
    lib = adapter(profile="h100x8-dynamic-mig")
    gi = dynamic.create_gpu_instance(lib, 0, 9, Placement(0, 4))
    dynamic.create_compute_instance(lib, 0, gi, 3)
    mig = lib.mig_device_by_index(lib.device_by_index(0), 0)
    assert lib.uuid(mig).startswith("MIG-")
    assert (lib.gpu_instance_id(mig), lib.compute_instance_id(mig)) == (gi, 0)
    handle = lib.gpu_instance_by_id(lib.device_by_index(0), gi)
    compute_instance = lib.compute_instances(handle)[0]
    dynamic.destroy(lib, 0, gi)
    # The adapter skips the compute-instance profiles NVML calls invalid (enumerators newer than the
    # driver), so a destroyed GPU instance lists no compute instance rather than failing.
    assert lib.compute_instances(handle) == []
    for stale in (
        lambda: lib.destroy_gpu_instance(handle),
        lambda: lib.compute_instance_info_id(compute_instance),
    ):
        with pytest.raises(GpuLibraryError) as err:
            stale()
        assert err.value.code == ERROR_INVALID_ARGUMENT
    for query in (lib.uuid, lib.gpu_instance_id, lib.mig_attributes):
        with pytest.raises(GpuLibraryError) as err:
            query(mig)
        assert err.value.code == ERROR_INVALID_ARGUMENT
    with pytest.raises(GpuLibraryError) as err:
        lib.gpu_instance_id(MigHandle(lib.device_by_index(0)))  # a GPU has no GPU instance ID
    assert err.value.code == ERROR_INVALID_ARGUMENT


def test_events_come_for_registered_gpus_only_and_name_mig_instances(tmp_path: Path) -> None:
    events = tmp_path / "events"
    fake = FakeGpuLibrary(load_profile("h100x8-mig"), NODE, events_file=events)
    lib = _over(NvmlStandIn(fake))
    lib.init()
    gpu4 = lib.device_by_index(4)
    mig = lib.mig_device_by_index(gpu4, 0)
    lib.watch_xid_events(gpu4)
    other, gpu, mig_uuid = fake.uuid(fake.device_by_index(0)), lib.uuid(gpu4), lib.uuid(mig)
    events.write_text(f"{other} 79\nGPU-unknown 31\n{gpu} 48\n{mig_uuid} 94\n{gpu} 13 2 0\n")
    assert [lib.wait_xid_event(50) for _ in range(4)] == [
        XidEvent(gpu, 48),
        # An error of a MIG device comes as NVML gives it: the GPU, with the instances.
        XidEvent(gpu, 94, lib.gpu_instance_id(mig), lib.compute_instance_id(mig)),
        XidEvent(gpu, 13, 2, 0),
        None,
    ]
    with pytest.raises(GpuLibraryError) as err:
        lib._call("nvmlDeviceRegisterEvents", gpu4, 0x2, lib._event_set)
    assert err.value.code == ERROR_NOT_SUPPORTED
    lib.shutdown()
    assert _standin_of(lib).faults == []


def test_the_time_slice_cannot_be_read_through_nvml(adapter: Callable[..., NvmlLibrary]) -> None:
    lib = adapter()
    with pytest.raises(GpuLibraryError) as err:
        lib.time_slice(lib.device_by_index(0))
    assert err.value.code == ERROR_NOT_SUPPORTED


def test_a_gpu_lost_while_listing_compute_instances_fails(
    adapter: Callable[..., NvmlLibrary],
) -> None:
    lib = adapter("h100x8-dynamic-mig")
    gi = dynamic.create_gpu_instance(lib, 0, 9, Placement(4, 4))
    handle = lib.gpu_instance_by_id(lib.device_by_index(0), gi)
    fake = _standin_of(lib).fake

    def lost(gi: GpuInstanceHandle) -> GpuInstanceInfo:
        raise GpuLibraryError(ERROR_GPU_IS_LOST, "fallen off the bus")

    fake.gpu_instance_info = lost  # type: ignore[method-assign]
    with pytest.raises(GpuLibraryError) as err:
        lib.compute_instances(handle)
    assert err.value.code == ERROR_GPU_IS_LOST


def test_a_second_library_in_the_process_shares_the_first_ones_nvml(tmp_path: Path) -> None:
    # As a daemon re-discovers: a second NvmlLibrary inits and shuts down while the first watches.
    first = _over(_standin("h100x8-mig"))
    first.init()
    gpu = first.device_by_index(4)
    first.watch_xid_events(gpu)
    second = NvmlLibrary(library=first.library)
    second.init()
    assert second.uuid(second.device_by_index(4)) == first.uuid(gpu)
    second.shutdown()
    assert first.uuid(gpu).startswith("GPU-")
    assert first.wait_xid_event(10) is None
    first.shutdown()
    assert pynvml.nvmlLib is None
    assert _standin_of(first).calls["nvmlInitWithFlags"] == 2


def test_what_is_in_use_cannot_be_destroyed_or_switched_off(adapter: Callable[..., NvmlLibrary]) -> None:
    lib = adapter("h100x8-dynamic-mig")
    gi = dynamic.create_gpu_instance(lib, 0, 9, Placement(0, 4))
    dynamic.create_compute_instance(lib, 0, gi, 3)
    gpu = lib.device_by_index(0)
    refusals: list[Callable[[], None]] = [
        lambda: lib.destroy_gpu_instance(lib.gpu_instance_by_id(gpu, gi)),  # it has a compute instance
        lambda: lib.set_mig_mode(gpu, 0),  # the GPU has MIG devices
    ]
    for refused in refusals:
        with pytest.raises(GpuLibraryError) as err:
            refused()
        assert err.value.code == ERROR_IN_USE
    dynamic.destroy(lib, 0, gi)
    lib.set_mig_mode(gpu, 0)
    assert lib.mig_mode(gpu) == (0, 0)
    # MIG mode off: the profile is still described (as on a real H200, driver 580), but nothing is made.
    assert lib.gpu_instance_possible_placements(gpu, 9) == [Placement(0, 4), Placement(4, 4)]
    with pytest.raises(GpuLibraryError) as err:
        dynamic.create_gpu_instance(lib, 0, 9, Placement(0, 4))
    assert err.value.code == ERROR_NOT_SUPPORTED


def test_a_gpu_that_fails_half_way_through_discovery_leaves_no_offer_behind(
    adapter: Callable[..., NvmlLibrary],
) -> None:
    # Its offers are read before its MIG devices, which need the call this driver lacks.
    lib = adapter("h100x8-dynamic-mig", lacks={"nvmlDeviceGetMaxMigDeviceCount"})
    inventory = discover(lib, parse_mig_modes("dynamic"))
    assert (inventory.gpus, inventory.partitions, inventory.instances) == ((), (), ())


def test_nvml_is_shut_down_even_when_freeing_the_event_set_fails() -> None:
    standin = _standin(lacks={"nvmlEventSetFree"})
    lib = _over(standin)
    lib.init()
    lib.watch_xid_events(lib.device_by_index(0))
    with pytest.raises(GpuLibraryError) as err:
        lib.shutdown()
    assert err.value.code == ERROR_FUNCTION_NOT_FOUND
    assert standin.calls["nvmlShutdown"] == 1
    assert pynvml.nvmlLib is None


def _driver_without(name: str, profile: str) -> list[str]:
    """Discovery, a dynamic MIG device and an XID watch on a driver lacking one function; what failed."""
    standin = _standin(profile, lacks={name})
    lib = _over(standin)
    failed: list[str] = []
    try:
        lib.init()
    except GpuLibraryError as err:
        failed.append(str(err))
    else:
        try:
            _use(lib)
        except GpuLibraryError as err:
            failed.append(str(err))
        finally:
            try:
                lib.shutdown()
            except GpuLibraryError as err:
                failed.append(str(err))
    assert standin.faults == []
    assert pynvml.nvmlLib is None  # taken back, whatever failed
    return failed


def _use(lib: NvmlLibrary) -> None:
    inventory = discover(lib, parse_mig_modes("dynamic"))
    parents = {g.uuid for g in inventory.gpus}
    for device in (*inventory.devices, *inventory.partitions, *inventory.instances):
        # Nothing of a GPU left out for an error stays behind.
        assert (device.uuid if isinstance(device, Gpu) else device.parent.uuid) in parents
    held = {i.parent for i in inventory.instances}
    # A dynamic-MIG GPU with MIG off is offered too; instances need it on.
    for gpu in [g for g in inventory.dynamic_gpus if g not in held and g.mig_enabled][:1]:
        gi = dynamic.create_gpu_instance(lib, gpu.index, 9, Placement(0, 4))
        dynamic.find_mig_device(lib, gpu, gi, dynamic.create_compute_instance(lib, gpu.index, gi, 3))
        dynamic.destroy(lib, gpu.index, gi)
    lib.watch_xid_events(lib.device_by_index(0))
    lib.wait_xid_event(1)


@pytest.mark.parametrize("name", sorted(set(_standin()._table()) - {"nvmlShutdown", "nvmlErrorString"}))
@pytest.mark.parametrize("profile", ["h100x8-mig", "h100x8-dynamic-mig"])
def test_a_driver_without_one_function_fails_only_with_nvml_errors(name: str, profile: str) -> None:
    failed = _driver_without(name, profile)
    assert all("Function Not Found" in message for message in failed)


@pytest.mark.anyio
async def test_the_health_monitor_watches_through_the_adapter_and_sees_a_gpu_lost(tmp_path: Path) -> None:
    events = tmp_path / "events"
    standin = NvmlStandIn(FakeGpuLibrary(load_profile("h100x8-mig"), NODE, events_file=events))
    lib = _over(standin)
    lib.init()
    inventory = discover(lib)
    tracker = HealthTracker(inventory)
    monitor = HealthMonitor(lib, tracker, inventory, retry=(0.01, 0.02))
    reported: list[str] = []
    changed = anyio.Event()

    def on_change(names: list[str]) -> None:
        nonlocal changed
        reported.extend(names)
        changed.set()
        changed = anyio.Event()

    assert monitor.start(on_change) == ()
    try:
        mig = next(d for d in inventory.devices if isinstance(d, MigDevice) and d.parent.index == 4)
        events.write_text(f"{inventory.gpus[0].uuid} 79\n{mig.parent.uuid} 94 {mig.gpu_instance_id} 0\n")
        with anyio.fail_after(10):
            while len(reported) < 2:
                await changed.wait()
        standin.lost.add(5)
        with anyio.fail_after(10):
            while not any(name.startswith("gpu-5-") for name in reported):
                await changed.wait()
    finally:
        assert await monitor.stop()
        lib.shutdown()
    assert reported[:2] == ["gpu-0", mig.name]
    assert sorted(reported[2:]) == sorted(d.name for d in inventory.devices if d.name.startswith("gpu-5-"))
    assert standin.faults == []


def test_a_lost_gpu_is_left_out_of_discovery_and_the_others_are_published(
    adapter: Callable[..., NvmlLibrary],
) -> None:
    lib = adapter("h100x8-mig", lost={4})
    inventory = discover(lib)
    assert [g.index for g in inventory.gpus] == [0, 1, 2, 3, 5, 6, 7]
    assert not [d.name for d in inventory.devices if d.name.startswith("gpu-4")]
    with pytest.raises(GpuLibraryError) as err:
        lib.uuid(lib.device_by_index(4))
    assert err.value.code == ERROR_GPU_IS_LOST


def test_the_instances_of_a_gpu_that_is_gone_are_gone(adapter: Callable[..., NvmlLibrary]) -> None:
    lib = adapter("h100x8-dynamic-mig")
    with pytest.raises(GpuLibraryError) as err:
        lib.device_by_index(8)
    assert err.value.code == ERROR_INVALID_ARGUMENT  # nvml.h, for an index past the count
    # A GPU past the count (an inventory older than NVML's GPUs) holds nothing to destroy.
    dynamic.destroy(lib, 8, 1)
