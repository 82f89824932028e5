"""Run dra-gpu daemons as real processes against the local cluster, for tests and the demo."""

from __future__ import annotations

import abc
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Self

from fakenvml.node import FakeNode

from dra.adapters.checkpoint import CheckpointStore
from dra.fakegpus.node import FAKE_MIG_STATE
from dra.kubeletplugin.server import sockets
from localcluster.binaries import ensure_nvidia_cdi_hook
from localcluster.clusterinfo import ClusterInfo


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class DaemonProcess(abc.ABC):
    """A dra-gpu daemon as a real process: started, awaited on /readyz, stopped or killed."""

    #: How the daemon is called in error messages.
    what = "daemon"

    def __init__(self, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self.env = env or {}
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @abc.abstractmethod
    def args(self) -> list[str]:
        """The command line."""

    def dra_gpu(self, command: str, cluster: ClusterInfo, profile: str | FakeNode, *flags: str) -> list[str]:
        """`dra-gpu COMMAND` on the cluster's node, its GPUs and an HTTP port of its own, then `flags`.

        The GPUs are fake ones of a profile (--fake-gpus), or a fake node's, which the daemon reads
        through NVML as on a real node: the fake NVML in its driver root, in a mount namespace that
        shows the node's sysfs.
        """
        if isinstance(profile, FakeNode):
            gpus = [f"--driver-root={profile.driver_root}"]
        else:
            # On containerd real containers see the fake GPUs: device nodes and nvidia-smi.
            root = [f"--fake-gpu-root={cluster.fake_gpu_root}"] if cluster.fake_gpu_root else []
            gpus = [f"--fake-gpus={profile}", *root]
        if isinstance(profile, FakeNode) or cluster.fake_gpu_root:
            # The specs carry driver files, and the hooks that go with them: the hook the image ships,
            # found on PATH as there.
            path = self.env.get("PATH", os.environ.get("PATH", ""))
            self.env["PATH"] = f"{ensure_nvidia_cdi_hook().parent}{os.pathsep}{path}"
        command_line = [
            sys.executable,
            "-m",
            "dra",
            command,
            f"--node-name={cluster.node_name}",
            *gpus,
            f"--http-address=127.0.0.1:{self.port}",
            *flags,
        ]
        return profile.wrap(command_line) if isinstance(profile, FakeNode) else command_line

    def start(self, timeout: float = 30.0, on_spawn: Callable[[int], object] | None = None) -> Self:
        """Start and wait until /readyz answers 200 (the daemon decides what ready means).

        on_spawn gets the PID as soon as the process exists, before it is ready.
        """
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )
        if on_spawn is not None:
            on_spawn(self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.what} exited with {self.proc.returncode}:\n{self.log_path.read_text()}"
                )
            if self.ready():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"{self.what} not ready after {timeout}s:\n{self.log_path.read_text()}")

    def ready(self) -> bool:
        """Whether /readyz answers 200."""
        return self.ready_at("/readyz")

    def ready_at(self, path: str) -> bool:
        """Whether `path` of the daemon's HTTP port answers 200."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> str:
        """The /metrics text."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as resp:
            return str(resp.read().decode())

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.terminate()
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)


class DriverProcess(DaemonProcess):
    """The driver on the cluster's kubelet, CDI directory and API server."""

    what = "driver"

    def __init__(
        self,
        cluster: ClusterInfo,
        profile: str | FakeNode,
        log_path: Path,
        driver_name: str = "gpu.nvidia.com",
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        kubeconfig: str | None = None,
        instance_id: str | None = None,
        cdi_root: str | None = None,
    ) -> None:
        """`profile`: a fake-GPU profile, or a fake node whose GPUs it reads through NVML.

        `instance_id`: the driver's --instance-id (rolling updates, the default); None: a fresh one.

        `cdi_root`: where the driver writes CDI specs; by default the cluster's, which its runtime reads.
        """
        super().__init__(log_path, env)
        self.cluster = cluster
        self.profile = profile
        self.driver_name = driver_name
        self.extra_args = extra_args
        self.instance_id = instance_id or uuid.uuid4().hex[:12]
        #: The driver's credentials: the cluster admin's unless a test gives it its own.
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.cdi_root = cdi_root or cluster.cdi_dir

    @property
    def checkpoint(self) -> Path:
        """The checkpoint file the driver keeps."""
        return Path(self.cluster.kubelet_root) / "plugins" / self.driver_name / "checkpoint.json"

    @property
    def fake_mig_state(self) -> Path:
        """The file the fake GPUs keep their MIG modes and instances in (dra.fakegpus.mig)."""
        if isinstance(self.profile, FakeNode):
            return self.profile.config.state_dir / FAKE_MIG_STATE
        return self.checkpoint.parent / FAKE_MIG_STATE

    def fake_mig_modes(self) -> dict[int, int]:
        """The MIG mode the fake GPUs were switched to, by GPU (absent: never switched, the profile's).

        Read as the file holds it: one written for another profile, which the fake GPUs ignore, counts
        here too, so a test that reads it removes the file before the driver starts.
        """
        path = self.fake_mig_state
        data = json.loads(path.read_text()) if path.exists() else {}
        return {int(gpu): int(mode) for gpu, mode in data.get("migMode", {}).items()}

    def checkpointed(self) -> dict[str, dict[str, Any]]:
        """The claims the checkpoint records, by UID, each as its JSON fields (devices, namespace, ...)."""
        return {uid: asdict(claim) for uid, claim in CheckpointStore(self.checkpoint).load().items()}

    @property
    def rolling_update(self) -> bool:
        """Whether this driver runs with its own instance sockets (unless the test turned them off)."""
        return "--rolling-update=false" not in self.extra_args

    @property
    def dra_socket(self) -> Path:
        """The DRA service socket this driver serves."""
        return self._sockets[0]

    @property
    def registration_socket(self) -> Path:
        """The registration socket the kubelet finds this driver by."""
        return self._sockets[1]

    @property
    def _sockets(self) -> tuple[Path, Path]:
        instance = self.instance_id if self.rolling_update else None
        return sockets(Path(self.cluster.kubelet_root), self.driver_name, instance)

    def args(self) -> list[str]:
        """dra-gpu kubelet-plugin on the cluster, fake GPUs, an HTTP port of its own."""
        return self.dra_gpu(
            "kubelet-plugin",
            self.cluster,
            self.profile,
            f"--driver-name={self.driver_name}",
            f"--kubeconfig={self.kubeconfig}",
            f"--kubelet-root={self.cluster.kubelet_root}",
            f"--cdi-root={self.cdi_root}",
            # Only an instance of a rolling update has an ID (the command refuses it otherwise).
            *([f"--instance-id={self.instance_id}"] if self.rolling_update else []),
            *self.extra_args,
        )
