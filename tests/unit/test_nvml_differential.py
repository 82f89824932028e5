"""The real adapter over the fake NVML library against the fake alone: the same scenarios, the same answers.

For every built-in profile, each scenario runs twice from the same start: on
FakeGpuLibrary directly, and on NvmlLibrary (dra.gpu.nvml, through pynvml's
own wrappers) over the fake NVML library answering from an NvmlStandIn of
an identical fake. Inventories, slices,
the MIG devices made and the NVML codes of every refusal must be identical;
a difference is a bug in the adapter, in the stand-in or in the fake.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fakenvml.adapter import over
from fakenvml.host import host_tree
from fakenvml.standin import NvmlStandIn

from dra.core.migconfig import parse_mig_configs
from dra.core.slices import build_slices
from dra.core.taints import Effect
from dra.daemon.health import HealthTracker
from dra.fakegpus import mig as fakemig
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.processes import FakeProcess
from dra.fakegpus.profiles import BUILTIN_PROFILES, load_profile
from dra.gpu import dynamic
from dra.gpu.discovery import discover, mig_handles, profile_infos
from dra.gpu.library import (
    GpuHandle,
    GpuInstanceProfileInfo,
    GpuLibrary,
    GpuLibraryError,
    MigHandle,
    Placement,
)
from dra.gpu.nvml import NvmlLibrary
from dra.kubeletplugin.miglayout import MigLayoutError, apply_layout
from dra.model.devices import MigDevice
from dra.model.migmode import MigModes, parse_mig_modes
from tests.unit.helpers import DRIVER, NODE

PROFILES = sorted(BUILTIN_PROFILES)


class Serials:
    """The fake's clock for MIG device serials, restarted before each side runs a scenario."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """From 1 again."""
        self._next = itertools.count(1)

    def time_ns(self) -> int:
        """The next serial."""
        return next(self._next)


@dataclass
class Pair:
    """The fake alone and the adapter over a stand-in of an identical fake."""

    fake: FakeGpuLibrary
    nvml: NvmlLibrary
    standin: NvmlStandIn
    modes: MigModes
    serials: Serials

    def both(self, scenario: Callable[[GpuLibrary], Any]) -> tuple[Any, Any]:
        """The scenario's outcome on each: its value, or the NVML code it failed with."""
        self.serials.restart()
        on_fake = _outcome(scenario, self.fake)
        # MIG device UUIDs carry a creation serial (the clock's nanoseconds): the same on both sides.
        self.serials.restart()
        return on_fake, _outcome(scenario, self.nvml)

    def same(self, scenario: Callable[[GpuLibrary], Any]) -> Any:
        """Run the scenario on both, assert the outcomes are equal, return it."""
        on_fake, on_nvml = self.both(scenario)
        assert on_nvml == on_fake
        assert self.standin.faults == []
        return on_fake


def _outcome(scenario: Callable[[GpuLibrary], Any], lib: GpuLibrary) -> Any:
    try:
        return scenario(lib)
    except GpuLibraryError as err:
        return ("NVML error", err.code)


