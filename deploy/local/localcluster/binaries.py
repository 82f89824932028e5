"""The Go binaries the tests run (real Kubernetes, helm, containerd...): each module, what it pins and builds.

Each small Go module under ``deploy/local`` pins what it builds, and its go.mod is
the one place that version is set:

- ``deploy/local/k8sbin`` pins ``k8s.io/kubernetes`` (and every staging module to the
  matching v0.x), the etcd server Kubernetes pins, and the fake CRI runtime, which its
  ``hyperkube`` serves as one binary with the Kubernetes commands a cluster starts; its go.mod is
  the default release, and ``versions/<version>.mod`` (with its ``.sum``) pins each other
  supported release, built with ``go build -modfile``; ``KUBERNETES_VERSION`` picks one;
- ``deploy/local/helmbin`` pins ``helm.sh/helm/v3`` (for rendering and linting the chart
  in ``deploy/helm``);
- ``deploy/local/gobench`` pins the same ``k8s.io/kubernetes`` release (``versions/`` as in
  k8sbin) for Kubernetes' own DRA test driver, a reference for ``make bench`` only; built
  only when the comparison benchmark runs;
- ``deploy/local/ctrbin`` pins containerd 2.x (``containerd``, ``ctr``, the runc shim) and
  runc, as ``tool`` lines of its go.mod, for clusters on a real runtime
  (``CONTAINER_RUNTIME=containerd``); built only when such a cluster starts;
- ``deploy/local/promqlbin`` pins ``github.com/prometheus/prometheus`` for ``promeval``, a
  small program of its own that evaluates PromQL with Prometheus' engine over scraped
  exposition text (the dashboard test); built only when that test runs.

Binaries land in a per-user cache, one directory per module and version keyed by that
version and a hash of the module's sources (``<cache>/k8s/v1.34.12-<hash>/``,
``<cache>/helm/v3.19.5-<hash>/``), so a second run (or a second checkout)
reuses them, and changing one module rebuilds only that module. A command is built on
first use, so a cluster never waits for helm or kubectl; how is localcluster.gomodule's.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from localcluster.gomodule import BuildError, GoModule, cache_root, ensure_built

_LOCAL_DIR = Path(__file__).resolve().parent.parent


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


#: What a cluster starts: the module's own helper programs, then commands of k8s.io/kubernetes,
#: all served by one multi-call binary (deploy/local/k8sbin/hyperkube), so a first build
#: links once instead of once per command (kube-proxy runs on containerd clusters only). kubectl
#: is built on its own, only for whoever asks for it.
CLUSTER_COMMANDS = (
    "etcd",
    "fakeruntime",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubelet",
)

KUBERNETES = GoModule(
    name="k8s",
    directory=_LOCAL_DIR / "k8sbin",
    pinned="k8s.io/kubernetes",
    packages=("./hyperkube", "k8s.io/kubernetes/cmd/kubectl"),
    ldflags=_kube_ldflags,
    multicall=("./hyperkube", CLUSTER_COMMANDS),
)
HELM = GoModule(
    name="helm",
    directory=_LOCAL_DIR / "helmbin",
    pinned="helm.sh/helm/v3",
    packages=("helm.sh/helm/v3/cmd/helm",),
    ldflags=_helm_ldflags,
)


def _containerd_ldflags(version: str) -> str:
    # containerd reports this in `containerd --version` and the CRI Version call (the kubelet
    # logs it); runc and the CNI plugins take theirs from the module's build info.
    return f"-s -w -X github.com/containerd/containerd/v2/version.Version={version}"


#: Debian's package of libseccomp's headers and static library, for runc's seccomp support.
LIBSECCOMP_PACKAGE = "libseccomp-dev"


def _libseccomp_env() -> dict[str, str]:
    """cgo flags for a runc with seccomp, from libseccomp-dev downloaded (not installed) once.

    The kubelet asks for the RuntimeDefault seccomp profile for every pod sandbox, which a
    runc without seccomp refuses; this machine has no libseccomp headers, and installing
    packages is not the harness's business. The package is unpacked into the cache and
    linked statically (its .so link points into another package, so it is removed), so
    runc needs nothing of it at run time.
    """
    target = cache_root() / "libseccomp"
    lib_dir = target / "usr/lib/x86_64-linux-gnu"
    if not (lib_dir / "libseccomp.a").is_file():
        if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
            raise BuildError(
                f"apt-get and dpkg-deb are needed to fetch {LIBSECCOMP_PACKAGE} for runc's seccomp"
            )
        with tempfile.TemporaryDirectory() as tmp:
            fetched = subprocess.run(
                ["apt-get", "download", LIBSECCOMP_PACKAGE],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
            )
            debs = sorted(Path(tmp).glob(f"{LIBSECCOMP_PACKAGE}_*.deb"))
            if fetched.returncode != 0 or not debs:
                raise BuildError(f"apt-get download {LIBSECCOMP_PACKAGE} failed:\n{fetched.stderr}")
            staging = Path(tempfile.mkdtemp(prefix=".libseccomp-", dir=cache_root()))
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(staging)], check=True)
            (staging / "usr/lib/x86_64-linux-gnu/libseccomp.so").unlink(missing_ok=True)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    return {
        "CGO_ENABLED": "1",
        "CGO_CFLAGS": f"-I{target / 'usr/include'}",
        "CGO_LDFLAGS": f"-L{lib_dir}",
        "PKG_CONFIG_PATH": str(lib_dir / "pkgconfig"),
        "PKG_CONFIG_SYSROOT_DIR": str(target),
    }


#: What a cluster on containerd runs beside the Kubernetes binaries: containerd, its runc shim,
#: runc, ctr (to import the local images), and the CNI plugins of the pod network (ptp,
#: host-local, loopback), without which containerd reports the network not ready and the
#: kubelet keeps the node NotReady.
CONTAINERD = GoModule(
    name="containerd",
    directory=_LOCAL_DIR / "ctrbin",
    pinned="github.com/containerd/containerd/v2",
    packages=(
        "github.com/containerd/containerd/v2/cmd/containerd",
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        "github.com/containerd/containerd/v2/cmd/ctr",
        "github.com/opencontainers/runc",
        "github.com/containernetworking/plugins/plugins/main/ptp",
        "github.com/containernetworking/plugins/plugins/ipam/host-local",
        "github.com/containernetworking/plugins/plugins/main/loopback",
    ),
    ldflags=_containerd_ldflags,
    # runc's seccomp support (libseccomp through cgo); containerd has none of its own to enable.
    tags=("seccomp",),
    build_env=_libseccomp_env,
)

MODULE_DIR = KUBERNETES.directory
#: One <version>.mod (and .sum) per supported Kubernetes release besides the default.
VERSIONS_DIR = KUBERNETES.directory / "versions"


def default_kubernetes_version() -> str:
    """The release deploy/local/k8sbin/go.mod pins, e.g. v1.34.12: what runs unless told otherwise."""
    return KUBERNETES.version()


def supported_kubernetes_versions() -> tuple[str, ...]:
    """The default release, then every release with a modfile in deploy/local/k8sbin/versions."""
    others = sorted(path.stem for path in VERSIONS_DIR.glob("v*.mod"))
    return (default_kubernetes_version(), *others)


def kubernetes_version() -> str:
    """The release to run: $KUBERNETES_VERSION (e.g. v1.37.2), else the default."""
    wanted = os.environ.get("KUBERNETES_VERSION", "").strip()
    if not wanted:
        return default_kubernetes_version()
    version = wanted if wanted.startswith("v") else f"v{wanted}"
    supported = supported_kubernetes_versions()
    if version not in supported:
        raise BuildError(
            f"KUBERNETES_VERSION={wanted} is not a supported release; supported: {', '.join(supported)} "
            f"(another needs deploy/local/k8sbin/versions/{version}.mod and .sum, see docs/testing.md)"
        )
    return version


def _at_release(module: GoModule, version: str | None) -> GoModule:
    """A module pinning k8s.io/kubernetes, at one release (default: kubernetes_version()):
    its go.mod for the default release, else its ``versions/<version>.mod``."""
    version = version or kubernetes_version()
    if version == default_kubernetes_version():
        return module
    modfile = module.directory / "versions" / f"{version}.mod"
    if not modfile.is_file():
        raise BuildError(f"{module.directory} has no versions/{version}.mod (and .sum) to build {version}")
    released = dataclasses.replace(module, modfile=modfile)
    if released.version() != version:
        raise BuildError(f"{released.go_mod} pins {released.pinned} {released.version()}, not {version}")
    return released


def kubernetes_module(version: str | None = None) -> GoModule:
    """The Kubernetes module building one release (default: kubernetes_version())."""
    return _at_release(KUBERNETES, version)


#: Kubernetes' own DRA test driver (k8s.io/kubernetes/test/e2e/dra/test-driver), the Go
#: reference `make bench` compares the driver with; never part of a cluster.
GO_DRA_DRIVER = "test-driver"
GOBENCH = GoModule(
    name="gobench",
    directory=_LOCAL_DIR / "gobench",
    pinned="k8s.io/kubernetes",
    packages=(f"k8s.io/kubernetes/test/e2e/dra/{GO_DRA_DRIVER}",),
    ldflags=_kube_ldflags,
)


def go_dra_driver_module(version: str | None = None) -> GoModule:
    """The module building Kubernetes' DRA test driver of one release (default: kubernetes_version())."""
    return _at_release(GOBENCH, version)


