"""Benchmark: what sharing adds to NodePrepareResources and NodeUnprepareResources on one node.

    PYTHONPATH=deploy/local .venv/bin/python -m tests.bench.bench_sharing [--runs 20]

Prepare then unprepare one claim on gpu-0 of fake h100x8, through DeviceState (checkpoint,
CDI spec and GPU settings on disk, fsyncs included; no gRPC), for: an exclusive GPU, a
time-slice interval (set on the fake GPU, restored after), MPS (the fake control daemon
started, configured, quit and its directories removed) and a consumable share. Prints the
median and the slowest run; asserts nothing about speed.
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

from dra.adapters.cdistore import CdiStore
from dra.adapters.checkpoint import CheckpointStore
from dra.core.allocation import AllocatedDevice, ClaimAllocation, OpaqueConfig
from dra.gpu.discovery import discover
from dra.gpu.fake import FakeGpuLibrary
from dra.gpu.profiles import load_profile
from dra.kubeletplugin.mps import MpsDaemons
from dra.kubeletplugin.state import DeviceState
from dra.kubeletplugin.timeslice import TimeSlicer

DRIVER = "gpu.nvidia.com"
NODE = "bench-node"


def _config(sharing: dict[str, Any]) -> tuple[OpaqueConfig, ...]:
    parameters = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}
    return (OpaqueConfig("FromClaim", (), parameters),)


CASES: dict[str, tuple[tuple[OpaqueConfig, ...], str]] = {
    "exclusive": ((), ""),
    "time-slice Long": (_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}), ""),
    "MPS (fake daemon)": (
        _config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}),
        "",
    ),
    "share of 20Gi": ((), "11111111-0000-4000-8000-000000000001"),
}


def _run(
    root: Path, configs: tuple[OpaqueConfig, ...], share: str, runs: int
) -> tuple[list[float], list[float]]:
    lib = FakeGpuLibrary(load_profile("h100x8"), NODE, state_file=root / "fake-gpu-state.json")
    state = DeviceState(
        DRIVER,
        NODE,
        discover(lib),
        CdiStore(root / "cdi", DRIVER),
        CheckpointStore(root / "checkpoint.json"),
        time_slicer=TimeSlicer(lib),
        mps=MpsDaemons(root / "mps", [sys.executable, "-m", "dra.gpu.fakemps"]),
    )
    prepare, unprepare = [], []
    for i in range(runs):
        uid = f"aaaaaaaa-0000-4000-8000-{i:012d}"
        consumed = (("memory", "20Gi"),) if share else ()
        device = AllocatedDevice("gpu", NODE, "gpu-0", share_id=share, consumed_capacity=consumed)
        allocation = ClaimAllocation(uid, "bench", f"claim-{i}", (device,), configs)
        start = time.perf_counter()
        state.prepare(allocation)
        prepare.append(time.perf_counter() - start)
        start = time.perf_counter()
        state.unprepare(uid)
        unprepare.append(time.perf_counter() - start)
    return prepare, unprepare


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms"


def main() -> None:
    """Run every case and print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, {args.runs} runs per case")
    for name, (configs, share) in CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            prepare, unprepare = _run(Path(tmp), configs, share, args.runs)
        print(f"{name:>20}: prepare {_ms(prepare)}; unprepare {_ms(unprepare)}")


if __name__ == "__main__":
    main()