@pytest.fixture(params=PROFILES)
def pair(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    serials = Serials()
    monkeypatch.setattr(fakemig, "time", serials)
    name = request.param
    profile = load_profile(name)
    (tmp_path / "fake").mkdir()
    (tmp_path / "standin").mkdir()
    fake = FakeGpuLibrary(profile, NODE, events_file=tmp_path / "fake/events")
    behind = FakeGpuLibrary(profile, NODE, events_file=tmp_path / "standin/events")
    standin = NvmlStandIn(behind)
    sysfs, procfs = host_tree(behind, tmp_path / "host")
    nvml = over(standin, sysfs=sysfs, procfs=procfs, dev=tmp_path / "host")
    nvml.init()
    modes = parse_mig_modes("dynamic") if "dynamic" in name else MigModes()
    yield Pair(fake, nvml, standin, modes, serials)
    nvml.shutdown()
    assert standin.faults == []


def test_discovery_and_slices_are_the_same(pair: Pair) -> None:
    def published(lib: GpuLibrary) -> tuple[object, object]:
        inventory = discover(lib, pair.modes)
        return inventory, build_slices(inventory, DRIVER, NODE, None, generation=1)

    inventory, _ = pair.same(published)
    assert inventory.gpus
    # The stand-in was reached through pynvml, not around it.
    assert {"nvmlInitWithFlags", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetPciInfo_v3"} <= set(
        pair.standin.calls
    )


def _gpu_kinds(lib: FakeGpuLibrary) -> list[int]:
    """One GPU of each kind (model and MIG layout) in the profile."""
    seen: dict[object, int] = {}
    for index, gpu in enumerate(lib.profile.gpus):
        seen.setdefault((gpu.model.product_name, gpu.mig), index)
    return sorted(seen.values())


def test_dynamic_mig_at_every_placement_of_every_profile(pair: Pair) -> None:
    tried = 0
    for index in _gpu_kinds(pair.fake):
        infos = pair.same(partial(_profiles, index=index))
        if pair.fake.profile.gpus[index].mig is None:
            continue  # MIG off (its profiles are answered alike) or no MIG: nothing can be made
        assert isinstance(infos, list)
        for info in infos:
            for placement in pair.same(partial(_placements, index=index, profile_id=info.id)):
                pair.same(partial(_make_use_destroy, index=index, info=info, placement=placement))
                tried += 1
    # Every placement of every profile of a MIG-capable GPU with MIG on (7 profiles, 25 placements).
    mig_on = [g for g in pair.fake.profile.gpus if g.mig is not None]
    assert tried == (25 * len({(g.model.product_name, g.mig) for g in mig_on}))


def _profiles(lib: GpuLibrary, index: int) -> list[GpuInstanceProfileInfo]:
    return list(profile_infos(lib, lib.device_by_index(index)))


def _placements(lib: GpuLibrary, index: int, profile_id: int) -> list[Placement]:
    return lib.gpu_instance_possible_placements(lib.device_by_index(index), profile_id)


def _make_use_destroy(
    lib: GpuLibrary, index: int, info: GpuInstanceProfileInfo, placement: Placement
) -> object:
    """Make the instance and its MIG device, try every placement beside it, destroy it; what each said."""
    gi = dynamic.create_gpu_instance(lib, index, info.id, placement)
    ci = dynamic.create_compute_instance(lib, index, gi, info.slice_count)
    inventory = discover(lib, parse_mig_modes("dynamic"))
    parent = next(g for g in inventory.gpus if g.index == index)
    device = dynamic.find_mig_device(lib, parent, gi, ci)
    beside = []
    for other in lib.gpu_instance_possible_placements(lib.device_by_index(index), info.id):
        try:
            made = dynamic.create_gpu_instance(lib, index, info.id, other)
        except GpuLibraryError as err:
            beside.append((other, err.code))
        else:
            beside.append((other, made))
            dynamic.destroy(lib, index, made)
    made_instances = dynamic.instances(lib, index)
    dynamic.destroy(lib, index, gi)
    dynamic.destroy(lib, index, gi)  # gone already: nothing to do
    return gi, ci, device, beside, made_instances, dynamic.instances(lib, index)


def _layouts(lib: FakeGpuLibrary) -> dict[str, Any]:
    """Three layouts of the profile's first two GPUs: all 1g, mixed (one GPU off), one that cannot fit."""
    table = lib.profile.gpus[0].model.mig_table
    if not table:
        refused = [{"devices": [0], "mig-enabled": True, "mig-devices": {}}]
        return {"version": "v1", "mig-configs": {"on": refused}}
    by_slices = {p.slices: p.name for p in sorted(table, key=lambda p: -p.memory_slices)}
    small, two, three, whole = by_slices[1], by_slices[2], by_slices[3], by_slices[7]
    return {
        "version": "v1",
        "mig-configs": {
            "ones": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {small: 7}}],
            "mixed": [
                {"devices": [0], "mig-enabled": True, "mig-devices": {three: 1, two: 1, small: 2}},
                {"devices": [1], "mig-enabled": False},
            ],
            "too-big": [
                {"devices": [0], "mig-enabled": True, "mig-devices": {three: 1}},
                {"devices": [1], "mig-enabled": True, "mig-devices": {whole: 1, small: 1}},
            ],
        },
    }


def test_a_mig_layout_applied_changed_and_rolled_back(pair: Pair) -> None:
    layouts = _layouts(pair.fake)
    configs = parse_mig_configs(layouts, "layouts.yaml")

    def apply(name: str) -> Callable[[GpuLibrary], object]:
        def scenario(lib: GpuLibrary) -> object:
            try:
                applied = apply_layout(lib, configs, name, set(), pair.modes)
            except MigLayoutError as err:
                return "refused", str(err), discover(lib, pair.modes)
            return applied.warnings, applied.uuids, discover(lib, pair.modes)

        return scenario

    for name in layouts["mig-configs"]:
        pair.same(apply(name))


