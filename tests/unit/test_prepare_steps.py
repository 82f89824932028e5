"""Prepare, unprepare and start-up repair as steps: the order a program calls them in, and a crash after each.

The first half runs the programs of dra.core.prepare on a runner that only records: which steps, in
which order, with which crash points. The second half runs them on the real state (DeviceState) on
fake GPUs and ends the process before every step in turn, as kill -9 would between two steps (the
in-memory state is thrown away, what is on disk stays); a new instance's start-up repair and the
kubelet's retry must then converge.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra.adapters import nodefiles
from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.metadatastore import MetadataStore
from dra.adapters.nodefiles import CdiStore
from dra.adapters.pcisysfs import PciSysfs
from dra.core import devicemetadata, migdevices, mpsdaemons, vfio
from dra.core import prepare as programs
from dra.core.plan import PreparePlan, decide_prepare
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.fakegpus.sysfs import FakeFunction, FakeSysfs
from dra.gpu import dynamic
from dra.gpu.discovery import discover
from dra.gpu.library import GpuHandle, Placement
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation, ClaimError, OpaqueConfig
from dra.model.devices import Inventory
from dra.model.migmode import parse_mig_modes
from dra.model.node import ClaimRead, Facts, Node
from dra.model.pci import IommuGroup, PciFunction, VfioHost
from dra.model.prepared import PreparedClaim
from tests.unit.helpers import DRIVER, NODE, RecordingRunner

UID = "6b1f7e7c-0d3e-4d4b-9a0e-2f1c3b4a5d6e"
OTHER = "0c2d9e8f-1a2b-4c3d-8e4f-5a6b7c8d9e0f"
WHOLE = "gpu-1"
#: The whole of the GPU that makes MIG devices on demand.
DYNAMIC_WHOLE = "gpu-0"
MIG = "gpu-0-mig-3g40gb-at4"
#: GPU 0 makes MIG devices on demand; the others are given whole.
MODES = "whole,0=dynamic"
NODE_FACTS = Node(DRIVER, NODE, mig=True, checkpoint="checkpoint.json")
#: What the API server answers for a claim that was deleted.
GONE = ClaimRead(None, 404, "not found")


def _lib(root: Path) -> FakeGpuLibrary:
    return FakeGpuLibrary(load_profile("h100x8-dynamic-mig"), NODE, mig_state=root / "fake-gpu-mig.json")


def _inventory(root: Path) -> Inventory:
    return discover(_lib(root), parse_mig_modes(MODES))


def _allocation(device: str, uid: str = UID) -> ClaimAllocation:
    return ClaimAllocation(uid, "default", f"claim-{uid[:4]}", (AllocatedDevice("gpu", NODE, device),))


VFIO_CONFIG = OpaqueConfig(
    "FromClaim",
    (),
    {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "VfioDeviceConfig",
        "iommu": {"enableAPIDevice": True},
    },
)
#: GPU 0's HDMI audio function, in its IOMMU group: passthrough unbinds it with the GPU.
AUDIO = "0000:10:00.1"


def _vfio_allocation(device: str, uid: str = UID) -> ClaimAllocation:
    return replace(_allocation(device, uid), configs=(VFIO_CONFIG,))


def _pci(root: Path) -> FakeSysfs:
    """The node's PCI functions (each GPU in its own IOMMU group, GPU 0 with its audio function)."""
    fake = FakeSysfs(root / "host")
    gpus = [FakeFunction(g.pci_bus_id, group=g.index, class_code="0x030000") for g in _inventory(root).gpus]
    fake.build([*gpus, FakeFunction(AUDIO, group=0, driver="snd_hda_intel", class_code="0x040300")])
    return fake


def _drivers(root: Path) -> dict[str, tuple[str, str]]:
    """(driver, driver_override) of every PCI function."""
    fake = FakeSysfs(root / "host")
    return {
        p.name: (fake.driver_of(p.name), fake.override_of(p.name))
        for p in sorted((fake.sys / "bus/pci/devices").iterdir())
    }


# -- the programs, read as data -----------------------------------------------------------------


def _recorder(answers: Mapping[str, object]) -> RecordingRunner:
    """A recording runner answering each step from `answers` by its method name (None when not there)."""
    return RecordingRunner(lambda name, args: answers.get(name))


Program = Callable[[Any], object]


