"""Prepare, unprepare and start-up repair as steps: the order a program yields them, and a crash after each.

The first half reads the programs of dra.core.prepare as data: which steps, in which order, with which
crash points. The second half runs them through the real executor (DeviceState) on fake GPUs and ends
it after every step in turn, as kill -9 would between two steps (the in-memory state is thrown away,
what is on disk stays); a new instance's start-up repair and the kubelet's retry must then converge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.metadatastore import MetadataStore
from dra.adapters.nodefiles import CdiStore
from dra.adapters.pcisysfs import PciSysfs
from dra.core import devicemetadata, gpusteps, migdevices, mpsdaemons, steps, vfio
from dra.core import prepare as programs
from dra.core.plan import PreparePlan, decide_prepare
from dra.core.prepare import NodeRunner
from dra.core.steps import ClaimRead, Step
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.fakegpus.sysfs import FakeFunction, FakeSysfs
from dra.gpu import dynamic
from dra.gpu.discovery import discover
from dra.gpu.library import GpuHandle, Placement
from dra.kubeletplugin.state import CallSteps, DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation, ClaimError, OpaqueConfig
from dra.model.devices import Inventory
from dra.model.migmode import parse_mig_modes
from dra.model.pci import IommuGroup, PciFunction, VfioHost
from dra.model.prepared import PreparedClaim
from tests.unit.helpers import DRIVER, NODE

UID = "6b1f7e7c-0d3e-4d4b-9a0e-2f1c3b4a5d6e"
OTHER = "0c2d9e8f-1a2b-4c3d-8e4f-5a6b7c8d9e0f"
WHOLE = "gpu-1"
#: The whole of the GPU that makes MIG devices on demand.
DYNAMIC_WHOLE = "gpu-0"
MIG = "gpu-0-mig-3g40gb-at4"
#: GPU 0 makes MIG devices on demand; the others are given whole.
MODES = "whole,0=dynamic"
NODE_FACTS = steps.Node(DRIVER, NODE, mig=True, checkpoint="checkpoint.json")
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


def _steps(
    program: programs.Program[object], answers: Mapping[type[Step[NodeRunner]], object]
) -> list[Step[NodeRunner]]:
    """Run a program against fixed answers; the steps it yielded."""
    seen: list[Step[NodeRunner]] = []
    result: object = None
    while True:
        try:
            step = program.send(result)
        except StopIteration:
            return seen
        seen.append(step)
        result = answers.get(type(step))


def _trace(program: programs.Program[object], answers: Mapping[type[Step[NodeRunner]], object]) -> list[str]:
    """Run a program against fixed answers; each step as "Kind" or "Kind@point"."""
    return [
        type(step).__name__ + (f"@{step.point}" if step.point else "") for step in _steps(program, answers)
    ]


def _answers(
    facts: steps.Facts, more: Mapping[type[Step[NodeRunner]], object] | None = None
) -> dict[type[Step[NodeRunner]], object]:
    fixed: dict[type[Step[NodeRunner]], object] = {
        steps.ReadState: facts,
        steps.HasSpec: False,
        steps.MissingHostPaths: (),
        steps.Save: 1,
    }
    return {**fixed, **(more or {})}


def test_a_new_claim_is_spec_then_record_then_settings_then_fsync(tmp_path: Path) -> None:
    facts = steps.Facts({}, (), _inventory(tmp_path))
    program = programs.prepare(NODE_FACTS, _allocation(WHOLE), facts)
    assert _trace(program, _answers(facts)) == [
        "MissingHostPaths",
        "Mark@prepare.before-cdi-write",
        "WriteSpec@prepare.cdi-written",
        "Save",
        "Log",
        "Mark@sharing-before-gpu-settings",
        "Sync@prepare.checkpoint-saved",
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
    facts = steps.Facts({}, (), _inventory(tmp_path))
    plan = decide_prepare(_allocation(WHOLE), facts.inventory, {}, node, stale={}, has_spec=False)
    assert isinstance(plan, PreparePlan)
    assert (plan.mig_off, plan.mig_on, plan.create, plan.mps, plan.given_back) == ((), (), (), False, [])
    assert "Sync@prepare.checkpoint-saved" in _trace(
        programs.prepare(node, _allocation(WHOLE), facts), _answers(facts)
    )
    prepared = {UID: plan.claim}
    assert _trace(programs.unprepare(node, UID, replace(facts, prepared=prepared)), _answers(facts)) == [
        "RemoveSpec@unprepare.spec-removed",
        "Mark@sharing-before-unrecord",
        "Save@unprepare.checkpoint-saved",
        "Log",
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
    facts = steps.Facts({}, (), _inventory(tmp_path))
    node = steps.Node(DRIVER, NODE, metadata_root="/plugin/dra-device-metadata", device_metadata=True)
    trace = _trace(programs.prepare(node, _allocation(WHOLE), facts), _answers(facts))
    assert trace[1:4] == [
        "WriteMetadata@prepare.metadata-written",
        "Mark@prepare.before-cdi-write",
        "WriteSpec@prepare.cdi-written",
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
    facts = steps.Facts({OTHER: prepared}, (), _inventory(tmp_path))
    program = programs.prepare(NODE_FACTS, _allocation(WHOLE), facts)
    trace = _trace(program, _answers(facts, {steps.AskStale: {OTHER: GONE}}))
    # A new claim's spec is written whether or not one is there: no HasSpec.
    assert trace[:3] == ["AskStale", "ReadState", "MissingHostPaths"]
    # The holder (prepared with device metadata) loses its files with its spec.
    assert trace[3:7] == [
        "Log",
        "RemoveSpec@prepare.stale-spec-removed",
        "RemoveMetadata",
        "Mark@prepare.before-cdi-write",
    ]
    assert not steps.AskStale.locked
    assert steps.ReadState.locked


def test_a_mig_device_is_recorded_as_intent_made_in_two_steps_then_recorded_done(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path)
    facts = steps.Facts({}, (), inventory)
    scratch = _state(tmp_path / "scratch")
    scratch.prepare(_allocation(MIG))
    made = scratch.inventory.instances[0]
    answers = _answers(
        facts,
        {
            gpusteps.ReadMigMode: (1, 1),
            gpusteps.CreateGpuInstance: 2,
            gpusteps.CreateComputeInstance: 0,
            gpusteps.FindMigDevice: made,
        },
    )
    assert _trace(programs.prepare(NODE_FACTS, _allocation(MIG), facts), answers)[:8] == [
        "ReadMigMode",
        "Save@mig-intent-recorded",
        "CreateGpuInstance@mig-gpu-instance-created",
        "CreateComputeInstance@mig-compute-instance-created",
        "FindMigDevice",
        "Save@mig-recorded",
        "SetInventory",
        "ReadState",
    ]


def _mig_mode_off(tmp_path: Path) -> tuple[steps.Facts, dict[type[Step[NodeRunner]], object]]:
    """A MIG claim's prepare on a dynamic-MIG GPU with MIG off: the facts and the answers it gets."""
    facts = steps.Facts({}, (), _inventory(tmp_path))
    scratch = _state(tmp_path / "scratch")
    scratch.prepare(_allocation(MIG))
    answers = _answers(
        facts,
        {
            gpusteps.ReadMigMode: (0, 0),
            gpusteps.SetMigMode: True,
            gpusteps.FindMigDevice: scratch.inventory.instances[0],
        },
    )
    return facts, answers