def test_an_xid_taints_a_gpu_and_it_recovers(pair: Pair, tmp_path: Path) -> None:
    inventory = discover(pair.fake, pair.modes)
    gpu = inventory.gpus[-1]
    lines = [f"{gpu.uuid} 79\n", f"{gpu.uuid} 13\n"]
    mig = next((d for d in inventory.devices if isinstance(d, MigDevice) and d.parent == gpu), None)
    if mig is not None:
        lines.append(f"{gpu.uuid} 94 {mig.gpu_instance_id} {mig.compute_instance_id}\n")
    for side in ("fake", "standin"):
        (tmp_path / side / "events").write_text("".join(lines))

    def taint_and_recover(lib: GpuLibrary) -> object:
        clock = [0.0]
        tracker = HealthTracker(discover(lib, pair.modes), clock=lambda: clock[0])
        for index in range(lib.device_count()):
            lib.watch_xid_events(lib.device_by_index(index))
        seen = []
        while (event := lib.wait_xid_event(50)) is not None:
            seen.append((event, tracker.apply(event)))
        tainted = {
            n: (t.key, t.value, t.effect) for n, t in tracker.taints(DRIVER, Effect.NO_SCHEDULE).items()
        }
        clock[0] = 3600.0
        recovered = tracker.recover(60)
        lib.unwatch_xid_events()
        return seen, list(tainted), recovered, tracker.taints(DRIVER, Effect.NO_SCHEDULE)

    seen, tainted, recovered, after = pair.same(taint_and_recover)
    assert [xid for (event, _) in seen for xid in [event.xid]] == [int(line.split()[1]) for line in lines]
    assert tainted
    assert recovered
    assert after == {}


def _ask(method: str, args: tuple[object, ...], lib: GpuLibrary) -> object:
    return getattr(lib, method)(*args)


def _usage(lib: GpuLibrary, clock: list[float]) -> object:
    """Every usage reading of every GPU and MIG device, GPM over ten seconds of the duties."""
    readings: list[object] = []
    clock[0] = 5.0
    for index in range(lib.device_count()):
        gpu = lib.device_by_index(index)
        migs = mig_handles(lib, gpu)
        readings.append((lib.memory_used(gpu), _outcome(partial(_ask, "utilization", (gpu,)), lib)))
        readings.append(sorted(lib.running_processes(gpu), key=lambda p: p.pid))
        readings.append(_outcome(partial(_ask, "process_utilization", (gpu, 0)), lib))
        readings.append([(lib.memory_used(m), lib.running_processes(m)) for m in migs])
        if not lib.gpm_supported(gpu):
            readings.append(_outcome(partial(_ask, "gpm_sample", (gpu, None)), lib))
            continue
        for gi in [None, *(lib.gpu_instance_id(m) for m in migs)]:
            clock[0] = 10.0
            first = lib.gpm_sample(gpu, gi)
            clock[0] = 20.0
            second = lib.gpm_sample(gpu, gi)
            readings.append((gi, round(lib.gpm_graphics_utilization(first, second), 6)))
            lib.gpm_free(first)
            lib.gpm_free(second)
        readings.append(_outcome(partial(_ask, "gpm_sample", (gpu, 99)), lib))
    return readings


def test_usage_readings_are_the_same(pair: Pair) -> None:
    clock = [0.0]
    for lib in (pair.fake, pair.standin.fake):
        lib.processes.clock = lambda: clock[0]
        processes, pid = [], 100
        for index in range(lib.device_count()):
            gpu = lib.device_by_index(index)
            devices: list[GpuHandle | MigHandle] = [gpu, *mig_handles(lib, gpu)]
            for device in devices[:3]:
                duty = (0.2, 0.6, 0.0)[pid % 3]
                processes.append(FakeProcess(pid, lib.uuid(device), pid * 1024 * 1024, duty))
                pid += 1
        lib.processes.set(processes)
    readings = pair.same(lambda lib: _usage(lib, clock))
    assert readings
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in pair.standin.calls
    hopper = any(g.model.architecture >= 9 for g in pair.fake.profile.gpus)
    assert ("nvmlGpmMetricsGet" in pair.standin.calls) == hopper
