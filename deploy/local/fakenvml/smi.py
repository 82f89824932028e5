"""nvidia-smi on a fake node's host: the GPU settings drivers change, on the fake GPUs' shared state.

`python -m fakenvml.smi CONF ARGS...`, run by the driver root's nvidia-smi for anything but -L.
Both drivers change one setting this way, with the same command line (dra.gpu.nvml and NVIDIA's
plugin, nvlib.go): `compute-policy -i <UUID> --set-timeslice <0-3>`, recorded where the fake GPUs
keep it (FakeGpuLibrary.set_time_slice), so that either driver, and a test, reads the same. NVIDIA's
plugin also sets the compute mode for MPS (`-i <UUID> -c <mode>`), kept in the same state.

nvidia-smi's own words for these are not recorded anywhere this project can read (docs/testing.md
lists what a GPU machine has recorded), so success prints nothing and a failure prints one line
naming what was refused, with exit status 2, as nvidia-smi exits on a bad argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dra.fakegpus.library import FakeGpuLibrary
from dra.fakegpus.node import FAKE_GPU_STATE, write_if_changed
from dra.gpu.library import GpuHandle, GpuLibraryError
from fakenvml.node import NodeConfig

#: nvidia-smi -c's modes, by name and number.
COMPUTE_MODES = {"DEFAULT": 0, "EXCLUSIVE_THREAD": 1, "PROHIBITED": 2, "EXCLUSIVE_PROCESS": 3}


def _gpu(fake: FakeGpuLibrary, wanted: str) -> GpuHandle:
    """The GPU named by index, UUID or PCI bus ID, as nvidia-smi -i takes it."""
    for index in range(fake.device_count()):
        gpu = fake.device_by_index(index)
        if wanted in (str(index), fake.uuid(gpu)) or wanted.lower() in fake.pci_bus_id(gpu).lower():
            return gpu
    raise LookupError(f"No devices were found matching {wanted!r}")


def _compute_mode(config: NodeConfig, fake: FakeGpuLibrary, gpu: GpuHandle, mode: str) -> None:
    level = COMPUTE_MODES.get(mode.upper(), int(mode) if mode.isdigit() else -1)
    if level not in COMPUTE_MODES.values():
        raise ValueError(f"Invalid compute mode {mode!r}")
    path = config.state_dir / FAKE_GPU_STATE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        state = {}
    state.setdefault(fake.uuid(gpu), {})["computeMode"] = level
    write_if_changed(path, (json.dumps(state, indent=2, sort_keys=True) + "\n").encode(), 0o644)


def main(argv: list[str]) -> int:
    """Run one nvidia-smi command line against the fake GPUs of the configuration argv[0]."""
    config = NodeConfig.read(Path(argv[0]))
    parser = argparse.ArgumentParser(prog="nvidia-smi", add_help=False, exit_on_error=False)
    parser.add_argument("command", nargs="?")
    parser.add_argument("-i", "--id", dest="gpu")
    parser.add_argument("--set-timeslice", type=int)
    parser.add_argument("-c", "--compute-mode")
    parser.add_argument("-pm", "--persistence-mode")
    try:
        args, unknown = parser.parse_known_args(argv[1:])
        if unknown:
            raise ValueError(f"not implemented by the fake nvidia-smi: {' '.join(argv[1:])}")
        fake = config.fake_gpus()
        if args.gpu is None:
            raise ValueError("the fake nvidia-smi changes one GPU at a time: -i is needed")
        gpu = _gpu(fake, args.gpu)
        if args.command == "compute-policy" and args.set_timeslice is not None:
            fake.set_time_slice(gpu, args.set_timeslice)
        elif args.command is None and args.compute_mode is not None:
            _compute_mode(config, fake, gpu, args.compute_mode)
        elif args.command is None and args.persistence_mode in ("0", "1"):
            pass  # the fake keeps no persistence mode: a GPU's state outlives its processes anyway
        else:
            raise ValueError(f"not implemented by the fake nvidia-smi: {' '.join(argv[1:])}")
    except (argparse.ArgumentError, GpuLibraryError, LookupError, ValueError) as err:
        print(f"nvidia-smi (fake): {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