def _recorded(program: Program, answers: Mapping[str, object]) -> RecordingRunner:
    """Run a program (called with its runner) on a recorder answering from `answers`; the recorder."""
    recorder = _recorder(answers)
    program(recorder)
    return recorder


def _trace(program: Program, answers: Mapping[str, object]) -> list[str]:
    """Run a program against fixed answers; each step as "name" or "name@point"."""
    return _recorded(program, answers).trace()


def _answers(facts: Facts, more: Mapping[str, object] | None = None) -> dict[str, object]:
    fixed: dict[str, object] = {
        "read_state": facts,
        "has_spec": False,
        "missing_host_paths": (),
        "save": 1,
    }
    return {**fixed, **(more or {})}


def test_a_new_claim_is_spec_then_record_then_settings_then_fsync(tmp_path: Path) -> None:
    facts = Facts({}, (), _inventory(tmp_path))
    assert _trace(
        lambda steps: programs.prepare(steps, NODE_FACTS, _allocation(WHOLE), facts), _answers(facts)
    ) == [
        "missing_host_paths",
        "mark@prepare.before-cdi-write",
        "write_spec@prepare.cdi-written",
        "save",
        "log",
        "mark@sharing-before-gpu-settings",
        "sync@prepare.checkpoint-saved",
    ]


def test_a_whole_gpu_claim_runs_no_mig_or_mps_code_on_a_node_that_has_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The plan says what a prepare makes: a GPU outside dynamic MIG, shared by no MPS daemon, has
    # nothing of either, and neither its prepare nor its unprepare enters their programs.
    def entered(*args: object) -> None:
        raise AssertionError("a whole-GPU claim entered MIG or MPS code")

    for name in ("switch_for_claim", "make", "destroy_claim_devices", "claim_parents", "release_mig_mode"):
        monkeypatch.setattr(migdevices, name, entered)
    for name in ("start", "release"):
        monkeypatch.setattr(mpsdaemons, name, entered)
    monkeypatch.setattr(vfio, "release", entered)
    node = replace(NODE_FACTS, mps_root="/run/mps")
    facts = Facts({}, (), _inventory(tmp_path))
    plan = decide_prepare(_allocation(WHOLE), facts.inventory, {}, node, stale={}, has_spec=False)
    assert isinstance(plan, PreparePlan)
    assert (plan.mig_off, plan.mig_on, plan.create, plan.mps, plan.given_back) == ((), (), (), False, [])
    assert "sync@prepare.checkpoint-saved" in _trace(
        lambda steps: programs.prepare(steps, node, _allocation(WHOLE), facts), _answers(facts)
    )
    prepared = {UID: plan.claim}
    assert _trace(
        lambda steps: programs.unprepare(steps, node, UID, replace(facts, prepared=prepared)), _answers(facts)
    ) == [
        "remove_spec@unprepare.spec-removed",
        "mark@sharing-before-unrecord",
        "save@unprepare.checkpoint-saved",
        "log",
    ]


def test_the_whole_of_a_dynamic_mig_gpu_has_its_mig_mode_turned_off_by_the_plan(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path)
    plan = decide_prepare(_allocation(DYNAMIC_WHOLE), inventory, {}, NODE_FACTS, stale={}, has_spec=False)
    assert isinstance(plan, PreparePlan)
    assert [g.name for g in plan.mig_off] == [DYNAMIC_WHOLE]
    assert plan.mig_on == ()
    mig = decide_prepare(_allocation(MIG), inventory, {}, NODE_FACTS, stale={}, has_spec=False)
    assert isinstance(mig, PreparePlan)
    assert ([g.name for g in mig.mig_on], mig.mig_off) == ([DYNAMIC_WHOLE], ())


def test_device_metadata_files_are_written_before_the_spec_that_mounts_them(tmp_path: Path) -> None:
    facts = Facts({}, (), _inventory(tmp_path))
    node = Node(DRIVER, NODE, metadata_root="/plugin/dra-device-metadata", device_metadata=True)
    trace = _trace(lambda steps: programs.prepare(steps, node, _allocation(WHOLE), facts), _answers(facts))
    assert trace[1:4] == [
        "write_metadata@prepare.metadata-written",
        "mark@prepare.before-cdi-write",
        "write_spec@prepare.cdi-written",
    ]


