"""Run `dra-gpu node-labeller` as a real process against the local cluster's API server, for tests."""

from __future__ import annotations

from pathlib import Path

from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DaemonProcess


class LabellerProcess(DaemonProcess):
    """The node labeller of the cluster's node, on fake GPUs; XID injections are read from `events`."""

    what = "node labeller"

    def __init__(
        self,
        cluster: ClusterInfo,
        profile: str,
        workdir: Path,
        kubeconfig: str,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(workdir / "node-labeller.log")
        self.cluster = cluster
        self.profile = profile
        self.kubeconfig = kubeconfig
        self.events = workdir / "labeller-xid-events"
        self.events.touch()
        self.extra_args = extra_args

    def args(self) -> list[str]:
        """The command line."""
        return self.dra_gpu(
            "node-labeller",
            self.cluster,
            self.profile,
            f"--kubeconfig={self.kubeconfig}",
            f"--fake-gpu-events={self.events}",
            *self.extra_args,
        )
