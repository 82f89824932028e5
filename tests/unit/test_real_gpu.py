"""The fake GPUs against a recording of a real one: where they differ, the fake is wrong.

tests/data/real/h200-580/nvml-record.json is what `python -m tests.gpu.record` wrote on a real
NVIDIA H200 (driver 580.159.04, MIG mode off; tests/data/real/README.md). The same recorder runs
here over the fake of that model, directly (FakeGpuLibrary) and through the real adapter over the
NVML stand-in, and every answer that belongs to the model rather than to the machine must match.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import parse_profile
from dra.gpu.library import GpuLibrary
from tests.gpu.record import record
from tests.unit.helpers import NODE, standin_nvml

RECORDING = Path(__file__).parents[1] / "data/real/h200-580/nvml-record.json"

#: Answers of the machine, not of the model: which PCI slot, its NUMA wiring (a VM's: none), the
#: kernel's addressing mode (this VM's kernel has no HMM), the UUID; and the time slice, which the
#: real adapter cannot read while the fake remembers what was set.
MACHINE = {"uuid", "pci_bus_id", "pcie_root", "numa_node", "numa_nodes", "addressing_mode", "path_exists"}
NOT_COMPARED = MACHINE | {"time_slice", "gpm"}

PROFILE = {"driverVersion": "580.159.04", "cudaDriverVersion": "13.0", "gpus": [{"model": "h200-sxm5-141gb"}]}


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads(RECORDING.read_text())
    return recorded


@pytest.fixture(params=["fake", "adapter-over-standin"])
def fake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GpuLibrary]:
    gpus = FakeGpuLibrary(parse_profile(PROFILE, "h200"), NODE, root=tmp_path)
    if request.param == "fake":
        gpus.init()
        yield gpus
        return
    lib = standin_nvml(gpus, tmp_path)
    try:
        yield lib
    finally:
        lib.shutdown()


def _answers(recording: dict[str, Any]) -> dict[str, Any]:
    """The model's answers of a recording, by call."""
    gpu = recording["gpus"][0]
    found = {f"system.{k}": v for k, v in recording["system"].items() if k != "mig_capability_minors"}
    found |= {k: _code_only(v) for k, v in gpu["calls"].items() if k not in NOT_COMPARED}
    for profile, entry in gpu["gpu_instance_profiles"].items():
        found |= {f"profile {profile}.{k}": _code_only(v) for k, v in entry.items()}
    return found


def _code_only(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without the error's message: the adapter's and NVML's words differ, the code may not."""
    return {k: v for k, v in answer.items() if k != "message"}


def test_the_fake_h200_answers_what_a_real_h200_answered(real: dict[str, Any], fake: GpuLibrary) -> None:
    recorded = _answers(real)
    faked = _answers(record(fake))
    differences = {
        call: {"real": answer, "fake": faked.get(call)}
        for call, answer in recorded.items()
        if faked.get(call) != answer
    }
    assert differences == {}


def test_the_recording_is_of_an_idle_h200_without_mig(real: dict[str, Any]) -> None:
    """What the comparison assumes of the machine it was made on."""
    calls = real["gpus"][0]["calls"]
    assert calls["name"]["ok"] == "NVIDIA H200"
    assert calls["mig_mode"]["ok"] == [0, 0]
    assert calls["running_processes"]["ok"] == []
