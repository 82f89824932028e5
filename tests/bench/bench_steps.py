"""Benchmark: what a program's step costs, and a static MIG layout applied.

    python -m tests.bench.bench_steps [--runs 7] [--steps 40000]

Per step: DeviceState (CDI specs and checkpoint in a temporary directory, the fake h100x8 GPUs)
runs one program of `--steps` steps, has_spec and mark in turn, under its lock: the call of the
runner's method, its step context (a failure's conversion, the crash-point check), with has_spec's
stat of the spec.
The MIG layout: apply_layout on a fresh fake h100x8 (eight GPUs, MIG off) for "sevens" (MIG on and
seven 1g.10gb on each GPU), the same again (nothing to change), then "mixed" (each GPU's instances
destroyed and four others made). Prints the fastest of --runs runs of each; asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from dra.adapters.checkpoint import CheckpointStore
from dra.adapters.nodefiles import CdiStore
from dra.core.migconfig import MigConfigs, parse_mig_configs
from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.profiles import load_profile
from dra.gpu.discovery import discover
from dra.kubeletplugin.miglayout import apply_layout
from dra.kubeletplugin.state import CallSteps, DeviceState
from dra.model.migmode import MigModes

DRIVER, NODE = "gpu.nvidia.com", "bench-node"
UID = "6b1f7e7c-0d3e-4d4b-9a0e-2f1c3b4a5d6e"
LAYOUTS = {
    "version": "v1",
    "mig-configs": {
        "sevens": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
        "mixed": [
            {"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}
        ],
    },
}


def _lib(root: Path) -> FakeGpuLibrary:
    return FakeGpuLibrary(load_profile("h100x8"), NODE, mig_state=root / "fake-gpu-mig.json")


def _program(steps: CallSteps, count: int) -> None:
    for _ in range(count // 2):
        steps.has_spec(UID)
        steps.mark("")


def per_step(count: int) -> float:
    """Microseconds per step of one program of `count` steps."""
    with tempfile.TemporaryDirectory(prefix="dra-gpu-bench-") as tmp:
        root = Path(tmp)
        state = DeviceState(
            DRIVER,
            NODE,
            discover(_lib(root)),
            CdiStore(root / "cdi", DRIVER),
            CheckpointStore(root / "checkpoint.json"),
        )
        started = time.perf_counter()
        state._run(lambda steps, facts: _program(steps, count))
        return (time.perf_counter() - started) / count * 1e6


def layouts(configs: MigConfigs) -> tuple[float, float, float]:
    """Milliseconds of apply_layout on fresh fake GPUs: sevens, sevens again, mixed."""
    with tempfile.TemporaryDirectory(prefix="dra-gpu-bench-") as tmp:
        root = Path(tmp)
        times = []
        for name in ("sevens", "sevens", "mixed"):
            started = time.perf_counter()
            apply_layout(_lib(root), configs, name, set(), MigModes())
            times.append((time.perf_counter() - started) * 1e3)
        return times[0], times[1], times[2]


def main() -> None:
    """Run the benchmark; print the fastest run of each figure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40000)
    args = parser.parse_args()
    step = min(per_step(args.steps) for _ in range(args.runs))
    print(f"a step: {step:.2f} us (fastest of {args.runs} runs of {args.steps} steps)")
    configs = parse_mig_configs(LAYOUTS, "bench")
    runs = [layouts(configs) for _ in range(args.runs)]
    first, again, other = (min(r[i] for r in runs) for i in range(3))
    print(
        f"apply_layout on 8 fake H100s: sevens {first:.1f} ms, again {again:.1f} ms, "
        f"then mixed {other:.1f} ms (fastest of {args.runs} runs)"
    )


if __name__ == "__main__":
    main()
