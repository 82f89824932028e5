"""NVIDIA's DRA driver on the local cluster, in place of this one: its kubelet plugin over a fake node.

NVIDIA's gpu-kubelet-plugin (sigs.k8s.io/dra-driver-nvidia-gpu, built by localcluster.binaries
from deploy/local/nvidiabin) runs as a process on the cluster's kubelet, as its chart's DaemonSet
runs it on a node: the environment of the chart's `gpus` container (helm template of the chart in
the same module, so the DeviceClasses, gates and settings are that release's), the node's driver
root mounted at the same path inside as outside (a host process sees one file system), and the
fake node's mount namespace for /sys and /proc/driver (fakenvml.node). Its NVML is the fake
library in that driver root; the GPUs it finds are the ones this driver finds on the same node.

What differs from the chart, and why: no container (the plugin is a host process, as ours is in
the tests), the admin's kubeconfig unless another is given (ours too), the plugin's own copy of
nvidia-cdi-hook made here (its image ships the hook and the plugin copies it into its plugin
directory; here it is built from the module proxy and copied to the same place), and a metrics
address on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import yaml
from fakenvml.node import FakeNode

from dra.adapters.checkpoint import KIND as DRA_GPU_CHECKPOINT
from localcluster.binaries import NVIDIA, NVIDIA_CDI_HOOK, NVIDIA_PLUGIN, ensure_nvidia_plugin
from localcluster.chart import helm
from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DaemonProcess, free_port
from localcluster.gomodule import BuildError
from localcluster.kube import Kube, Obj
from localcluster.workloads import published_slices

DRIVER = "gpu.nvidia.com"
#: The release's chart, inside the module the plugin is built from.
CHART_PATH = "deployments/helm/dra-driver-nvidia-gpu"
NAMESPACE = "nvidia-dra-driver-gpu"
#: What its chart needs to render the GPU driver alone: no ComputeDomain driver, and the GPU classes
#: on a cluster that runs no NVIDIA device plugin (the chart refuses them by default until KEP-5004 is
#: GA), which the local cluster does not.
CHART_VALUES = {"resources.computeDomains.enabled": "false", "gpuResourcesEnabledOverride": "true"}
#: The gates that turn its features on, as an admin sets them (featureGates in its values): all of
#: them but passthrough, which needs a sysfs of PCI functions and an IOMMU the fake node has not.
FEATURE_GATES = {"TimeSlicingSettings": True, "MPSSupport": True}
#: Where its image has the release's templates/ (its Dockerfile: COPY /templates /templates), which
#: its plugin reads at that fixed path (the MPS control daemon's Deployment).
TEMPLATES = Path("/templates")


def gates_for(profile: str, extra: Mapping[str, bool] | None = None) -> dict[str, bool]:
    """The gates NVIDIA's plugin runs with on a profile: DynamicMIG on the dynamic-MIG profiles, without
    MPSSupport there (this release refuses to start with both: "currently mutually exclusive")."""
    dynamic = profile.endswith("dynamic-mig")
    return {**FEATURE_GATES, "DynamicMIG": dynamic, "MPSSupport": not dynamic, **(extra or {})}


@cache
def chart_dir() -> Path:
    """NVIDIA's chart of the pinned release, from the Go module cache (downloaded if need be)."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", NVIDIA.pinned],
        cwd=NVIDIA.directory,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        chart = Path(json.loads(done.stdout)["Dir"]) / CHART_PATH
    except (ValueError, KeyError):
        raise BuildError(f"go mod download {NVIDIA.pinned} failed:\n{done.stderr or done.stdout}") from None
    if not (chart / "Chart.yaml").is_file():
        raise BuildError(f"{NVIDIA.pinned} {NVIDIA.version()} has no chart at {CHART_PATH}")
    return chart


def templates_dir() -> Path:
    """The release's templates/ directory, beside its chart in the module."""
    return chart_dir().parents[2] / "templates"