def test_a_failed_metadata_write_refuses_the_claim_and_leaves_nothing(tmp_path: Path) -> None:
    state = _state(tmp_path)
    (tmp_path / "metadata").write_text("not a directory")
    with pytest.raises(ClaimError, match="cannot write the device metadata files of claim"):
        state.prepare(_allocation(WHOLE))
    assert state.prepared == {}
    assert CdiStore(tmp_path / "cdi", DRIVER).claim_uids() == []


def test_a_holder_is_asked_about_without_the_lock_and_released_before_the_spec(tmp_path: Path) -> None:
    prepared = _prepare_and_record(tmp_path, _allocation(WHOLE, OTHER))
    facts = Facts({OTHER: prepared}, (), _inventory(tmp_path))
    trace = _trace(
        lambda steps: programs.prepare(steps, NODE_FACTS, _allocation(WHOLE), facts),
        _answers(facts, {"ask_stale": {OTHER: GONE}}),
    )
    # A new claim's spec is written whether or not one is there: no has_spec.
    assert trace[:3] == ["ask_stale", "read_state", "missing_host_paths"]
    # The holder (prepared with device metadata) loses its files with its spec.
    assert trace[3:7] == [
        "log",
        "remove_spec@prepare.stale-spec-removed",
        "remove_metadata",
        "mark@prepare.before-cdi-write",
    ]


def test_the_api_server_is_asked_about_holders_without_the_lock(tmp_path: Path) -> None:
    state = _state(tmp_path)
    state.prepare(_allocation(WHOLE, OTHER))
    free: list[bool] = []

    def stale(holders: Sequence[PreparedClaim]) -> Mapping[str, ClaimRead]:
        # Another thread's prepare could take the lock now.
        free.append(state._lock.acquire(blocking=False))
        state._lock.release()
        return _gone(holders)

    state.prepare(_allocation(WHOLE), stale)
    assert free == [True]
    assert set(state.prepared) == {UID}


def test_a_mig_device_is_recorded_as_intent_made_in_two_steps_then_recorded_done(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path)
    facts = Facts({}, (), inventory)
    scratch = _state(tmp_path / "scratch")
    scratch.prepare(_allocation(MIG))
    made = scratch.inventory.instances[0]
    answers = _answers(
        facts,
        {
            "read_mig_mode": (1, 1),
            "create_gpu_instance": 2,
            "create_compute_instance": 0,
            "find_mig_device": made,
        },
    )
    assert _trace(lambda steps: programs.prepare(steps, NODE_FACTS, _allocation(MIG), facts), answers)[
        :8
    ] == [
        "read_mig_mode",
        "save@mig-intent-recorded",
        "create_gpu_instance@mig-gpu-instance-created",
        "create_compute_instance@mig-compute-instance-created",
        "find_mig_device",
        "save@mig-recorded",
        "set_inventory",
        "read_state",
    ]


def _mig_mode_off(tmp_path: Path) -> tuple[Facts, dict[str, object]]:
    """A MIG claim's prepare on a dynamic-MIG GPU with MIG off: the facts and the answers it gets."""
    facts = Facts({}, (), _inventory(tmp_path))
    scratch = _state(tmp_path / "scratch")
    scratch.prepare(_allocation(MIG))
    answers = _answers(
        facts,
        {
            "read_mig_mode": (0, 0),
            "set_mig_mode": True,
            "find_mig_device": scratch.inventory.instances[0],
        },
    )
    return facts, answers


def test_mig_device_records_ride_on_the_claims_fsync_and_mig_mode_records_are_fsynced(tmp_path: Path) -> None:
    # Instances do not outlive a reboot or a driver reload; MIG mode does (docs/architecture.md).
    facts, answers = _mig_mode_off(tmp_path)
    done = _recorded(lambda steps: programs.prepare(steps, NODE_FACTS, _allocation(MIG), facts), answers)
    saves = [(kwargs.get("point", ""), kwargs.get("durable", True)) for _, kwargs in done.called("save")]
    synced = [args[0] for args, _ in done.called("sync")]
    assert saves == [
        ("mig-mode-intent-recorded", True),
        ("mig-mode-recorded", True),
        ("mig-intent-recorded", False),
        ("mig-recorded", False),
        ("", False),
    ]
    # The claim's own save is made durable before the kubelet is answered, the lines before it with it.
    assert synced == [1]