def test_mig_device_records_ride_on_the_claims_fsync_and_mig_mode_records_are_fsynced(tmp_path: Path) -> None:
    # Instances do not outlive a reboot or a driver reload; MIG mode does (docs/architecture.md).
    facts, answers = _mig_mode_off(tmp_path)
    done = _steps(programs.prepare(NODE_FACTS, _allocation(MIG), facts), answers)
    saves = [(step.point, step.durable) for step in done if isinstance(step, steps.Save)]
    synced = [step.ticket for step in done if isinstance(step, steps.Sync)]
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
    assert _trace(programs.prepare(NODE_FACTS, _allocation(MIG), facts), answers)[:5] == [
        "ReadMigMode",
        "Save@mig-mode-intent-recorded",
        "SetMigMode@mig-mode-set",
        "Save@mig-mode-recorded",
        "Save@mig-intent-recorded",
    ]


def test_the_whole_of_a_dynamic_mig_gpu_gets_leftovers_destroyed_then_mig_mode_off_before_its_spec(
    tmp_path: Path,
) -> None:
    facts = steps.Facts({}, (), _inventory(tmp_path))
    answers = _answers(
        facts, {gpusteps.ReadMigMode: (1, 1), gpusteps.SetMigMode: True, gpusteps.ListGpuInstances: ()}
    )
    assert _trace(programs.prepare(NODE_FACTS, _allocation(DYNAMIC_WHOLE), facts), answers)[:6] == [
        "ListGpuInstances",
        "ReadMigMode",
        "Save@mig-mode-intent-recorded",
        "SetMigMode@mig-mode-set",
        "Save@mig-mode-recorded",
        "MissingHostPaths",
    ]


