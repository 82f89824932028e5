"""Benchmark: what sharing adds to NodePrepareResources and NodeUnprepareResources on one node.

    PYTHONPATH=deploy/local .venv/bin/python -m tests.bench.bench_sharing [--runs 20]

Prepare then unprepare one claim on gpu-0 of fake h100x8, through DeviceState (checkpoint,
CDI spec and GPU settings on disk, fsyncs included; no gRPC), for: an exclusive GPU, a
time-slice interval (set on the fake GPU, restored after), MPS (the fake control daemon
started in a mount namespace of its own, configured, quit and its directories removed), a
consumable share, and an MPS share that joins the daemon another share's claim keeps running
(nothing started or stopped). Prints the median and the slowest run; asserts nothing about
speed. Needs root for the daemons' mount namespaces.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.mps import MpsDaemons
from dra.kubeletplugin.state import DeviceState
from dra.kubeletplugin.timeslice import TimeSlicer
from dra.model.allocation import AllocatedDevice, ClaimAllocation, OpaqueConfig

DRIVER = "gpu.nvidia.com"
NODE = "bench-node"


def _config(sharing: dict[str, Any]) -> tuple[OpaqueConfig, ...]:
    parameters = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}
    return (OpaqueConfig("FromClaim", (), parameters),)


MPS = _config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}})
SHARE = "11111111-0000-4000-8000-000000000001"
#: name -> (configs, share ID, whether another share's claim keeps an MPS daemon on the GPU)
CASES: dict[str, tuple[tuple[OpaqueConfig, ...], str, bool]] = {
    "exclusive": ((), "", False),
    "time-slice Long": (
        _config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
        "",
        False,
    ),
    "MPS (fake daemon)": (MPS, "", False),
    "share of 20Gi": ((), SHARE, False),
    "MPS share, joins": (MPS, SHARE, True),
}


def _allocation(uid: str, name: str, configs: tuple[OpaqueConfig, ...], share: str) -> ClaimAllocation:
    consumed = (("memory", "20Gi"),) if share else ()
    device = AllocatedDevice("gpu", NODE, "gpu-0", share_id=share, consumed_capacity=consumed)
    return ClaimAllocation(uid, "bench", name, (device,), configs)


def _run(
    root: Path, configs: tuple[OpaqueConfig, ...], share: str, joins: bool, runs: int
) -> tuple[list[float], list[float]]:
    lib = FakeGpuLibrary(load_profile("h100x8"), NODE, state_file=root / "fake-gpu-state.json")
    state = DeviceState(
        DRIVER,
        NODE,
        discover(lib),
        CdiStore(root / "cdi", DRIVER),
        CheckpointStore(root / "checkpoint.json"),
        time_slicer=TimeSlicer(lib),
        mps=MpsDaemons(root / "mps", [sys.executable, "-m", "dra.fakegpus.mpscontrol"]),
    )
    holder = "bbbbbbbb-0000-4000-8000-000000000000"
    if joins:
        state.prepare(_allocation(holder, "holder", configs, "22222222-0000-4000-8000-000000000002"))
    prepare, unprepare = [], []
    for i in range(runs):
        uid = f"aaaaaaaa-0000-4000-8000-{i:012d}"
        allocation = _allocation(uid, f"claim-{i}", configs, share)
        start = time.perf_counter()
        state.prepare(allocation)
        prepare.append(time.perf_counter() - start)
        start = time.perf_counter()
        state.unprepare(uid)
        unprepare.append(time.perf_counter() - start)
    if joins:
        state.unprepare(holder)
    return prepare, unprepare


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms"


def main() -> None:
    """Run every case and print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {args.runs} runs per case")
    for name, (configs, share, joins) in CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            prepare, unprepare = _run(Path(tmp), configs, share, joins, args.runs)
        print(f"{name:>20}: prepare {_ms(prepare)}; unprepare {_ms(unprepare)}")


if __name__ == "__main__":
    main()
