"""The fake CUDA driver library (fakecuda.c): libcuda.so.1 answering for the GPUs a container was given.

Built with gcc into the cache beside the fake NVML, keyed by its source, in a fraction of a second;
fakecuda.c says what it answers and where each behaviour comes from.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from localcluster.gomodule import cache_root

from fakenvml.library import compiled_library, ensure_library

SOURCE = Path(__file__).resolve().parent / "fakecuda.c"
SONAME = "libcuda.so.1"


def ensure_fake_cuda(log: bool = True) -> Path:
    """Build the fake libcuda.so.1 on first use (or when fakecuda.c changed); its path in the cache."""
    source = SOURCE.read_text()
    key = hashlib.sha256(source.encode()).hexdigest()[:12]
    return compiled_library(
        "the fake CUDA driver",
        cache_root() / "fakecuda" / key,
        SONAME,
        source,
        SOURCE.name,
        flags=("-Wextra", "-Werror"),
        log=log,
    )


def install_driver_libraries(directory: Path) -> None:
    """The fake driver's libraries, by SONAME, into `directory`: a fake GPU root's libraries/, which the
    daemon copies into its driver root (dra.fakegpus.node), so that containers load ELF objects."""
    directory.mkdir(parents=True, exist_ok=True)
    for built in (ensure_fake_cuda(), ensure_library()):
        staging = directory / f".{built.name}.tmp"
        shutil.copyfile(built, staging)
        staging.replace(directory / built.name)