def test_mig_mode_is_recorded_as_intent_switched_then_recorded_done_before_any_mig_device(
    tmp_path: Path,
) -> None:
    facts, answers = _mig_mode_off(tmp_path)
    assert _trace(lambda steps: programs.prepare(steps, NODE_FACTS, _allocation(MIG), facts), answers)[
        :5
    ] == [
        "read_mig_mode",
        "save@mig-mode-intent-recorded",
        "set_mig_mode@mig-mode-set",
        "save@mig-mode-recorded",
        "save@mig-intent-recorded",
    ]


def test_the_whole_of_a_dynamic_mig_gpu_gets_leftovers_destroyed_then_mig_mode_off_before_its_spec(
    tmp_path: Path,
) -> None:
    facts = Facts({}, (), _inventory(tmp_path))
    answers = _answers(facts, {"read_mig_mode": (1, 1), "set_mig_mode": True, "list_gpu_instances": ()})
    assert _trace(
        lambda steps: programs.prepare(steps, NODE_FACTS, _allocation(DYNAMIC_WHOLE), facts), answers
    )[:6] == [
        "list_gpu_instances",
        "read_mig_mode",
        "save@mig-mode-intent-recorded",
        "set_mig_mode@mig-mode-set",
        "save@mig-mode-recorded",
        "missing_host_paths",
    ]


@pytest.mark.parametrize(("modes", "switched"), [((0, 1), False), ((0, 0), True)])
def test_a_mig_mode_change_left_pending_is_a_claim_error_and_leaves_no_record(
    tmp_path: Path, modes: tuple[int, int], switched: bool
) -> None:
    facts = Facts({}, (), _inventory(tmp_path))
    recorder = _recorder(_answers(facts, {"read_mig_mode": modes, "set_mig_mode": False}))
    with pytest.raises(ClaimError, match=r"pending until the GPU is reset .* offered as it is, MIG off"):
        programs.prepare(recorder, NODE_FACTS, _allocation(MIG), facts)
    assert not recorder.called("create_gpu_instance")
    saved = [tuple(f"{a.kind}={a.params['mode']}" for a in args[1]) for args, _ in recorder.called("save")]
    # Asked only when no change waits already; its intent goes again.
    assert saved == ([("mig-mode=1",), ()] if switched else [])


def test_a_gpu_passed_through_is_recorded_as_intent_bound_then_recorded_done_before_its_spec(
    tmp_path: Path,
) -> None:
    inventory = _inventory(tmp_path)
    facts = Facts({}, (), inventory)
    gpu = inventory.gpus[0]
    group = IommuGroup(0, (PciFunction(gpu.pci_bus_id, "nvidia"), PciFunction(AUDIO, "snd_hda_intel")))
    answers = _answers(
        facts,
        {
            # MIG mode is off already: the whole of the dynamic-MIG GPU needs no switch.
            "list_gpu_instances": (),
            "read_mig_mode": (0, 0),
            "read_vfio_host": VfioHost(iommu=True, vfio_pci=True),
            "read_iommu_group": group,
        },
    )
    node = replace(NODE_FACTS, vfio=True)
    assert _trace(
        lambda steps: programs.prepare(steps, node, _vfio_allocation(DYNAMIC_WHOLE), facts), answers
    )[:9] == [
        "list_gpu_instances",
        "read_mig_mode",
        "read_vfio_host",
        "read_iommu_group",
        "save@vfio-intent-recorded",
        "restore_pci@vfio-sibling-unbound",
        "bind_vfio@vfio-bound",
        "save@vfio-recorded",
        "missing_host_paths",
    ]


def test_a_refused_claim_changes_nothing(tmp_path: Path) -> None:
    facts = Facts({}, (), _inventory(tmp_path))
    recorder = _recorder({})
    with pytest.raises(ClaimError, match="device gpu-99 does not exist"):
        programs.prepare(recorder, NODE_FACTS, _allocation("gpu-99"), facts)
    assert recorder.calls == []


def test_unprepare_removes_the_spec_undoes_settings_then_drops_the_record(tmp_path: Path) -> None:
    prepared = _prepare_and_record(tmp_path, _allocation(WHOLE))
    facts = Facts({UID: prepared}, (), _inventory(tmp_path))
    node = Node(DRIVER, NODE, mps_root="/run/mps", time_slicing=True)
    assert _trace(lambda steps: programs.unprepare(steps, node, UID, facts), {}) == [
        "remove_spec@unprepare.spec-removed",
        # The claim was prepared with device metadata files: they go once no container can mount them.
        "remove_metadata@unprepare.metadata-removed",
        # No RestoreTimeSlices: the claim sets no time-slice interval (dra.core.sharing decides).
        # No MPS step: the claim uses no MPS daemon (dra.core.mpsdaemons.release decides).
        "mark@sharing-before-unrecord",
        "save@unprepare.checkpoint-saved",
        "log",
    ]
    assert _trace(lambda steps: programs.unprepare(steps, node, OTHER, facts), {}) == ["remove_spec"]