def render_chart(gates: Mapping[str, bool], kubernetes: str = "1.34.0") -> list[Obj]:
    """`helm template` of NVIDIA's chart with these feature gates, as an admin installs it."""
    values = {**CHART_VALUES, **{f"featureGates.{name}": str(on).lower() for name, on in gates.items()}}
    done = helm(
        "template",
        "nvidia",
        str(chart_dir()),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        kubernetes,
        "--api-versions",
        "resource.k8s.io/v1",
        *(arg for name, value in values.items() for arg in ("--set", f"{name}={value}")),
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def device_classes(rendered: list[Obj]) -> list[Obj]:
    """The DeviceClasses of a render."""
    return [doc for doc in rendered if doc["kind"] == "DeviceClass"]


def plugin_environment(rendered: list[Obj]) -> dict[str, str]:
    """The plain values of the environment the chart gives the kubelet plugin's `gpus` container."""
    daemonset = next(
        d for d in rendered if d["kind"] == "DaemonSet" and "kubelet-plugin" in d["metadata"]["name"]
    )
    container = next(c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "gpus")
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


class NvidiaDriverProcess(DaemonProcess):
    """NVIDIA's gpu-kubelet-plugin on the cluster's kubelet, CDI directory and API server."""

    what = "NVIDIA's kubelet plugin"

    def __init__(
        self,
        cluster: ClusterInfo,
        node: FakeNode,
        log_path: Path,
        gates: Mapping[str, bool] | None = None,
        kubeconfig: str | None = None,
        verbosity: int | None = None,
    ) -> None:
        """`gates`: its feature gates (default: gates_for the profile); `verbosity`: -v (the chart's)."""
        super().__init__(log_path)
        self.cluster = cluster
        self.node = node
        self.gates = dict(gates) if gates is not None else gates_for(node.config.profile)
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.rendered = render_chart(self.gates)
        chart_env = plugin_environment(self.rendered)
        self.verbosity = verbosity if verbosity is not None else int(chart_env.get("LOG_VERBOSITY", "4"))
        self.binaries = ensure_nvidia_plugin()
        self.env = self._environment(chart_env, Path(cluster.kubelet_root) / "plugins")
        self._kube = Kube(cluster.kubeconfig)

    def _environment(self, chart_env: dict[str, str], plugins: Path) -> dict[str, str]:
        return {
            **chart_env,
            "NODE_NAME": self.cluster.node_name,
            "NAMESPACE": NAMESPACE,
            "IMAGE_NAME": f"dra-driver-nvidia-gpu:{NVIDIA.version()}",
            "NVIDIA_DRIVER_ROOT": str(self.node.driver_root),
            # Its container sees the host's driver root at /driver-root; a host process at its own path.
            "DRIVER_ROOT_CTR_PATH": str(self.node.driver_root),
            "CDI_ROOT": self.cluster.cdi_dir,
            "KUBELET_REGISTRAR_DIRECTORY_PATH": str(Path(self.cluster.kubelet_root) / "plugins_registry"),
            "KUBELET_PLUGINS_DIRECTORY_PATH": str(plugins),
            "NVIDIA_CDI_HOOK_PATH": str(plugins / DRIVER / NVIDIA_CDI_HOOK),
            "HTTP_ENDPOINT": f"127.0.0.1:{self.port}",
            # The chart's fixed port would keep two instances (a rolling update, two clusters) apart.
            "HEALTHCHECK_PORT": str(free_port()),
            "KUBECONFIG": self.kubeconfig,
            # Its chart sets none with no featureGates value (its default): the plugin's own defaults.
            **(
                {"FEATURE_GATES": ",".join(f"{n}={str(on).lower()}" for n, on in sorted(self.gates.items()))}
                if self.gates
                else {}
            ),
        }

    @property
    def registration_socket(self) -> Path:
        """The socket the kubelet finds NVIDIA's plugin by."""
        return Path(self.cluster.kubelet_root) / "plugins_registry" / f"{DRIVER}-reg.sock"

    def args(self) -> list[str]:
        """The plugin as its chart's container runs it, in the fake node's namespace.

        A registration socket and slices left by an earlier run are removed first, so that ready()
        sees this one's (the kubelet would wipe the slices of a gone driver after some 30 s), and a
        checkpoint dra-gpu left is moved aside, as an admin switching the node's driver does: NVIDIA's
        plugin keeps its own at the same path and will not start on one it cannot parse
        (docs/migration.md).
        """
        self.registration_socket.unlink(missing_ok=True)
        checkpoint = Path(self.env["KUBELET_PLUGINS_DIRECTORY_PATH"]) / DRIVER / "checkpoint.json"
        with contextlib.suppress(FileNotFoundError, ValueError):
            if json.loads(checkpoint.read_text().split("\n", 1)[0]).get("kind") == DRA_GPU_CHECKPOINT:
                checkpoint.replace(checkpoint.with_name("checkpoint.json.dra-gpu"))
        for stale in published_slices(self._kube, self.cluster):
            self._kube.delete("resource.k8s.io/v1", "ResourceSlice", stale["metadata"]["name"])
        # Its release's namespace, which `helm install --create-namespace` makes: the plugin creates
        # its MPS control daemons' Deployments there.
        if self._kube.get_or_none("v1", "Namespace", NAMESPACE) is None:
            self._kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        hook = Path(self.env["NVIDIA_CDI_HOOK_PATH"])
        hook.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.binaries / NVIDIA_CDI_HOOK, hook)
        # Its image's /templates, bound in the plugin's own mount namespace; the host keeps only the
        # empty mount point.
        TEMPLATES.mkdir(exist_ok=True)
        with_templates = f'mount --bind {shlex.quote(str(templates_dir()))} {TEMPLATES} && exec "$@"'
        plugin = [str(self.binaries / NVIDIA_PLUGIN), "-v", str(self.verbosity)]
        return self.node.wrap(["sh", "-c", with_templates, "templates", *plugin])

    def ready(self) -> bool:
        """Its registration socket made, its slices published and its metrics served."""
        return (
            self.registration_socket.exists()
            and bool(published_slices(self._kube, self.cluster))
            and self.ready_at("/metrics")
        )
