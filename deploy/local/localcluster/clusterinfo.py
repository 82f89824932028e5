"""What a user of a local cluster needs: its paths, node name and processes (cluster.json); where runs live.

`localcluster.cluster` starts the cluster and writes this; tests, benchmarks and the demo read it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dra.adapters.nodefiles import write_atomic

NODE_NAME = "gpu-node-1"


class ClusterError(RuntimeError):
    """The cluster did not come up; the message names the component and its log."""


@dataclass
class ClusterInfo:
    """What a user of the cluster needs: paths, the node name, process IDs."""

    run_dir: str
    kubeconfig: str
    kubelet_root: str
    device_plugin_dir: str
    cdi_dir: str
    runtime_records: str
    node_name: str
    api_server: str
    feature_gates: dict[str, bool]
    pids: dict[str, int] = field(default_factory=dict)
    #: The Kubernetes release the cluster runs, e.g. v1.37.2.
    kubernetes_version: str = ""
    #: "fake" (records what it resolved in runtime_records) or "containerd" (real containers).
    container_runtime: str = "fake"
    #: On containerd: where the driver makes the fake GPUs' device nodes and driver (--fake-gpu-root).
    fake_gpu_root: str = ""
    #: On containerd: the image test pods run (a static busybox) and the sandbox image.
    test_image: str = ""
    pause_image: str = "registry.k8s.io/pause:3.10"
    #: The node's InternalIP: its own network namespace's address on containerd (localcluster.nodenet).
    node_ip: str = "127.0.0.1"
    #: On containerd: the pods' addresses.
    pod_subnet: str = ""

    @property
    def plugins_registry(self) -> str:
        """Where DRA drivers place their registration socket."""
        return os.path.join(self.kubelet_root, "plugins_registry")

    @property
    def plugins_dir(self) -> str:
        """Where DRA drivers place their service socket (plugins/<driver>/dra.sock)."""
        return os.path.join(self.kubelet_root, "plugins")

    def log_path(self, component: str) -> str:
        """The log file of one component."""
        return os.path.join(self.run_dir, "logs", f"{component}.log")

    def save(self) -> None:
        """Write cluster.json into the run directory, for `down` and for tools."""
        write_atomic(Path(self.run_dir) / "cluster.json", json.dumps(asdict(self), indent=2).encode())

    @classmethod
    def load(cls, run_dir: str | Path) -> ClusterInfo:
        """Read the cluster.json a running cluster wrote."""
        data = json.loads((Path(run_dir) / "cluster.json").read_text())
        return cls(**data)


def cluster_dir() -> Path:
    """The directory of the cluster that `make cluster-up` starts (DRA_GPU_CLUSTER_DIR)."""
    return Path(os.environ.get("DRA_GPU_CLUSTER_DIR", "/tmp/dra-gpu-cluster"))


def demo_dir() -> Path:
    """The directory of the cluster that `make demo` starts: beside cluster_dir(), so
    `make cluster-down` finds it."""
    return cluster_dir().with_name(cluster_dir().name + "-demo")