def ensure_go_dra_driver(version: str | None = None, log: bool = True) -> Path:
    """Build Kubernetes' DRA test driver of a release (default: the chosen one) on first use; its path.

    It shares most packages with the kubelet, so with the Go build cache warm from the
    cluster binaries this takes about a minute on two cores; later calls return at once.
    """
    module = go_dra_driver_module(version)
    return ensure_built(module, f"Kubernetes' DRA test driver {module.version()}", log) / GO_DRA_DRIVER


#: Prometheus' PromQL engine, text parser and TSDB behind a small program of the project's own
#: (deploy/local/promqlbin/promeval), not the whole server.
PROMEVAL = "promeval"
PROMQL = GoModule(
    name="promql",
    directory=_LOCAL_DIR / "promqlbin",
    pinned="github.com/prometheus/prometheus",
    packages=(f"./{PROMEVAL}",),
    ldflags=lambda _version: "-s -w",
)


def ensure_promeval(log: bool = True) -> Path:
    """Build promeval (PromQL over scraped exposition text) on first use; its path.

    About 80 s on two cores with the modules downloaded; later calls return at once.
    """
    return ensure_built(PROMQL, f"promeval (Prometheus {PROMQL.version()})", log) / PROMEVAL


#: A DRA v1 gRPC server in Go that does no work (floorbin/grpcfloor/main.go): the per-call floor of
#: gRPC in Go, measured beside the same floor in Python (tests/bench/bench_grpcserver.py). Pinned to
#: the kubelet API module of the test driver's release, and the same grpc and protobuf versions.
GRPC_FLOOR = "grpcfloor"
FLOOR = GoModule(
    name="floor",
    directory=_LOCAL_DIR / "floorbin",
    pinned="k8s.io/kubelet",
    packages=(f"./{GRPC_FLOOR}",),
    ldflags=lambda _version: "-s -w",
)


