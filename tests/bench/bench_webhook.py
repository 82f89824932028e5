"""Benchmark: what the admission webhook adds to a create (the figures in docs/sharing.md's webhook section).

    PYTHONPATH=deploy/local .venv/bin/python -m tests.bench.bench_webhook [--requests 500]

Decision: `review()` of an AdmissionReview of a claim with one MPS config, in process.
Round trip: POST /validate to a real `dra-gpu webhook` process on 127.0.0.1 over TLS, on one
kept-alive connection (as the API server's client reuses them) and on a new connection per
request (a TLS handshake each). Median and 99th percentile. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import ssl
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from localcluster.webhookprocess import WebhookProcess

from dra.webhook.admission import review

DRIVER = "gpu.nvidia.com"


def _body() -> bytes:
    parameters = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {
            "strategy": "MPS",
            "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
        },
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "bench", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}],
                "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}],
            }
        },
    }
    request = {"uid": "u", "kind": {"kind": "ResourceClaim"}, "operation": "CREATE", "object": claim}
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def _times_ms(run: Callable[[], object], count: int) -> tuple[float, float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        run()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    print(f"Python {platform.python_version()} on {platform.machine()}, {time.strftime('%Y-%m-%d')}")
    body = _body()
    document = json.loads(body)
    median, p99 = _times_ms(lambda: review(document, DRIVER), args.requests)
    print(f"decision, in process:            median {median:.3f} ms, p99 {p99:.3f} ms")

    with tempfile.TemporaryDirectory() as work:
        process = WebhookProcess(Path(work), DRIVER).start()
        try:
            context = ssl.create_default_context(cafile=str(process.ca.cert_path))
            headers = {"Content-Type": "application/json"}
            kept = http.client.HTTPSConnection("127.0.0.1", process.https_port, context=context)

            def on_kept() -> None:
                kept.request("POST", "/validate", body, headers)
                kept.getresponse().read()

            def on_new() -> None:
                fresh = http.client.HTTPSConnection("127.0.0.1", process.https_port, context=context)
                fresh.request("POST", "/validate", body, headers)
                fresh.getresponse().read()
                fresh.close()

            on_kept()  # the first request pays for the handshake
            median, p99 = _times_ms(on_kept, args.requests)
            print(f"HTTPS round trip, kept-alive:    median {median:.3f} ms, p99 {p99:.3f} ms")
            median, p99 = _times_ms(on_new, args.requests)
            print(f"HTTPS round trip, new each time: median {median:.3f} ms, p99 {p99:.3f} ms")
            kept.close()
        finally:
            process.stop()


if __name__ == "__main__":
    main()
