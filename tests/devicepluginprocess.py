"""Run `dra-gpu device-plugin` as a real process against the local cluster's kubelet, for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.cluster.cluster import ClusterInfo
from tests.driverprocess import free_port


class DevicePluginProcess:
    """The device plugin on the cluster's device-plugin directory, CDI directory and kubelet root.

    It records every kubelet call in `call_log` and reads XID injections from `events`.
    Its GPU assignment record is the kubelet-plugin's default one (<kubelet root>/plugins/<driver>),
    so a DriverProcess on the same cluster sees it.
    """

    def __init__(
        self,
        cluster: ClusterInfo,
        profile: str,
        workdir: Path,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.cluster = cluster
        self.profile = profile
        self.workdir = workdir
        self.log_path = workdir / "device-plugin.log"
        self.call_log = workdir / "calls.jsonl"
        self.events = workdir / "xid-events"
        self.events.touch()
        self.extra_args = extra_args
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        """The command line."""
        return [
            sys.executable,
            "-m",
            "dra",
            "device-plugin",
            f"--node-name={self.cluster.node_name}",
            f"--kubelet-root={self.cluster.kubelet_root}",
            f"--device-plugin-dir={self.cluster.device_plugin_dir}",
            f"--cdi-root={self.cluster.cdi_dir}",
            f"--fake-gpus={self.profile}",
            f"--fake-gpu-events={self.events}",
            f"--http-address=127.0.0.1:{self.port}",
            f"--call-log={self.call_log}",
            *self.extra_args,
        ]

    def start(self, timeout: float = 30.0) -> DevicePluginProcess:
        """Start and wait until /readyz says every resource is registered with the kubelet."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ)
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"device plugin exited with {self.proc.returncode}:\n{self.log_path.read_text()}"
                )
            if self.ready():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"device plugin not ready after {timeout}s:\n{self.log_path.read_text()}")

    def ready(self) -> bool:
        """Whether /readyz answers 200."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def calls(self, event: str | None = None) -> list[dict[str, Any]]:
        """The kubelet calls recorded so far (of one kind)."""
        if not self.call_log.exists():
            return []
        entries = [json.loads(line) for line in self.call_log.read_text().splitlines() if line]
        return [e for e in entries if event is None or e["event"] == event]

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)
