"""The real NVML adapter (dra.gpu.nvml) over a stand-in, through the fake NVML library, in this process."""

from __future__ import annotations

from pathlib import Path

from dra.gpu.nvml import NvmlLibrary
from fakenvml.cabi import install
from fakenvml.library import ensure_library
from fakenvml.standin import NvmlStandIn


def over(
    standin: NvmlStandIn, sysfs: Path = Path("/sys"), procfs: Path = Path("/proc"), dev: Path = Path("/")
) -> NvmlLibrary:
    """An NvmlLibrary (not initialised) whose NVML is the fake library answering from `standin`.

    The library loaded from the cache is the process's one fake NVML: installing another stand-in
    reroutes it for every NvmlLibrary over it, as a process has one NVML.
    """
    path = ensure_library(log=False)
    install(standin, path)
    return NvmlLibrary(sysfs=sysfs, procfs=procfs, dev=dev, library=path)
