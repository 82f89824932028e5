"""A whole-GPU claim's route (issue 53): no MIG code without a MIG-capable GPU, nor sharing code.

The daemon gives the state its GPU library only where a GPU can do MIG (`mig_library`, Node.mig):
elsewhere a prepare, an unprepare and the start-up repair never enter dra.core.migdevices. And
the plan decides configuration, passthrough and sharing only where the claim asks for them, so
a claim of a whole GPU without configs enters neither dra.core.config, .vfio nor .sharing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.core import config, migdevices, sharing, vfio
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover, supports_mig
from dra.kubeletplugin.daemon import mig_library
from dra.kubeletplugin.state import DeviceState
from dra.kubeletplugin.timeslice import TimeSlicer
from dra.model.allocation import AllocatedDevice, ClaimAllocation
from tests.unit.helpers import DRIVER, NODE

UID = "aaaaaaaa-0000-4000-8000-00000000000a"


@pytest.mark.parametrize(
    ("profile", "mig"), [("mixed", False), ("h100x8", True), ("a100x4-dynamic-mig", True)]
)
def test_the_state_gets_the_gpu_library_only_where_a_gpu_can_do_mig(profile: str, mig: bool) -> None:
    lib = FakeGpuLibrary(load_profile(profile), NODE)
    assert supports_mig(lib) is mig
    assert (mig_library(lib) is lib) is mig


def test_a_node_without_mig_gpus_never_enters_mig_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = FakeGpuLibrary(load_profile("mixed"), NODE)
    for name in ("adopt", "destroy_claim_devices", "switch_for_claim", "make", "release_mig_mode", "recover"):
        if hasattr(migdevices, name):
            monkeypatch.setattr(migdevices, name, _entered(name))
    state = _state(tmp_path, lib)
    state.recover()
    _prepare_and_unprepare_a_whole_gpu(state)
    assert state.prepared == {}


def test_a_whole_gpu_claim_without_configs_enters_no_configuration_passthrough_or_sharing_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = FakeGpuLibrary(load_profile("h100x8"), NODE)
    state = _state(tmp_path, lib, time_slicer=TimeSlicer(lib), vfio=True)
    for module, names in (
        (config, ("problems",)),
        (vfio, ("passthrough", "problems", "bind", "release")),
        (
            sharing,
            ("decide_sharing", "share_env", "mps_edits", "wanted_time_slices", "time_slices_to_restore"),
        ),
    ):
        for name in names:
            monkeypatch.setattr(module, name, _entered(name))
    _prepare_and_unprepare_a_whole_gpu(state)


def _state(tmp_path: Path, lib: FakeGpuLibrary, **options: Any) -> DeviceState:
    """The state as the daemon builds it over `lib` (its GPU library only where a GPU can do MIG)."""
    return DeviceState(
        DRIVER,
        NODE,
        discover(lib),
        CdiStore(tmp_path / "cdi", DRIVER),
        CheckpointStore(tmp_path / "checkpoint.json"),
        mig_library(lib),
        **options,
    )


def _prepare_and_unprepare_a_whole_gpu(state: DeviceState) -> None:
    gpu = state.inventory.gpus[0].name
    allocation = ClaimAllocation(UID, "team-a", "claim", (AllocatedDevice("gpu", NODE, gpu),))
    assert [d.device for d in state.prepare(allocation).devices] == [gpu]
    assert state.unprepare(UID) is not None


def _entered(name: str) -> object:
    def fail(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"entered {name} on a route that needs none")

    return fail