def _prepare_and_record(root: Path, allocation: ClaimAllocation) -> PreparedClaim:
    """The record a prepare on a scratch node gives the claim."""
    return _state(root / "scratch").prepare(allocation)


# -- a crash after every step --------------------------------------------------------------------


class _Killed(BaseException):
    """The process ended between two steps (BaseException: no program or executor handles it)."""


def _state(root: Path) -> DeviceState:
    lib = _lib(root)
    pci = _pci(root)
    return DeviceState(
        DRIVER,
        NODE,
        # The VFIO group nodes are under the fake host's /dev.
        replace(discover(lib, parse_mig_modes(MODES)), dev_root=str(pci.root)),
        CdiStore(root / "cdi", DRIVER),
        CheckpointStore(root / "checkpoint.json"),
        lib,
        pci=PciSysfs(pci.root, write=pci.write),
        vfio=True,
        metadata=MetadataStore(root / "metadata"),
        device_metadata=True,
    )


def _killed_after(count: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """End the process (as far as the state knows) before the step after its `count`-th; the steps
    that ran, by their runner's method. Every step runs inside a nodefiles.Step, entered first."""
    ran: list[str] = []

    def once_more(self: nodefiles.Step) -> None:
        if len(ran) == count:
            raise _Killed
        ran.append(sys._getframe(1).f_code.co_name)

    monkeypatch.setattr(nodefiles.Step, "__enter__", once_more)
    return ran


def _gone(holders: Sequence[PreparedClaim]) -> Mapping[str, ClaimRead]:
    return {h.uid: GONE for h in holders}


def _instances(root: Path) -> list[tuple[int, str, int, int]]:
    return [
        (gpu, i.profile, i.start, i.size)
        for gpu, found in sorted(_lib(root).instances().items())
        for i in found
    ]


def _metadata(root: Path) -> set[str]:
    """Every file under the metadata root (temporary ones too), relative to it."""
    base = root / "metadata"
    return {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()} if base.is_dir() else set()


#: (name, what happens before, the call that is killed, the device it prepares or "" for an unprepare)
Scenario = tuple[str, Callable[[DeviceState], object], Callable[[DeviceState], object], str]

SCENARIOS: list[Scenario] = [
    ("prepare a whole GPU", lambda s: None, lambda s: s.prepare(_allocation(WHOLE)), WHOLE),
    ("prepare a dynamic MIG device", lambda s: None, lambda s: s.prepare(_allocation(MIG)), MIG),
    (
        "prepare over a stale holder",
        lambda s: s.prepare(_allocation(WHOLE, OTHER)),
        lambda s: s.prepare(_allocation(WHOLE), _gone),
        WHOLE,
    ),
    (
        "prepare the whole of a dynamic-MIG GPU in MIG mode",
        lambda s: None,
        lambda s: s.prepare(_allocation(DYNAMIC_WHOLE)),
        DYNAMIC_WHOLE,
    ),
    (
        "prepare a dynamic MIG device with MIG mode off",
        lambda s: (s.prepare(_allocation(DYNAMIC_WHOLE, OTHER)), s.unprepare(OTHER)),
        lambda s: s.prepare(_allocation(MIG)),
        MIG,
    ),
    ("unprepare a whole GPU", lambda s: s.prepare(_allocation(WHOLE)), lambda s: s.unprepare(UID), ""),
    (
        "unprepare the whole of a dynamic-MIG GPU",
        lambda s: s.prepare(_allocation(DYNAMIC_WHOLE)),
        lambda s: s.unprepare(UID),
        "",
    ),
    ("unprepare a dynamic MIG device", lambda s: s.prepare(_allocation(MIG)), lambda s: s.unprepare(UID), ""),
    (
        "pass a GPU through (MIG mode off, audio unbound, vfio-pci)",
        lambda s: None,
        lambda s: s.prepare(_vfio_allocation(DYNAMIC_WHOLE)),
        DYNAMIC_WHOLE,
    ),
    (
        "pass a GPU through over a stale holder that passed it through",
        lambda s: s.prepare(_vfio_allocation(DYNAMIC_WHOLE, OTHER)),
        lambda s: s.prepare(_vfio_allocation(DYNAMIC_WHOLE), _gone),
        DYNAMIC_WHOLE,
    ),
    (
        "give a GPU passed through back",
        lambda s: s.prepare(_vfio_allocation(DYNAMIC_WHOLE)),
        lambda s: s.unprepare(UID),
        "",
    ),
]


def _step_count(root: Path, scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> int:
    _, before, call, _ = scenario
    state = _state(root)
    before(state)
    with monkeypatch.context() as patch:
        ran = _killed_after(10**6, patch)
        call(state)
    return len(ran)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_a_crash_after_any_step_is_repaired_and_the_retry_converges(
    tmp_path: Path, scenario: Scenario, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, before, call, device = scenario
    total = _step_count(tmp_path / "count", scenario, monkeypatch)
    assert total > 3
    _pci(tmp_path / "untouched")
    untouched = _drivers(tmp_path / "untouched")
    for count in range(total):
        root = tmp_path / str(count)
        before(_state(root))
        with monkeypatch.context() as patch:
            crashing = _state(root)
            ran = _killed_after(count, patch)
            with pytest.raises(_Killed):
                call(crashing)
        assert len(ran) == count
        restarted = _state(root)
        restarted.recover()
        claim = call(restarted)
        cdi = CdiStore(root / "cdi", DRIVER)
        if device:
            assert isinstance(claim, PreparedClaim), ran
            assert set(restarted.prepared) == {UID}, ran
            assert cdi.claim_uids() == [UID], ran
            assert _metadata(root) == {f"default_claim-{UID[:4]}/gpu/{devicemetadata.HOST_FILE}"}, ran
            assert _instances(root) == ([(0, "3g.40gb", 4, 4)] if device == MIG else []), ran
            # CUDA sees the whole GPU only with MIG off; MIG devices need it on.
            if device in (MIG, DYNAMIC_WHOLE):
                assert _lib(root).mig_mode(GpuHandle(0)) == ((1, 1) if device == MIG else (0, 0)), ran
            if claim.devices[0].vfio_group >= 0:
                gpu = restarted.inventory.gpus[0].pci_bus_id
                bound = {**untouched, gpu: ("vfio-pci", "vfio-pci"), AUDIO: ("", "")}
                assert _drivers(root) == bound, ran
                assert FakeSysfs(root / "host").group_node(0).exists(), ran
            # Held: no second claim gets it.
            with pytest.raises(ClaimError):
                restarted.prepare(_allocation(device, uid="ffffffff-0000-4000-8000-000000000000"))
            restarted.unprepare(UID)
        assert restarted.prepared == {}, ran
        assert restarted.actions == [], ran
        assert cdi.claim_uids() == [], ran
        assert _metadata(root) == set(), ran
        assert _instances(root) == [], ran
        assert _drivers(root) == {**untouched, AUDIO: ("snd_hda_intel", "")}, ran
        # What a fresh start reads from disk agrees.
        assert CheckpointStore(root / "checkpoint.json").load() == {}, ran


def test_a_crash_inside_the_start_up_repair_is_repaired_by_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crashed_node(root: Path) -> None:
        """A prepared MIG claim, a spec no claim records and a MIG instance no claim holds."""
        state = _state(root)
        state.prepare(_allocation(MIG))
        CdiStore(root / "cdi", DRIVER).write(OTHER, {"cdiVersion": "0.6.0", "kind": "x/y", "devices": []})
        # 1g.10gb (H100 profile ID 19) at memory slice 0, as if made by hand.
        dynamic.create_gpu_instance(_lib(root), 0, 19, Placement(0, 1))

    crashed_node(tmp_path / "count")
    total = _step_count(
        tmp_path / "count", ("recover", lambda s: None, lambda s: s.recover(), ""), monkeypatch
    )
    for count in range(total):
        root = tmp_path / str(count)
        crashed_node(root)
        with monkeypatch.context() as patch:
            _killed_after(count, patch)
            with pytest.raises(_Killed):
                _state(root).recover()
        restarted = _state(root)
        restarted.recover()
        assert set(restarted.prepared) == {UID}, count
        assert CdiStore(root / "cdi", DRIVER).claim_uids() == [UID], count
        assert _instances(root) == [(0, "3g.40gb", 4, 4)], count