def ensure_grpc_floor(log: bool = True) -> Path:
    """Build grpcfloor on first use; its path. Seconds with the modules downloaded."""
    return ensure_built(FLOOR, f"grpcfloor (k8s.io/kubelet {FLOOR.version()})", log) / GRPC_FLOOR


#: NVIDIA's DRA kubelet plugin (sigs.k8s.io/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin), the
#: driver users run instead of this one: started beside it on the local cluster over the fake NVML
#: (deploy/local/fakenvml), never part of a cluster by default. nvidiabin/go.mod pins the newest
#: release whose dependencies the module proxy serves whole (v0.5.0 needs go-nvfm, which it does not).
NVIDIA_PLUGIN = "gpu-kubelet-plugin"
#: The hook NVIDIA's CDI specs name (its image ships it; the plugin copies it into its plugin directory).
NVIDIA_CDI_HOOK = "nvidia-cdi-hook"
NVIDIA = GoModule(
    name="nvidia",
    directory=_LOCAL_DIR / "nvidiabin",
    pinned="sigs.k8s.io/dra-driver-nvidia-gpu",
    packages=(
        f"sigs.k8s.io/dra-driver-nvidia-gpu/cmd/{NVIDIA_PLUGIN}",
        f"github.com/NVIDIA/nvidia-container-toolkit/cmd/{NVIDIA_CDI_HOOK}",
    ),
    # As NVIDIA's Makefile stamps it, so that --version says which release runs.
    ldflags=lambda version: f"-s -w -X sigs.k8s.io/dra-driver-nvidia-gpu/internal/info.version={version}",
)


