"""Build and cache the Go binaries the tests run: real Kubernetes and helm.

Each small Go module under ``tests/`` pins what it builds, and its go.mod is
the one place that version is set:

- ``deploy/local/k8sbin`` pins ``k8s.io/kubernetes`` (and every staging module to the
  matching v0.x), the etcd server Kubernetes pins, and the fake CRI runtime;
- ``deploy/local/helmbin`` pins ``helm.sh/helm/v3`` (for rendering and linting the chart
  in ``deploy/helm``).

Binaries land in a per-user cache, one directory per module keyed by that
version and a hash of the module's sources (``<cache>/k8s/v1.34.12-<hash>/``,
``<cache>/helm/v3.19.5-<hash>/``), so a second run (or a second checkout)
reuses them, and changing one module rebuilds only that module.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_LOCAL_DIR = Path(__file__).resolve().parent.parent


class BuildError(RuntimeError):
    """The binaries could not be built; the message says why and what to install."""


@dataclass(frozen=True)
class GoModule:
    """A Go module under tests/ and the commands built from it."""

    #: The cache subdirectory, e.g. "k8s".
    name: str
    directory: Path
    #: The required module whose version names the build, e.g. k8s.io/kubernetes.
    pinned: str
    #: Packages to build, in `go build` syntax; each yields a binary named after its last element.
    packages: tuple[str, ...]
    #: -ldflags for the pinned version.
    ldflags: Callable[[str], str]

    @property
    def commands(self) -> tuple[str, ...]:
        """The binaries this module yields."""
        return tuple(package.rsplit("/", 1)[-1] for package in self.packages)

    def version(self) -> str:
        """The version go.mod requires of the pinned module, e.g. v1.34.12."""
        text = (self.directory / "go.mod").read_text()
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(self.pinned)} (v\S+)", text, re.MULTILINE)
        if match is None:
            raise BuildError(f"{self.directory / 'go.mod'} does not require {self.pinned}")
        return match.group(1)

    def source_hash(self) -> str:
        """A hash of the module's Go sources, go.mod and go.sum."""
        digest = hashlib.sha256()
        for path in sorted(self.directory.rglob("*")):
            if path.is_file() and (path.suffix == ".go" or path.name in ("go.mod", "go.sum")):
                digest.update(path.relative_to(self.directory).as_posix().encode())
                digest.update(path.read_bytes())
        return digest.hexdigest()[:12]

    def bin_dir(self) -> Path:
        """Where this module's binaries live (whether built yet or not)."""
        return cache_root() / self.name / f"{self.version()}-{self.source_hash()}"

    def is_built(self) -> bool:
        """Whether every command is in the cache."""
        target = self.bin_dir()
        return all((target / name).is_file() for name in self.commands)


def _kube_ldflags(version: str) -> str:
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


def _helm_ldflags(version: str) -> str:
    # helm's own Makefile sets these: without them `helm version` says v3.19 and, worse,
    # `helm template` and `helm lint` assume Kubernetes v1.20 (.Capabilities.KubeVersion).
    # Like that Makefile, take the Kubernetes minor from the client-go helm is built with
    # (v0.34.x -> 1.34), so the key (helm's go.mod) covers it.
    client_go = re.search(r"^\s*k8s\.io/client-go v0\.(\d+)\.", (HELM.directory / "go.mod").read_text(), re.M)
    if client_go is None:
        raise BuildError(f"{HELM.directory / 'go.mod'} does not require k8s.io/client-go")
    major, minor = "1", client_go.group(1)
    flags = ["-s -w", f"-X helm.sh/helm/v3/internal/version.version={version}"]
    flags.append("-X helm.sh/helm/v3/internal/version.gitTreeState=clean")
    for package in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {package}.k8sVersionMajor={major}", f"-X {package}.k8sVersionMinor={minor}"]
    return " ".join(flags)


#: Commands built from k8s.io/kubernetes, then the module's own helper programs.
KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
LOCAL_COMMANDS = ("etcd", "fakeruntime")

KUBERNETES = GoModule(
    name="k8s",
    directory=_LOCAL_DIR / "k8sbin",
    pinned="k8s.io/kubernetes",
    packages=tuple(f"./{name}" for name in LOCAL_COMMANDS)
    + tuple(f"k8s.io/kubernetes/cmd/{name}" for name in KUBE_COMMANDS),
    ldflags=_kube_ldflags,
)
HELM = GoModule(
    name="helm",
    directory=_LOCAL_DIR / "helmbin",
    pinned="helm.sh/helm/v3",
    packages=("helm.sh/helm/v3/cmd/helm",),
    ldflags=_helm_ldflags,
)
#: Every module ensure_binaries() builds, in build order.
MODULES = (KUBERNETES, HELM)

MODULE_DIR = KUBERNETES.directory
BINARIES = KUBE_COMMANDS + LOCAL_COMMANDS


def kubernetes_version() -> str:
    """The k8s.io/kubernetes version pinned by deploy/local/k8sbin/go.mod, e.g. v1.34.12."""
    return KUBERNETES.version()


def cache_root() -> Path:
    """DRA_GPU_CACHE_DIR, else $XDG_CACHE_HOME/dra-gpu, else ~/.cache/dra-gpu."""
    explicit = os.environ.get("DRA_GPU_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-gpu"


def bin_dir() -> Path:
    """Where the Kubernetes binaries of the pinned version live (whether built yet or not)."""
    return KUBERNETES.bin_dir()


def _module_of(name: str) -> GoModule:
    for module in MODULES:
        if name in module.commands:
            return module
    raise KeyError(f"no Go module under tests/ builds {name!r}")


def binary(name: str) -> Path:
    """The cached path of one command of any module (built or not): binary("helm")."""
    return _module_of(name).bin_dir() / name


def _build(module: GoModule, log: bool) -> None:
    target = module.bin_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if module.is_built():
            return
        version = module.version()
        staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
        env = dict(os.environ, GOFLAGS=(os.environ.get("GOFLAGS", "") + " -mod=readonly").strip())
        if log:
            print(f"building {', '.join(module.commands)} ({version}) into {target} ...", file=sys.stderr)
        started = time.monotonic()
        result = subprocess.run(
            [
                "go",
                "build",
                "-trimpath",
                "-ldflags",
                module.ldflags(version),
                "-o",
                str(staging),
                *module.packages,
            ],
            cwd=module.directory,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise BuildError(f"go build failed in {module.directory}:\n{result.stdout}")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        if log:
            print(f"built in {time.monotonic() - started:.0f}s", file=sys.stderr)


def ensure_binary(name: str, log: bool = True) -> Path:
    """The path of one command, building only its module on first use: ensure_binary("helm")."""
    module = _module_of(name)
    if not module.is_built():
        if shutil.which("go") is None:
            raise BuildError(f"the Go toolchain (go >= 1.25) is needed to build {name}")
        _build(module, log)
    return module.bin_dir() / name


def ensure_binaries(log: bool = True) -> Path:
    """Build every module's binaries on first use; return the Kubernetes binaries' directory.

    Concurrent callers wait on a lock instead of building twice. The first
    build downloads the modules and compiles Kubernetes (about 6 minutes on two
    cores with an empty Go cache) and helm (about 3.5 more); later calls return at once.
    Other commands are found with binary(name).
    """
    missing = [module for module in MODULES if not module.is_built()]
    if missing and shutil.which("go") is None:
        raise BuildError(
            "the Go toolchain (go >= 1.25) is needed to build the test binaries (Kubernetes, helm)"
        )
    for module in missing:
        _build(module, log)
    return KUBERNETES.bin_dir()
