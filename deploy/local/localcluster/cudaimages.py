"""Workload images of a CUDA program, built here from Debian's packages (no registry): the container a
CUDA workload runs in, for the tests that look at the driver the way such a workload finds it.

Two kinds, as images are made:

- ``debian``: Debian 12's C library and its ``ldconfig`` (libc6, libc-bin), a shell and tools
  (busybox-static), and ``/etc/ld.so.cache`` built by the image's own ldconfig before any driver
  is there, as every CUDA, PyTorch and Ubuntu image is built (the driver comes from the node);
- ``distroless``: the C library alone (libc6): no ldconfig, no ``/etc/ld.so.cache``, no shell.

Both hold ``cudaprobe`` (cudaprobe.c, compiled here against the same C library): it loads
libcuda.so.1 and libnvidia-ml.so.1 by SONAME and lists the CUDA devices. A ``compat`` variant of
either also holds ``/usr/local/cuda/compat/libcuda.so.<version>`` and its ``libcuda.so.1`` link,
as CUDA's cuda-compat package installs its forward-compatibility driver: a copy of the fake CUDA
driver (fakenvml.fakecuda), told apart by its path. The images are OCI tarballs in the cache
(localcluster.images), keyed by their recipe and sources.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from fakenvml.fakecuda import SOURCE as FAKE_CUDA_SOURCE
from fakenvml.fakecuda import ensure_fake_cuda

from localcluster import debs
from localcluster.gomodule import BuildError, cache_root
from localcluster.images import REGISTRY, Image, tree_layer, write_oci_tarball

PROBE_SOURCE = Path(__file__).resolve().parent / "cudaprobe.c"
#: The kinds of image and the Debian packages each is made of.
PACKAGES = {"debian": ("libc6", "libc-bin", "busybox-static"), "distroless": ("libc6",)}
#: Where cudaprobe is in each kind.
PROBE = {"debian": "/usr/local/bin/cudaprobe", "distroless": "/cudaprobe"}
COMPAT_DIR = "usr/local/cuda/compat"
_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_TRIMMED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian")


def cuda_image(kind: str, compat: str | None = None) -> Image:
    """The workload image of `kind` (debian, distroless), with CUDA forward-compatibility libraries of
    driver version `compat` (e.g. 570.86.10) or none; built into the cache on first use (seconds)."""
    if kind not in PACKAGES:
        raise BuildError(f"no CUDA workload image of kind {kind!r} (known: {', '.join(PACKAGES)})")
    recipe = json.dumps([kind, PACKAGES[kind], PROBE[kind], compat, COMPAT_DIR, _PATH, _TRIMMED]).encode()
    digest = hashlib.sha256(recipe + PROBE_SOURCE.read_bytes() + FAKE_CUDA_SOURCE.read_bytes())
    repository = f"cuda-{kind}" + (f"-compat-{compat}" if compat else "")
    name = f"{REGISTRY}/{repository}:{digest.hexdigest()[:12]}"
    tarball = cache_root() / "images" / f"{repository}-{digest.hexdigest()[:12]}.tar"
    if not tarball.is_file():
        with tempfile.TemporaryDirectory(prefix="dra-gpu-cuda-image-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _root_filesystem(rootfs, kind, compat)
            write_oci_tarball(tarball, name, tree_layer(rootfs), {"Env": [_PATH]})
    return Image(name, tarball)


def _root_filesystem(rootfs: Path, kind: str, compat: str | None) -> None:
    debs.unpack(PACKAGES[kind], rootfs, f"the {kind} CUDA workload image")
    for trimmed in _TRIMMED:
        shutil.rmtree(rootfs / trimmed, ignore_errors=True)
    for directory in ("dev", "proc", "sys", "tmp", "etc", "usr/lib/x86_64-linux-gnu", "usr/bin"):
        (rootfs / directory).mkdir(parents=True, exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    probe = rootfs / PROBE[kind].lstrip("/")
    probe.parent.mkdir(parents=True, exist_ok=True)
    _run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(probe), str(PROBE_SOURCE), "-ldl"], "gcc")
    if compat is not None:
        compat_dir = rootfs / COMPAT_DIR
        compat_dir.mkdir(parents=True)
        shutil.copyfile(ensure_fake_cuda(), compat_dir / f"libcuda.so.{compat}")
        (compat_dir / "libcuda.so.1").symlink_to(f"libcuda.so.{compat}")
    if kind == "debian":
        busybox = rootfs / "bin/busybox"
        applets = _run([str(busybox), "--list"], "busybox --list").split()
        for applet in applets:
            link = rootfs / "bin" / applet
            # Debian's own programs (ldconfig) win over busybox's applets of the same name.
            if not link.exists() and not (rootfs / "sbin" / applet).exists():
                link.symlink_to("busybox")
        # The cache a CUDA image is built with: the image's libraries, no driver.
        _run(["ldconfig", "-r", str(rootfs)], "ldconfig of the image")
    else:
        for gone in ("etc/ld.so.cache", "sbin/ldconfig", "etc/ld.so.conf"):
            (rootfs / gone).unlink(missing_ok=True)


def _run(command: list[str], what: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BuildError(f"{what} failed for a CUDA workload image:\n{done.stderr.strip()}")
    return done.stdout
