"""Node.mig: only a node with a GPU that can do MIG makes and destroys MIG devices (issue 53).

The daemon gives the state its GPU library for that alone (`mig_library`); on a node whose GPUs
cannot do MIG, a prepare, an unprepare and the start-up repair never enter dra.core.migdevices.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import CheckpointStore
from dra.core import migdevices
from dra.core.allocation import AllocatedDevice, ClaimAllocation
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover, supports_mig
from dra.kubeletplugin.daemon import mig_library
from dra.kubeletplugin.state import DeviceState
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
    state = DeviceState(
        DRIVER,
        NODE,
        discover(lib),
        CdiStore(tmp_path / "cdi", DRIVER),
        CheckpointStore(tmp_path / "checkpoint.json"),
        mig_library(lib),
    )
    state.recover()
    gpu = state.inventory.gpus[0].name
    allocation = ClaimAllocation(UID, "team-a", "claim", (AllocatedDevice("gpu", NODE, gpu),))
    assert [d.device for d in state.prepare(allocation).devices] == [gpu]
    assert state.unprepare(UID) is not None
    assert state.prepared == {}


def _entered(name: str) -> object:
    def fail(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"entered dra.core.migdevices.{name} on a node without MIG")

    return fail