def ensure_nvidia_plugin(log: bool = True) -> Path:
    """Build NVIDIA's gpu-kubelet-plugin and the nvidia-cdi-hook its specs name on first use; their directory.

    About 440 MB of modules and two minutes of compiling on two cores the first time (cgo:
    go-nvml's bindings); later calls return at once.
    """
    return ensure_built(NVIDIA, f"NVIDIA's DRA driver {NVIDIA.version()}", log)


#: The same hook as this driver's image ships it (deploy/Dockerfile): linked statically, because the
#: container runtime runs it on the host, whatever C library the host has. Its cgo dependency (go-nvml)
#: is only dlopen'd by the subcommands that query GPUs, which the specs do not run.
NVIDIA_HOOK = GoModule(
    name="nvidia-cdi-hook",
    directory=_LOCAL_DIR / "nvidiabin",
    pinned="github.com/NVIDIA/nvidia-container-toolkit",
    packages=(f"github.com/NVIDIA/nvidia-container-toolkit/cmd/{NVIDIA_CDI_HOOK}",),
    # As NVIDIA's Makefile stamps it, so that --version says which release runs.
    ldflags=lambda version: (
        "-s -w -linkmode external -extldflags -static "
        f"-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version={version.lstrip('v')}"
    ),
)


def ensure_nvidia_cdi_hook(log: bool = True) -> Path:
    """Build NVIDIA's nvidia-cdi-hook, static, on first use (the hook this driver's specs run, shipped in
    its image); its path. About a minute on two cores with the modules downloaded."""
    what = f"nvidia-cdi-hook (NVIDIA container toolkit {NVIDIA_HOOK.version()})"
    return ensure_built(NVIDIA_HOOK, what, log) / NVIDIA_CDI_HOOK


def modules() -> tuple[GoModule, ...]:
    """Every module ensure_binaries() builds, in build order."""
    return (kubernetes_module(), HELM)


def bin_dir() -> Path:
    """Where the Kubernetes binaries of the chosen release live (whether built yet or not)."""
    return kubernetes_module().bin_dir()


def _module_of(name: str) -> GoModule:
    for module in modules():
        if name in module.commands:
            return module
    raise KeyError(f"no Go module under deploy/local builds {name!r}")


def binary(name: str) -> Path:
    """The cached path of one command of any module (built or not): binary("helm")."""
    return _module_of(name).bin_dir() / name


def ensure_binary(name: str, log: bool = True) -> Path:
    """The path of one command, building only that command on first use: ensure_binary("helm")."""
    return ensure_built(_module_of(name), name, log, (name,)) / name


def ensure_cluster_binaries(version: str | None = None, log: bool = True) -> Path:
    """Build what a cluster of a release (default: the chosen one) starts, on first use; return
    their directory.

    One multi-call binary serves them all (about 14 CPU-minutes with empty Go caches, so about
    7 minutes on two free cores; no helm, no kubectl); later calls return at once.
    """
    module = kubernetes_module(version)
    return ensure_built(module, f"Kubernetes {module.version()}", log, CLUSTER_COMMANDS)


def ensure_containerd_binaries(log: bool = True) -> Path:
    """Build containerd, ctr, the runc shim, runc and the CNI plugins on first use; return their directory.

    About 5 minutes on two cores with empty Go caches; later calls return at once.
    """
    return ensure_built(CONTAINERD, f"containerd {CONTAINERD.version()}", log)


def ensure_binaries(log: bool = True) -> Path:
    """Build every module's binaries on first use; return the Kubernetes binaries' directory.

    Concurrent callers wait on a lock instead of building twice. The first
    build downloads the modules and compiles Kubernetes (about 6 minutes on two
    cores with an empty Go cache) and helm (about 3.5 more); later calls return at once.
    Other commands are found with binary(name).
    """
    for module in modules():
        ensure_built(module, None, log)
    return kubernetes_module().bin_dir()


if __name__ == "__main__":
    # `make cluster-binaries`: the system Python, before the venv exists.
    try:
        ensure_cluster_binaries()
    except BuildError as err:
        sys.exit(f"error: {err}")
