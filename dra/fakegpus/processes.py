"""Processes on the fake GPUs: declared device memory and a duty cycle that may change while they run.

A control file (JSON) declares them; a test or an e2e scenario rewrites it to start, change
and end processes, and every NVML call of the fake reads it again when it changed:

    {"processes": [
        {"pid": 4242, "device": "GPU-...", "memory": 1073741824, "duty": 0.6},
        {"pid": 4243, "device": "MIG-...", "memory": 5368709120, "duty": 0.2}
    ]}

`device` is the UUID of the GPU or MIG device the process has its context on, `memory` the
bytes of device memory it holds, `duty` the fraction of the time it keeps kernels on the SMs
(0 to 1). A process whose device the fake does not have is ignored, as NVML lists no
process of a device it does not have. Tests may also call `set` directly.

What the NVML calls answer follows from that, as NVIDIA's nvml.h describes them:
device memory used is the sum of its processes' memory; device utilisation the sum of its
processes' duties (at most 100 %); a process's SM utilisation its duty, with one sample per
process that used the SMs and NOT_FOUND when none did; GPM's graphics activity the busy
time between two samples over the time between them, integrated from the duties as they
changed (the time a change is noticed counts as the time it happened).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from dra import documents
from dra.gpu.library import ERROR_INVALID_ARGUMENT, GpuLibraryError


@dataclass(frozen=True)
class FakeProcess:
    """A declared process on a fake GPU or MIG device."""

    pid: int
    device: str
    memory: int
    duty: float


def parse_processes(data: object, where: str) -> list[FakeProcess]:
    """The control file's processes; ValueError naming the field that is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("processes", []), list):
        raise ValueError(f'{where}: expected {{"processes": [...]}}')
    found = []
    for index, entry in enumerate(data.get("processes", [])):
        at = f"{where}: processes[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at}: expected an object with pid, device, memory, duty")
        pid, device, memory, duty = (entry.get(k) for k in ("pid", "device", "memory", "duty"))
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise ValueError(f"{at}.pid: expected a positive integer, got {pid!r}")
        if not isinstance(device, str) or not device:
            raise ValueError(f"{at}.device: expected a GPU- or MIG- UUID, got {device!r}")
        if not isinstance(memory, int) or isinstance(memory, bool) or memory < 0:
            raise ValueError(f"{at}.memory: expected bytes (an integer >= 0), got {memory!r}")
        if not isinstance(duty, int | float) or isinstance(duty, bool) or not 0 <= duty <= 1:
            raise ValueError(f"{at}.duty: expected a fraction from 0 to 1, got {duty!r}")
        found.append(FakeProcess(pid, device, memory, float(duty)))
    return found


class FakeProcesses:
    """The processes of the control file (or set by a test), and each device's busy time so far."""

    def __init__(self, control: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self.control = control
        #: Seconds since the epoch (NVML's sample timestamps are CPU time); tests set their own.
        self.clock = clock
        self._lock = threading.Lock()
        self._processes: list[FakeProcess] = []
        self._seen: tuple[int, int] | None = None
        self._since = clock()
        #: Busy seconds by device UUID up to self._since.
        self._busy: dict[str, float] = {}

    def set(self, processes: Iterable[FakeProcess]) -> None:
        """Replace the processes now (the busy time so far is kept)."""
        with self._lock:
            self._advance()
            self._processes = list(processes)

    def current(self) -> list[FakeProcess]:
        """The processes now, the control file read again when it changed."""
        with self._lock:
            self._reload()
            return list(self._processes)

    def busy_seconds(self, devices: Iterable[str]) -> tuple[float, float]:
        """(now, seconds so far that these devices had kernels running, summed over the devices).

        Each device counts at most 1 s per second, however many processes keep it busy.
        """
        wanted = set(devices)
        with self._lock:
            self._reload()
            self._advance()
            return self._since, sum(self._busy.get(d, 0.0) for d in wanted)

    def _advance(self) -> None:
        now = self.clock()
        elapsed = max(now - self._since, 0.0)
        duties: dict[str, float] = {}
        for process in self._processes:
            duties[process.device] = duties.get(process.device, 0.0) + process.duty
        for device, duty in duties.items():
            self._busy[device] = self._busy.get(device, 0.0) + min(duty, 1.0) * elapsed
        self._since = now

    def _reload(self) -> None:
        if self.control is None:
            return
        try:
            stat = self.control.stat()
        except FileNotFoundError:
            seen = None
        else:
            seen = (stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return
        self._advance()
        self._seen = seen
        if seen is None:
            self._processes = []
            return
        try:
            data = documents.load_json(documents.read_file(self.control, "control file"), str(self.control))
            self._processes = parse_processes(data, str(self.control))
        except (OSError, ValueError) as err:
            raise GpuLibraryError(ERROR_INVALID_ARGUMENT, f"fake GPU processes: {err}") from None
