"""Build and cache the real Kubernetes binaries the local cluster runs.

The Go module in ``tests/k8sbin`` pins ``k8s.io/kubernetes`` (and every staging
module to the matching v0.x), the etcd server Kubernetes pins, and the fake CRI
runtime. Its go.mod is the one place the version is set. Binaries land in a
per-user cache, keyed by that version and a hash of the module's sources, so a
second run (or a second checkout) reuses them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parent.parent / "k8sbin"

#: Commands built from k8s.io/kubernetes, then the module's own helper programs.
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
LOCAL_COMMANDS = ("etcd", "fakeruntime")
BINARIES = KUBE_COMMANDS + LOCAL_COMMANDS


class BuildError(RuntimeError):
    """The binaries could not be built; the message says why and what to install."""


def kubernetes_version() -> str:
    """The k8s.io/kubernetes version pinned by tests/k8sbin/go.mod, e.g. v1.34.12."""
    text = (MODULE_DIR / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", text, re.MULTILINE)
    if match is None:
        raise BuildError(f"{MODULE_DIR / 'go.mod'} does not require k8s.io/kubernetes")
    return match.group(1)


def _source_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(MODULE_DIR.rglob("*")):
        if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
            digest.update(path.relative_to(MODULE_DIR).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def cache_root() -> Path:
    """DRA_GPU_CACHE_DIR, else $XDG_CACHE_HOME/dra-gpu, else ~/.cache/dra-gpu."""
    explicit = os.environ.get("DRA_GPU_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-gpu"


def bin_dir() -> Path:
    """Where the binaries of the pinned version live (whether built yet or not)."""
    return cache_root() / "k8s" / f"{kubernetes_version()}-{_source_hash()}"


def _ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    prefix = "k8s.io/component-base/version"
    # Without these the binaries report v0.0.0 and the kubelet/API server skew checks misfire.
    return " ".join(
        [
            "-s -w",
            f"-X {prefix}.gitVersion={version}",
            f"-X {prefix}.gitMajor={major}",
            f"-X {prefix}.gitMinor={minor}",
            f"-X {prefix}.gitTreeState=clean",
        ]
    )


def ensure_binaries(log: bool = True) -> Path:
    """Return the directory holding every binary, building them on first use.

    Concurrent callers wait on a lock instead of building twice. The first
    build downloads the modules and compiles Kubernetes (about 15 to 25 minutes
    on two cores); later calls return at once.
    """
    target = bin_dir()
    if all((target / name).is_file() for name in BINARIES):
        return target
    if shutil.which("go") is None:
        raise BuildError("the Go toolchain (go >= 1.25) is needed to build the Kubernetes test binaries")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((target / name).is_file() for name in BINARIES):
            return target
        version = kubernetes_version()
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
        packages = [f"./{name}" for name in LOCAL_COMMANDS]
        packages += [f"k8s.io/kubernetes/cmd/{name}" for name in KUBE_COMMANDS]
        env = dict(os.environ, GOFLAGS=(os.environ.get("GOFLAGS", "") + " -mod=readonly").strip())
        if log:
            print(f"building Kubernetes {version} test binaries into {target} ...", file=sys.stderr)
        started = time.monotonic()
        result = subprocess.run(
            ["go", "build", "-trimpath", "-ldflags", _ldflags(version), "-o", str(staging), *packages],
            cwd=MODULE_DIR,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise BuildError(f"go build failed in {MODULE_DIR}:\n{result.stdout}")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        if log:
            print(f"built in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return target
