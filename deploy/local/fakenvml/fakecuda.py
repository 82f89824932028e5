"""The fake CUDA driver library (fakecuda.c): libcuda.so.1 answering for the GPUs a container was given.

Built with gcc into the cache beside the fake NVML, keyed by its source, in a fraction of a second;
fakecuda.c says what it answers and where each behaviour comes from.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from localcluster.gomodule import BuildError, cache_root

from fakenvml.library import ensure_library

SOURCE = Path(__file__).resolve().parent / "fakecuda.c"
SONAME = "libcuda.so.1"
_GCC = ("gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden")


def ensure_fake_cuda(log: bool = True) -> Path:
    """Build the fake libcuda.so.1 on first use (or when fakecuda.c changed); its path in the cache."""
    source = SOURCE.read_bytes()
    library = cache_root() / "fakecuda" / hashlib.sha256(source).hexdigest()[:12] / SONAME
    if library.is_file():
        return library
    if shutil.which("gcc") is None:
        raise BuildError(f"gcc is needed to build the fake CUDA driver ({SONAME})")
    if log:
        print(f"building the fake CUDA driver into {library.parent}", file=sys.stderr, flush=True)
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        built = Path(tmp) / SONAME
        compiled = subprocess.run(
            [*_GCC, f"-Wl,-soname,{SONAME}", "-o", str(built), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if compiled.returncode != 0:
            raise BuildError(f"gcc failed to build the fake CUDA driver:\n{compiled.stderr}")
        built.replace(library)
    return library


def install_driver_libraries(directory: Path) -> None:
    """The fake driver's libraries, by SONAME, into `directory`: a fake GPU root's libraries/, which the
    daemon copies into its driver root (dra.fakegpus.node), so that containers load ELF objects."""
    directory.mkdir(parents=True, exist_ok=True)
    for built in (ensure_fake_cuda(), ensure_library()):
        staging = directory / f".{built.name}.tmp"
        shutil.copyfile(built, staging)
        staging.replace(directory / built.name)
