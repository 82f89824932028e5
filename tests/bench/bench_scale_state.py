"""Benchmark: the device state alone, dynamic-MIG prepare and unprepare with 10 and 1,000 claims held.

    python -m tests.bench.bench_scale_state [--runs 3] [--held 10,1000] [--probes 12]

bench_scale's node without the cluster, the gRPC server or the claim GET: DeviceState over the
fake GPU library (32 whole H100s, 16 in dynamic MIG mode with the common profiles), the
checkpoint on disk and the CDI specs on tmpfs. A tenth of the claims held are 1g.10gb MIG devices
(made, as a prepare makes them), the rest admin-access claims on the whole GPUs; then --probes
fresh 1g.10gb claims are prepared and unprepared one at a time. Each run is a fresh state in a
fresh directory. Prints the median (range) of each figure over the runs and the ratio of the
highest level to the lowest (1.00x is flat); asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import AllocatedDevice, ClaimAllocation
from dra.model.migmode import parse_mig_modes
from tests.bench.bench_compare import cdi_dirs, parse_levels
from tests.bench.bench_scale import MIG_MODE, SHARED_GPUS, _mig_results, _profile, print_levels

DRIVER, NODE = "gpu.nvidia.com", "bench-node"


def _allocation(device: str, admin: bool = False) -> ClaimAllocation:
    return ClaimAllocation(
        str(uuid.uuid4()), "bench", "claim", (AllocatedDevice("gpu", NODE, device, admin_access=admin),)
    )


def run_once(held: int, probes: int) -> tuple[float, float]:
    """A fresh state with `held` claims prepared; the median ms of the probes' prepare and unprepare."""
    with tempfile.TemporaryDirectory(prefix="dra-gpu-bench-") as tmp, cdi_dirs("cdi") as (cdi,):
        root = Path(tmp)
        profile = root / "profile.yaml"
        _profile(profile)
        lib = FakeGpuLibrary(load_profile(str(profile)), NODE, mig_state=root / "fake-gpu-mig.json")
        inventory = discover(lib, parse_mig_modes(MIG_MODE))
        checkpoint = CheckpointStore(root / "checkpoint.json")
        state = DeviceState(DRIVER, NODE, inventory, CdiStore(cdi, DRIVER), checkpoint, lib)
        placements = [r["device"] for r in _mig_results()]
        mig_held = held // 10
        if mig_held + probes > len(placements):
            raise SystemExit(f"{mig_held} MIG devices held and {probes} probes exceed {len(placements)}")
        for device in placements[:mig_held]:
            state.prepare(_allocation(device))
        for n in range(held - mig_held):
            state.prepare(_allocation(f"gpu-{n % SHARED_GPUS}", admin=True))
        prepare, unprepare = [], []
        held_instances = _instance_count(lib)
        for device in placements[mig_held : mig_held + probes]:
            claim = _allocation(device)
            started = time.perf_counter()
            state.prepare(claim)
            prepare.append((time.perf_counter() - started) * 1000)
            # A figure of a prepare that made no MIG device, or an unprepare that left it, times nothing.
            if _instance_count(lib) != held_instances + 1:
                raise RuntimeError(f"preparing {device} did not make its MIG device")
            started = time.perf_counter()
            state.unprepare(claim.uid)
            unprepare.append((time.perf_counter() - started) * 1000)
            if _instance_count(lib) != held_instances:
                raise RuntimeError(f"unpreparing {device} did not destroy its MIG device")
        return statistics.median(prepare), statistics.median(unprepare)


def _instance_count(lib: FakeGpuLibrary) -> int:
    """The GPU instances on the fake GPUs."""
    return sum(len(made) for made in lib.instances().values())


def main() -> None:
    """Time the probes at each level over --runs fresh states; print figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--held", type=parse_levels, default=(10, 1000), help="claims held, e.g. 10,1000")
    parser.add_argument("--probes", type=int, default=12, help="fresh MIG claims timed at each level")
    args = parser.parse_args()
    figures: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.runs):
        # Levels alternate within a run, so that both see the same machine.
        for level in args.held:
            prepare, unprepare = run_once(level, args.probes)
            figures.setdefault(("MIG prepare p50", level), []).append(prepare)
            figures.setdefault(("MIG unprepare p50", level), []).append(unprepare)
    print(f"DeviceState alone, {args.probes} MIG probes per level; median (range) over {args.runs} runs")
    for what in ("MIG prepare p50", "MIG unprepare p50"):
        print_levels(what, "ms", {level: figures[(what, level)] for level in args.held})


if __name__ == "__main__":
    main()
