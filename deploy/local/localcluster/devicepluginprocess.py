"""Run `dra-gpu device-plugin` as a real process against the local cluster's kubelet, for tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localcluster.clusterinfo import ClusterInfo
from localcluster.driverprocess import DaemonProcess


class DevicePluginProcess(DaemonProcess):
    """The device plugin on the cluster's device-plugin directory, CDI directory and kubelet root.

    It records every kubelet call in `call_log` and reads XID injections from `events`.
    With `with_driver` its state directory (GPU assignment record, the checkpoint of claims
    prepared for DRA) is the kubelet-plugin's default one (<kubelet root>/plugins/<driver>), which
    a DriverProcess on the same cluster shares; otherwise one of its own under `workdir`, so that
    what earlier tests' drivers left on the session's cluster is not its concern.
    """

    what = "device plugin"

    def __init__(
        self,
        cluster: ClusterInfo,
        profile: str,
        workdir: Path,
        extra_args: tuple[str, ...] = (),
        with_driver: bool = False,
    ) -> None:
        super().__init__(workdir / "device-plugin.log")
        self.with_driver = with_driver
        self.cluster = cluster
        self.profile = profile
        self.workdir = workdir
        self.call_log = workdir / "calls.jsonl"
        self.events = workdir / "xid-events"
        self.events.touch()
        self.extra_args = extra_args

    def args(self) -> list[str]:
        """The command line."""
        return self.dra_gpu(
            "device-plugin",
            self.cluster,
            self.profile,
            f"--kubelet-root={self.cluster.kubelet_root}",
            f"--device-plugin-dir={self.cluster.device_plugin_dir}",
            f"--cdi-root={self.cluster.cdi_dir}",
            f"--fake-gpu-events={self.events}",
            f"--call-log={self.call_log}",
            *([] if self.with_driver else [f"--state-dir={self.workdir / 'state'}"]),
            *self.extra_args,
        )

    def calls(self, event: str | None = None) -> list[dict[str, Any]]:
        """The kubelet calls recorded so far (of one kind)."""
        if not self.call_log.exists():
            return []
        entries = [json.loads(line) for line in self.call_log.read_text().splitlines() if line]
        return [e for e in entries if event is None or e["event"] == event]
