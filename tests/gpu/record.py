"""Record what a GpuLibrary answers, call by call: on a real GPU, the facts the fakes must match.

`python -m tests.gpu.record OUT.json` initialises NVML (dra.gpu.nvml, the real
adapter) and writes, for every GPU, the answer or the NVML return code of
each read the driver makes: the GpuLibrary surface, every GPU-instance
profile and its placements, a GPM sample, an XID event wait. Nothing is
changed on the GPU: no MIG mode, no instance, no time slice.

The same `record` runs over the fake GPUs in tests/unit/test_real_gpu.py,
which compares a recording made on real hardware (tests/data/real/) with the
fake of the same model: where they differ the fake is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.gpu.discovery import discover
from dra.gpu.driverfiles import find_driver_files
from dra.gpu.library import GpuHandle, GpuLibrary, GpuLibraryError
from dra.gpu.nvml import NvmlLibrary
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation
from dra.model.migmode import parse_mig_modes

#: GPU-instance profile enumerators asked about: past the end of every nvml.h so far (0x12 in the 580
#: bindings), so that the recording shows where a driver's range ends and any profile newer than the tables.
PROFILE_IDS = range(20)


def _plain(value: Any) -> Any:
    """JSON for a GpuLibrary answer: dataclasses as objects, tuples as lists, handles as their type."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return f"<{type(value).__name__}>"


def answer(call: Callable[[], Any]) -> dict[str, Any]:
    """{"ok": the answer} or {"error": the NVML code, "message": ...}; other exceptions by type."""
    try:
        return {"ok": _plain(call())}
    except GpuLibraryError as err:
        return {"error": err.code, "message": str(err)}
    except Exception as err:  # a recording keeps going and says what broke
        return {"exception": type(err).__name__, "message": str(err)}


def record_gpu(lib: GpuLibrary, index: int) -> dict[str, Any]:
    """Every read the driver makes of one GPU, without changing it."""
    gpu = lib.device_by_index(index)
    calls: dict[str, Any] = {}
    for name in (
        "name",
        "uuid",
        "brand",
        "architecture",
        "cuda_compute_capability",
        "memory_total",
        "memory_used",
        "pci_bus_id",
        "pci_device_id",
        "minor_number",
        "addressing_mode",
        "numa_node",
        "numa_nodes",
        "mig_mode",
        "max_mig_device_count",
        "utilization",
        "running_processes",
        "gpm_supported",
        "time_slice",
    ):
        calls[name] = answer(lambda name=name: getattr(lib, name)(gpu))  # type: ignore[misc]
    calls["process_utilization"] = answer(lambda: lib.process_utilization(gpu, 0))
    bus_id = calls["pci_bus_id"].get("ok")
    if isinstance(bus_id, str):
        calls["pcie_root"] = answer(lambda: lib.pcie_root(bus_id))
    minor = calls["minor_number"].get("ok")
    if isinstance(minor, int):
        calls["path_exists"] = answer(lambda: lib.path_exists(f"/dev/nvidia{minor}"))
    calls["gpm"] = answer(lambda: gpm_utilization(lib, gpu))
    profiles: dict[str, Any] = {}
    for profile in PROFILE_IDS:
        info = answer(lambda profile=profile: lib.gpu_instance_profile_info(gpu, profile))  # type: ignore[misc]
        entry: dict[str, Any] = {"info": info}
        if "ok" in info:
            pid = info["ok"]["id"]
            entry["placements"] = answer(lambda pid=pid: lib.gpu_instance_possible_placements(gpu, pid))  # type: ignore[misc]
            entry["instances"] = answer(lambda pid=pid: len(lib.gpu_instances(gpu, pid)))  # type: ignore[misc]
        profiles[str(profile)] = entry
    return {"index": index, "calls": calls, "gpu_instance_profiles": profiles}


def gpm_utilization(lib: GpuLibrary, gpu: GpuHandle) -> float:
    """Two GPM samples 100 ms apart and the graphics utilisation between them, as usage reads it."""
    first = lib.gpm_sample(gpu, None)
    try:
        time.sleep(0.1)
        second = lib.gpm_sample(gpu, None)
        try:
            return lib.gpm_graphics_utilization(first, second)
        finally:
            lib.gpm_free(second)
    finally:
        lib.gpm_free(first)


def _xid_wait(lib: GpuLibrary) -> Any:
    """Register every GPU for XID events and wait 100 ms: a healthy GPU answers a timeout (None)."""
    for index in range(lib.device_count()):
        lib.watch_xid_events(lib.device_by_index(index))
    try:
        return lib.wait_xid_event(100)
    finally:
        lib.unwatch_xid_events()


def record(lib: GpuLibrary) -> dict[str, Any]:
    """The whole recording of an initialised library."""
    system = {
        name: answer(getattr(lib, name))
        for name in ("driver_version", "cuda_driver_version", "device_count", "mig_capability_minors")
    }
    count = system["device_count"].get("ok", 0)
    gpus = [record_gpu(lib, index) for index in range(count)]
    system["xid_wait_100ms"] = answer(lambda: _xid_wait(lib))
    timings: dict[str, float] = {}
    for mode in ("static", "dynamic"):
        started = time.perf_counter()
        inventory = discover(lib, parse_mig_modes(mode))
        timings[f"discover_{mode}_ms"] = round((time.perf_counter() - started) * 1000, 2)
        timings[f"discover_{mode}_devices"] = len(list(inventory))
    return {"system": system, "gpus": gpus, "timings": timings}


def record_prepare(lib: GpuLibrary, driver_root: Path) -> dict[str, Any]:
    """Prepare the first GPU for a claim as the kubelet plugin does; its CDI spec and the host paths it lacks.

    A runtime fails a container whose spec names a host path that is not there, so on a real
    node every one of them must exist: the device nodes and the driver's files under driver_root.
    """
    inventory = discover(lib)
    files = find_driver_files(lib.driver_version(), driver_root)
    inventory = dataclasses.replace(inventory, driver_files=files, dev_root="/")
    with tempfile.TemporaryDirectory() as work:
        store = CdiStore(Path(work) / "cdi", "gpu.nvidia.com")
        state = DeviceState(
            "gpu.nvidia.com", "gpu-node", inventory, store, CheckpointStore(Path(work) / "cp.json"), lib
        )
        device = inventory.gpus[0].name
        started = time.perf_counter()
        allocated = (AllocatedDevice("gpu", "gpu-node", device),)
        state.prepare(ClaimAllocation("uid-1", "default", "one", allocated))
        prepare_ms = (time.perf_counter() - started) * 1000
        spec = json.loads(store.path("uid-1").read_text())
        state.unprepare("uid-1")
    return {
        "device": device,
        "driver_files": len(files),
        "prepare_ms": round(prepare_ms, 2),
        "missing_host_paths": store.missing_host_paths(spec),
        "spec": spec,
    }


def main(argv: list[str]) -> int:
    """Record the machine's GPUs through real NVML into argv[0]."""
    if len(argv) != 1:
        print("usage: python -m tests.gpu.record OUT.json", file=sys.stderr)
        return 2
    lib = NvmlLibrary()
    lib.init()
    try:
        recording = record(lib)
        for root in ("/", "/usr/local/nvidia"):
            prepared = answer(lambda root=root: record_prepare(lib, Path(root)))  # type: ignore[misc]
            recording[f"prepare_driver_root_{root}"] = prepared
    finally:
        lib.shutdown()
    Path(argv[0]).write_text(json.dumps(recording, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
