"""Fuzz target: the files the daemons read at start, from their bytes to the state they hold.

atheris convention: TestOneInput(data) returns for every input, or raises what is a bug. The input
is written, as a disk fault or a bad restore might leave it, as each file of a state directory in
turn: the checkpoint (loaded as the kubelet-plugin loads it), the GPU assignment record, and the
fake GPUs' MIG and settings files. Each must load, or be refused with its own error type in one
line naming the file (CheckpointError, the record's ValueError, GpuLibraryError); a traceback,
a RecursionError or a MemoryError is a bug.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from dra.adapters.assignmentrecord import AssignmentRecord
from dra.adapters.checkpoint import CheckpointError, CheckpointStore
from dra.fakegpus import node
from dra.gpu.library import GpuLibraryError

#: The state directory, its files rewritten for each input.
_STATE = Path(tempfile.mkdtemp(prefix="fuzz-statefiles-"))


def _one_line(err: Exception, names: str = "") -> None:
    message = str(err)
    assert message, repr(err)
    assert "\n" not in message, message
    assert names in message, message


def TestOneInput(data: bytes) -> None:  # noqa: N802 (atheris' name)
    """Read `data` as each file of the state directory the daemons read at start."""
    checkpoint = _STATE / "checkpoint.json"
    checkpoint.write_bytes(data)
    try:
        CheckpointStore(checkpoint).load_state()
    except CheckpointError as err:
        _one_line(err, str(checkpoint))
    checkpoint.unlink(missing_ok=True)  # NVIDIA's with no claim is moved aside: the aside stays
    record = AssignmentRecord(_STATE)
    record.path.write_bytes(data)
    try:
        assert isinstance(record.read(), dict)
    except ValueError as err:
        _one_line(err)
    for name in (node.FAKE_MIG_STATE, node.FAKE_GPU_STATE):
        (_STATE / name).write_bytes(data)
    lib = node.fake_gpu_library("a100x4-mig", "node-a", state_dir=_STATE)
    try:
        lib.init()
        for index in range(lib.device_count()):
            gpu = lib.device_by_index(index)
            lib.max_mig_device_count(gpu)
            lib.time_slice(gpu)
    except GpuLibraryError as err:
        _one_line(err)
    for name in (node.FAKE_MIG_STATE, node.FAKE_GPU_STATE):
        (_STATE / name).unlink()
