"""Run `dra-gpu webhook` as a real process on 127.0.0.1 with a certificate of a throwaway CA, for tests."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

from localcluster.driverprocess import DaemonProcess, free_port
from localcluster.pki import CertificateAuthority


class WebhookProcess(DaemonProcess):
    """The admission webhook on https://127.0.0.1:<https_port>/validate, probes on its own HTTP port."""

    what = "webhook"

    def __init__(self, workdir: Path, driver_name: str) -> None:
        super().__init__(workdir / "webhook.log")
        self.driver_name = driver_name
        self.https_port = free_port()
        self.ca = CertificateAuthority(workdir / "webhook-pki")
        self.pair = self.ca.issue("webhook", "dra-gpu-webhook", hosts=("127.0.0.1",), server=True)

    @property
    def url(self) -> str:
        """Where the API server calls it."""
        return f"https://127.0.0.1:{self.https_port}/validate"

    @property
    def ca_bundle(self) -> str:
        """The CA that signed its certificate, as a ValidatingWebhookConfiguration's caBundle."""
        return base64.b64encode(self.ca.cert_path.read_bytes()).decode()

    def args(self) -> list[str]:
        """The command line."""
        return [
            sys.executable,
            "-m",
            "dra",
            "webhook",
            f"--driver-name={self.driver_name}",
            f"--bind-address=127.0.0.1:{self.https_port}",
            f"--tls-cert-file={self.pair.cert}",
            f"--tls-key-file={self.pair.key}",
            f"--http-address=127.0.0.1:{self.port}",
        ]
