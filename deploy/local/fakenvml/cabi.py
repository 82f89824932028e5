"""Which function answers each name of the fake NVML library: the stand-in's, or a refusal.

The library (loader.c) exports every function of nvml.h as a jump through a slot. install() points
the slots at an NvmlStandIn's C functions: a function the stand-in has answers as the stand-in does,
one it is told the driver lacks answers FUNCTION_NOT_FOUND (what pynvml and go-nvml say for a
missing symbol), and the rest answer NOT_SUPPORTED, each reported once on stderr. serve() is what
the library runs in a process that has its configuration file beside it (fakenvml.conf, written by
fakenvml.node): the fake GPUs it names, their state, refusals and events, through one stand-in.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

from fakenvml.library import SONAME
from fakenvml.standin import NvmlStandIn

#: The stand-in each loaded library answers from: its C functions must live as long as the process may call.
_installed: dict[Path, NvmlStandIn] = {}


def _library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.fakenvml_count.restype = ctypes.c_uint
    lib.fakenvml_name.restype = ctypes.c_char_p
    lib.fakenvml_name.argtypes = (ctypes.c_uint,)
    lib.fakenvml_route.argtypes = (ctypes.c_uint, ctypes.c_void_p)
    lib.fakenvml_set_installed.argtypes = (ctypes.c_int,)
    return lib


def names(path: Path) -> list[str]:
    """Every function the library at `path` exports, in its slots' order."""
    lib = _library(path)
    return [lib.fakenvml_name(i).decode() for i in range(lib.fakenvml_count())]


def install(standin: NvmlStandIn, path: Path) -> None:
    """Make the library at `path` (loaded once per process) answer from `standin` from the next call on."""
    lib = _library(path)
    not_found = ctypes.cast(lib.fakenvml_function_not_found, ctypes.c_void_p).value
    for index in range(lib.fakenvml_count()):
        name = lib.fakenvml_name(index).decode()
        target = not_found if name in standin.lacks else standin.c_address(name)
        lib.fakenvml_route(index, target)
    _installed[path.resolve()] = standin
    lib.fakenvml_set_installed(1)


def serve(conf: str) -> None:
    """Install the stand-in that the configuration file `conf` describes (run by the library itself)."""
    from fakenvml.node import NodeConfig  # the daemon's fakes, imported only where a library serves them

    config = NodeConfig.read(Path(conf))
    standin = NvmlStandIn(
        config.fake_gpus(), lacks=config.lacks, reset_required=config.reset_required, lost=config.lost
    )
    # A stand-in's own bug answers NVML_ERROR_UNKNOWN; a process has no test to check its faults, so say so.
    standin.on_fault = lambda fault: print(f"fakenvml: stand-in fault: {fault}", file=sys.stderr, flush=True)
    install(standin, Path(conf).parent / SONAME)