@pytest.mark.parametrize(("modes", "switched"), [((0, 1), False), ((0, 0), True)])
def test_a_mig_mode_change_left_pending_is_a_claim_error_and_leaves_no_record(
    tmp_path: Path, modes: tuple[int, int], switched: bool
) -> None:
    facts = steps.Facts({}, (), _inventory(tmp_path))
    program = programs.prepare(NODE_FACTS, _allocation(MIG), facts)
    answers = _answers(facts, {gpusteps.ReadMigMode: modes, gpusteps.SetMigMode: False})
    saved: list[tuple[str, ...]] = []

    def run() -> None:
        result: object = None
        while True:
            step = program.send(result)
            assert not isinstance(step, gpusteps.CreateGpuInstance)
            if isinstance(step, steps.Save):
                saved.append(tuple(f"{a.kind}={a.params['mode']}" for a in step.actions))
            result = answers.get(type(step))

    with pytest.raises(ClaimError, match=r"pending until the GPU is reset .* offered as it is, MIG off"):
        run()
    # Asked only when no change waits already; its intent goes again.
    assert saved == ([("mig-mode=1",), ()] if switched else [])


def test_a_gpu_passed_through_is_recorded_as_intent_bound_then_recorded_done_before_its_spec(
    tmp_path: Path,
) -> None:
    inventory = _inventory(tmp_path)
    facts = steps.Facts({}, (), inventory)
    gpu = inventory.gpus[0]
    group = IommuGroup(0, (PciFunction(gpu.pci_bus_id, "nvidia"), PciFunction(AUDIO, "snd_hda_intel")))
    answers = _answers(
        facts,
        {
            # MIG mode is off already: the whole of the dynamic-MIG GPU needs no switch.
            gpusteps.ListGpuInstances: (),
            gpusteps.ReadMigMode: (0, 0),
            vfio.ReadVfioHost: VfioHost(iommu=True, vfio_pci=True),
            vfio.ReadIommuGroup: group,
        },
    )
    node = replace(NODE_FACTS, vfio=True)
    assert _trace(programs.prepare(node, _vfio_allocation(DYNAMIC_WHOLE), facts), answers)[:9] == [
        "ListGpuInstances",
        "ReadMigMode",
        "ReadVfioHost",
        "ReadIommuGroup",
        "Save@vfio-intent-recorded",
        "RestorePci@vfio-sibling-unbound",
        "BindVfio@vfio-bound",
        "Save@vfio-recorded",
        "MissingHostPaths",
    ]


def test_a_refused_claim_changes_nothing(tmp_path: Path) -> None:
    facts = steps.Facts({}, (), _inventory(tmp_path))
    program = programs.prepare(NODE_FACTS, _allocation("gpu-99"), facts)
    with pytest.raises(ClaimError, match="device gpu-99 does not exist"):
        next(program)


def test_unprepare_removes_the_spec_undoes_settings_then_drops_the_record(tmp_path: Path) -> None:
    prepared = _prepare_and_record(tmp_path, _allocation(WHOLE))
    facts = steps.Facts({UID: prepared}, (), _inventory(tmp_path))
    node = steps.Node(DRIVER, NODE, mps_root="/run/mps", time_slicing=True)
    assert _trace(programs.unprepare(node, UID, facts), {}) == [
        "RemoveSpec@unprepare.spec-removed",
        # The claim was prepared with device metadata files: they go once no container can mount them.
        "RemoveMetadata@unprepare.metadata-removed",
        # No RestoreTimeSlices: the claim sets no time-slice interval (dra.core.sharing decides).
        # No MPS step: the claim uses no MPS daemon (dra.core.mpsdaemons.release decides).
        "Mark@sharing-before-unrecord",
        "Save@unprepare.checkpoint-saved",
        "Log",
    ]
    assert _trace(programs.unprepare(node, OTHER, facts), {}) == ["RemoveSpec"]


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


def _killed_after(state: DeviceState, count: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the executor end after its `count`-th step; the steps it ran, by kind."""
    ran: list[str] = []
    run = CallSteps._run_step

    def once_more(self: CallSteps, step: Step[CallSteps]) -> object:
        if len(ran) == count:
            raise _Killed
        ran.append(type(step).__name__)
        return run(self, step)

    monkeypatch.setattr(CallSteps, "_run_step", once_more)
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
    ran: list[str] = []
    run = CallSteps._run_step

    def counting(self: CallSteps, step: Step[CallSteps]) -> object:
        ran.append(type(step).__name__)
        return run(self, step)

    with monkeypatch.context() as patch:
        patch.setattr(CallSteps, "_run_step", counting)
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
            ran = _killed_after(_state(root), count, patch)
            crashing = _state(root)
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
            _killed_after(_state(root), count, patch)
            with pytest.raises(_Killed):
                _state(root).recover()
        restarted = _state(root)
        restarted.recover()
        assert set(restarted.prepared) == {UID}, count
        assert CdiStore(root / "cdi", DRIVER).claim_uids() == [UID], count
        assert _instances(root) == [(0, "3g.40gb", 4, 4)], count
