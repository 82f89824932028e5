"""Build and cache a CPython other than the machine's, for the tests on the newest Python the image takes.

    python -m localcluster.cpython 3.13.5    # prints the interpreter's path, building it first if needed

deploy/Dockerfile builds the image on any supported Python (its PYTHON_VERSION argument), and the
machine's own interpreter is the oldest of them (3.11); newer ones change defaults the driver
meets (3.13's TLS context refuses certificates without key identifiers). The machines this
project builds on reach Debian's archive but not python.org, so the source is Debian's copy of
the upstream release (the ``orig`` tarball, checked against the SHA-256 Debian's Sources index
gives for it). It is built without profile-guided optimisation (minutes, not half an hour): the
tests need its behaviour, not its speed. The result lives in ``<cache>/cpython/<version>/``; a
``.complete`` file marks a finished build, so a killed build is started again, not used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from localcluster.gomodule import BuildError, cache_root

#: Upstream release -> (URL of Debian's copy of its source, its SHA-256 from trixie's Sources index).
SOURCES: dict[str, tuple[str, str]] = {
    "3.13.5": (
        "http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_3.13.5.orig.tar.xz",
        "93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640",
    ),
}

#: How long the download may take before the build gives up, in seconds.
DOWNLOAD_TIMEOUT = 300
#: What the tests need of the interpreter: CPython's build leaves a module out, and still succeeds,
#: when the machine lacks its library's headers (TLS for pip and the API server, ctypes for NVML).
NEEDED_MODULES = ("ssl", "_hashlib", "ctypes", "zlib")


def _fetch(url: str, sha256: str, into: Path) -> Path:
    """Download `url` into the directory `into` and check its digest; the file's path."""
    path = into / url.rsplit("/", 1)[-1]
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as answer, open(path, "wb") as out:
            while chunk := answer.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except OSError as err:
        raise BuildError(f"cannot download the Python source {url}: {err}") from None
    if digest.hexdigest() != sha256:
        raise BuildError(f"{url}: SHA-256 {digest.hexdigest()}, expected {sha256}")
    return path


def _run(command: list[str], cwd: Path, log: Path) -> None:
    with open(log, "ab") as out:
        done = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise BuildError(f"{' '.join(command)} failed ({done.returncode}); its log ends:\n" + "\n".join(tail))


def ensure_cpython(version: str) -> Path:
    """The path of a python built from `version`'s source, built into the cache on first use."""
    if version not in SOURCES:
        raise BuildError(f"no source is pinned for Python {version}; known: {', '.join(sorted(SOURCES))}")
    prefix = cache_root() / "cpython" / version
    python = prefix / "bin" / f"python{version.rsplit('.', 1)[0]}"
    # A shared libpython, as Debian's and python.org's builds have: the fake NVML starts the interpreter
    # inside processes that have none (NVIDIA's plugin, tests' C programs) by loading it. The rpath
    # lets the interpreter find its library without a library path of its own.
    configure = [
        "./configure",
        f"--prefix={prefix}",
        "--with-ensurepip=install",
        "--enable-shared",
        f"LDFLAGS=-Wl,-rpath,{prefix / 'lib'}",
    ]
    complete = prefix / ".complete"
    # The marker holds the configure line: a build made another way is made again.
    if complete.is_file() and complete.read_text() == " ".join(configure) and python.is_file():
        return python
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True, exist_ok=True)
    url, sha256 = SOURCES[version]
    print(f"building Python {version} from {url} into {prefix} (a few minutes, once)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="dra-gpu-cpython-") as tmp:
        work = Path(tmp)
        with tarfile.open(_fetch(url, sha256, work)) as archive:
            # The bytes are the release's (digest checked); the "data" filter, where this Python has
            # it (3.11.4 and later), refuses members that would land outside `work` all the same.
            if hasattr(tarfile, "data_filter"):
                archive.extractall(work, filter="data")
            else:
                archive.extractall(work)
        source = work / f"Python-{version}"
        log = prefix / "build.log"
        _run(configure, source, log)
        _run(["make", f"-j{os.cpu_count() or 1}"], source, log)
        _run(["make", "install"], source, log)
    if not python.is_file():
        raise BuildError(f"the build of Python {version} left no {python}")
    check = f"import {', '.join(NEEDED_MODULES)}"
    imported = subprocess.run([str(python), "-c", check], capture_output=True, text=True, check=False)
    if imported.returncode != 0:
        raise BuildError(
            f"Python {version} was built without a module the tests need ({imported.stderr.strip()}): "
            f"install the development package of its library (libssl-dev, libffi-dev, zlib1g-dev) and "
            f"run again; {log} says which were left out"
        )
    complete.write_text(" ".join(configure))
    return python


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m localcluster.cpython VERSION")
    try:
        print(ensure_cpython(sys.argv[1]))
    except BuildError as err:
        sys.exit(f"localcluster.cpython: {err}")
